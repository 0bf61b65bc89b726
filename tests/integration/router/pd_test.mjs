// P/D disaggregation on loopback (router/routing/README.md, "Prefill and decode on different
// workers"): mock workers with --role prefill and --role decode.
//   A. 2 prefill + 2 decode workers: the roles show in /fleet; a long prompt is prefilled on a
//      prefill worker and pulled by a decode worker, whole or streamed, reported cached; a
//      short one, or one a decode worker holds, stays on one decode worker; a prefill worker
//      killed mid-prompt costs a retry on the other; with no decode worker left, a 503.
//   B. 1 prefill + 1 decode whose link is too slow for the pull's deadline: the decode worker
//      gives up the pull and computes the prompt, without waiting for the pull to end.
//   node pd_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { Fleet, check, runFleet, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
// The mock's pulls cross a modelled 25 GB/s link, as the router assumes; its prefill costs
// 300 µs a token, so a 3,000-token prompt takes ~0.9 s on a prefill worker.
const routerArgs = ['--transfer-bytes-per-s', '25e9', '--pd-split-tokens', '1024'];
const workerArgs = ['--mock-transfer-bytes-per-s', '25e9', '--mock-prefill-token-us', '300'];

async function complete(fleet, prompt, extra = {}) {
  const started = Date.now();
  const r = await fetch(`${fleet.url()}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', prompt, max_tokens: 8, ignore_eos: true, ...extra }) });
  const text = await r.text();
  return { status: r.status, text, ms: Date.now() - started, body: extra.stream ? null : JSON.parse(text) };
}
// The final usage chunk of a stream.
function streamUsage(text) {
  const chunks = text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
  return chunks.find((c) => c.usage)?.usage;
}
const splits = (fleet) => fleet.metric('kvfleet_router_split_requests_total');
const long = (tag) => `${tag} `.padEnd(3000, `${tag} long prompt for a prefill worker. `);

let failed = false;
const run = async (fleet, body) => {
  failed = !(await runFleet(fleet, body)) || failed;
};

const a = new Fleet({ routerBin, workerBin, dir: `${dir}/a`, basePort: Number(basePort), workers: 4, routerArgs,
                      workerArgs, workerRoles: ['prefill', 'prefill', 'decode', 'decode'] });
await run(a, async () => {
  const roles = Object.fromEntries((await a.fleetJson()).workers.map((w) => [w.name, w.role]));
  check(roles['worker-0'] === 'prefill' && roles['worker-1'] === 'prefill' && roles['worker-2'] === 'decode' &&
        roles['worker-3'] === 'decode', `/fleet shows each worker's role (${JSON.stringify(roles)})`);
  const decoders = ['worker-2', 'worker-3'];

  let before = await splits(a);
  const first = await complete(a, long('one'));
  check(first.status === 200, 'a long prompt is answered');
  check(await splits(a) - before === 1, 'it was split');
  check(decoders.includes(first.body.kvfleet.worker), `a decode worker streamed it (${first.body.kvfleet.worker})`);
  check(first.body.usage.prompt_tokens_details.cached_tokens >= 2944,
        `the pulled prompt counts as cached (${first.body.usage.prompt_tokens_details.cached_tokens})`);

  const streamed = await complete(a, long('two'), { stream: true, stream_options: { include_usage: true } });
  check(streamed.status === 200 && streamed.text.includes('data: [DONE]'), 'a long streamed prompt is answered');
  check(await splits(a) - before === 2, 'it was split too');
  const usage = streamUsage(streamed.text);
  check(usage && usage.completion_tokens === 8 && usage.prompt_tokens_details.cached_tokens >= 2944,
        `its stream carries the decode's 8 tokens and the pulled prefix (${JSON.stringify(usage)})`);

  before = await splits(a);
  const held = await complete(a, `${long('one')} and a short follow-up`);
  check(held.status === 200 && held.body.kvfleet.worker === first.body.kvfleet.worker,
        'a prompt a decode worker holds goes to it');
  check(held.body.usage.prompt_tokens_details.cached_tokens >= 2944, 'and is cached there');
  const short = await complete(a, 'a short prompt');
  check(short.status === 200 && decoders.includes(short.body.kvfleet.worker), 'a short prompt goes to a decode worker');
  check(await splits(a) - before === 0, 'neither was split');

  // A prefill worker killed mid-prompt: the prefill is retried on the other one.
  before = await splits(a);
  const pending = complete(a, long('three'));
  let victim;
  for (let i = 0; i < 100 && !victim; i++) {
    await sleep(20);
    victim = (await a.fleetJson()).workers.find((w) => w.role === 'prefill' && w.router_inflight_requests > 0);
  }
  check(victim, `the prompt is on a prefill worker (${victim?.name})`);
  await a.kill(victim.name, 'SIGKILL');
  const retried = await pending;
  check(retried.status === 200 && decoders.includes(retried.body.kvfleet.worker),
        `the request survives its prefill worker (${retried.status}, ${retried.ms} ms)`);

  // No decode worker left: a clear 503, at once.
  await a.kill('worker-2', 'SIGKILL');
  await a.kill('worker-3', 'SIGKILL');
  await sleep(2000);  // the heartbeat timeout is 1.5 s
  const none = await complete(a, long('four'));
  check(none.status === 503 && /prefill workers/.test(none.text) && none.ms < 1000,
        `only prefill workers: 503 naming why (${none.status} in ${none.ms} ms: ${none.text.slice(0, 160)})`);
});

const b = new Fleet({ routerBin, workerBin, dir: `${dir}/b`, basePort: Number(basePort) + 120, workers: 2, routerArgs,
                      workerArgs: ['--mock-transfer-bytes-per-s', '5e7', '--mock-prefill-token-us', '300'],
                      workerRoles: ['prefill', 'decode'] });
await run(b, async () => {
  const before = await splits(b);
  const r = await complete(b, long('five'));
  check(r.status === 200, 'a split request whose pull cannot finish in time is answered');
  check(await splits(b) - before === 1, 'it was split');
  check(r.body.usage.prompt_tokens_details.cached_tokens < 1000,
        `the decode worker computed the prompt (${r.body.usage.prompt_tokens_details.cached_tokens} cached)`);
  // ~0.9 s of prefill on the prefill worker, the pull's deadline (as long as computing the prompt,
  // ~0.9 s) and ~0.9 s computing it: ~2.7 s, not the ~8 s the pull would take.
  check(r.ms < 5000, `no long wait for the pull (${r.ms} ms)`);
});
process.exit(failed ? 1 : 0);
