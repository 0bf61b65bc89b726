#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <unordered_map>
#include <unordered_set>

#include "common/tokenizer_files.h"
#include "tokenizer/added_token_trie.h"
#include "tokenizer/bpe.h"
#include "tokenizer/jinja.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/section_cache.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok {

using json = nlohmann::json;

namespace {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

struct Section {
  std::string_view text;
  int token = -1;  // index into added tokens, or -1 for text
};

// tokenizer_config.json spells special tokens as strings or as {"content": ...}.
std::optional<std::string> TokenText(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// The reference's clean_up_tokenization (transformers' clean_up_tokenization_spaces).
std::string CleanUpTokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string_view f(from);
    if (s.find(f) == std::string::npos) continue;
    std::string out;
    size_t last = 0;
    for (size_t pos = s.find(f); pos != std::string::npos; pos = s.find(f, last)) {
      out.append(s, last, pos - last);
      out.append(to);
      last = pos + f.size();
    }
    out.append(s, last);
    s = std::move(out);
  }
  return s;
}

}  // namespace

namespace {
// Instance ids for the section cache's keys; never reused, unlike addresses.
std::atomic<uint64_t> next_instance_id{1};
}  // namespace

class TokenizerImpl {
 public:
  const uint64_t instance_id = next_instance_id.fetch_add(1, std::memory_order_relaxed);
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  PostProcessor post_processor;
  std::unique_ptr<Decoder> decoder;

  std::vector<AddedToken> added;
  std::unordered_map<TokenId, int> added_by_id;
  std::unordered_map<std::string, int> added_by_text;  // content and normalized content
  AddedTokenTrie unnormalized_trie, normalized_trie;
  std::unordered_set<std::string> special_texts;
  std::unordered_map<TokenId, TokenId> vocab_remap;  // vocab ids spelled like an added token

  std::vector<TokenId> prefix_ids, suffix_ids;
  bool clean_up_tokenization_spaces = true;
  std::optional<TokenId> bos_id;
  std::vector<TokenId> eos_ids;
  size_t vocab_size = 0;
  nlohmann::ordered_json special_context = nlohmann::ordered_json::object();  // bos_token, eos_token, ... for chat templates
  std::shared_ptr<const jinja::Template> chat_template;
  std::string chat_template_error;
  std::string chat_template_source;
  std::string chat_template_text;  // the template's source text

  std::optional<TokenId> TokenToId(std::string_view t) const {
    auto it = added_by_text.find(std::string(t));
    if (it != added_by_text.end()) return added[it->second].id;
    return model->TokenToId(t);
  }

  // Cuts `text` at added tokens (leftmost, longest) and applies lstrip / rstrip.
  void SplitAdded(std::string_view text, const AddedTokenTrie& trie, bool parse_special,
                  std::vector<Section>* out) const {
    out->clear();
    if (trie.empty()) {
      out->push_back({text, -1});
      return;
    }
    auto accept = [&](int t, size_t begin, size_t end) {
      const AddedToken& a = added[t];
      if (a.special && !parse_special) return false;
      if (a.single_word) {
        if (begin > 0) {
          size_t b = begin - 1;
          while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
          if (IsAlphanumeric(NextCodePoint(text, &b))) return false;
        }
        if (end < text.size()) {
          size_t e = end;
          if (IsAlphanumeric(NextCodePoint(text, &e))) return false;
        }
      }
      return true;
    };
    size_t start = 0, i = 0;
    while (i < text.size()) {
      if (!trie.MayStart(static_cast<unsigned char>(text[i]))) {
        ++i;
        continue;
      }
      int token = -1;
      size_t len = trie.Match(text, i, accept, &token);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) out->push_back({text.substr(start, i - start), -1});
      out->push_back({text.substr(i, len), token});
      i += len;
      start = i;
    }
    if (start < text.size()) out->push_back({text.substr(start), -1});
    for (size_t k = 0; k < out->size(); ++k) {
      int t = (*out)[k].token;
      if (t < 0) continue;
      if (added[t].lstrip && k > 0 && (*out)[k - 1].token < 0) (*out)[k - 1].text = TrimEndJs((*out)[k - 1].text);
      if (added[t].rstrip && k + 1 < out->size() && (*out)[k + 1].token < 0) {
        (*out)[k + 1].text = TrimStartJs((*out)[k + 1].text);
      }
    }
  }

  // The model's ids for one piece of text that holds no added token.
  Status EncodeText(std::string_view text, int section_index, std::vector<TokenId>* out) const {
    size_t first = out->size();
    if (pre_tokenizer) {
      KVF_RETURN_IF_ERROR(
          pre_tokenizer->Apply(text, section_index, [&](std::string_view piece) { model->Encode(piece, out); }));
    } else {
      model->Encode(text, out);
    }
    if (!vocab_remap.empty()) {
      for (size_t i = first; i < out->size(); ++i) {
        auto it = vocab_remap.find((*out)[i]);
        if (it != vocab_remap.end()) (*out)[i] = it->second;
      }
    }
    if (model->fuse_unk() && model->unk_id()) {
      TokenId unk = *model->unk_id();
      auto end = std::unique(out->begin() + static_cast<std::ptrdiff_t>(first), out->end(),
                             [unk](TokenId a, TokenId b) { return a == unk && b == unk; });
      out->erase(end, out->end());
    }
    return Status::Ok();
  }

  // Appends the ids of one text section (no added token was cut out of it). They depend
  // only on the text, parse_special and whether section_index is 0 (SectionKey).
  Status EncodeSection(std::string_view text, int section_index, bool parse_special, std::vector<TokenId>* ids,
                       std::vector<Section>* subsections) const {
    if (parse_special) {
      auto it = added_by_text.find(std::string(text));
      if (it != added_by_text.end()) {
        ids->push_back(added[it->second].id);
        return Status::Ok();
      }
    }
    std::string normalized;
    std::string_view piece = text;
    if (normalizer) {
      normalized = std::string(text);
      KVF_RETURN_IF_ERROR(normalizer->Apply(&normalized));
      piece = normalized;
    }
    if (piece.empty()) return Status::Ok();
    if (normalized_trie.empty()) return EncodeText(piece, section_index, ids);
    SplitAdded(piece, normalized_trie, parse_special, subsections);
    for (const Section& sub : *subsections) {
      if (sub.token >= 0) {
        ids->push_back(added[sub.token].id);
      } else if (!sub.text.empty()) {
        KVF_RETURN_IF_ERROR(EncodeText(sub.text, section_index, ids));
      }
    }
    return Status::Ok();
  }

  Result<std::vector<TokenId>> Encode(std::string_view input, const EncodeOptions& options) const {
    std::string repaired;
    std::string_view text = input;
    if (!IsValidUtf8(input)) {
      repaired = RepairUtf8(input);
      text = repaired;
    }
    std::vector<TokenId> ids;
    ids.reserve(text.size() / 3 + 8);
    if (options.add_special_tokens) ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
    std::vector<Section> sections, subsections;
    SplitAdded(text, unnormalized_trie, options.parse_special, &sections);
    for (size_t si = 0; si < sections.size(); ++si) {
      const Section& section = sections[si];
      if (section.token >= 0) {
        ids.push_back(added[section.token].id);
        continue;
      }
      if (section.text.empty()) continue;
      const int index = static_cast<int>(si);
      if (!options.use_section_cache || section.text.size() < config::kSectionCacheMinBytes) {
        KVF_RETURN_IF_ERROR(EncodeSection(section.text, index, options.parse_special, &ids, &subsections));
        continue;
      }
      const SectionKey key{instance_id, options.parse_special, /*first_section=*/si == 0, section.text};
      SectionCache& cache = ThisThreadSectionCache();
      if (cache.Lookup(key, &ids)) continue;
      const size_t first = ids.size();
      KVF_RETURN_IF_ERROR(EncodeSection(section.text, index, options.parse_special, &ids, &subsections));
      cache.Insert(key, std::span<const TokenId>(ids).subspan(first));
    }
    if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
    return ids;
  }

  std::string TokenString(TokenId id, bool* known) const {
    auto it = added_by_id.find(id);
    if (it != added_by_id.end()) {
      *known = true;
      return added[it->second].content;
    }
    const std::string& s = model->IdToToken(id);
    *known = !s.empty();
    return s;
  }

  std::string Decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (TokenId id : ids) {
      bool known = false;
      std::string s = TokenString(id, &known);
      if (!known) {
        if (model->unk_token().empty()) continue;  // the reference joins an undefined token as ""
        s = model->unk_token();
      }
      if (options.skip_special_tokens && special_texts.count(s)) continue;
      tokens.push_back(std::move(s));
    }
    std::string text;
    if (decoder) {
      decoder->Apply(&tokens);
      for (const std::string& t : tokens) text += t;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (i) text += ' ';
        text += tokens[i];
      }
    }
    if (options.clean_up_tokenization_spaces && clean_up_tokenization_spaces) text = CleanUpTokenization(std::move(text));
    return text;
  }

  Status Load(std::string_view tokenizer_text, std::string_view config_text, std::string_view generation_text,
              const std::optional<std::string>& chat_template_override);
};

Status TokenizerImpl::Load(std::string_view tokenizer_text, std::string_view config_text,
                           std::string_view generation_text, const std::optional<std::string>& chat_template_override) {
  json tj = json::parse(tokenizer_text, nullptr, /*allow_exceptions=*/false);
  if (tj.is_discarded() || !tj.is_object()) return InvalidArgument("tokenizer.json is not a JSON object");
  json config = config_text.empty() ? json::object() : json::parse(config_text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return InvalidArgument("tokenizer_config.json is not a JSON object");

  if (!tj.contains("model") || !tj["model"].is_object()) return InvalidArgument("tokenizer.json has no model");
  std::string model_type = tj["model"].value("type", std::string("BPE"));
  if (model_type != "BPE") return Unimplemented("tokenizer.json: model type '" + model_type + "' is not supported");
  if (config.contains("remove_space") && config["remove_space"].is_boolean() && config["remove_space"].get<bool>()) {
    return Unimplemented("tokenizer_config.json: remove_space is not supported");
  }
  if (config.value("do_lowercase_and_remove_accent", false)) {
    return Unimplemented("tokenizer_config.json: do_lowercase_and_remove_accent is not supported");
  }

  KVF_ASSIGN_OR_RETURN(normalizer, MakeNormalizer(tj.value("normalizer", json())));
  bool byte_level = false;
  KVF_ASSIGN_OR_RETURN(pre_tokenizer, MakePreTokenizer(tj.value("pre_tokenizer", json()), &byte_level));
  KVF_ASSIGN_OR_RETURN(model, BpeModel::FromJson(tj["model"], byte_level));
  KVF_ASSIGN_OR_RETURN(post_processor, MakePostProcessor(tj.value("post_processor", json())));

  // Added tokens.
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      AddedToken t;
      if (!a.contains("id") || !a.contains("content")) return InvalidArgument("tokenizer.json: added token without id or content");
      t.id = a["id"].get<TokenId>();
      t.content = a["content"].get<std::string>();
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.special = a.value("special", false);
      t.normalized = a.contains("normalized") && a["normalized"].is_boolean() ? a["normalized"].get<bool>() : !t.special;
      added.push_back(std::move(t));
    }
  }
  for (int i = 0; i < static_cast<int>(added.size()); ++i) {
    const AddedToken& t = added[i];
    added_by_id[t.id] = i;
    added_by_text[t.content] = i;
    if (t.special) special_texts.insert(t.content);
    if (auto vid = model->TokenToId(t.content); vid && *vid != t.id) vocab_remap[*vid] = t.id;
    if (t.normalized && normalizer) {
      std::string n = t.content;
      KVF_RETURN_IF_ERROR(normalizer->Apply(&n));
      added_by_text[n] = i;
      normalized_trie.Insert(n, i);
    } else {
      unnormalized_trie.Insert(t.content, i);
    }
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    for (const auto& s : config["additional_special_tokens"]) {
      if (s.is_string()) special_texts.insert(s.get<std::string>());
    }
  }
  KVF_ASSIGN_OR_RETURN(decoder, MakeDecoder(tj.value("decoder", json()), [this](std::string_view t) {
                         return added_by_text.count(std::string(t)) > 0;
                       }));

  auto id_of = [&](const std::string& t) -> Result<TokenId> {
    if (auto id = TokenToId(t)) return *id;
    if (model->unk_id()) return *model->unk_id();
    return InvalidArgument("tokenizer.json: post_processor token '" + t + "' is not in the vocabulary");
  };
  for (const auto& t : post_processor.prefix) {
    KVF_ASSIGN_OR_RETURN(TokenId id, id_of(t));
    prefix_ids.push_back(id);
  }
  for (const auto& t : post_processor.suffix) {
    KVF_ASSIGN_OR_RETURN(TokenId id, id_of(t));
    suffix_ids.push_back(id);
  }

  vocab_size = model->id_limit();
  for (const auto& t : added) vocab_size = std::max<size_t>(vocab_size, t.id + size_t{1});

  if (config.contains("clean_up_tokenization_spaces") && config["clean_up_tokenization_spaces"].is_boolean()) {
    clean_up_tokenization_spaces = config["clean_up_tokenization_spaces"].get<bool>();
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (auto text = TokenText(config, key)) special_context[key] = *text;
  }
  if (auto bos = TokenText(config, "bos_token")) bos_id = TokenToId(*bos);
  if (auto eos = TokenText(config, "eos_token")) {
    if (auto id = TokenToId(*eos)) eos_ids.push_back(*id);
  }
  if (!generation_text.empty()) {
    json gen = json::parse(generation_text, nullptr, false);
    if (gen.is_object() && gen.contains("eos_token_id")) {
      const json& e = gen["eos_token_id"];
      if (e.is_number_unsigned()) eos_ids.push_back(e.get<TokenId>());
      if (e.is_array()) {
        for (const auto& x : e) {
          if (x.is_number_unsigned()) eos_ids.push_back(x.get<TokenId>());
        }
      }
    }
  }
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());

  if (chat_template_override) {
    auto parsed = jinja::Template::Parse(*chat_template_override);
    if (!parsed.ok()) return InvalidArgument("chat template: " + parsed.status().message());
    chat_template = *parsed;
    chat_template_source = "override";
    chat_template_text = *chat_template_override;
    return Status::Ok();
  }
  // chat_template: a string, or a list of {name, template} where "default" is used.
  if (auto source = ChatTemplateOfConfig(config)) {
    chat_template_source = "tokenizer_config.json";
    chat_template_text = *source;
    auto parsed = jinja::Template::Parse(*source);
    if (parsed.ok()) {
      chat_template = *parsed;
    } else {
      // The tokenizer still works; only ApplyChatTemplate reports the problem.
      chat_template_error = parsed.status().message();
    }
  }
  return Status::Ok();
}

// ---- Tokenizer ----

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::shared_ptr<const Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                             std::string_view tokenizer_config_json,
                                                             std::string_view generation_config_json,
                                                             std::optional<std::string> chat_template) {
  auto impl = std::make_unique<TokenizerImpl>();
  KVF_RETURN_IF_ERROR(impl->Load(tokenizer_json, tokenizer_config_json, generation_config_json, chat_template));
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string& model_dir, const LoadOptions& options) {
  auto tokenizer_json = ReadModelFile(model_dir + "/tokenizer.json");
  if (!tokenizer_json.ok()) return tokenizer_json.status().WithContext("loading tokenizer");
  auto config_json = ReadModelFile(model_dir + "/tokenizer_config.json");
  std::string config_text = config_json.ok() ? *config_json : std::string();
  auto generation_json = ReadModelFile(model_dir + "/generation_config.json");
  std::string generation_text = generation_json.ok() ? *generation_json : std::string();
  if (options.chat_template) {
    auto tok = FromJson(*tokenizer_json, config_text, generation_text, options.chat_template);
    if (!tok.ok()) return tok.status().WithContext("loading tokenizer from " + model_dir);
    return tok;
  }
  // The precedence of the template files is common/tokenizer_files.h's, shared with the
  // worker's tokenizer digest.
  auto file = FindChatTemplateFile(model_dir);
  if (!file.ok()) return file.status().WithContext("loading tokenizer");
  auto impl = std::make_unique<TokenizerImpl>();
  Status st = impl->Load(*tokenizer_json, config_text, generation_text, std::nullopt);
  if (!st.ok()) return st.WithContext("loading tokenizer from " + model_dir);
  if (*file) {
    // A template file replaces tokenizer_config.json's; like that one, it reports a parse
    // error only when a chat is rendered, so completions still work.
    impl->chat_template = nullptr;
    impl->chat_template_error.clear();
    impl->chat_template_source = (*file)->source;
    impl->chat_template_text = (*file)->text;
    auto parsed = jinja::Template::Parse((*file)->text);
    if (parsed.ok()) {
      impl->chat_template = *parsed;
    } else {
      impl->chat_template_error = (*file)->source + ": " + parsed.status().message();
    }
  }
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::vector<TokenId>> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  return impl_->Encode(text, options);
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  DecodeOptions options;
  options.skip_special_tokens = skip_special_tokens;
  return impl_->Decode(ids, options);
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  return impl_->Decode(ids, options);
}

Result<std::string> Tokenizer::ApplyChatTemplate(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                 const nlohmann::ordered_json& extra_context) const {
  if (!impl_->chat_template) {
    if (!impl_->chat_template_error.empty()) return Unimplemented("chat_template: " + impl_->chat_template_error);
    return FailedPrecondition(
        "the model has no chat template (none in chat_template.jinja, chat_template.json or tokenizer_config.json)");
  }
  if (!messages.is_array()) return InvalidArgument("messages must be a JSON array");
  nlohmann::ordered_json context = impl_->special_context;
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) context[it.key()] = it.value();
  }
  return impl_->chat_template->Render(context);
}

bool Tokenizer::has_chat_template() const { return impl_->chat_template != nullptr; }
const std::string& Tokenizer::chat_template_source() const { return impl_->chat_template_source; }
const std::string& Tokenizer::chat_template_text() const { return impl_->chat_template_text; }
const std::vector<TokenId>& Tokenizer::eos_token_ids() const { return impl_->eos_ids; }
std::optional<TokenId> Tokenizer::bos_token_id() const { return impl_->bos_id; }
size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<TokenId> Tokenizer::TokenToId(std::string_view token) const { return impl_->TokenToId(token); }

std::string Tokenizer::IdToToken(TokenId id) const {
  bool known = false;
  return impl_->TokenString(id, &known);
}

std::string Tokenizer::TokenBytes(TokenId id) const {
  bool known = false;
  std::string s = impl_->TokenString(id, &known);
  if (!known || impl_->added_by_id.contains(id)) return s;
  std::string out;
  if (impl_->model->byte_level()) {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    for (size_t i = 0; i < s.size();) {
      const size_t at = i;
      const int b = alphabet.ByteOf(NextCodePoint(s, &i));
      if (b >= 0) {
        out += static_cast<char>(b);
      } else {
        out.append(s, at, i - at);  // a symbol outside the alphabet stands for itself
      }
    }
    return out;
  }
  // SentencePiece style: <0xXX> byte-fallback tokens, "▁" for a space.
  if (s.size() == 6 && s.starts_with("<0x") && s.back() == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
      std::isxdigit(static_cast<unsigned char>(s[4]))) {
    return std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
  }
  static constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581
  for (size_t i = 0; i < s.size();) {
    if (std::string_view(s).substr(i, kSpace.size()) == kSpace) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

bool Tokenizer::IsSpecial(TokenId id) const {
  bool known = false;
  std::string s = impl_->TokenString(id, &known);
  return known && impl_->special_texts.count(s) > 0;
}

// ---- IncrementalDecoder ----

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens)
    : tok_(std::move(tok)) {
  options_.skip_special_tokens = skip_special_tokens;
  options_.clean_up_tokenization_spaces = false;
}

namespace {
bool EndsWithReplacement(const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0; }
}  // namespace

std::string IncrementalDecoder::Push(TokenId id) {
  ids_.push_back(id);
  std::span<const TokenId> all(ids_);
  // Decoding from prefix_offset_ gives the window's first token its context (a leading
  // space that a decoder strips only at the start of the text).
  std::string before = tok_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_);
  std::string after = tok_->Decode(all.subspan(prefix_offset_), options_);
  // A trailing U+FFFD may be half a character that the next token completes.
  if (after.size() <= before.size() || EndsWithReplacement(after) || after.compare(0, before.size(), before) != 0) {
    return "";
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return after.substr(before.size());
}

std::string IncrementalDecoder::Finish() {
  std::span<const TokenId> all(ids_);
  std::string before = tok_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_);
  std::string after = tok_->Decode(all.subspan(prefix_offset_), options_);
  prefix_offset_ = read_offset_ = ids_.size();
  if (after.size() <= before.size() || after.compare(0, before.size(), before) != 0) return "";
  return after.substr(before.size());
}

}  // namespace kvfleet::tok
