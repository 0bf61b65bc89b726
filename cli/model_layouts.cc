#include "cli/model_layouts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/model_layout_table.h"
#include "common/tokenizer_files.h"
#include "worker/model/checkpoint.h"
#include "worker/model/model_config.h"
#include "worker/model/random_model.h"

namespace kvfleet::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ojson = nlohmann::ordered_json;
using layouts::Layout;
using layouts::Layouts;



// Gives the added tokens the family's current names where the tokenizer still has a
// reserved placeholder at their ids; true when it renamed one.
bool RenameReservedTokens(const Layout& l, json& tok) {
  if (l.renamed_reserved == nullptr || !tok.contains("added_tokens") || !tok["added_tokens"].is_array()) return false;
  json* vocab = tok["model"].contains("vocab") && tok["model"]["vocab"].is_object() ? &tok["model"]["vocab"] : nullptr;
  bool renamed = false;
  for (auto& a : tok["added_tokens"]) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string()) {
      continue;
    }
    const std::string name = l.renamed_reserved(a["id"].get<int64_t>());
    const std::string old = a["content"].get<std::string>();
    if (name.empty() || old == name || old.rfind("<|reserved_special_token_", 0) != 0) continue;
    if (vocab != nullptr && vocab->contains(old) && (*vocab)[old] == a["id"]) {
      vocab->erase(old);
      (*vocab)[name] = a["id"];
    }
    a["content"] = name;
    renamed = true;
  }
  return renamed;
}

ojson Token(const std::string& content) {
  return ojson{{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"single_word", false}};
}


Result<Layout> FindLayout(const std::string& name) {
  for (Layout& l : Layouts()) {
    if (l.name == name) return std::move(l);
  }
  std::string names;
  for (const auto& n : ModelLayoutNames()) names += (names.empty() ? "" : ", ") + n;
  return InvalidArgument("--layout " + name + ": unknown layout (one of: " + names + ")");
}

Status WriteText(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return Unavailable(path.string() + ": write failed");
  return Status::Ok();
}

Status WriteJson(const fs::path& path, const ojson& j) { return WriteText(path, j.dump(2) + "\n"); }

// The id of `content` in a tokenizer.json: an added token, else a vocabulary entry; -1: none.
int64_t TokenId(const json& tok, const std::string& content) {
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const auto& a : tok["added_tokens"]) {
      if (a.value("content", std::string()) == content && a.contains("id")) return a["id"].get<int64_t>();
    }
  }
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object()) {
    auto v = tok["model"]["vocab"].find(content);
    if (v != tok["model"]["vocab"].end() && v->is_number_integer()) return v->get<int64_t>();
  }
  return -1;
}

// vocab.json (ids ascending) and merges.txt ("#version: 0.2", one "a b" per line).
Status WriteVocabAndMerges(const fs::path& dir, const json& tok, const std::string& flag) {
  const json& model = tok["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges")) {
    return InvalidArgument(flag + ": tokenizer.json has no BPE vocab and merges");
  }
  std::vector<std::pair<int64_t, std::string>> by_id;
  for (const auto& [piece, id] : model["vocab"].items()) by_id.emplace_back(id.get<int64_t>(), piece);
  std::sort(by_id.begin(), by_id.end());
  // Written by hand: an ordered_json object inserts in linear time per key.
  std::string vocab = "{";
  for (const auto& [id, piece] : by_id) {
    vocab += (vocab.size() > 1 ? "," : "") + json(piece).dump() + ":" + std::to_string(id);
  }
  KVF_RETURN_IF_ERROR(WriteText(dir / "vocab.json", vocab + "}"));
  std::string merges = "#version: 0.2\n";
  for (const auto& m : model["merges"]) {
    if (m.is_string()) {
      merges += m.get<std::string>();
    } else if (m.is_array() && m.size() == 2) {  // newer tokenizers: ["a", "b"]
      merges += m[0].get<std::string>() + " " + m[1].get<std::string>();
    } else {
      return InvalidArgument(flag + ": tokenizer.json: a merge is neither \"a b\" nor [a, b]");
    }
    merges += "\n";
  }
  return WriteText(dir / "merges.txt", merges);
}

// Multiplies row `row` of `name` (a [rows, cols] bf16 or fp32 tensor) in the model's
// safetensors file by `scale`, in place.
Status ScaleRow(const std::string& dir, const std::string& name, int64_t row, double scale) {
  std::string file = "model.safetensors";
  if (fs::exists(dir + "/model.safetensors.index.json")) {
    KVF_ASSIGN_OR_RETURN(std::string text, ReadModelFile(dir + "/model.safetensors.index.json"));
    json index = json::parse(text, nullptr, false);
    if (index.is_discarded() || !index["weight_map"].contains(name)) return Internal(name + ": not in the index");
    file = index["weight_map"][name].get<std::string>();
  }
  const std::string path = dir + "/" + file;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return Unavailable(path + ": cannot open");
  uint8_t len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  json h = json::parse(header, nullptr, false);
  if (!f || h.is_discarded() || !h.contains(name)) return Internal(path + ": no tensor " + name);
  const json& t = h[name];
  const std::string dtype = t["dtype"].get<std::string>();
  const int64_t cols = t["shape"][1].get<int64_t>();
  const size_t size = dtype == "BF16" ? 2 : 4;
  if ((dtype != "BF16" && dtype != "F32") || row >= t["shape"][0].get<int64_t>()) {
    return Internal(path + ": " + name + " is not a bf16/fp32 matrix with row " + std::to_string(row));
  }
  const uint64_t at = 8 + header_len + t["data_offsets"][0].get<uint64_t>() + static_cast<uint64_t>(row * cols) * size;
  std::vector<char> bytes(static_cast<size_t>(cols) * size);
  f.seekg(static_cast<std::streamoff>(at));
  f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  for (int64_t i = 0; i < cols; ++i) {
    float v;
    if (size == 2) {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      uint32_t u = static_cast<uint32_t>(b) << 16;
      std::memcpy(&v, &u, 4);
      uint16_t out = model::F32ToBF16(static_cast<float>(v * scale));
      std::memcpy(&bytes[i * 2], &out, 2);
    } else {
      std::memcpy(&v, &bytes[i * 4], 4);
      v = static_cast<float>(v * scale);
      std::memcpy(&bytes[i * 4], &v, 4);
    }
  }
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return Unavailable(path + ": write failed");
  return Status::Ok();
}

}  // namespace

std::vector<std::string> ModelLayoutNames() {
  std::vector<std::string> out;
  for (const Layout& l : Layouts()) out.push_back(l.name);
  return out;
}

Result<int64_t> EndOfTurnId(const std::string& layout) {
  KVF_ASSIGN_OR_RETURN(Layout l, FindLayout(layout));
  return l.end_of_turn;
}

Status WriteModelLayout(const ModelLayoutOptions& o) {
  KVF_ASSIGN_OR_RETURN(Layout l, FindLayout(o.layout));
  const std::string tflag = "--tokenizer " + o.tokenizer_dir;
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) && !fs::is_empty(o.out_dir, ec)) {
    return InvalidArgument("--out " + o.out_dir + ": not empty (a layout writes exactly the repository's files)");
  }
  if (!(o.end_of_turn_scale > 0) || !std::isfinite(o.end_of_turn_scale)) {
    return InvalidArgument("--end-of-turn-scale: must be a positive number");
  }

  // The tokenizer: the repository's special tokens at its ids, and only its added tokens.
  KVF_ASSIGN_OR_RETURN(std::string tok_text, ReadModelFile(o.tokenizer_dir + "/tokenizer.json"));
  json tok = json::parse(tok_text, nullptr, false);
  if (tok.is_discarded() || !tok.is_object() || !tok.contains("model")) {
    return InvalidArgument(tflag + ": tokenizer.json is not a tokenizer");
  }
  bool rewritten = RenameReservedTokens(l, tok);
  for (const auto& [content, id] : l.tokens) {
    int64_t got = TokenId(tok, content);
    if (got != id) {
      return InvalidArgument(tflag + ": not " + l.repo + "'s tokenizer: " + content + " is " +
                             (got < 0 ? std::string("missing") : "id " + std::to_string(got)) + ", not " +
                             std::to_string(id));
    }
  }
  std::set<int64_t> kept_added;
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    json kept = json::array();
    for (const auto& a : tok["added_tokens"]) {
      int64_t id = a.value("id", int64_t{-1});
      if (l.max_added_id >= 0 && id > l.max_added_id) {
        rewritten = true;
        continue;
      }
      kept_added.insert(id);
      kept.push_back(a);
    }
    tok["added_tokens"] = std::move(kept);
  }
  int64_t max_id = -1;
  const json vocab = tok["model"].value("vocab", json::object());
  for (const auto& [piece, id] : vocab.items()) {
    if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
  }
  if (!kept_added.empty()) max_id = std::max(max_id, *kept_added.rbegin());
  // Llama4ForConditionalGeneration keeps the text model's fields under text_config.
  const ojson& text_config = l.config.contains("text_config") ? l.config["text_config"] : l.config;
  const int64_t vocab_size = text_config["vocab_size"].get<int64_t>();
  if (max_id >= vocab_size) {
    return InvalidArgument(tflag + ": token id " + std::to_string(max_id) + " does not fit " + l.repo +
                           "'s vocab_size " + std::to_string(vocab_size));
  }

  // The chat template: --chat-template FILE, else the tokenizer directory's.
  std::string chat_template;
  if (!o.chat_template_file.empty()) {
    auto text = ReadModelFile(o.chat_template_file);
    if (!text.ok()) return InvalidArgument("--chat-template " + o.chat_template_file + ": cannot read the file");
    chat_template = *text;
  } else {
    auto found = FindChatTemplate(o.tokenizer_dir);
    if (!found.ok()) return InvalidArgument(tflag + ": " + std::string(found.status().message()));
    if (!*found) {
      return InvalidArgument(tflag + ": no chat template (" + l.repo +
                             " ships one in tokenizer_config.json): give --chat-template FILE");
    }
    chat_template = (*found)->text;
  }
  if (chat_template.find(l.end_of_turn_text) == std::string::npos) {
    return InvalidArgument("the chat template does not write " + l.end_of_turn_text + ": not " + l.repo +
                           "'s (give its template with --chat-template FILE)");
  }

  // tokenizer_config.json: the directory's, with the repository's fields and template.
  ojson tcfg = ojson::object();
  if (auto text = ReadModelFile(o.tokenizer_dir + "/tokenizer_config.json"); text.ok()) {
    tcfg = ojson::parse(*text, nullptr, false);
    if (tcfg.is_discarded() || !tcfg.is_object()) {
      return InvalidArgument(tflag + ": tokenizer_config.json is not a JSON object");
    }
  }
  ojson decoder = ojson::object();
  const json added = tok.value("added_tokens", json::array());
  for (const auto& a : added) {
    decoder[std::to_string(a["id"].get<int64_t>())] =
        ojson{{"content", a["content"]},         {"lstrip", a.value("lstrip", false)},
              {"normalized", a.value("normalized", false)}, {"rstrip", a.value("rstrip", false)},
              {"single_word", a.value("single_word", false)}, {"special", a.value("special", true)}};
  }
  tcfg["added_tokens_decoder"] = decoder;
  for (const auto& [key, value] : l.tokenizer_config.items()) tcfg[key] = value;
  tcfg["chat_template"] = chat_template;

  // Stage the tokenizer files, so the model directory gets exactly these.
  const fs::path out(o.out_dir);
  const fs::path staging = out / ".layout-tokenizer";
  fs::create_directories(staging, ec);
  if (ec) return Unavailable(staging.string() + ": " + ec.message());
  // The source's bytes unless tokens were renamed or dropped (a rewrite orders the vocab by key).
  KVF_RETURN_IF_ERROR(WriteText(staging / "tokenizer.json", rewritten ? tok.dump() : tok_text));
  KVF_RETURN_IF_ERROR(WriteJson(staging / "tokenizer_config.json", tcfg));
  KVF_RETURN_IF_ERROR(WriteJson(staging / "generation_config.json", l.generation_config));
  if (l.vocab_and_merges) KVF_RETURN_IF_ERROR(WriteVocabAndMerges(staging, tok, tflag));
  if (l.special_tokens_map) {
    ojson map{{"bos_token", Token(tcfg["bos_token"].get<std::string>())},
              {"eos_token", Token(tcfg["eos_token"].get<std::string>())}};
    if (tcfg.contains("unk_token") && tcfg["unk_token"].is_string()) {
      map["unk_token"] = Token(tcfg["unk_token"].get<std::string>());
    }
    KVF_RETURN_IF_ERROR(WriteJson(staging / "special_tokens_map.json", map));
  }

  // Weights, sharded as many ways as the repository's.
  const std::string config_text = l.config.dump(2) + "\n";
  auto parsed = model::ParseModelConfig(config_text);
  if (!parsed.ok()) {
    fs::remove_all(staging, ec);
    return InvalidArgument("--layout " + l.name + ": this build cannot make " +
                           l.config["architectures"][0].get<std::string>() + " weights: " +
                           std::string(parsed.status().message()));
  }
  uint64_t total = 0;
  for (const auto& spec : model::ExpectedTensors(*parsed)) {
    uint64_t n = model::DTypeSize(o.dtype);
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  model::RandomModelOptions r;
  r.config = json::parse(config_text);
  r.tokenizer_dir = staging.string();
  r.out_dir = o.out_dir;
  r.seed = o.seed;
  r.dtype = o.dtype;
  r.max_shard_bytes = l.shards > 1 ? total / static_cast<uint64_t>(l.shards) + 1 : total + 1;
  Status made = model::MakeRandomModel(r);
  fs::remove_all(staging, ec);
  KVF_RETURN_IF_ERROR(made);
  if (!l.params_path.empty()) KVF_RETURN_IF_ERROR(WriteJson(out / l.params_path, l.params));
  if (o.end_of_turn_scale != 1.0) {
    KVF_RETURN_IF_ERROR(
        ScaleRow(o.out_dir, parsed->tensor_prefix + "lm_head.weight", l.end_of_turn, o.end_of_turn_scale));
  }
  return Status::Ok();
}

}  // namespace kvfleet::cli
