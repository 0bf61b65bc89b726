// The files of a Hugging Face model directory that decide how text becomes token ids:
// where its chat template is, and the tokenizer digest that a worker's Hello carries
// (Contract 3) so a router can refuse a worker whose tokenizer is not its own.
//
// These live in common/ because both sides read them: the router's tokenizer (tokenizer/)
// finds its chat template here, and the worker, which may not include tokenizer/
// (tests/layering_test.sh), digests the same files the same way. Only files are read; no
// tokenizer is built.
//
//   digest = XXH3_64(tokenizer.json's bytes ‖ 0x00 ‖ the chat template's text)
//
// The template is the one FindChatTemplate picks (empty when there is none). 0 means "no
// tokenizer" (no tokenizer.json); a computed 0 is sent as 1.
//
// Thread safety: pure functions (they read files).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace kvfleet {

struct ChatTemplateText {
  std::string text;
  std::string source;  // "chat_template.jinja", "chat_template.json" or "tokenizer_config.json"
};

// tokenizer_config.json's "chat_template": a string, or a list of {name, template} whose
// "default" entry is used. nullopt when absent or empty.
std::optional<std::string> ChatTemplateOfConfig(const nlohmann::json& tokenizer_config);

// The model directory's chat template file, in Hugging Face transformers' precedence:
//   1. chat_template.jinja: a tokenizer's from_pretrained lets it clobber tokenizer_config.json's
//      (tokenization_utils_base.py; tests/test_tokenization_common.py,
//      test_chat_template_file_priority).
//   2. chat_template.json, {"chat_template": "..."}: LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE, read
//      only by processors (processing_utils.py, get_processor_dict), whose template is passed
//      over the tokenizer's. A processor takes it even over a chat_template.jinja beside it,
//      but a text model loads through its tokenizer, which reads only the .jinja ("a raw
//      chat_template.jinja is preferred in future"), so the .jinja goes first here.
// nullopt when neither file exists; InvalidArgument for a malformed chat_template.json.
Result<std::optional<ChatTemplateText>> FindChatTemplateFile(const std::string& model_dir);

// FindChatTemplateFile, else tokenizer_config.json's (3.). nullopt: the model has none.
Result<std::optional<ChatTemplateText>> FindChatTemplate(const std::string& model_dir);

// The digest above from the files' contents (`chat_template` empty when there is none).
uint64_t TokenizerDigestOf(std::string_view tokenizer_json, std::string_view chat_template);

// The digest of `model_dir`'s tokenizer: 0 when it has no tokenizer.json (a mock's
// directory, or none); an error when a file cannot be read or chat_template.json is malformed.
Result<uint64_t> TokenizerDigest(const std::string& model_dir);

// A model directory file's bytes; NotFound when it cannot be read.
Result<std::string> ReadModelFile(const std::string& path);

// "0x" and 16 hex digits, as logs and /fleet show a digest.
std::string DigestHex(uint64_t digest);

}  // namespace kvfleet
