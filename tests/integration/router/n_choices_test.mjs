// n > 1 through the official `openai` npm package, kvfleet-router and a mock worker:
// completions and chat, streamed and not. The worker's model has a 128-token vocabulary,
// so with the router's byte codec each generated token is one ASCII character and a
// choice's text length is its token count.
//   node n_choices_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { Fleet, check, runAgainst, sleep } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');

const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir, { recursive: true });
fs.writeFileSync(path.join(modelDir, 'config.json'), JSON.stringify({
  architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: 128, hidden_size: 64,
  intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
  max_position_embeddings: 2048, eos_token_id: 127 }));

const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 1,
                          workerArgs: ['--model-dir', modelDir] });
const N = 3;
const MAX = 7;

// Checks a whole response's choices: indexes 0..n-1 in order, each MAX characters.
function checkChoices(what, choices, textOf) {
  check(choices.length === N, `${what}: ${N} choices (got ${choices.length})`);
  choices.forEach((c, i) => {
    check(c.index === i, `${what}: choice ${i} has index ${c.index}`);
    check(textOf(c).length === MAX && c.finish_reason === 'length',
          `${what}: choice ${i} runs to max_tokens (${JSON.stringify(textOf(c))}, ${c.finish_reason})`);
  });
}

// Reads a stream's chunks into per-choice text and finish reasons, and its usage; checks
// that every chunk names a choice 0..N-1 that has not finished yet.
async function collect(what, stream, textOf) {
  const text = Array(N).fill(''); const finish = Array(N).fill(null); let usage = null; const stray = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (!(c.index >= 0 && c.index < N && finish[c.index] === null)) stray.push(c);
      text[c.index] += textOf(c) ?? '';
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  check(stray.length === 0, `${what}: every chunk names an unfinished choice (${JSON.stringify(stray)})`);
  return { text, finish, usage };
}

// The worker's prompt tokens computed so far (kvfleet_worker_prefix_miss_tokens_total),
// once the counter has caught up: the worker refreshes its KV metrics every 250 ms, so
// two reads 300 ms apart must agree.
async function missedTokens() {
  const read = async () => {
    const text = await (await fetch(`http://127.0.0.1:${Number(basePort) + 100}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith('kvfleet_worker_prefix_miss_tokens_total'));
    return Number(line.split(' ').pop());
  };
  let last = await read();
  for (let i = 0; i < 20; i++) {
    await sleep(300);
    const now = await read();
    if (now === last) return now;
    last = now;
  }
  return last;
}

await runAgainst(fleet, async () => {
  const client = new OpenAI({ baseURL: `${fleet.url()}/v1`, apiKey: 'unused', maxRetries: 0 });
  const prompt = 'The quick brown fox jumps over the lazy dog, again and again and again.';
  const base = { model: 'mock', max_tokens: MAX, ignore_eos: true };

  const one = await client.completions.create({ ...base, prompt });
  const c = await client.completions.create({ ...base, prompt, n: N, seed: 42, temperature: 1 });
  checkChoices('completions', c.choices, (x) => x.text);
  check(c.usage.prompt_tokens === one.usage.prompt_tokens, 'completions: the prompt is counted once');
  check(c.usage.completion_tokens === N * MAX, `completions: completion tokens summed (${c.usage.completion_tokens})`);
  check(new Set(c.choices.map((x) => x.text)).size === N, 'completions: each choice samples its own tokens');
  const again = await client.completions.create({ ...base, prompt, n: N, seed: 42, temperature: 1 });
  check(JSON.stringify(again.choices.map((x) => x.text)) === JSON.stringify(c.choices.map((x) => x.text)),
        'completions: a seeded request of n repeats');
  const seeded1 = await client.completions.create({ ...base, prompt, seed: 42, temperature: 1 });
  check(seeded1.choices[0].text === c.choices[0].text, 'completions: choice 0 is the n=1 answer of the same seed');

  const messages = [{ role: 'user', content: 'Say something.' }];
  const chat = await client.chat.completions.create({ ...base, messages, n: N });
  checkChoices('chat', chat.choices, (x) => x.message.content);
  chat.choices.forEach((x) => check(x.message.role === 'assistant', 'chat: each choice is the assistant\'s'));
  check(chat.usage.completion_tokens === N * MAX, 'chat: completion tokens summed');

  // A prompt the worker has not seen: sequence 0 computes it, each fork only its last
  // partial block (the fleet's blocks are 32 tokens).
  const before = await missedTokens();
  const fresh = await client.completions.create({ ...base, prompt: `Never seen before: ${prompt}`, n: N });
  const L = fresh.usage.prompt_tokens;
  const missed = (await missedTokens()) - before;
  check(fresh.usage.prompt_tokens_details?.cached_tokens === 0, 'the fresh prompt is not cached');
  check(missed === L + (N - 1) * (L % 32 === 0 ? 1 : L % 32),
        `the prompt is prefilled once: ${missed} prompt tokens computed for n=${N} of a ${L}-token prompt`);

  const cs = await collect('chat stream', await client.chat.completions.create({
    ...base, messages, n: N, stream: true, stream_options: { include_usage: true } }), (x) => x.delta?.content);
  cs.text.forEach((t, i) => check(t.length === MAX && cs.finish[i] === 'length',
                                  `chat stream: choice ${i} (${JSON.stringify(t)}, ${cs.finish[i]})`));
  check(cs.usage?.completion_tokens === N * MAX, 'chat stream: usage sums the choices');

  const ps = await collect('completions stream', await client.completions.create({
    ...base, prompt, n: N, seed: 42, temperature: 1, stream: true }), (x) => x.text);
  check(JSON.stringify(ps.text) === JSON.stringify(c.choices.map((x) => x.text)),
        'completions stream: each choice streams what the whole response held');
  ps.finish.forEach((f, i) => check(f === 'length', `completions stream: choice ${i} finish ${f}`));

  for (const [body, param] of [[{ n: 2, best_of: 4 }, 'best_of'], [{ n: 17 }, 'n'], [{ n: 0 }, 'n']]) {
    try {
      await client.completions.create({ ...base, prompt, ...body });
      check(false, `${JSON.stringify(body)} is refused`);
    } catch (e) {
      check(e.status === 400 && e.error?.param === param, `${JSON.stringify(body)}: 400 naming ${param}`);
    }
  }
});
