#include "common/tokenizer_files.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace kvfleet {
using nlohmann::json;

Result<std::string> ReadModelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<std::string> ChatTemplateOfConfig(const json& config) {
  if (!config.is_object() || !config.contains("chat_template")) return std::nullopt;
  std::string source;
  const json& ct = config["chat_template"];
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    for (const auto& entry : ct) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        source = entry["template"].get<std::string>();
      }
    }
  }
  if (source.empty()) return std::nullopt;
  return source;
}

Result<std::optional<ChatTemplateText>> FindChatTemplateFile(const std::string& model_dir) {
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    KVF_ASSIGN_OR_RETURN(std::string text, ReadModelFile(jinja_path));
    return std::make_optional(ChatTemplateText{std::move(text), "chat_template.jinja"});
  }
  const std::string json_path = model_dir + "/chat_template.json";
  if (!std::filesystem::exists(json_path)) return std::optional<ChatTemplateText>();
  KVF_ASSIGN_OR_RETURN(std::string text, ReadModelFile(json_path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(json_path + ": not a JSON object");
  auto ct = j.find("chat_template");
  if (ct == j.end() || !ct->is_string()) return InvalidArgument(json_path + ": chat_template: missing or not a string");
  return std::make_optional(ChatTemplateText{ct->get<std::string>(), "chat_template.json"});
}

Result<std::optional<ChatTemplateText>> FindChatTemplate(const std::string& model_dir) {
  KVF_ASSIGN_OR_RETURN(auto file, FindChatTemplateFile(model_dir));
  if (file) return file;
  auto config_text = ReadModelFile(model_dir + "/tokenizer_config.json");
  if (!config_text.ok()) return std::optional<ChatTemplateText>();
  json config = json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
  auto text = ChatTemplateOfConfig(config);
  if (!text) return std::optional<ChatTemplateText>();
  return std::make_optional(ChatTemplateText{std::move(*text), "tokenizer_config.json"});
}

uint64_t TokenizerDigestOf(std::string_view tokenizer_json, std::string_view chat_template) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, tokenizer_json.data(), tokenizer_json.size());
  const char zero = 0;
  XXH3_64bits_update(state, &zero, 1);
  XXH3_64bits_update(state, chat_template.data(), chat_template.size());
  uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest == 0 ? 1 : digest;
}

Result<uint64_t> TokenizerDigest(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  if (model_dir.empty() || !std::filesystem::exists(path)) return uint64_t{0};
  KVF_ASSIGN_OR_RETURN(std::string tokenizer_json, ReadModelFile(path));
  KVF_ASSIGN_OR_RETURN(auto chat_template, FindChatTemplate(model_dir));
  return TokenizerDigestOf(tokenizer_json, chat_template ? chat_template->text : std::string());
}

std::string DigestHex(uint64_t digest) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

}  // namespace kvfleet
