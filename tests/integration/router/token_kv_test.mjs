// KV-aware routing against token-level KV workers (--block-size 1, LightLLM's TokenAttention).
// Each worker keeps one KV slot per token and reuses prompts to the token, but publishes its
// events in routing groups of 16 tokens and says so in its Hello (block size 16, KV block
// size 1), so the router hashes prompts in 16-token blocks as for any 16-token worker:
//   1. /fleet shows each worker's block size 16 and KV block size 1;
//   2. a repeated prompt is routed by kv to the worker holding it (predicted entries are off,
//      so only the workers' events can say where), which reports every prompt token but the
//      last cached;
//   3. a worker with 16-token KV blocks joins the same model's fleet: the hashing agrees.
//   node token_kv_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { Fleet, check, sleep, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);

const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 2, blockSize: 1,
                          workerArgs: ['--mock-verify-kv'], routerArgs: ['--predicted-ttl-ms', '0'] });

async function complete(prompt, extra = {}) {
  const r = await fetch(`${fleet.url()}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', prompt, max_tokens: 4, ...extra }) });
  const body = await r.json();
  return { status: r.status, worker: r.headers.get('x-kvfleet-worker'), body,
           promptTokens: body.usage?.prompt_tokens, cached: body.usage?.prompt_tokens_details?.cached_tokens };
}

await runAgainst(fleet, async () => {
  // 1. The Hello as the router keeps it.
  const f = await fleet.fleetJson();
  for (const w of f.workers) {
    check(w.block_size === 16 && w.kv_block_size === 1,
          `${w.name}: routing block size ${w.block_size}, KV block size ${w.kv_block_size} (want 16 and 1)`);
  }

  // 2. Prompts first sent round-robin (spread over the workers), then again with kv routing.
  const predictedBefore = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}');
  const holders = new Set();
  let groups = 0;
  for (let i = 0; i < 4; i++) {
    const prompt = `${i}: a prompt of the token-level KV test. `.repeat(8);  // ~330 byte-tokens
    const first = await complete(prompt, { routing: 'round_robin' });
    check(first.status === 200 && first.cached === 0, `prompt ${i}: first request served by ${first.worker}, nothing cached`);
    holders.add(first.worker);
    await sleep(300);  // its stored events reach the router
    const again = await complete(prompt);
    check(again.status === 200 && again.worker === first.worker,
          `prompt ${i}: kv routing sends the repeat to ${first.worker}, which holds it (got ${again.worker})`);
    check(again.cached === again.promptTokens - 1,
          `prompt ${i}: the repeat reuses every prompt token but the last (${again.cached} of ${again.promptTokens})`);
    groups += Math.floor(again.promptTokens / 16);
  }
  check(holders.size === 2, `the first requests were spread over ${holders.size} workers`);
  const predicted = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}') - predictedBefore;
  check(predicted >= 16 * (groups - 4), `the router matched the 16-token groups from the events (${predicted} tokens)`);

  // 3. A 16-token worker serves the same model beside them.
  fleet.blockSize = 16;
  fleet.startWorker(2);
  await fleet.waitLive(3);
  const w2 = (await fleet.fleetJson()).workers.find((w) => w.name === 'worker-2');
  check(w2 && w2.block_size === 16 && w2.kv_block_size === 16, 'a 16-token worker joins the fleet of token-level ones');
});
