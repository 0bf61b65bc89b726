// LoRA adapters through kvfleet-router with the official `openai` npm client, against two cpu
// workers on a tiny model (`kvfleet make-model --shape tiny --lora NAME:RANK`): worker-0 starts
// with adapter "sql" (--lora sql=DIR), worker-1 with none. Requests whose model is "sql" go
// only to worker-0 and carry the adapter (their blocks hash with it: the base model's same
// prompt is a miss), /v1/models lists the adapter under its base model, an unknown adapter is
// 404, and /v1/load_lora_adapter and /v1/unload_lora_adapter change what is served at run time.
//   node lora_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT KVFLEET_BIN
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { Fleet, byteLevelTokenizer, check, runAgainst, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePortText, kvfleetBin] = process.argv.slice(2);
const basePort = Number(basePortText);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
if (!kvfleetBin || kvfleetBin === 'missing' || !fs.existsSync(kvfleetBin)) {
  console.log('SKIP: the kvfleet CLI is not built');
  process.exit(77);
}
if (!fs.existsSync(`${cache}/npm/node_modules/openai/package.json`)) {
  console.log('SKIP: the openai npm package is missing (run tests/assets.sh)');
  process.exit(77);
}
const help = spawnSync(kvfleetBin, ['make-model', '--help'], { encoding: 'utf8', timeout: 20000 });
if (!`${help.stdout}${help.stderr}`.includes('--lora')) {
  console.log('SKIP: this kvfleet make-model writes no LoRA adapters (--lora)');
  process.exit(77);
}
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');

// The tiny model, with a byte-level tokenizer and a plain chat template, and two adapters.
const tokDir = path.join(dir, 'tokenizer');
fs.mkdirSync(tokDir, { recursive: true });
fs.writeFileSync(path.join(tokDir, 'tokenizer.json'), JSON.stringify(byteLevelTokenizer()));
fs.writeFileSync(path.join(tokDir, 'tokenizer_config.json'), '{}');
fs.writeFileSync(path.join(tokDir, 'chat_template.jinja'),
                 '{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>');
const modelDir = path.join(dir, 'tiny');
const made = spawnSync(kvfleetBin, ['make-model', '--shape', 'tiny', '--tokenizer', tokDir, '--out', modelDir,
                                    '--dtype', 'fp32', '--lora', 'sql:8', '--lora', 'poetry:4'],
                       { encoding: 'utf8', timeout: 60000 });
if (made.status !== 0) {
  console.error(`make-model --lora failed: ${made.stdout}${made.stderr}`);
  process.exit(1);
}
const adapter = (name) => path.join(modelDir, 'loras', name);

const model = 'tiny';
const fleet = new Fleet({
  routerBin, workerBin, dir, basePort, workers: 0, model,
  routerArgs: ['--tokenizer', modelDir, '--unknown-model-grace-s', '0'],
});

function startWorker(i, extra) {
  const p = basePort + 10 + 3 * i;
  fleet.spawnLogged(`worker-${i}`, workerBin, [
    '--backend', 'cpu', '--model-dir', modelDir, '--model-name', model, '--worker-id', `worker-${i}`,
    '--requests', `tcp://127.0.0.1:${p}`, '--events', `tcp://127.0.0.1:${p + 1}`,
    '--replay', `tcp://127.0.0.1:${p + 2}`, '--http-port', String(basePort + 150 + i),
    '--router', fleet.registration, '--advertise-host', '127.0.0.1', '--block-size', '16',
    '--kv-cache-bytes', String(64 << 20), '--max-loras', '2', ...extra]);
}

async function post(route, body) {
  const r = await fetch(`${fleet.url()}${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* vLLM's success answer is text */ }
  return { status: r.status, text, json };
}

async function refusal(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return e;
  }
}

// The worker that answered, from x-kvfleet-worker.
async function complete(client, body) {
  const { data, response } = await client.completions.create({ max_tokens: 2, temperature: 0, ...body }).withResponse();
  return { data, worker: response.headers.get('x-kvfleet-worker') };
}

await runAgainst(fleet, async () => {
  startWorker(0, ['--lora', `sql=${adapter('sql')}`]);
  startWorker(1, []);
  await fleet.waitLive(2, 60000);
  const client = new OpenAI({ baseURL: `${fleet.url()}/v1`, apiKey: 'unused', maxRetries: 0 });

  // /v1/models: the base model and the adapter, with its parent.
  const models = (await client.models.list()).data;
  const sql = models.find((m) => m.id === 'sql');
  check(models.some((m) => m.id === model) && sql && sql.parent === model && sql.object === 'model',
        `/v1/models lists adapter sql under ${model} (${JSON.stringify(models)})`);
  const f = await fleet.fleetJson();
  const w0 = f.workers.find((w) => w.name === 'worker-0');
  const w1 = f.workers.find((w) => w.name === 'worker-1');
  check(w0.loras.length === 1 && w0.loras[0].name === 'sql' && w0.loras[0].rank === 8 && w1.loras.length === 0,
        `/fleet lists worker-0's adapter and none on worker-1 (${JSON.stringify([w0.loras, w1.loras])})`);

  // model "sql": only worker-0, through chat completions and completions.
  const chat = await client.chat.completions.create({
    model: 'sql', messages: [{ role: 'user', content: 'select everything' }], max_tokens: 3, temperature: 0,
  }).withResponse();
  check(chat.response.headers.get('x-kvfleet-worker') === 'worker-0' && chat.data.model === 'sql' &&
        chat.data.choices[0].message.role === 'assistant',
        `a chat with model sql is answered by worker-0 (${chat.response.headers.get('x-kvfleet-worker')})`);
  const prompt = 'SELECT name FROM users WHERE id = 42; -- the same prompt, over and over again';
  for (let i = 0; i < 4; i++) {
    const r = await complete(client, { model: 'sql', prompt, routing: 'round_robin' });
    check(r.worker === 'worker-0', `sql request ${i} (round robin) goes to worker-0, the only one serving it`);
  }
  // The repeated prompt hits under the adapter; the base model's same prompt is another
  // namespace: neither its full blocks nor a partial first block are reused there.
  const hit = await complete(client, { model: 'sql', prompt });
  const hitTokens = hit.data.usage.prompt_tokens_details.cached_tokens;
  check(hitTokens >= 64, `the adapter's repeated prompt hits its cache (${JSON.stringify(hit.data.usage)})`);
  const base = await complete(client, { model, prompt, routing: 'round_robin' });
  const base2 = await complete(client, { model, prompt, routing: 'round_robin' });
  const onWorker0 = [base, base2].find((r) => r.worker === 'worker-0');
  check(onWorker0 && onWorker0.data.usage.prompt_tokens_details.cached_tokens === 0,
        `the base model's same prompt on worker-0 does not reuse the adapter's blocks (${
          JSON.stringify([base, base2].map((x) => [x.worker, x.data.usage]))})`);

  // After a request, worker-0's load report lists sql as resident.
  let resident = false;
  for (let i = 0; i < 50 && !resident; i++) {
    const w = (await fleet.fleetJson()).workers.find((x) => x.name === 'worker-0');
    resident = w.loras[0]?.resident === true;
    if (!resident) await sleep(100);
  }
  check(resident, '/fleet shows sql resident on worker-0 once it has served it');

  // An adapter nobody serves: 404, as an unknown model.
  let e = await refusal(client.completions.create({ model: 'poetry', prompt: 'roses', max_tokens: 2 }));
  check(e?.status === 404 && String(e.message).includes('LoRA adapter'), `an unknown adapter is 404 (${e?.message})`);

  // Run-time load onto worker-1 only: then poetry is served, there alone.
  let r = await post('/v1/load_lora_adapter', { lora_name: 'poetry', lora_path: adapter('poetry'), workers: ['worker-1'] });
  check(r.status === 200 && r.text.includes("LoRA adapter 'poetry' added successfully"),
        `load_lora_adapter poetry onto worker-1 (${r.status} ${r.text})`);
  for (let i = 0; i < 3; i++) {
    const p = await complete(client, { model: 'poetry', prompt: `roses are red ${i}` });
    check(p.worker === 'worker-1', `poetry request ${i} goes to worker-1`);
  }
  check((await client.models.list()).data.some((m) => m.id === 'poetry' && m.parent === model),
        '/v1/models lists the loaded adapter');
  // Unload it: 404 again (the worker's re-sent Hello agrees).
  r = await post('/v1/unload_lora_adapter', { lora_name: 'poetry' });
  check(r.status === 200 && r.text.includes('removed successfully'), `unload_lora_adapter poetry (${r.status} ${r.text})`);
  await sleep(300);
  e = await refusal(client.completions.create({ model: 'poetry', prompt: 'roses', max_tokens: 2 }));
  check(e?.status === 404, 'an unloaded adapter is 404');

  // Bad input.
  r = await post('/v1/load_lora_adapter', { lora_name: 'broken', lora_path: path.join(dir, 'no-such-adapter') });
  check(r.status === 400 && r.json?.error?.message.includes('worker-0') && r.json.error.message.includes('worker-1'),
        `a path no worker can read is 400 naming each worker (${r.text})`);
  r = await post('/v1/load_lora_adapter', { lora_name: model, lora_path: adapter('poetry') });
  check(r.status === 400 && r.json?.error?.param === 'lora_name', `an adapter named as the model is 400 (${r.text})`);
  r = await post('/v1/load_lora_adapter', { lora_path: adapter('poetry') });
  check(r.status === 400 && r.json?.error?.param === 'lora_name', 'a load without lora_name is 400');
  r = await post('/v1/unload_lora_adapter', { lora_name: 'never-loaded' });
  check(r.status === 404, `unloading an adapter nobody serves is 404 (${r.text})`);
  check(await fleet.metric('kvfleet_router_lora_requests_total{op="load",outcome="ok"}') === 1 &&
        await fleet.metric('kvfleet_router_lora_requests_total{op="load",outcome="refused"}') === 1,
        'load outcomes are counted');
});
