// Deterministic text generators for the tokenizer tests and benchmark: prose, code, CJK,
// Arabic, emoji (ZWJ sequences), combining marks, whitespace / digit runs, mixed scripts,
// random bytes. seed(n) makes every later call sequence reproducible.
function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
let rand = mulberry32(1);
export function seed(n) { rand = mulberry32(n); }
export const random = () => rand();
export const ri = (n) => Math.floor(rand() * n);
export const pick = (a) => a[ri(a.length)];
export const cp = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));

// ---- corpus ----
export const WORDS = ("the of and to in is was for on that with as by at from it his an were are which this be or has had " +
  "not but first one their its new after who they have her she two been other when there all during into school time " +
  "may years more most only over city some world would where later up such used many can state about national out " +
  "known university united then made three also than between people while government system could well American " +
  "don't it's we're you've I'm they'll she'd Hello WORLD Tokenizer's CamelCase snake_case kvfleet GPU cache prefix " +
  "naïve café résumé Zürich coöperate façade jalapeño Ελληνικά Москва привет").split(" ");
const PUNCT = [".", ",", ";", ":", "!", "?", "...", " -", " —", "'", "\"", "(", ")", "[", "]"];

export function prose(n) {
  let s = "";
  while (s.length < n) {
    let sentence = [];
    const len = 4 + ri(18);
    for (let i = 0; i < len; ++i) sentence.push(pick(WORDS));
    sentence[0] = sentence[0][0].toUpperCase() + sentence[0].slice(1);
    let t = sentence.join(" ");
    if (rand() < 0.2) t = `"${t}"`;
    if (rand() < 0.15) t += " (" + pick(WORDS) + ", " + ri(2030) + ")";
    s += t + pick(PUNCT) + (rand() < 0.1 ? "\n\n" : rand() < 0.1 ? "\n" : " ");
  }
  return s;
}

const IDENTS = ["x", "i", "value", "count_", "kvBlock", "parse_json", "std::vector<int>", "self", "this->next", "__init__", "Ω"];
export function code(n) {
  let s = "";
  let indent = 0;
  const ind = () => (rand() < 0.7 ? "    ".repeat(indent) : "\t".repeat(indent));
  while (s.length < n) {
    const r = ri(12);
    if (r === 0) { s += ind() + `def ${pick(IDENTS)}(${pick(IDENTS)}, *args, **kwargs):\n`; indent = Math.min(indent + 1, 6); }
    else if (r === 1) { s += ind() + `for (int ${pick(IDENTS)} = 0; i < ${ri(100000)}; ++i) {\n`; indent = Math.min(indent + 1, 6); }
    else if (r === 2) { s += ind() + "}\n"; indent = Math.max(indent - 1, 0); }
    else if (r === 3) { s += ind() + `// ${prose(30 + ri(40)).trim()}\n`; }
    else if (r === 4) { s += ind() + `const ${pick(IDENTS)} = ${JSON.stringify({ a: ri(1000), b: [1.5, -2e10, "s\\n"], c: null })};\r\n`; }
    else if (r === 5) { s += ind() + `if (${pick(IDENTS)} != ${pick(IDENTS)} && x >= 0x${ri(1 << 30).toString(16)}) return ${pick(IDENTS)};\n`; }
    else if (r === 6) { s += "\n\n"; indent = 0; }
    else if (r === 7) { s += ind() + `printf("%d %s\\n", ${ri(99)}, "${pick(WORDS)}"); /* ${pick(WORDS)} */\n`; }
    else if (r === 8) { s += ind() + `<div class="${pick(WORDS)}">{{ ${pick(IDENTS)} | safe }}</div>\n`; }
    else if (r === 9) { s += ind() + `SELECT * FROM t WHERE id IN (${ri(9)}, ${ri(99)}) AND name LIKE '%${pick(WORDS)}%';\n`; }
    else if (r === 10) { s += ind() + `x = [${Array.from({ length: ri(8) }, () => ri(1000)).join(", ")}]  # ${pick(WORDS)}'s\n`; }
    else { s += ind() + `return ${pick(IDENTS)}->${pick(IDENTS)}[${ri(64)}] << ${ri(32)} | ~mask;   \n`; }
  }
  return s;
}

export function cjk(n) {
  let s = "";
  while (s.length < n) {
    const r = ri(10);
    if (r < 4) s += cp(0x4e00, 0x9fff);
    else if (r < 5) s += cp(0x3041, 0x3096);
    else if (r < 6) s += cp(0x30a1, 0x30fa);
    else if (r < 8) s += cp(0xac00, 0xd7a3);
    else if (r < 9) s += pick(["。", "、", "「", "」", "！", "？", "（", "）", "　", " ", "\n", "，"]);
    else s += pick(["東京", "中国語", "日本語のテキスト", "한국어", "漢字", "2024年", "第3章"]);
  }
  return s;
}

export function arabic(n) {
  let s = "";
  while (s.length < n) {
    let w = "";
    const len = 2 + ri(7);
    for (let i = 0; i < len; ++i) {
      w += cp(0x0621, 0x064a);
      if (rand() < 0.2) w += cp(0x064b, 0x0652);  // harakat
    }
    s += w + (rand() < 0.1 ? pick(["،", "؟", ".", " ١٢٣", " 42", "\n"]) : " ");
  }
  return s;
}

const EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "❤️", "🧑🏾‍💻", "👩‍❤️‍💋‍👨", "🐈‍⬛", "✈️", "🫠", "1️⃣", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "™", "©"];
export function emoji(n) {
  let s = "";
  while (s.length < n) s += pick(EMOJI) + (rand() < 0.4 ? " " : rand() < 0.5 ? pick(WORDS) : "");
  return s;
}

export function combining(n) {
  let s = "";
  while (s.length < n) {
    const r = ri(6);
    if (r < 3) { s += cp(0x61, 0x7a); for (let k = ri(4); k > 0; --k) s += cp(0x0300, 0x036f); }
    else if (r === 3) s += "e\u0301 a\u0308 n\u0303 Å A\u030a ﬁ ｆｕｌｌ ① ";
    else if (r === 4) s += "\u1100\u1161\u11a8 \u1112\u1161\u11ab"; // conjoining jamo: NFC composes
    else s += pick(["Tiếng Việt ", "देवनागरी ", "ภาษาไทย ", "עִבְרִית ", "Ǆemal ", "ﷺ "]);
    if (rand() < 0.3) s += " ";
  }
  return s;
}

const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\ufeff", "\u0085", "\u2028", "\v", "\f"];
export function runs(n) {
  let s = "";
  while (s.length < n) {
    const r = ri(6);
    if (r === 0) s += " ".repeat(1 + ri(40));
    else if (r === 1) s += Array.from({ length: 1 + ri(30) }, () => pick(SPACES)).join("");
    else if (r === 2) s += Array.from({ length: 1 + ri(60) }, () => ri(10)).join("");
    else if (r === 3) s += pick(WORDS) + pick(SPACES);
    else if (r === 4) s += "\n".repeat(1 + ri(8)) + " ".repeat(ri(6));
    else s += ri(1e9) + "." + ri(1e6) + pick(SPACES);
  }
  return s;
}

export function mixed(n) {
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x900, 0x97f],
    [0xe00, 0xe7f], [0x2000, 0x206f], [0x2200, 0x22ff], [0x1f300, 0x1f5ff], [0x20000, 0x2a6df]];
  let s = "";
  while (s.length < n) { const [lo, hi] = pick(ranges); s += cp(lo, hi); }
  return s;
}

export function randomBytes(n) {
  const bytes = new Uint8Array(n);
  for (let i = 0; i < n; ++i) {
    const r = ri(4);
    bytes[i] = r === 0 ? ri(256) : r === 1 ? 0x80 + ri(64) : r === 2 ? 0x20 + ri(95) : 0xc0 + ri(64);
  }
  return bytes;
}

export function withSpecials(text, specials) {
  let out = "";
  for (let i = 0; i < text.length;) {
    const step = 1 + ri(200);
    out += text.slice(i, i + step);
    i += step;
    const r = ri(6);
    if (r === 0) out += pick(specials);
    else if (r === 1) out += " " + pick(specials) + " ";
    else if (r === 2) out += "\n" + pick(specials) + "\n";
    else if (r === 3) { const s = pick(specials); out += s.slice(0, 1 + ri(s.length - 1)); }  // partial
    else if (r === 4) out += pick(specials) + pick(specials);
  }
  return out;
}

