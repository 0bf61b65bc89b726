// The steps of a tokenizer.json pipeline around the model: normalizers, pre-tokenizers,
// post-processors and decoders, each built from its JSON object. A type we do not
// support fails with Unimplemented naming it, so a tokenizer is never mis-run.
//
// Semantics follow the JavaScript reference (@huggingface/tokenizers), which is what the
// tests compare against.
//
// Thread safety: immutable after construction; every method is const and thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // REQUIRES: text is valid UTF-8; it stays so.
  virtual Status Apply(std::string* text) const = 0;
};
// Null JSON gives a null normalizer.
Result<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& config);

// A pre-tokenizer splits one piece of text into pieces, each of which the model encodes
// separately. Emitted views stay valid until the Emit callback returns.
class PreTokenizer {
 public:
  using Emit = std::function<void(std::string_view)>;
  virtual ~PreTokenizer() = default;
  // section_index: the position of this text among the added-token sections (Metaspace's
  // prepend_scheme "first" prepends only in section 0). The section cache (section_cache.h)
  // keys on section_index == 0 only: a step that used the index otherwise must widen its key.
  // Fails only when a regex hits PCRE2's limits on hostile input.
  virtual Status Apply(std::string_view text, int section_index, const Emit& emit) const = 0;
};
// Null JSON gives a null pre-tokenizer. *byte_level is set when the last step is
// ByteLevel: pieces are then emitted as raw bytes for the model to map.
Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& config, bool* byte_level);

// The special tokens a post-processor adds around one sequence when add_special_tokens.
struct PostProcessor {
  std::vector<std::string> prefix;  // token strings before the sequence
  std::vector<std::string> suffix;  // and after it
};
Result<PostProcessor> MakePostProcessor(const nlohmann::json& config);

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings (the reference's decode_chain); the text is their concatenation.
  virtual void Apply(std::vector<std::string>* tokens) const = 0;
};
// Null JSON gives a null decoder. `is_added(token)` says whether a token string is an
// added token (ByteLevel passes those through unchanged).
Result<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& config,
                                             std::function<bool(std::string_view)> is_added);

}  // namespace kvfleet::tok
