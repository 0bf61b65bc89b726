// The router with 3 mock workers on loopback, as the issue lists:
//   1. a repeated 4,000-token system prompt lands on one worker; later requests report it cached;
//   2. with predicted entries, a burst of 20 concurrent requests sharing a new prefix goes to one worker;
//   3. SIGKILL of a worker mid-run: requests in flight are retried or end cleanly, and routing
//      skips the worker within the heartbeat timeout;
//   4. restarting the router: the index is rebuilt from the workers' snapshots and routing resumes.
//   node fleet_behaviour_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { Fleet, check, diff, sleep, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 3 });

async function chat(system, user, extra = {}) {
  const r = await fetch(`${fleet.url()}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', messages: [{ role: 'system', content: system }, { role: 'user', content: user }],
                           max_tokens: 4, ...extra }) });
  return { status: r.status, body: await r.json() };
}

// Streams a completion; resolves to 'done', 'error-event' or a thrown network error's text.
async function streamOnce(prompt, maxTokens) {
  try {
    const r = await fetch(`${fleet.url()}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock', prompt, max_tokens: maxTokens, stream: true, ignore_eos: true }) });
    if (r.status !== 200) return `status ${r.status}`;
    const text = await r.text();
    if (text.includes('"error"')) return text.includes('data: [DONE]') ? 'error-event' : 'error-no-done';
    return text.includes('data: [DONE]') ? 'done' : 'truncated';
  } catch (e) {
    return `network: ${e.message}`;
  }
}

await runAgainst(fleet, async () => {
  const system = 'You are a helpful assistant. '.repeat(138).slice(0, 4000);  // 4,000 byte-tokens

  // 1. A repeated system prompt.
  let before = await fleet.requestsByWorker();
  const first = await chat(system, 'question 0');
  check(first.status === 200, 'first request with the system prompt');
  let cached = [];
  for (let i = 1; i <= 5; i++) {
    const r = await chat(system, `question ${i}`);
    check(r.status === 200, `request ${i} with the system prompt`);
    cached.push(r.body.usage.prompt_tokens_details.cached_tokens);
  }
  let landed = diff(await fleet.requestsByWorker(), before);
  check(Object.keys(landed).length === 1, `the system prompt's 6 requests landed on one worker (${JSON.stringify(landed)})`);
  check(cached.every((c) => c >= 3968), `later requests report the prompt cached (${cached})`);

  // 2. A burst sharing a new prefix.
  const prefix = 'A brand new shared prefix for the burst. '.repeat(50);
  before = await fleet.requestsByWorker();
  const burst = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(prefix, `burst ${i}`)));
  check(burst.every((r) => r.status === 200), 'all 20 burst requests succeeded');
  landed = diff(await fleet.requestsByWorker(), before);
  check(Object.keys(landed).length === 1, `the burst of 20 went to one worker (${JSON.stringify(landed)})`);

  // 3. SIGKILL a worker mid-run.
  const inflight = Array.from({ length: 12 }, (_, i) => streamOnce(`kill test ${i} `.repeat(20), 400));
  await sleep(150);
  await fleet.kill('worker-1', 'SIGKILL');
  const outcomes = await Promise.all(inflight);
  check(outcomes.every((o) => ['done', 'error-event'].includes(o)),
        `in-flight requests were retried or ended cleanly (${outcomes})`);
  await sleep(2000);  // the heartbeat timeout is 1.5 s
  const f = await fleet.fleetJson();
  const dead = f.workers.find((w) => w.name === 'worker-1');
  check(dead && !dead.routable, `the killed worker is out of routing (state ${dead?.state})`);
  const after = await Promise.all(Array.from({ length: 10 }, (_, i) => chat('short', `after kill ${i}`)));
  check(after.every((r) => r.status === 200), 'requests after the kill all succeed on the others');

  // 4. Restart the router. A prompt cached on a live worker first.
  const system2 = 'Another long system prompt for the restart. '.repeat(60);
  check((await chat(system2, 'warm up')).status === 200, 'a prompt cached before the restart');
  await sleep(500);  // its stored events reach the workers' snapshots
  await fleet.kill('router', 'SIGTERM');
  fleet.startRouter();
  await fleet.waitLive(2);
  const predictedBefore = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}');
  before = await fleet.requestsByWorker();
  const again = await chat(system2, 'after restart');
  check(again.status === 200, 'routing resumed after the restart');
  const predicted = await fleet.metric('kvfleet_router_cached_tokens_total{kind="predicted"}') - predictedBefore;
  check(predicted >= 2560, `the rebuilt index knew where the prompt is (${predicted} tokens predicted)`);
  check(again.body.usage.prompt_tokens_details.cached_tokens >= 2560, 'and that worker reports it cached');
});
