// Mixture-of-experts models need nothing new from the router: two cpu workers serving
// make-model's tiny-qwen3-moe (8 experts, top-2, a dense layer between two MoE layers) and
// one serving tiny-mixtral, behind one kvfleet-router. For each model a prompt is answered,
// and the same prompt again is routed by KV to the worker that holds it, which reports its
// full blocks cached; the answers agree (greedy, the same model and weights).
//   node moe_model_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT KVFLEET_BIN
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, byteLevelTokenizer, check, runAgainst, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePortText, kvfleetBin] = process.argv.slice(2);
const basePort = Number(basePortText);
if (!kvfleetBin || kvfleetBin === 'missing' || !fs.existsSync(kvfleetBin)) {
  console.log('SKIP: the kvfleet CLI is not built');
  process.exit(77);
}
if (!workerBin || workerBin === 'missing' || !fs.existsSync(workerBin)) {
  console.log('SKIP: kvfleet-worker is not built');
  process.exit(77);
}

// The models, with a byte-level tokenizer (a 256-token vocabulary: a small LM head).
const tokDir = path.join(dir, 'tokenizer');
fs.mkdirSync(tokDir, { recursive: true });
fs.writeFileSync(path.join(tokDir, 'tokenizer.json'), JSON.stringify(byteLevelTokenizer()));
fs.writeFileSync(path.join(tokDir, 'tokenizer_config.json'), '{}');
const models = ['tiny-qwen3-moe', 'tiny-mixtral'];
for (const shape of models) {
  const made = spawnSync(kvfleetBin, ['make-model', '--shape', shape, '--tokenizer', tokDir,
                                      '--out', path.join(dir, shape), '--seed', '5'],
                         { encoding: 'utf8', timeout: 60000 });
  if (made.status !== 0) {
    console.error(`make-model --shape ${shape} failed: ${made.stdout}${made.stderr}`);
    process.exit(1);
  }
}

const fleet = new Fleet({
  routerBin, workerBin, dir, basePort, workers: 0, model: models[0],
  routerArgs: [...models.flatMap((m) => ['--tokenizer', `${m}=${path.join(dir, m)}`]),
               '--unknown-model-grace-s', '0'],
});

const workers = [['moe-0', models[0]], ['moe-1', models[0]], ['mixtral-0', models[1]]];
function startWorker(i) {
  const [name, model] = workers[i];
  const p = basePort + 10 + 3 * i;
  fleet.spawnLogged(name, workerBin, [
    '--backend', 'cpu', '--model-dir', path.join(dir, model), '--model-name', model, '--worker-id', name,
    '--requests', `tcp://127.0.0.1:${p}`, '--events', `tcp://127.0.0.1:${p + 1}`,
    '--replay', `tcp://127.0.0.1:${p + 2}`, '--http-port', String(basePort + 150 + i),
    '--router', fleet.registration, '--advertise-host', '127.0.0.1', '--block-size', '16',
    '--kv-cache-bytes', String(16 << 20)]);
}

async function complete(body) {
  const r = await fetch(`${fleet.url()}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ max_tokens: 4, temperature: 0, ...body }) });
  const json = await r.json();
  return { status: r.status, worker: r.headers.get('x-kvfleet-worker'), json,
           cached: json.usage?.prompt_tokens_details?.cached_tokens };
}

await runAgainst(fleet, async () => {
  workers.forEach((_, i) => startWorker(i));
  await fleet.waitLive(workers.length, 60000);

  for (const model of models) {
    const prompt = `${model}: routed to one expert pair per token, and to one worker per prefix. `.repeat(3);
    const first = await complete({ model, prompt, routing: 'round_robin' });
    check(first.status === 200 && first.cached === 0 && first.json.choices[0].text.length > 0,
          `${model}: answered by ${first.worker}, nothing cached (${JSON.stringify(first.json.usage)})`);
    check(workers.some(([w, m]) => w === first.worker && m === model), `${model}: ${first.worker} serves it`);
    await sleep(300);  // its stored-block events reach the router
    const again = await complete({ model, prompt });
    check(again.status === 200 && again.worker === first.worker,
          `${model}: kv routing sends the repeat to ${first.worker}, which holds its prefix (got ${again.worker})`);
    const full = Math.floor((first.json.usage.prompt_tokens - 1) / 16) * 16;
    check(again.cached > 0 && again.cached >= full,
          `${model}: the repeat reports its full blocks cached (${again.cached} of ${first.json.usage.prompt_tokens})`);
    check(again.json.choices[0].text === first.json.choices[0].text,
          `${model}: the cached prefix gives the same greedy answer (${JSON.stringify([first.json.choices[0].text,
            again.json.choices[0].text])})`);
  }
});
