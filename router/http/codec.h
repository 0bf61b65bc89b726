// TextCodec: how the router turns prompts into token ids and generated ids back into
// text. With a model directory it is the model's tokenizer (tokenizer/); without
// one (a mock fleet) it is the byte codec: one token per UTF-8 byte, a plain-text chat
// template, and ids >= 256 shown as letters, since a mock worker's ids mean nothing.
//
// Thread safety: a TextCodec (and a ModelCodecs once filled) is immutable and shared; a
// StreamDecoder belongs to one request.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <span>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet::router {

class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  // The text that `id` completes (may be empty while a multi-byte character is partial).
  virtual std::string Push(TokenId id) = 0;
  virtual std::string Finish() = 0;
};

// How a chat is rendered (vLLM's request fields of the same names).
struct ChatTemplateOptions {
  bool add_generation_prompt = true;    // end with the assistant's turn opened
  bool continue_final_message = false;  // end inside the last message (a prefill); excludes the above
  bool add_special_tokens = false;      // BOS etc. on top of what the template wrote (/tokenize)
  std::string kwargs_json;              // chat_template_kwargs: a JSON object's text, empty: none
  // The request's function tools (chat_tools.h), the template's `tools` variable; null: none.
  std::shared_ptr<const nlohmann::ordered_json> tools;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // A completion prompt (with the tokenizer's special prefix, e.g. BOS).
  virtual Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const = 0;
  // The same without special tokens (/tokenize with add_special_tokens false). Default: as
  // EncodePrompt, for codecs that add none.
  virtual Result<std::vector<TokenId>> EncodeText(std::string_view text) const { return EncodePrompt(text); }
  // A chat: `messages` is the OpenAI messages array as NormalizeChatMessages left it (chat_messages.h), as
  // the request's parse left it, each object's keys in the client's order. FailedPrecondition: the model has no chat template;
  // Unimplemented: its template does not parse; both are the server's problem, not the
  // request's. InvalidArgument: the options do not fit the messages (continue_final_message
  // without a final message text to continue).
  virtual Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json& messages,
                                                  const ChatTemplateOptions& options) const = 0;
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json& messages) const {
    return EncodeChat(messages, ChatTemplateOptions{});
  }
  // Ids back to text, special tokens kept (/detokenize). Default: through NewDecoder.
  virtual std::string Decode(std::span<const TokenId> ids) const;
  // One id as the vocabulary spells it (/tokenize's token_strs). Default: Decode({id}).
  virtual std::string TokenString(TokenId id) const { return Decode(std::span<const TokenId>(&id, 1)); }
  // Ids at or past this are not the model's (0: any id decodes, the byte codec).
  virtual size_t vocab_size() const { return 0; }
  virtual std::unique_ptr<StreamDecoder> NewDecoder() const = 0;
  // A decoder that shows the special tokens `shown` (tool-call markers such as Mistral's
  // [TOOL_CALLS] and [ARGS]) where NewDecoder's hides special tokens. Default: NewDecoder().
  virtual std::unique_ptr<StreamDecoder> NewDecoderShowing(const std::vector<std::string_view>& shown) const {
    (void)shown;
    return NewDecoder();
  }
  // The chat template's source text, for what it writes (tool-call markers, <think>);
  // empty: none, or not Jinja (the byte codec).
  virtual std::string_view chat_template_text() const { return {}; }
  virtual std::vector<TokenId> eos_token_ids() const = 0;
  virtual std::string name() const = 0;
  // The byte codec: its ids are bytes, which only a mock worker accepts.
  virtual bool is_byte_codec() const { return false; }
};

std::unique_ptr<TextCodec> MakeByteCodec();

// The codec of each model a router serves: its own (--tokenizer MODEL=DIR), else the
// default (a plain --tokenizer DIR, else the byte codec). Filled at start-up, then only read.
class ModelCodecs {
 public:
  explicit ModelCodecs(std::shared_ptr<const TextCodec> fallback) : fallback_(std::move(fallback)) {}
  void Set(std::string model, std::shared_ptr<const TextCodec> codec) { by_model_[std::move(model)] = std::move(codec); }
  const std::shared_ptr<const TextCodec>& For(std::string_view model) const {
    auto it = by_model_.find(model);
    return it == by_model_.end() ? fallback_ : it->second;
  }
  const std::shared_ptr<const TextCodec>& fallback() const { return fallback_; }
  const std::map<std::string, std::shared_ptr<const TextCodec>, std::less<>>& by_model() const { return by_model_; }

 private:
  std::shared_ptr<const TextCodec> fallback_;
  std::map<std::string, std::shared_ptr<const TextCodec>, std::less<>> by_model_;
};

// The model's tokenizer from `model_dir` (tokenizer.json, tokenizer_config.json, and the
// chat template files tok::Tokenizer::Load names). A set `chat_template` replaces the
// directory's template and must parse. Unimplemented when this build has no tokenizer library.
Result<std::shared_ptr<const TextCodec>> LoadTokenizerCodec(const std::string& model_dir,
                                                            const std::optional<std::string>& chat_template = {});

}  // namespace kvfleet::router
