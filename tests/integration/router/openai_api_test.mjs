// The official `openai` npm package against the router's request-field rule and its
// tokenizer and operator endpoints, with an API key and a byte-level tokenizer whose chat
// template reads a chat_template_kwargs variable:
//   - an unknown field is a 400 naming it; --allow-unknown-fields admits it (counted);
//   - response_format is refused unless it asks for nothing; tools need a known call format;
//   - chat_template_kwargs reach the template (/tokenize and chat usage both show it);
//   - /tokenize then /detokenize gives the prompt back; /version; /fleet needs the key.
//   node openai_api_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { Fleet, byteLevelTokenizer, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePort] = process.argv.slice(2);
const cache = process.env.KVFLEET_CACHE || `${process.env.HOME}/.cache/kvfleet`;
const require = createRequire(`${cache}/npm/`);
const OpenAI = require('openai').default ?? require('openai');

const key = 'sk-kvfleet-test';
fs.mkdirSync(dir, { recursive: true });
const keyFile = path.join(dir, 'keys.txt');
fs.writeFileSync(keyFile, `${key}\n`);
const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir, { recursive: true });
fs.writeFileSync(path.join(modelDir, 'tokenizer.json'), JSON.stringify(byteLevelTokenizer()));
fs.writeFileSync(path.join(modelDir, 'tokenizer_config.json'), '{}');
fs.writeFileSync(path.join(modelDir, 'chat_template.jinja'),
                 '{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}' +
                 '{% if greeting is defined %}[{{ greeting }}]{% endif %}' +
                 '{% if add_generation_prompt %}<assistant>{% endif %}');

const routerArgs = ['--api-key-file', keyFile, '--tokenizer', modelDir, '--unknown-model-grace-s', '0'];
const fleet = new Fleet({ routerBin, workerBin, dir, basePort: Number(basePort), workers: 1, routerArgs,
                          apiKey: key });

async function refusal(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  return null;
}

await runAgainst(fleet, async () => {
  const client = new OpenAI({ baseURL: `${fleet.url()}/v1`, apiKey: key, maxRetries: 0 });
  const root = new OpenAI({ baseURL: fleet.url(), apiKey: key, maxRetries: 0 });
  const stranger = new OpenAI({ baseURL: fleet.url(), apiKey: 'sk-wrong', maxRetries: 0 });
  const messages = [{ role: 'user', content: 'Hello' }];

  // Unknown and unbuilt fields.
  let e = await refusal(client.completions.create({ model: 'mock', prompt: 'x', max_tokens: 2, mirostat: 2 }));
  check(e?.status === 400 && e.error?.param === 'mirostat', 'an unknown field is a 400 naming it');
  e = await refusal(client.chat.completions.create({
    model: 'mock', messages, response_format: { type: 'json_object' } }));
  check(e === null, 'response_format json_object is served (the mock workers decode under constraints)');
  // This template writes no tool-call format kvfleet knows: tools with tool_choice auto
  // could not return their calls, so they need --tool-call-parser; tool_choice none is served.
  const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
  e = await refusal(client.chat.completions.create({ model: 'mock', messages, tools }));
  check(e?.status === 400 && e.error?.param === 'tools' && /--tool-call-parser/.test(e.error?.message),
        'tools for a template without a known call format are refused, naming --tool-call-parser');
  const none = await client.chat.completions.create({ model: 'mock', messages, tools, tool_choice: 'none', max_tokens: 2 });
  check(none.choices[0].message.role === 'assistant', 'tools with tool_choice none are rendered and served');
  const plain = await client.chat.completions.create({
    model: 'mock', messages, max_tokens: 2, response_format: { type: 'text' }, tool_choice: 'none' });
  check(plain.choices[0].message.role === 'assistant', 'response_format text and tool_choice none pass');

  // chat_template_kwargs reach the template: the byte-level prompt grows by "[hi]".
  const bare = await client.chat.completions.create({ model: 'mock', messages, max_tokens: 1 });
  const greeted = await client.chat.completions.create({
    model: 'mock', messages, max_tokens: 1, chat_template_kwargs: { greeting: 'hi' } });
  check(greeted.usage.prompt_tokens === bare.usage.prompt_tokens + 4,
        `chat_template_kwargs render into the prompt (${bare.usage.prompt_tokens} -> ${greeted.usage.prompt_tokens})`);

  // /tokenize and /detokenize, in vLLM's shapes.
  const text = 'Once upon a time, ünïcode';
  const t = await root.post('/tokenize', { body: { model: 'mock', prompt: text, return_token_strs: true } });
  check(Array.isArray(t.tokens) && t.count === t.tokens.length && t.count === Buffer.byteLength(text),
        `/tokenize counts ${t.count} byte tokens`);
  check(t.max_model_len > 0 && t.token_strs.length === t.count, '/tokenize max_model_len and token_strs');
  const d = await root.post('/detokenize', { body: { model: 'mock', tokens: t.tokens } });
  check(d.prompt === text, '/detokenize gives the prompt back');
  const chat = await root.post('/tokenize', {
    body: { model: 'mock', messages, add_generation_prompt: false, chat_template_kwargs: { greeting: 'yo' } } });
  const rendered = await root.post('/detokenize', { body: { model: 'mock', tokens: chat.tokens } });
  check(rendered.prompt === '<user>Hello</user>[yo]',
        `/tokenize renders messages with the options (${rendered.prompt})`);
  const prefill = await root.post('/tokenize', {
    body: { model: 'mock', messages: [...messages, { role: 'assistant', content: 'Sure' }],
            continue_final_message: true, add_generation_prompt: false } });
  const open = await root.post('/detokenize', { body: { model: 'mock', tokens: prefill.tokens } });
  check(open.prompt === '<user>Hello</user><assistant>Sure',
        `continue_final_message leaves the last turn open (${open.prompt})`);
  e = await refusal(root.post('/tokenize', { body: { model: 'mock', prompt: 'x', truncate: 1 } }));
  check(e?.status === 400 && e.error?.param === 'truncate', '/tokenize refuses an unknown field by name');
  e = await refusal(root.post('/detokenize', { body: { model: 'mock', tokens: [1, -1] } }));
  check(e?.status === 400 && e.error?.param === 'tokens', '/detokenize refuses a negative id');
  e = await refusal(stranger.post('/tokenize', { body: { model: 'mock', prompt: 'x' } }));
  check(e?.status === 401, '/tokenize needs the API key');

  // /version, and /fleet behind the key.
  const v = await stranger.get('/version');
  check(typeof v.version === 'string' && v.version.length > 0, `/version (${v.version}) needs no key`);
  const f = await root.get('/fleet');
  check(Array.isArray(f.workers) && f.workers.length === 1, '/fleet with the key');
  e = await refusal(stranger.get('/fleet'));
  check(e?.status === 401, '/fleet with a wrong key is 401');
  check((await fetch(`${fleet.url()}/fleet`)).status === 401, '/fleet without a key is 401');

  // Router and worker both export their build.
  const routerMetrics = await (await fetch(`${fleet.url()}/metrics`)).text();
  const workerMetrics = await (await fetch(`http://127.0.0.1:${fleet.basePort + 100}/metrics`)).text();
  check(routerMetrics.includes(`kvfleet_build_info{build_type=`) && routerMetrics.includes(`version="${v.version}"`),
        'the router exports kvfleet_build_info with /version\'s version');
  check(workerMetrics.includes(`version="${v.version}"`), 'the worker exports kvfleet_build_info');

  // The same unknown field with --allow-unknown-fields: admitted and counted.
  await fleet.kill('router', 'SIGTERM');
  fleet.routerArgs = [...routerArgs, '--allow-unknown-fields'];
  fleet.startRouter();
  await fleet.waitLive(1);
  const admitted = await client.completions.create({ model: 'mock', prompt: 'x', max_tokens: 2, mirostat: 2 });
  check(admitted.choices.length === 1 && admitted.usage.completion_tokens === 2,
        '--allow-unknown-fields admits the unknown field');
  check(await fleet.metric('kvfleet_router_unknown_fields_total') === 1, 'the admitted field is counted');
  check(await fleet.metric('kvfleet_router_generation_tokens_total{') === admitted.usage.completion_tokens,
        'generated tokens are counted per model');
  e = await refusal(client.chat.completions.create({
    model: 'mock', messages, prediction: { type: 'content', content: 'x' } }));
  check(e?.status === 400 && e.error?.param === 'prediction', 'known unbuilt fields stay refused with the flag');
});
