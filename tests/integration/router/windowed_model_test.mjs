// KV-aware routing for a model whose every layer has a sliding window (Mistral-style): three
// mock workers shaped like make-model's tiny-mistral (2 layers, MQA, a 20-token window of a
// 32K context) with 4-token blocks. Each worker stores only a sequence's first window (its
// first 5 blocks) for reuse, and its Hello names that windowed pool, so the router indexes
// those blocks instead of dropping every event as not the full-attention pool's:
//   1. /fleet shows each worker's one pool (window 20, reuse of 20 tokens) as the pool indexed;
//   2. a repeated long prompt is routed by kv to the worker holding it, which reports its
//      first window cached (predicted entries are off, so only KV events can say where);
//   3. --routing-window-size 0 overrides it: nothing is indexed for these workers.
//   node windowed_model_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, check, sleep, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);

const modelDir = path.join(dir, 'tiny-mistral');
fs.mkdirSync(modelDir, { recursive: true });
fs.writeFileSync(path.join(modelDir, 'config.json'), JSON.stringify({
  architectures: ['MistralForCausalLM'], model_type: 'mistral', vocab_size: 512, hidden_size: 64,
  intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 1, head_dim: 16,
  max_position_embeddings: 32768, rope_theta: 10000.0, rms_norm_eps: 1e-5, sliding_window: 20,
  tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2 }));

const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 3, blockSize: 4,
                          // 4,096 blocks of 512 bytes (2 layers x K,V x 1 head x 16 x bf16 x 4 tokens)
                          workerArgs: ['--model-dir', modelDir, '--kv-cache-bytes', String(4096 * 512)],
                          routerArgs: ['--predicted-ttl-ms', '0'] });

async function complete(prompt, extra = {}) {
  const r = await fetch(`${fleet.url()}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', prompt, max_tokens: 4, ...extra }) });
  const body = await r.json();
  return { status: r.status, worker: r.headers.get('x-kvfleet-worker'), body,
           cached: body.usage?.prompt_tokens_details?.cached_tokens };
}

await runAgainst(fleet, async () => {
  // 1. The pools as announced, and the one indexed.
  let f = await fleet.fleetJson();
  for (const w of f.workers) {
    const pools = w.kv_pools;
    check(pools.length === 1 && pools[0].window === 20 && pools[0].reuse && pools[0].reuse_tokens === 20,
          `${w.name} announces one windowed pool storing its first window (${JSON.stringify(pools)})`);
    check(w.indexed_window === 20, `${w.name}: the router indexes its window-20 pool`);
  }

  // 2. Long prompts, each first sent round-robin (spread over the workers), then again with kv routing.
  const predictedBefore = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}');
  const holders = new Set();
  for (let i = 0; i < 6; i++) {
    const prompt = `${i}: a prompt of the windowed-model test. `.repeat(12);  // ~500 byte-tokens, distinct from the first
    const first = await complete(prompt, { routing: 'round_robin' });
    check(first.status === 200 && first.cached === 0, `prompt ${i}: first request served by ${first.worker}, nothing cached`);
    holders.add(first.worker);
    await sleep(300);  // its stored events reach the router
    const again = await complete(prompt);
    check(again.status === 200 && again.worker === first.worker,
          `prompt ${i}: kv routing sends the repeat to ${first.worker}, which holds it (got ${again.worker})`);
    check(again.cached === 20, `prompt ${i}: the repeat reports its first window cached (${again.cached})`);
  }
  check(holders.size >= 2, `the first requests were spread over ${holders.size} workers`);
  const predicted = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}') - predictedBefore;
  check(predicted >= 6 * 20, `the router predicted the cached windows from the events (${predicted} tokens)`);

  // 3. The override: the full-attention pool for every worker; these workers have none.
  await fleet.kill('router', 'SIGTERM');
  fleet.routerArgs.push('--routing-window-size', '0');
  fleet.startRouter();
  await fleet.waitLive(3);
  f = await fleet.fleetJson();
  check(f.workers.every((w) => w.indexed_window === 0), '--routing-window-size 0: the full-attention pool is indexed');
  const before = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}');
  const prompt = 'After the override: a prompt. '.repeat(12);
  check((await complete(prompt)).status === 200, 'a request after the override');
  await sleep(300);
  check((await complete(prompt)).status === 200, 'the same request again');
  const after = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}');
  check(after === before, `with the override no windowed block is indexed (${after - before} tokens predicted)`);
});
