// The official `openai` npm package against kvfleet-router and 3 mock workers:
// completions and chat completions, streaming and not, result shapes and usage. This
// proves compatibility with a real client, not only with our reading of the spec.
//   node openai_client_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { createRequire } from 'node:module';
import { Fleet, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');

// No grace after start for unknown models: this test checks the 404 of one that never exists.
const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 3,
                          routerArgs: ['--unknown-model-grace-s', '0'] });
await runAgainst(fleet, async () => {
  const client = new OpenAI({ baseURL: `${fleet.url()}/v1`, apiKey: 'unused', maxRetries: 0 });

  const models = await client.models.list();
  check(models.data.some((m) => m.id === 'mock'), 'models.list() names the mock model');

  const c = await client.completions.create({ model: 'mock', prompt: 'Once upon a time', max_tokens: 8 });
  check(c.object === 'text_completion' && typeof c.choices[0].text === 'string', 'completion shape');
  check(['stop', 'length'].includes(c.choices[0].finish_reason), 'completion finish_reason');
  check(c.usage.prompt_tokens === 16 && c.usage.completion_tokens > 0 &&
        c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, 'completion usage');
  check(typeof c.usage.prompt_tokens_details?.cached_tokens === 'number', 'completion cached_tokens');

  const chat = await client.chat.completions.create({
    model: 'mock', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }],
    max_completion_tokens: 6 });
  check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant', 'chat shape');
  check(typeof chat.choices[0].message.content === 'string', 'chat content');
  check(chat.usage.completion_tokens > 0, 'chat usage');

  const stream = await client.chat.completions.create({
    model: 'mock', messages: [{ role: 'user', content: 'Stream please' }], max_tokens: 10, stream: true,
    stream_options: { include_usage: true } });
  let text = ''; let finish = null; let usage = null; let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === 'chat.completion.chunk', `chunk ${chunks} object`);
    if (chunk.choices.length > 0) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(text.length > 0 && finish !== null, 'chat stream text and finish_reason');
  check(usage && usage.completion_tokens > 0 && usage.prompt_tokens > 0, 'chat stream usage (include_usage)');

  // The x-kvfleet-worker header names the worker that served, as the body's kvfleet.worker does.
  const { data: wc, response: wr } = await client.completions
    .create({ model: 'mock', prompt: 'which worker?', max_tokens: 3 }).withResponse();
  const served = wr.headers.get('x-kvfleet-worker');
  check(typeof served === 'string' && served.length > 0 && served === wc.kvfleet?.worker,
        `x-kvfleet-worker header (${served}) matches the body (${wc.kvfleet?.worker})`);
  const { response: sr } = await client.completions
    .create({ model: 'mock', prompt: 'which worker?', max_tokens: 3, stream: true }).withResponse();
  check((sr.headers.get('x-kvfleet-worker') ?? '').length > 0, 'x-kvfleet-worker header on a stream');

  const cstream = await client.completions.create({ model: 'mock', prompt: 'abc', max_tokens: 5, stream: true });
  let ctext = '';
  for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? '';
  check(ctext.length > 0, 'completion stream text');

  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x' });
    check(false, 'unknown model is refused');
  } catch (e) {
    check(e.status === 404 && e.error?.code === 'model_not_found', 'unknown model: 404 model_not_found');
  }
  try {
    await client.completions.create({ model: 'mock', prompt: 'x', n: 17 });
    check(false, 'n=17 is refused');
  } catch (e) {
    check(e.status === 400 && e.error?.param === 'n', 'n=17 (over the limit of 16): 400 naming the parameter');
  }
});
