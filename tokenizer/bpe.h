// BpeModel: the "BPE" model of a tokenizer.json. It turns one pre-token into ids by
// applying merges lowest rank first (leftmost on ties), as the reference does.
//
// Two spellings of the vocabulary are supported:
//   - byte-level (GPT-2, Llama 3, Qwen): vocabulary tokens are spelled in the byte-level
//     alphabet; Encode takes the pre-token's raw bytes and maps them itself, so no
//     byte-level string is ever built on the hot path;
//   - plain (SentencePiece-style, Llama 2 / Mistral): symbols are code points, and a
//     symbol left outside the vocabulary becomes <0xXX> byte tokens (byte_fallback) or
//     the unknown token.
//
// Thread safety: immutable after FromJson; Encode is thread-safe (its word cache is
// per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet::tok {

// An open-addressing map from strings to ids; lookups take string_views.
class StringIdMap {
 public:
  void Reserve(size_t n);
  // Returns false when `key` is already present (the first id stays).
  bool Insert(std::string_view key, TokenId id);
  std::optional<TokenId> Find(std::string_view key) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    TokenId id = 0;
    bool used = false;
  };
  void Grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object. `byte_level`: the pre-tokenizer ends in
  // ByteLevel, so pre-tokens reach Encode as raw bytes.
  static Result<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model, bool byte_level);
  ~BpeModel();

  // Appends the ids of one pre-token. REQUIRES: word is valid UTF-8 unless byte_level.
  void Encode(std::string_view word, std::vector<TokenId>* out) const;

  std::optional<TokenId> TokenToId(std::string_view token) const { return vocab_.Find(token); }
  // One past the largest vocabulary id.
  size_t id_limit() const { return id_to_token_.size(); }
  // The token's spelling; empty for an id without one.
  const std::string& IdToToken(TokenId id) const;
  std::optional<TokenId> unk_id() const { return unk_id_; }
  const std::string& unk_token() const { return unk_token_; }
  bool fuse_unk() const { return fuse_unk_; }
  bool byte_level() const { return byte_level_; }

 private:
  struct Merge {
    uint32_t rank;
    uint32_t result;  // a vocabulary id, or kExtraBase + index into extra_tokens_
  };
  class MergeMap;

  BpeModel();
  // Ids >= kExtraBase name merge results outside the vocabulary; kUnknownSymbol a
  // character outside it.
  static constexpr uint32_t kExtraBase = 0x80000000u;
  static constexpr uint32_t kUnknownSymbol = 0xFFFFFFFFu;

  // Encode without the per-thread word cache.
  void EncodeUncached(std::string_view word, std::vector<TokenId>* out) const;
  // Emits a symbol that is no vocabulary id: byte fallback, else unk, else nothing.
  void EmitUnknown(std::string_view text, std::vector<TokenId>* out) const;

  const uint32_t cache_id_;  // tells this model's entries in the per-thread word cache
  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<TokenId> unk_id_;
  std::string unk_token_;
  StringIdMap vocab_;      // spelling -> id
  StringIdMap raw_vocab_;  // byte-level only: the raw bytes a token stands for -> id
  std::vector<std::string> id_to_token_;
  std::vector<std::string> extra_tokens_;
  std::vector<uint32_t> byte_symbol_;       // byte-level: byte -> symbol
  StringIdMap char_symbol_;                 // plain: one character -> symbol
  std::vector<uint32_t> byte_fallback_ids_;  // byte -> id of <0xXX>, or kUnknownSymbol
  std::unique_ptr<MergeMap> merges_;
};

}  // namespace kvfleet::tok
