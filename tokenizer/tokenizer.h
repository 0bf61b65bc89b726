// Tokenizer: a Hugging Face `tokenizer.json` + `tokenizer_config.json` loaded from a model
// directory, encoding and decoding exactly as the Hugging Face reference does
// (@huggingface/tokenizers), and rendering the model's chat template.
//
// Supported pipelines (anything else fails to load with an error naming the component):
//   model:         BPE (byte-level or SentencePiece-style with byte_fallback, ignore_merges)
//   normalizer:    Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip
//   pre_tokenizer: Sequence, Split (Isolated / Removed), ByteLevel, Metaspace, Digits
//   post_processor: TemplateProcessing, ByteLevel, Sequence
//   decoder:       ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
// That covers Llama 2 / 3 / 3.1 / 3.2, TinyLlama, Mistral, Qwen2 / 2.5 / 3, SmolLM2, GPT-2.
//
// Encoding, as the reference does it:
//   1. invalid UTF-8 is replaced by U+FFFD the way a WHATWG TextDecoder does;
//   2. added tokens are cut out first (leftmost, longest), honouring lstrip / rstrip /
//      normalized / single_word; with EncodeOptions::parse_special = false special tokens
//      are plain text;
//   3. each remaining section is normalized, pre-tokenized (PCRE2 regexes with Unicode
//      properties) and run through the model, independently of the other sections;
//   4. the post-processor adds BOS etc. when add_special_tokens is set.
//
// Section cache: chat prompts repeat long sections (system prompt, few-shot examples,
// earlier turns), so step 3's ids for each section of >= 512 bytes are kept in a
// per-thread LRU cache (section_cache.h; 8 MiB per thread), keyed by the tokenizer
// instance, parse_special, whether the section comes first and its text. A repeated
// section costs a hash, one compare and a copy of its ids instead of its encoding. The
// ids are exactly those of an uncached encode (tests compare both on real tokenizers).
//
// Thread safety: a loaded Tokenizer is immutable and thread-safe; share it through the
// shared_ptr that Load returns. Encode takes no lock: the section cache and the BPE word
// cache are thread_local, so each thread warms its own. IncrementalDecoder is
// thread-compatible (one per stream).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet::tok {

struct EncodeOptions {
  bool add_special_tokens = true;  // BOS etc., as the post_processor says
  bool parse_special = true;       // false: special-token text in user input is plain text
  // false: neither read nor fill this thread's section cache (tests compare against it;
  // also for one-off texts that should not evict repeated ones).
  bool use_section_cache = true;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
  // Applies tokenizer_config's clean_up_tokenization_spaces (" ." -> "." etc.) when it is
  // set there, as the reference does. Streams never clean up: it could change sent text.
  bool clean_up_tokenization_spaces = true;
};

struct LoadOptions {
  // A chat template that replaces the model directory's (the router's --chat-template); it
  // must parse. Unset: the directory's, found as ChatTemplateSource describes.
  std::optional<std::string> chat_template;
};

class TokenizerImpl;

class Tokenizer {
 public:
  // Loads tokenizer.json + tokenizer_config.json (and generation_config.json's eos ids,
  // when present) from a HF model directory, and its chat template: chat_template.jinja,
  // else chat_template.json's "chat_template", else tokenizer_config.json's (a malformed
  // chat_template.json fails the load).
  static Result<std::shared_ptr<const Tokenizer>> Load(const std::string& model_dir, const LoadOptions& options = {});
  // The same from the files' contents; `generation_config_json` may be empty. A set
  // `chat_template` replaces tokenizer_config.json's, and must parse.
  static Result<std::shared_ptr<const Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                           std::string_view tokenizer_config_json,
                                                           std::string_view generation_config_json = {},
                                                           std::optional<std::string> chat_template = {});
  ~Tokenizer();

  // Thread-safe; repeated long sections hit the calling thread's section cache.
  Result<std::vector<TokenId>> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Ids outside the vocabulary decode to the unknown token, or to nothing without one.
  std::string Decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;
  std::string Decode(std::span<const TokenId> ids, const DecodeOptions& options) const;

  // Renders the chat template. messages: [{"role":..,"content":..}, ...]. extra_context adds
  // variables (tools, date_string, enable_thinking, ...). Objects keep their key order, so
  // `tojson` prints them as transformers does; an nlohmann::json argument has lost its
  // input order already (its objects are sorted). FailedPrecondition when the model has no
  // template; Unimplemented when its template did not parse.
  Result<std::string> ApplyChatTemplate(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                        const nlohmann::ordered_json& extra_context =
                                            nlohmann::ordered_json::object()) const;
  bool has_chat_template() const;
  // Where the chat template came from: "chat_template.jinja", "chat_template.json",
  // "tokenizer_config.json", "override" (LoadOptions), or "" (none).
  const std::string& chat_template_source() const;
  // The chat template's text as loaded (empty: none).
  const std::string& chat_template_text() const;

  // From tokenizer_config's eos_token and generation_config's eos_token_id, deduplicated.
  const std::vector<TokenId>& eos_token_ids() const;
  std::optional<TokenId> bos_token_id() const;
  // Number of ids: the model's vocabulary plus added tokens (one past the largest id).
  size_t vocab_size() const;

  // The id of a token's text (vocabulary or added token), if it has one.
  std::optional<TokenId> TokenToId(std::string_view token) const;
  // The token's text as the vocabulary spells it (byte-level symbols, "▁" ...); empty when
  // the id is unknown.
  std::string IdToToken(TokenId id) const;
  bool IsSpecial(TokenId id) const;
  // The bytes a token stands for, for matching generated text byte by byte (constrained
  // decoding): a byte-level token's symbols mapped back to bytes, a byte-fallback <0xXX> as
  // its byte, a SentencePiece "▁" as a space, an added token as its content. Empty when the
  // id is unknown. A token may be part of a UTF-8 character.
  std::string TokenBytes(TokenId id) const;

  const TokenizerImpl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Streaming detokenizer: never emits half a UTF-8 character, never changes emitted text.
// The concatenation of every Push and the Finish equals
// tok->Decode(ids, {skip_special_tokens, .clean_up_tokenization_spaces = false}).
// Thread-compatible: one per stream.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens = true);
  std::string Push(TokenId id);  // the new text that is final now (maybe empty)
  std::string Finish();          // whatever is left

 private:
  std::shared_ptr<const Tokenizer> tok_;
  DecodeOptions options_;
  std::vector<TokenId> ids_;
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) are emitted context
  size_t read_offset_ = 0;    // ids_[read_offset_, end) are not yet emitted
};

}  // namespace kvfleet::tok
