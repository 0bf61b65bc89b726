// The JS side of tests/bench/tokenizer/tokenizer_bench: writes the benchmark's documents
// (prose and code, 4 KiB each, seeded) to OUT_DIR and times @huggingface/tokenizers
// encoding them in this one process (one core, CPU time). Prints one JSON line of results.
//
//   node tests/js/tokenizer_bench.mjs NODE_MODULES MODEL_DIR OUT_DIR
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { seed, prose, code } from "./corpus.mjs";

const [nodeModules, modelDir, outDir] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(path.join(nodeModules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")));
fs.mkdirSync(outDir, { recursive: true });

const kDocBytes = 4096;
const kTotalBytes = 2 * 1024 * 1024;
const results = {};
for (const [name, gen, s] of [["prose", prose, 11], ["code", code, 12]]) {
  seed(s);
  const docs = [];
  let total = 0;
  while (total < kTotalBytes) {
    const d = gen(kDocBytes);
    docs.push(d);
    total += Buffer.byteLength(d);
  }
  fs.writeFileSync(path.join(outDir, `${name}.json`), JSON.stringify(docs));
  for (const d of docs.slice(0, 50)) tok.encode(d);  // warm up the JIT
  // CPU time of this process (user + system), as the C++ side measures its thread.
  const c0 = process.cpuUsage();
  let tokens = 0;
  for (const d of docs) tokens += tok.encode(d).ids.length;
  const c = process.cpuUsage(c0);
  const seconds = (c.user + c.system) / 1e6;
  results[name] = { bytes: total, tokens, seconds };
}
console.log(JSON.stringify(results));
