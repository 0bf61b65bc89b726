// The official `openai` npm package against kvfleet-router and a mock worker: logprobs
// (completions with echo and max_tokens 0 as lm-evaluation-harness asks, chat streamed),
// penalties, min_p and logit_bias accepted, and bad values refused naming the field. The mock
// worker's logprobs are placeholders of the right shape (-1 for each token), so this checks
// shapes and plumbing; the numbers are tested against the cpu and cuda backends.
//   node sampling_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { createRequire } from 'node:module';
import { Fleet, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');

const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 1 });
await runAgainst(fleet, async () => {
  const client = new OpenAI({ baseURL: `${fleet.url()}/v1`, apiKey: 'unused', maxRetries: 0 });
  const prompt = 'Once upon a time';  // 16 byte tokens with the mock's byte codec

  // lm-evaluation-harness's loglikelihood request: echo, logprobs, no generated token.
  const scored = await client.completions.create({ model: 'mock', prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const lp = scored.choices[0].logprobs;
  check(scored.choices[0].text === prompt, 'echo with max_tokens 0: the text is the prompt');
  check(scored.usage.completion_tokens === 0, 'echo with max_tokens 0: no completion tokens');
  check(lp.tokens.length === 16 && lp.tokens.join('') === prompt, 'echo: one logprobs entry per prompt token');
  check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, "echo: the first token's logprob is null");
  check(lp.token_logprobs.slice(1).every((x) => typeof x === 'number'), 'echo: the other prompt tokens have logprobs');
  check(lp.top_logprobs.slice(1).every((t) => t && Object.keys(t).length >= 1), 'echo: top_logprobs maps');
  check(lp.text_offset.every((o, i) => o === i), 'echo: text offsets of byte tokens');

  const gen = await client.completions.create({ model: 'mock', prompt, max_tokens: 4, logprobs: 3, seed: 5 });
  const glp = gen.choices[0].logprobs;
  check(glp.tokens.length === gen.usage.completion_tokens && glp.token_logprobs.length === glp.tokens.length,
        'completion logprobs: one entry per generated token');
  check(glp.text_offset[0] === 0, 'completion logprobs: offsets from the start of the text');

  const stream = await client.chat.completions.create({
    model: 'mock', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 5, stream: true,
    logprobs: true, top_logprobs: 2, stream_options: { include_usage: true } });
  let entries = 0; let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const e of chunk.choices[0]?.logprobs?.content ?? []) {
      entries++;
      check(typeof e.token === 'string' && typeof e.logprob === 'number' && Array.isArray(e.bytes) &&
            e.top_logprobs.length === 2, 'chat stream logprobs entry shape');
    }
  }
  check(usage && entries === usage.completion_tokens, `chat stream: ${entries} logprobs entries, one per token`);

  const penalised = await client.chat.completions.create({
    model: 'mock', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, presence_penalty: 0.5,
    frequency_penalty: 0.5, logit_bias: { 42: -100 }, repetition_penalty: 1.1, min_p: 0.05 });
  check(penalised.choices[0].message.content.length > 0, 'penalties, logit_bias, min_p accepted');

  for (const [field, body] of [['presence_penalty', { presence_penalty: 3 }], ['logit_bias', { logit_bias: { x: 1 } }],
                               ['top_logprobs', { logprobs: true, top_logprobs: 21 }]]) {
    try {
      await client.chat.completions.create({ model: 'mock', messages: [{ role: 'user', content: 'x' }], ...body });
      check(false, `${field}: refused`);
    } catch (e) {
      check(e.status === 400 && e.error?.param === field, `${field}: 400 naming it`);
    }
  }
});
