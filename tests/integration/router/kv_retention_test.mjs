// kv_retention end to end: the HTTP field through kvfleet-router to a mock worker's real KV
// cache manager, observed the way an operator would: the worker's KV events (`kvfleet events`,
// each stored block with its retention priority), a snapshot of what it holds, its eviction
// metrics, and the cached tokens of a repeated prompt. The worker holds 32 blocks of 32 tokens,
// and each flood of 24 fresh 3-block prompts at the default priority (35) turns it over twice.
//   1. token_ranges [0, 128) at priority 100: those 4 blocks are stored at 100, and outlive a
//      flood that evicts a control prompt stored at 35; the prompt is then served from cache.
//   2. decode_priority 100: the blocks filled by generated tokens are stored at 100 and outlive
//      a flood that evicts the generated blocks of a control request.
//   3. decode_priority 100 with decode_duration_ms 300: the generated blocks fall back to 35
//      once the duration passes without use (an `updated` event), and the next flood evicts them.
//   4. Event ids run one apart across every batch seen (Contract 2).
//   node kv_retention_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT KVFLEET_BIN
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, check, runAgainst, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePortText, cliBin] = process.argv.slice(2);
if (!cliBin || cliBin === 'missing' || !fs.existsSync(cliBin)) {
  console.log('SKIP: the kvfleet CLI is not built');
  process.exit(77);
}
const basePort = Number(basePortText);
const kBlock = 32;
// The mock model's KV takes 4 MiB per 32-token block: 128 MiB is 32 blocks.
const fleet = new Fleet({ routerBin, workerBin, dir, basePort, workers: 1,
                          workerArgs: ['--kv-cache-bytes', String(128 << 20), '--max-context', '1024'] });
const events = `tcp://127.0.0.1:${basePort + 11}`;  // Fleet.startWorker(0)'s ports
const replay = `tcp://127.0.0.1:${basePort + 12}`;
const workerMetrics = `http://127.0.0.1:${basePort + 100}/metrics`;

const range = (from, n) => Array.from({ length: n }, (_, i) => from + i);

// The Contract 1 hashes of a prompt's full blocks, from `kvfleet hash`.
function hashes(tokens) {
  const out = execFileSync(cliBin, ['hash', '--model', 'mock', '--block-size', String(kBlock), ...tokens.map(String)]);
  return out.toString().trim().split('\n').filter(Boolean).map((l) => l.split(' ')[1]);
}

async function complete(prompt, extra = {}) {
  const r = await fetch(`${fleet.url()}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock', prompt, max_tokens: 1, ignore_eos: true, ...extra }) });
  const body = await r.json();
  if (r.status !== 200) throw new Error(`completion: ${r.status} ${JSON.stringify(body)}`);
  return body;
}

// Every batch with events `kvfleet events` has printed so far (it logs JSON lines).
function batches() {
  const file = path.join(dir, 'events.log');
  if (!fs.existsSync(file)) return [];
  const text = fs.readFileSync(file, 'utf8');
  // Only whole lines: the one `kvfleet events` is writing now has no newline yet.
  return text.slice(0, text.lastIndexOf('\n') + 1).split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
}
const allEvents = () => batches().flatMap((b) => b.events);
// Stored blocks, each with its parent's hash (a stored event's blocks are a chain).
const storedBlocks = () => allEvents().filter((e) => e.type === 'stored')
  .flatMap((e) => e.blocks.map((b, i) => ({ ...b, parent: i === 0 ? e.parent : e.blocks[i - 1].hash })));
const removedHashes = () => new Set(allEvents().filter((e) => e.type === 'removed' && e.tier === 'device').flatMap((e) => e.hashes));

async function until(what, cond, ms = 10000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}; logs in ${dir}`);
}

// A stored block's priority as the events last said it (stored, then any updated).
function priorityOf(hash) {
  let p;
  for (const e of allEvents()) {
    if (e.type === 'stored') for (const b of e.blocks) if (b.hash === hash) p = b.priority;
    if (e.type === 'updated' && e.hash === hash && e.priority !== undefined) p = e.priority;
  }
  return p;
}

// Device evictions by priority, from the worker's /metrics.
async function evictions() {
  const text = await (await fetch(workerMetrics)).text();
  const out = {};
  for (const m of text.matchAll(/^kvfleet_worker_evictions_total\{priority="(\d+)"\} (\S+)$/gm)) out[m[1]] = Number(m[2]);
  return out;
}

// Every block the worker holds now, with its priority, from a snapshot.
function snapshot() {
  const out = execFileSync(cliBin, ['events', '--replay', replay, '--snapshot']).toString();
  const held = new Map();
  for (const line of out.trim().split('\n')) {
    for (const e of JSON.parse(line).events) for (const b of e.blocks) if (b.tier === 'device') held.set(b.hash, b.priority);
  }
  return held;
}

let nextFresh = 20000;
// `n` requests with fresh 3-block prompts at the default priority: each allocates 4 blocks.
async function flood(n = 24) {
  for (let i = 0; i < n; i++) {
    await complete(range(nextFresh, 3 * kBlock));
    nextFresh += 3 * kBlock;
  }
}

// The generated blocks a request stored: the chain that continues its prompt's last block.
async function decodeBlocks(prompt, atLeast) {
  const chainFrom = (hash) => {
    const stored = storedBlocks();
    const out = [];
    for (let next; (next = stored.find((b) => b.parent === hash)); hash = next.hash) out.push(next);
    return out;
  };
  const last = hashes(prompt).at(-1);
  await until(`${atLeast} generated blocks after ${last}`, () => chainFrom(last).length >= atLeast);
  return chainFrom(last);
}

await runAgainst(fleet, async () => {
  const bad = spawnSync(cliBin, ['events', '--snapshot']);
  check(bad.status === 2 && bad.stderr.toString().includes('--replay'), 'kvfleet events --snapshot alone: an error naming --replay');
  const silent = spawnSync(cliBin, ['events', '--replay', `tcp://127.0.0.1:${basePort + 99}`, '--snapshot', '--timeout', '0.3']);
  check(silent.status === 2 && silent.stderr.toString().includes('no snapshot reply'),
        `a replay endpoint that never answers: an error, not a hang (${silent.stderr.toString().trim()})`);
  fleet.spawnLogged('events', cliBin, ['events', '--events', events, '--heartbeats', '--duration', '170']);
  await until('the events subscription', () => fs.existsSync(path.join(dir, 'events.log')) &&
    fs.readFileSync(path.join(dir, 'events.log'), 'utf8').includes('"seq"'));

  // 1. A prompt range at priority 100 against a flood at 35.
  const system = range(1, 4 * kBlock);
  const systemHashes = hashes(system);
  const control = range(5000, 4 * kBlock);
  const controlHashes = hashes(control);
  await complete([...system, 7, 8, 9], { kv_retention: { token_ranges: [{ start: 0, end: 4 * kBlock, priority: 100 }] } });
  await complete([...control, 7, 8, 9]);
  await until('the stored events of both prompts', () => [...systemHashes, ...controlHashes].every((h) => priorityOf(h) !== undefined));
  check(systemHashes.every((h) => priorityOf(h) === 100), 'the retained range\'s 4 blocks are stored at priority 100');
  check(controlHashes.every((h) => priorityOf(h) === 35), 'the control prompt\'s 4 blocks are stored at priority 35');
  const evictedBefore = await evictions();
  await flood();
  await until('the control prompt\'s eviction', () => controlHashes.every((h) => removedHashes().has(h)));
  check(controlHashes.every((h) => removedHashes().has(h)), 'the flood evicts the control prompt (removed events)');
  check(systemHashes.every((h) => !removedHashes().has(h)), 'no removed event names a retained block');
  // The metrics refresh on their own period: wait until they count every eviction the events
  // reported, then ask which priorities those were.
  const removedCount = allEvents().filter((e) => e.type === 'removed' && e.tier === 'device')
    .reduce((n, e) => n + e.hashes.length, 0);
  const total = (m) => Object.values(m).reduce((a, b) => a + b, 0);
  let evictedAfter = {};
  for (const end = Date.now() + 10000; Date.now() < end; await sleep(100)) {
    evictedAfter = await evictions();
    if (total(evictedAfter) - total(evictedBefore) >= removedCount) break;
  }
  check((evictedAfter['35'] || 0) - (evictedBefore['35'] || 0) >= removedCount && removedCount >= 24,
        `kvfleet_worker_evictions_total counts the ${removedCount} evictions at priority 35 (${JSON.stringify(evictedAfter)})`);
  check(!evictedAfter['100'], 'and none at priority 100');
  let held = snapshot();
  check(systemHashes.every((h) => held.get(h) === 100), 'a snapshot shows the retained blocks held at priority 100');
  check(controlHashes.every((h) => !held.has(h)), 'and the control prompt gone');
  const again = await complete([...system, 7, 8, 9]);
  check(again.usage.prompt_tokens_details.cached_tokens === 4 * kBlock,
        `the retained prompt is served from cache (${again.usage.prompt_tokens_details.cached_tokens} tokens)`);
  const controlAgain = await complete([...control, 7, 8, 9]);
  check(controlAgain.usage.prompt_tokens_details.cached_tokens === 0, 'the control prompt is not');

  // 2. decode_priority: the generated blocks of two requests, one at 100, one at the default.
  const kept = range(9000, 2 * kBlock);
  const plain = range(9500, 2 * kBlock);
  await complete(kept, { max_tokens: 70, kv_retention: { decode_priority: 100 } });
  await complete(plain, { max_tokens: 70 });
  const keptDecode = await decodeBlocks(kept, 2);
  const plainDecode = await decodeBlocks(plain, 2);
  check(keptDecode.every((b) => b.priority === 100), `decode_priority 100: ${keptDecode.length} generated blocks stored at 100`);
  check(plainDecode.every((b) => b.priority === 35), `without it: ${plainDecode.length} generated blocks stored at 35`);
  await flood();
  await until('the control request\'s generated blocks evicted', () => plainDecode.every((b) => removedHashes().has(b.hash)));
  check(keptDecode.every((b) => !removedHashes().has(b.hash)), 'the flood evicts the generated blocks at 35 but not those at 100');
  held = snapshot();
  check(keptDecode.every((b) => held.get(b.hash) === 100), 'a snapshot shows them held at priority 100');

  // 3. decode_duration_ms: priority 100 for 300 ms without use, then the default.
  const brief = range(9800, 2 * kBlock);
  await complete(brief, { max_tokens: 70, kv_retention: { decode_priority: 100, decode_duration_ms: 300 } });
  const briefDecode = await decodeBlocks(brief, 2);
  check(briefDecode.every((b) => b.priority === 100), 'decode_duration_ms: the generated blocks are stored at 100');
  await sleep(500);
  await complete(range(nextFresh, kBlock));  // an engine step, where expired durations are applied
  nextFresh += kBlock;
  await until('the expiry updates', () => briefDecode.every((b) => priorityOf(b.hash) === 35));
  check(briefDecode.every((b) => priorityOf(b.hash) === 35), 'after 300 ms unused they fall back to 35 (updated events)');
  await flood();
  await until('the expired blocks evicted', () => briefDecode.every((b) => removedHashes().has(b.hash)));
  check(keptDecode.every((b) => !removedHashes().has(b.hash)), 'the next flood evicts them, and still not the kept ones');

  // 4. Every batch's first event id follows the previous batch's last.
  const withEvents = batches().filter((b) => b.events.length > 0);
  let breaks = 0;
  for (let i = 1; i < withEvents.length; i++) {
    if (withEvents[i].events[0].id !== withEvents[i - 1].events.at(-1).id + 1) breaks++;
  }
  check(withEvents.length > 50 && breaks === 0, `event ids run one apart across ${withEvents.length} batches`);
});
