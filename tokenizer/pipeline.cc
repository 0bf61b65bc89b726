#include "tokenizer/pipeline.h"

#include <cstdlib>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok {

namespace {

using json = nlohmann::json;

std::string TypeOf(const json& config) {
  return config.contains("type") && config["type"].is_string() ? config["type"].get<std::string>() : "<no type>";
}

std::string StringField(const json& config, const char* key, std::string fallback = "") {
  return config.contains(key) && config[key].is_string() ? config[key].get<std::string>() : fallback;
}

bool BoolField(const json& config, const char* key, bool fallback) {
  return config.contains(key) && config[key].is_boolean() ? config[key].get<bool>() : fallback;
}

std::string ReplaceLiteral(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  size_t last = 0;
  for (size_t pos = text.find(from); pos != std::string_view::npos; pos = text.find(from, last)) {
    out.append(text.substr(last, pos - last));
    out.append(to);
    last = pos + from.size();
  }
  out.append(text.substr(last));
  return out;
}

// A tokenizer.json {"String": ...} or {"Regex": ...} pattern.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  static Result<Pattern> FromJson(const json& config, std::string_view owner) {
    Pattern p;
    if (config.contains("String") && config["String"].is_string()) {
      p.literal = config["String"].get<std::string>();
      return p;
    }
    if (config.contains("Regex") && config["Regex"].is_string()) {
      auto regex = Regex::FromTokenizerJson(config["Regex"].get<std::string>());
      if (!regex.ok()) return regex.status().WithContext(std::string(owner));
      p.regex = *regex;
      return p;
    }
    return InvalidArgument(std::string(owner) + ": pattern is neither String nor Regex");
  }
  template <typename Fn>
  Status ForEachMatch(std::string_view text, Fn&& fn) const {
    if (regex) return regex->ForEachMatch(text, fn);
    if (literal.empty()) return Status::Ok();
    for (size_t pos = text.find(literal); pos != std::string_view::npos; pos = text.find(literal, pos + literal.size())) {
      fn(pos, pos + literal.size());
    }
    return Status::Ok();
  }
  Result<std::string> ReplaceAll(std::string_view text, std::string_view content) const {
    if (regex) return regex->ReplaceAll(text, content);
    return ReplaceLiteral(text, literal, content);
  }
};

// ---- normalizers ----

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  Status Apply(std::string* text) const override {
    KVF_ASSIGN_OR_RETURN(*text, Normalize(*text, form_));
    return Status::Ok();
  }

 private:
  NormalForm form_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> steps;
  Status Apply(std::string* text) const override {
    for (const auto& s : steps) KVF_RETURN_IF_ERROR(s->Apply(text));
    return Status::Ok();
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  Pattern pattern;
  std::string content;
  Status Apply(std::string* text) const override {
    KVF_ASSIGN_OR_RETURN(*text, pattern.ReplaceAll(*text, content));
    return Status::Ok();
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  std::string prepend;
  Status Apply(std::string* text) const override {
    text->insert(0, prepend);
    return Status::Ok();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  bool left = true, right = true;
  Status Apply(std::string* text) const override {
    std::string_view v = *text;
    if (left) v = TrimStartJs(v);
    if (right) v = TrimEndJs(v);
    *text = std::string(v);
    return Status::Ok();
  }
};

// ---- pre-tokenizers ----

class SplitPreTokenizer final : public PreTokenizer {
 public:
  Pattern pattern;
  bool invert = false;
  bool removed = false;  // behavior "Removed"; otherwise "Isolated"
  Status Apply(std::string_view text, int, const Emit& emit) const override {
    // As the reference: invert keeps only the matches (whatever the behavior).
    bool keep_matches = invert || !removed;
    size_t last = 0;
    KVF_RETURN_IF_ERROR(pattern.ForEachMatch(text, [&](size_t b, size_t e) {
      if (!invert && b > last) emit(text.substr(last, b - last));
      if (keep_matches && e > b) emit(text.substr(b, e - b));
      last = e;
    }));
    if (!invert && last < text.size()) emit(text.substr(last));
    return Status::Ok();
  }
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  bool add_prefix_space = false;
  std::shared_ptr<const Regex> regex;  // GPT-2's split, when use_regex
  Status Apply(std::string_view text, int, const Emit& emit) const override {
    std::string prefixed;
    if (add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (!regex) {
      emit(text);
      return Status::Ok();
    }
    return regex->ForEachMatch(text, [&](size_t b, size_t e) {
      if (e > b) emit(text.substr(b, e - b));
    });
  }
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  std::string replacement = "\u2581";
  std::string scheme = "always";  // always, first, never
  bool split = true;
  Status Apply(std::string_view text, int section_index, const Emit& emit) const override {
    std::string s = ReplaceLiteral(text, " ", replacement);
    bool starts = s.compare(0, replacement.size(), replacement) == 0;
    if (!starts && (scheme == "always" || (scheme == "first" && section_index == 0))) s.insert(0, replacement);
    if (!split) {
      emit(s);
      return Status::Ok();
    }
    // Rust's split: each piece starts at a replacement character (merged with next).
    std::string_view v = s;
    size_t start = 0;
    for (size_t pos = v.find(replacement, 1); pos != std::string_view::npos; pos = v.find(replacement, pos + 1)) {
      if (pos > start) emit(v.substr(start, pos - start));
      start = pos;
    }
    if (start < v.size()) emit(v.substr(start));
    return Status::Ok();
  }
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  bool individual = false;
  // The reference's /[^\d]+|\d+/gu: \d is ASCII digits in JS.
  Status Apply(std::string_view text, int, const Emit& emit) const override {
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i + 1;
      if (digit(text[i])) {
        if (!individual) while (j < text.size() && digit(text[j])) ++j;
      } else {
        while (j < text.size() && !digit(text[j])) ++j;
      }
      emit(text.substr(i, j - i));
      i = j;
    }
    return Status::Ok();
  }
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  Status Apply(std::string_view text, int section_index, const Emit& emit) const override {
    return Run(0, text, section_index, emit);
  }

 private:
  Status Run(size_t step, std::string_view text, int section_index, const Emit& emit) const {
    if (step == steps.size()) {
      emit(text);
      return Status::Ok();
    }
    Status inner;  // the first failure of a later step
    KVF_RETURN_IF_ERROR(steps[step]->Apply(text, section_index, [&](std::string_view piece) {
      if (inner.ok()) inner = Run(step + 1, piece, section_index, emit);
    }));
    return inner;
  }
};

// ---- decoders ----

class ByteLevelDecoder final : public Decoder {
 public:
  std::function<bool(std::string_view)> is_added;
  void Apply(std::vector<std::string>* tokens) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&]() {
      if (!bytes.empty()) out.push_back(RepairUtf8(bytes));
      bytes.clear();
    };
    bool pending = false;
    for (std::string& t : *tokens) {
      if (is_added(t)) {
        if (pending) flush();
        pending = false;
        out.push_back(std::move(t));
        continue;
      }
      pending = true;
      for (size_t i = 0; i < t.size();) {
        int b = alphabet.ByteOf(NextCodePoint(t, &i));
        bytes.push_back(static_cast<char>(b < 0 ? 0 : b));  // the reference turns unknowns into 0
      }
    }
    if (pending) flush();
    *tokens = std::move(out);
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  std::string replacement = "\u2581";
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string s = ReplaceLiteral((*tokens)[i], replacement, " ");
      if (i == 0 && !s.empty() && s[0] == ' ') s.erase(0, 1);
      (*tokens)[i] = std::move(s);
    }
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  Pattern pattern;
  std::string content;
  void Apply(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      // A regex failing on hostile input leaves the token as it is: decoding never fails.
      if (auto r = pattern.ReplaceAll(t, content); r.ok()) t = std::move(*r);
    }
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool pending = false;
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        char* end = nullptr;
        std::string hex = t.substr(3, 2);
        long v = std::strtol(hex.c_str(), &end, 16);
        if (end == hex.c_str() + 2) byte = static_cast<int>(v);
      }
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
        pending = true;
        continue;
      }
      if (pending) out.push_back(RepairUtf8(bytes));
      bytes.clear();
      pending = false;
      out.push_back(std::move(t));
    }
    if (pending) out.push_back(RepairUtf8(bytes));
    *tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  char32_t content = ' ';
  int start = 0, stop = 0;
  void Apply(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      std::string_view v = t;
      for (int i = 0; i < start && !v.empty(); ++i) {
        size_t j = 0;
        if (NextCodePoint(v, &j) != content) break;
        v.remove_prefix(j);
      }
      for (int i = 0; i < stop && !v.empty(); ++i) {
        size_t b = v.size() - 1;
        while (b > 0 && (static_cast<unsigned char>(v[b]) & 0xC0) == 0x80) --b;
        size_t j = b;
        if (NextCodePoint(v, &j) != content) break;
        v.remove_suffix(v.size() - b);
      }
      t = std::string(v);
    }
  }
};

class BpeDecoder final : public Decoder {
 public:
  std::string suffix;
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      (*tokens)[i] = ReplaceLiteral((*tokens)[i], suffix, i + 1 == tokens->size() ? "" : " ");
    }
  }
};

class SequenceDecoder final : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> steps;
  void Apply(std::vector<std::string>* tokens) const override {
    for (const auto& s : steps) s->Apply(tokens);
  }
};

// GPT-2's split as the reference writes it: a JS regex literal, so \s is ECMAScript
// whitespace (WhiteSpace + LineTerminator: TAB VT FF ZWNBSP Zs LF CR LS PS).
constexpr const char* kJsSpace = "\\t\\n\\x{0B}\\f\\r\\x{FEFF}\\x{2028}\\x{2029}\\p{Zs}";

std::string Gpt2Pattern() {
  std::string s = kJsSpace;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + s + "\\p{L}\\p{N}]+|[" + s + "]+(?![^" + s + "])|[" + s + "]+";
}

}  // namespace

Result<std::unique_ptr<Normalizer>> MakeNormalizer(const json& config) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  std::string type = TypeOf(config);
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkd));
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    if (!config.contains("normalizers") || !config["normalizers"].is_array()) return InvalidArgument("tokenizer.json: normalizer Sequence has no normalizers");
    for (const auto& c : config["normalizers"]) {
      KVF_ASSIGN_OR_RETURN(auto step, MakeNormalizer(c));
      if (step) seq->steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(std::move(seq));
  }
  if (type == "Replace") {
    auto r = std::make_unique<ReplaceNormalizer>();
    KVF_ASSIGN_OR_RETURN(r->pattern, Pattern::FromJson(config.value("pattern", json::object()), "normalizer Replace"));
    r->content = StringField(config, "content");
    return std::unique_ptr<Normalizer>(std::move(r));
  }
  if (type == "Prepend") {
    auto p = std::make_unique<PrependNormalizer>();
    p->prepend = StringField(config, "prepend");
    return std::unique_ptr<Normalizer>(std::move(p));
  }
  if (type == "Strip") {
    auto s = std::make_unique<StripNormalizer>();
    s->left = BoolField(config, "strip_left", false);
    s->right = BoolField(config, "strip_right", false);
    return std::unique_ptr<Normalizer>(std::move(s));
  }
  return Unimplemented("tokenizer.json: normalizer type '" + type + "' is not supported");
}

Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& config, bool* byte_level) {
  *byte_level = false;
  if (config.is_null()) return std::unique_ptr<PreTokenizer>();
  std::string type = TypeOf(config);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePreTokenizer>();
    if (!config.contains("pretokenizers") || !config["pretokenizers"].is_array()) return InvalidArgument("tokenizer.json: pre_tokenizer Sequence has no pretokenizers");
    for (const auto& c : config["pretokenizers"]) {
      if (*byte_level) return Unimplemented("tokenizer.json: pre_tokenizer ByteLevel followed by " + TypeOf(c) + " is not supported");
      bool step_byte_level = false;
      KVF_ASSIGN_OR_RETURN(auto step, MakePreTokenizer(c, &step_byte_level));
      *byte_level = step_byte_level;
      if (step) seq->steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(std::move(seq));
  }
  if (type == "Split") {
    auto s = std::make_unique<SplitPreTokenizer>();
    KVF_ASSIGN_OR_RETURN(s->pattern, Pattern::FromJson(config.value("pattern", json::object()), "pre_tokenizer Split"));
    s->invert = BoolField(config, "invert", false);
    std::string behavior = StringField(config, "behavior", "Isolated");
    if (behavior == "Removed") {
      s->removed = true;
    } else if (behavior != "Isolated") {
      return Unimplemented("tokenizer.json: pre_tokenizer Split with behavior '" + behavior + "' is not supported");
    }
    return std::unique_ptr<PreTokenizer>(std::move(s));
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevelPreTokenizer>();
    b->add_prefix_space = BoolField(config, "add_prefix_space", false);
    if (BoolField(config, "use_regex", true)) {
      KVF_ASSIGN_OR_RETURN(b->regex, Regex::Compile(Gpt2Pattern()));
    }
    *byte_level = true;
    return std::unique_ptr<PreTokenizer>(std::move(b));
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspacePreTokenizer>();
    m->replacement = StringField(config, "replacement", "\u2581");
    if (config.contains("prepend_scheme") && config["prepend_scheme"].is_string()) {
      m->scheme = config["prepend_scheme"].get<std::string>();
    } else if (!BoolField(config, "add_prefix_space", true)) {
      m->scheme = "never";
    }
    if (m->scheme != "always" && m->scheme != "first" && m->scheme != "never") {
      return Unimplemented("tokenizer.json: Metaspace prepend_scheme '" + m->scheme + "' is not supported");
    }
    m->split = BoolField(config, "split", true);
    return std::unique_ptr<PreTokenizer>(std::move(m));
  }
  if (type == "Digits") {
    auto d = std::make_unique<DigitsPreTokenizer>();
    d->individual = BoolField(config, "individual_digits", false);
    return std::unique_ptr<PreTokenizer>(std::move(d));
  }
  return Unimplemented("tokenizer.json: pre_tokenizer type '" + type + "' is not supported");
}

Result<PostProcessor> MakePostProcessor(const json& config) {
  PostProcessor pp;
  if (config.is_null()) return pp;
  std::string type = TypeOf(config);
  if (type == "ByteLevel") return pp;  // changes offsets only
  if (type == "Sequence") {
    if (!config.contains("processors") || !config["processors"].is_array()) return InvalidArgument("tokenizer.json: post_processor Sequence has no processors");
    for (const auto& c : config["processors"]) {
      KVF_ASSIGN_OR_RETURN(PostProcessor step, MakePostProcessor(c));
      // Each step wraps what the previous ones produced.
      pp.prefix.insert(pp.prefix.begin(), step.prefix.begin(), step.prefix.end());
      pp.suffix.insert(pp.suffix.end(), step.suffix.begin(), step.suffix.end());
    }
    return pp;
  }
  if (type == "TemplateProcessing") {
    if (!config.contains("single") || !config["single"].is_array()) return InvalidArgument("tokenizer.json: TemplateProcessing has no single template");
    bool seen_sequence = false;
    for (const auto& item : config["single"]) {
      if (item.contains("Sequence")) {
        if (seen_sequence) return Unimplemented("tokenizer.json: TemplateProcessing single template with two sequences");
        seen_sequence = true;
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        std::string id = item["SpecialToken"]["id"].get<std::string>();
        (seen_sequence ? pp.suffix : pp.prefix).push_back(id);
      } else {
        return InvalidArgument("tokenizer.json: TemplateProcessing item is neither Sequence nor SpecialToken");
      }
    }
    return pp;
  }
  return Unimplemented("tokenizer.json: post_processor type '" + type + "' is not supported");
}

Result<std::unique_ptr<Decoder>> MakeDecoder(const json& config, std::function<bool(std::string_view)> is_added) {
  if (config.is_null()) return std::unique_ptr<Decoder>();
  std::string type = TypeOf(config);
  if (type == "ByteLevel") {
    auto d = std::make_unique<ByteLevelDecoder>();
    d->is_added = std::move(is_added);
    return std::unique_ptr<Decoder>(std::move(d));
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = StringField(config, "replacement", "\u2581");
    return std::unique_ptr<Decoder>(std::move(d));
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    KVF_ASSIGN_OR_RETURN(d->pattern, Pattern::FromJson(config.value("pattern", json::object()), "decoder Replace"));
    d->content = StringField(config, "content");
    return std::unique_ptr<Decoder>(std::move(d));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    std::string content = StringField(config, "content", " ");
    size_t i = 0;
    if (content.empty() || !IsValidUtf8(content)) return InvalidArgument("tokenizer.json: Strip decoder content must be one character");
    d->content = NextCodePoint(content, &i);
    d->start = config.value("start", 0);
    d->stop = config.value("stop", 0);
    return std::unique_ptr<Decoder>(std::move(d));
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeDecoder>();
    d->suffix = StringField(config, "suffix", "</w>");
    return std::unique_ptr<Decoder>(std::move(d));
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDecoder>();
    if (!config.contains("decoders") || !config["decoders"].is_array()) return InvalidArgument("tokenizer.json: decoder Sequence has no decoders");
    for (const auto& c : config["decoders"]) {
      KVF_ASSIGN_OR_RETURN(auto step, MakeDecoder(c, is_added));
      if (step) seq->steps.push_back(std::move(step));
    }
    return std::unique_ptr<Decoder>(std::move(seq));
  }
  return Unimplemented("tokenizer.json: decoder type '" + type + "' is not supported");
}

}  // namespace kvfleet::tok
