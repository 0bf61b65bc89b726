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
#include <vector>

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

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // A completion prompt (with the tokenizer's special prefix, e.g. BOS).
  virtual Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const = 0;
  // A chat: `messages_json` is the validated OpenAI messages array. FailedPrecondition:
  // the model has no chat template; Unimplemented: its template does not parse; both are
  // the server's problem, not the request's.
  virtual Result<std::vector<TokenId>> EncodeChat(std::string_view messages_json) const = 0;
  virtual std::unique_ptr<StreamDecoder> NewDecoder() const = 0;
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
