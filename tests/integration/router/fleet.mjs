// A fleet on loopback for integration tests: starts kvfleet-router and kvfleet-worker
// processes directly (so a test can SIGKILL one, or restart the router), each logging to
// a file in the test's directory, and stops them all at the end.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Fleet {
  // apiKey: the key of a router started with --api-key-file, which guards /fleet.
  // workerRoles[i]: worker i's --role (P/D disaggregation); none: the worker's default.
  constructor({ routerBin, workerBin, dir, basePort, workers = 3, model = 'mock', routerArgs = [], workerArgs = [],
                blockSize = 32, apiKey = '', workerRoles = [] }) {
    Object.assign(this, { routerBin, workerBin, dir, basePort, model, routerArgs, workerArgs, blockSize, apiKey,
                          workerRoles });
    this.httpPort = basePort;
    this.registration = `tcp://127.0.0.1:${basePort + 1}`;
    this.workerCount = workers;
    this.procs = new Map();
    fs.mkdirSync(dir, { recursive: true });
  }

  url() { return `http://127.0.0.1:${this.httpPort}`; }

  spawnLogged(name, bin, args) {
    const log = fs.openSync(path.join(this.dir, `${name}.log`), 'a');
    const p = spawn(bin, args, { stdio: ['ignore', log, log] });
    p.exited = new Promise((resolve) => p.on('exit', (code, signal) => resolve({ code, signal })));
    this.procs.set(name, p);
    return p;
  }

  startRouter() {
    return this.spawnLogged('router', this.routerBin, [
      '--http-host', '127.0.0.1', '--http-port', String(this.httpPort), '--registration', this.registration,
      '--heartbeat-timeout-ms', '1500', ...this.routerArgs]);
  }

  startWorker(i) {
    const p = this.basePort + 10 + 3 * i;
    return this.spawnLogged(`worker-${i}`, this.workerBin, [
      '--backend', 'mock', '--worker-id', `worker-${i}`, '--model-name', this.model,
      '--requests', `tcp://127.0.0.1:${p}`, '--events', `tcp://127.0.0.1:${p + 1}`,
      '--replay', `tcp://127.0.0.1:${p + 2}`, '--http-port', String(this.basePort + 100 + i),
      '--router', this.registration, '--advertise-host', '127.0.0.1', '--block-size', String(this.blockSize),
      ...this.workerArgs, ...(this.workerRoles[i] ? ['--role', this.workerRoles[i]] : [])]);
  }

  async start() {
    this.startRouter();
    for (let i = 0; i < this.workerCount; i++) this.startWorker(i);
    await this.waitLive(this.workerCount);
  }

  async fleetJson() {
    const r = await fetch(`${this.url()}/fleet`,
                          { headers: this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {} });
    return r.json();
  }

  // Waits until `n` workers are routable and their event streams are live.
  async waitLive(n, timeoutMs = 30000) {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      try {
        const f = await this.fleetJson();
        const live = f.workers.filter((w) => w.routable && w.state === 'live').length;
        if (live === n) return;
      } catch { /* the router is starting */ }
      await sleep(100);
    }
    throw new Error(`timed out waiting for ${n} live workers; logs in ${this.dir}`);
  }

  async kill(name, signal = 'SIGKILL') {
    const p = this.procs.get(name);
    p.kill(signal);
    await p.exited;
  }

  async stop() {
    for (const [name, p] of this.procs) {
      if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    }
    const all = Promise.all([...this.procs.values()].map((p) => p.exited));
    await Promise.race([all, sleep(10000)]);
    for (const p of this.procs.values()) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    await all;  // every port is free again once this returns
  }

  // kvfleet_router_requests_total per worker name, from /metrics.
  async requestsByWorker() {
    const text = await (await fetch(`${this.url()}/metrics`)).text();
    const out = {};
    for (const line of text.split('\n')) {
      const m = line.match(/^kvfleet_router_requests_total\{(.*)\} (\S+)$/);
      if (!m) continue;
      const worker = m[1].match(/worker="([^"]*)"/)[1];
      const status = m[1].match(/status="([^"]*)"/)[1];
      if (status === '200') out[worker] = (out[worker] || 0) + Number(m[2]);
    }
    return out;
  }

  async metric(name) {
    const text = await (await fetch(`${this.url()}/metrics`)).text();
    let sum = 0;
    for (const line of text.split('\n')) if (line.startsWith(name)) sum += Number(line.split(' ').pop());
    return sum;
  }
}

export function diff(after, before) {
  const out = {};
  for (const [k, v] of Object.entries(after)) if (v - (before[k] || 0) > 0) out[k] = v - (before[k] || 0);
  return out;
}

// Runs a test script's body against a started fleet and stops the fleet; true when the body
// passed (a failure's stack is printed).
export async function runFleet(fleet, body) {
  try {
    await fleet.start();
    await body();
    return true;
  } catch (e) {
    console.error(e.stack || String(e));
    return false;
  } finally {
    await fleet.stop();
  }
}

// runFleet, then exits 0 or 1.
export async function runAgainst(fleet, body) {
  process.exit((await runFleet(fleet, body)) ? 0 : 1);
}

export function check(cond, message) {
  if (!cond) throw new Error(`FAILED: ${message}`);
  console.log(`ok: ${message}`);
}

// A byte-level BPE tokenizer.json with no merges: one token per byte, so a chat's
// prompt_tokens is the length of its rendered template.
export function byteLevelTokenizer() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const vocab = {};
  bs.forEach((b, i) => { vocab[String.fromCodePoint(cs[i])] = b; });
  return {
    added_tokens: [], normalizer: null, post_processor: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, use_regex: true },
    decoder: { type: 'ByteLevel' }, model: { type: 'BPE', vocab, merges: [] },
  };
}
