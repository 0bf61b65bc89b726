// The official `openai` npm package against kvfleet-router and 3 mock workers:
// completions and chat completions, streaming and not, result shapes and usage. This
// proves compatibility with a real client, not only with our reading of the spec. Agents'
// requests too: tools (the mock's byte codec renders them and reads calls in the hermes
// form), a two-turn tool conversation, content parts, and responses.create. A mock worker's
// tokens are random bytes, so only forced calls (decoded under their grammar) are generated
// here: the parsers are covered by router_api_test (tool_parsers_test.cc,
// reasoning_parser_test.cc, responses_api_test.cc).
//   node openai_client_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { createRequire } from 'node:module';
import { Fleet, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv').default ?? require('ajv');
const ajv = new Ajv({ strict: false });

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

  // Content parts are joined with "\n" before the template: the same prompt as the string.
  const parts = await client.chat.completions.create({ model: 'mock', max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }] });
  const joined = await client.chat.completions.create({ model: 'mock', max_tokens: 2,
    messages: [{ role: 'user', content: 'a\nb' }] });
  check(parts.usage.prompt_tokens === joined.usage.prompt_tokens, 'text content parts render as their joined text');
  try {
    await client.chat.completions.create({ model: 'mock', messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] });
    check(false, 'an image part is refused');
  } catch (e) {
    check(e.status === 400 && /image_url/.test(e.error?.message), 'an image part: 400 naming its type');
  }

  // Tools (tool_choice auto): rendered into the prompt, the answer in the chat shape.
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather now',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const ask = [{ role: 'user', content: 'Weather in Paris?' }];
  const withTools = await client.chat.completions.create({ model: 'mock', messages: ask, tools, max_tokens: 4 });
  const withoutTools = await client.chat.completions.create({ model: 'mock', messages: ask, max_tokens: 4 });
  check(withTools.usage.prompt_tokens > withoutTools.usage.prompt_tokens + 100, 'the tools are rendered into the prompt');
  check(['stop', 'length', 'tool_calls'].includes(withTools.choices[0].finish_reason), 'tools: finish_reason');
  // The second turn: the assistant's call (content null) and the tool's answer go back through the template.
  const turn2 = await client.chat.completions.create({ model: 'mock', tools, max_tokens: 4, messages: [...ask,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '20C and sunny' }] });
  check(turn2.usage.prompt_tokens > withTools.usage.prompt_tokens, 'a two-turn tool conversation is rendered');
  const toolStream = await client.chat.completions.create({ model: 'mock', messages: ask, tools, max_tokens: 4,
                                                             stream: true });
  let streamedFinish = null;
  for await (const chunk of toolStream) streamedFinish = chunk.choices[0]?.finish_reason ?? streamedFinish;
  check(['stop', 'length', 'tool_calls'].includes(streamedFinish), 'tools streamed: finish_reason');
  // tool_choice required: the mock workers decode under the forced-call grammar.
  const forced = await client.chat.completions.create({ model: 'mock', messages: ask, tools, tool_choice: 'required',
                                                         max_tokens: 400 });
  const calls = forced.choices[0].message.tool_calls ?? [];
  check(forced.choices[0].finish_reason === 'tool_calls' && calls.length >= 1 &&
        calls.every((c) => c.function.name === 'get_weather' && typeof JSON.parse(c.function.arguments) === 'object'),
        'tool_choice required: tool_calls whose arguments are JSON');

  // tool_choice naming a function: its arguments follow the function's parameters.
  const named = await client.chat.completions.create({ model: 'mock', messages: ask, tools, max_tokens: 400,
    tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const namedCalls = named.choices[0].message.tool_calls ?? [];
  check(namedCalls.length === 1 && namedCalls[0].function.name === 'get_weather' &&
        ajv.validate(tools[0].function.parameters, JSON.parse(namedCalls[0].function.arguments)),
        'tool_choice named: one call whose arguments validate against its parameters');
  // Forced calls streamed, through the SDK's stream helper: the name first, then the arguments
  // in many deltas; a mock's tokens are a function of the seed, so the assembled calls must be
  // the whole answer's, byte for byte.
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const params = { model: 'mock', messages: ask, tools, tool_choice, max_tokens: 400, seed: 5, temperature: 1 };
    const whole = (await client.chat.completions.create(params)).choices[0].message.tool_calls ?? [];
    let fragments = 0;
    const runner = client.chat.completions.stream(params);
    runner.on('tool_calls.function.arguments.delta', (e) => { if (e.arguments_delta) fragments++; });
    const final = await runner.finalChatCompletion();
    const streamedCalls = final.choices[0].message.tool_calls ?? [];
    check(final.choices[0].finish_reason === 'tool_calls' && streamedCalls.length >= 1 &&
          streamedCalls.length === whole.length &&
          streamedCalls.every((c, i) => c.function.name === whole[i].function.name &&
                                        c.function.arguments === whole[i].function.arguments),
          `tool_choice ${JSON.stringify(tool_choice)} streamed: the SDK assembles the whole answer's calls`);
    check(fragments > streamedCalls.length, `tool_choice ${JSON.stringify(tool_choice)} streamed: arguments ` +
          `arrive as they are decoded (${fragments} deltas)`);
  }

  // Structured outputs: every answer validates with ajv (the mock's tokens are random bytes
  // under the grammar's mask, so only the grammar makes them valid).
  const schema = { type: 'object', additionalProperties: false, required: ['name', 'kind', 'tags', 'size'],
    properties: { name: { type: 'string', maxLength: 12 }, kind: { enum: ['cat', 'dog', 7] },
                  tags: { type: 'array', items: { type: 'string', maxLength: 4 }, minItems: 1, maxItems: 3 },
                  size: { anyOf: [{ type: 'integer', minimum: -5, maximum: 300 }, { type: 'null' }] },
                  owner: { type: 'object', additionalProperties: false, required: ['id'],
                           properties: { id: { type: 'integer' }, vip: { type: 'boolean' } } } } };
  const format = { type: 'json_schema', json_schema: { name: 'pet', schema, strict: true } };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model: 'mock', messages: ask, response_format: format,
                                                     max_tokens: 600, seed, temperature: 1 });
    const text = r.choices[0].message.content;
    let value;
    try { value = JSON.parse(text); } catch { value = undefined; }
    check(r.choices[0].finish_reason === 'stop' && value !== undefined && ajv.validate(schema, value),
          `response_format json_schema (seed ${seed}): the answer validates`);
  }
  let streamed = '';
  const sstream = await client.chat.completions.create({ model: 'mock', messages: ask, response_format: format,
                                                         max_tokens: 600, stream: true });
  for await (const chunk of sstream) streamed += chunk.choices[0]?.delta?.content ?? '';
  let svalue;
  try { svalue = JSON.parse(streamed); } catch { svalue = undefined; }
  check(svalue !== undefined && ajv.validate(schema, svalue), 'response_format json_schema streamed: validates');
  const obj = await client.chat.completions.create({ model: 'mock', messages: ask, max_tokens: 600,
                                                     response_format: { type: 'json_object' } });
  let ovalue;
  try { ovalue = JSON.parse(obj.choices[0].message.content); } catch { ovalue = undefined; }
  check(ovalue !== null && typeof ovalue === 'object' && !Array.isArray(ovalue), 'response_format json_object: an object');
  try {
    await client.chat.completions.create({ model: 'mock', messages: ask, response_format: { type: 'json_schema',
      json_schema: { name: 'bad', schema: { type: 'object', patternProperties: { '^x': { type: 'string' } } } } } });
    check(false, 'an unsupported schema keyword is refused');
  } catch (e) {
    check(e.status === 400 && String(e.error?.message ?? e.message).includes('patternProperties'),
          'response_format: an unsupported keyword is a 400 naming it');
  }

  // responses.create (stateless: store left out), whole and streamed.
  const resp = await client.responses.create({ model: 'mock', instructions: 'Be brief.', input: 'Hello',
                                               max_output_tokens: 5 });
  check(resp.object === 'response' && resp.id.startsWith('resp_'), 'responses.create: a response object');
  check(['completed', 'incomplete'].includes(resp.status) && resp.store === false, 'responses.create: status, store false');
  check(resp.output.every((item) => item.type === 'message') && typeof resp.output_text === 'string',
        'responses.create: message items and the SDK\'s output_text');
  check(resp.usage.input_tokens > 0 && resp.usage.output_tokens > 0, 'responses.create: usage');
  const events = [];
  const rstream = await client.responses.create({ model: 'mock', input: [
    { role: 'user', content: [{ type: 'input_text', text: 'Weather?' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '20C' }], tools: [{ type: 'function',
    name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }],
    max_output_tokens: 6, stream: true });
  let deltas = '';
  let final = null;
  for await (const ev of rstream) {
    events.push(ev.type);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  check(events[0] === 'response.created' && events[1] === 'response.in_progress', 'responses stream: created, in_progress');
  check(['response.completed', 'response.incomplete'].includes(events.at(-1)), 'responses stream: ends completed');
  const finalText = final?.output.filter((i) => i.type === 'message').map((i) => i.content[0].text).join('') ?? '';
  check(final && deltas === finalText && final.usage.output_tokens > 0, 'responses stream: the deltas make the final text');
  try {
    await client.responses.create({ model: 'mock', input: 'x', store: true });
    check(false, 'store true is refused');
  } catch (e) {
    check(e.status === 400 && e.error?.param === 'store', 'responses store: true is a 400 (stateless)');
  }

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
