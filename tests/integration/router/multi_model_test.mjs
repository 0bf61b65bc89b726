// Two models on one kvfleet-router, each with its own tokenizer (--tokenizer MODEL=DIR):
// "alpha" has two mock workers that register, "beta" two static mock workers
// (--workers beta=EP,EP) that describe themselves to the router: their own ids, block size
// and context length replace the router's guesses (--block-size beta=16, --max-context
// beta=1000). Each request goes only to its own model's workers, each model's
// chats use its own template, a repeated prefix is a cache hit on its model's worker, and a
// worker announcing alpha's tokenizer for beta is refused. Bad per-model flags stop the
// router at start-up, naming the flag.
//   node multi_model_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, byteLevelTokenizer, check, runAgainst, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePortText] = process.argv.slice(2);
const basePort = Number(basePortText);
const kvfleetBin = path.join(path.dirname(routerBin), '..', 'cli', 'kvfleet');
if (!fs.existsSync(kvfleetBin)) {
  console.log(`SKIP: ${kvfleetBin} is not built`);
  process.exit(77);
}

// Two model directories whose tokenizers differ in their chat template (so in their digest).
const templates = { alpha: 'A:{{ messages[0].content }}', beta: 'BB:{{ messages[0].content }}' };
const modelDirs = {};
for (const [model, template] of Object.entries(templates)) {
  const d = path.join(dir, model);
  fs.mkdirSync(d, { recursive: true });
  fs.writeFileSync(path.join(d, 'tokenizer.json'), JSON.stringify(byteLevelTokenizer()));
  fs.writeFileSync(path.join(d, 'tokenizer_config.json'), '{}');
  fs.writeFileSync(path.join(d, 'chat_template.jinja'), template);
  fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 256, hidden_size: 64,
    intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
    max_position_embeddings: 4096 }));
  modelDirs[model] = d;
}

const betaPorts = [basePort + 40, basePort + 43];
const betaEndpoints = betaPorts.map((p) => `tcp://127.0.0.1:${p}`);
const fleet = new Fleet({
  routerBin, workerBin, dir, basePort, workers: 0,
  routerArgs: ['--tokenizer', `alpha=${modelDirs.alpha}`, '--tokenizer', `beta=${modelDirs.beta}`,
               '--workers', `beta=${betaEndpoints.join(',')}`, '--block-size', 'beta=16',
               '--max-context', 'beta=1000'],
});

// A mock worker of `model`, on the model directory `modelDir`; registers with the router
// unless `register` is false (a static worker).
function startWorker(name, model, modelDir, port, register, backend = 'mock') {
  const logName = name.replace(/[^A-Za-z0-9_-]/g, '_');
  const args = ['--backend', backend, '--worker-id', name, '--model-name', model, '--model-dir', modelDir,
                '--requests', `tcp://127.0.0.1:${port}`, '--events', `tcp://127.0.0.1:${port + 1}`,
                '--replay', `tcp://127.0.0.1:${port + 2}`, '--http-port', String(port + 150),
                '--advertise-host', '127.0.0.1', '--block-size', '32', '--kv-cache-bytes', String(64 << 20)];
  if (register) args.push('--router', fleet.registration);
  fleet.spawnLogged(logName, workerBin, args);
}

async function post(route, body) {
  const r = await fetch(`${fleet.url()}/v1/${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, worker: r.headers.get('x-kvfleet-worker'), body: await r.json() };
}

// The router's start-up error for `args`.
function refused(args) {
  const r = spawnSync(routerBin, ['--http-host', '127.0.0.1', '--http-port', '0', '--registration', '', ...args],
                      { encoding: 'utf8', timeout: 20000 });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

const alphaWorkers = ['alpha-0', 'alpha-1'];
const betaWorkers = ['beta-0', 'beta-1'];

await runAgainst(fleet, async () => {
  startWorker('alpha-0', 'alpha', modelDirs.alpha, basePort + 10, true);
  startWorker('alpha-1', 'alpha', modelDirs.alpha, basePort + 13, true);
  // Static workers with ids of their own: the router learns them (and follows their KV events
  // under them) by asking each worker to describe itself.
  startWorker(betaWorkers[0], 'beta', modelDirs.beta, betaPorts[0], false);
  startWorker(betaWorkers[1], 'beta', modelDirs.beta, betaPorts[1], false);
  // A cpu worker that announces beta but runs on a model made with alpha's tokenizer (mock
  // workers announce no tokenizer digest).
  const strangerDir = path.join(dir, 'alpha-cpu');
  const made = spawnSync(kvfleetBin, ['make-model', '--shape', 'tiny', '--tokenizer', modelDirs.alpha, '--out',
                                      strangerDir, '--dtype', 'fp32'], { encoding: 'utf8', timeout: 60000 });
  check(made.status === 0, `make-model writes a tiny model with alpha's tokenizer (${made.stderr.trim()})`);
  startWorker('beta-stranger', 'beta', strangerDir, basePort + 20, true, 'cpu');
  await fleet.waitLive(4);

  // The stranger is refused for beta's tokenizer, and listed with its reason.
  let f;
  for (let i = 0; i < 50; i++) {
    f = await fleet.fleetJson();
    if (f.refused.length > 0) break;
    await sleep(100);
  }
  const stranger = f.refused.find((r) => r.name === 'beta-stranger');
  // The static workers have described themselves (at once on connecting).
  for (let i = 0; i < 50; i++) {
    const beta = f.workers.filter((w) => w.model === 'beta').map((w) => w.name).sort();
    if (JSON.stringify(beta) === JSON.stringify(betaWorkers)) break;
    await sleep(100);
    f = await fleet.fleetJson();
  }
  for (const w of f.workers.filter((x) => x.model === 'beta')) {
    check(w.block_size === 32 && w.max_context === 4096,
          `static worker ${w.name} is known by its own block size and context length, not the router's 16 and 1000 ` +
          `(${w.block_size}, ${w.max_context})`);
  }
  check(stranger && stranger.reason === 'tokenizer-mismatch' && stranger.refused.includes("for model 'beta'"),
        `a beta worker on alpha's tokenizer is refused (${JSON.stringify(f.refused)})`);
  const byModel = {};
  for (const w of f.workers) (byModel[w.model] ||= []).push(w.name);
  check(JSON.stringify(byModel.alpha.sort()) === JSON.stringify(alphaWorkers) &&
        JSON.stringify(byModel.beta.sort()) === JSON.stringify([...betaWorkers].sort()),
        `/fleet lists each model's workers (${JSON.stringify(byModel)})`);
  const models = (await (await fetch(`${fleet.url()}/v1/models`)).json()).data.map((m) => m.id).sort();
  check(JSON.stringify(models) === '["alpha","beta"]', `/v1/models lists both (${models})`);

  // Each model's chats render with its own template.
  for (const model of ['alpha', 'beta']) {
    const r = await post('chat/completions', { model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    const expected = templates[model].replace('{{ messages[0].content }}', 'hi').length;
    check(r.status === 200 && r.body.usage.prompt_tokens === expected,
          `${model}: the chat is rendered with its own template (${r.body.usage?.prompt_tokens} tokens, want ${expected})`);
  }

  // A shared prefix per model: the first request of a prefix misses, the next ones hit its
  // model's worker that holds it. The same text on the other model is a miss there.
  const prefix = 'The quick brown fox jumps over the lazy dog. '.repeat(8);  // 360 bytes: 11 blocks of 32
  const seen = { alpha: new Set(), beta: new Set() };
  for (const model of ['alpha', 'beta']) {
    const first = await post('completions', { model, prompt: `${prefix}first ${model}`, max_tokens: 2 });
    check(first.status === 200 && first.body.usage.prompt_tokens_details.cached_tokens === 0,
          `${model}: a new prefix is a miss (${JSON.stringify(first.body.usage)})`);
    seen[model].add(first.worker);
    await sleep(300);  // its blocks' stored events reach the router
    for (let i = 0; i < 4; i++) {
      const r = await post('completions', { model, prompt: `${prefix}again ${i}`, max_tokens: 2 });
      seen[model].add(r.worker);
      check(r.status === 200 && r.worker === first.worker &&
            r.body.usage.prompt_tokens_details.cached_tokens >= 32 * 10,
            `${model}: request ${i} with the prefix goes to ${first.worker} and hits (${JSON.stringify(r.body.usage)})`);
    }
  }
  // Spread requests (round robin) reach every worker of their model and no other.
  for (const model of ['alpha', 'beta']) {
    for (let i = 0; i < 6; i++) {
      const r = await post('completions', { model, prompt: `request ${i}`, max_tokens: 2, routing: 'round_robin' });
      check(r.status === 200, `${model}: request ${i} answered by ${r.worker}`);
      seen[model].add(r.worker);
    }
  }
  const sorted = (set) => JSON.stringify([...set].sort());
  check(sorted(seen.alpha) === sorted(alphaWorkers) && sorted(seen.beta) === sorted(betaWorkers),
        `each model's requests went to all of its own workers and none of the other's (alpha: ${[...seen.alpha]}; ` +
        `beta: ${[...seen.beta]})`);

  // /metrics: kvfleet_router_requests_total pairs each model only with its own workers.
  const text = await (await fetch(`${fleet.url()}/metrics`)).text();
  const pairs = [...text.matchAll(/^kvfleet_router_requests_total\{(.*)\} (\S+)$/gm)].map((m) => ({
    model: m[1].match(/model="([^"]*)"/)[1], worker: m[1].match(/worker="([^"]*)"/)[1] }))
    .filter((p) => p.worker !== 'none');
  check(pairs.length > 0 && pairs.every((p) => (p.model === 'alpha' ? alphaWorkers : betaWorkers).includes(p.worker)),
        `metrics pair each model with its own workers only (${JSON.stringify(pairs)})`);

  // Start-up errors name the flag.
  const probe = refused(['--tokenizer', `alpha=${modelDirs.alpha}`, '--tokenizer', `alpha=${modelDirs.beta}`]);
  if (!probe.output.includes('no tokenizer library')) {
    check(probe.status === 2 && probe.output.includes("--tokenizer alpha=") && probe.output.includes('given twice'),
          `a model given two tokenizers stops the router (${probe.output.trim()})`);
  }
  const twice = refused(['--workers', 'a=tcp://127.0.0.1:1', '--workers', 'b=tcp://127.0.0.1:1']);
  check(twice.status === 2 && twice.output.includes('--workers b=tcp://127.0.0.1:1') &&
        twice.output.includes("listed twice (models 'a' and 'b')"),
        `an endpoint under two models stops the router (${twice.output.trim()})`);
  const orphan = refused(['--workers', 'tcp://127.0.0.1:1', '--max-context', 'qwen=4096']);
  check(orphan.status === 2 && orphan.output.includes("--max-context qwen=4096: model 'qwen' has no --workers"),
        `a size for a model without static workers stops the router (${orphan.output.trim()})`);
});
