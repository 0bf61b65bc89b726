// PackedTokens: the actual tokens of every block entry of one pool, bit-packed at the width
// the vocabulary needs (17 bits for a 128K vocabulary: 68 B per 32-token block instead of
// 128 B), so the reuse tree can compare a block's real tokens, not just its hash.
//
// Entry e holds B tokens as one little-endian bit stream of B x bits bits in
// stride() = ceil(B x bits / 8) bytes. A token id >= 2^bits cannot be packed: Pack() refuses
// it, so a block holding one is never stored and never matches (a miss, never wrong KV).
// bits = 32 when the vocabulary size is unknown (0).
//
// Thread safety: thread-compatible; owned by its BlockPool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "worker/kv/huge_page_allocator.h"

namespace kvfleet::kv {

class PackedTokens {
 public:
  // REQUIRES: block_size >= 1.
  PackedTokens(uint32_t num_entries, uint32_t block_size, uint32_t vocab_size);

  static uint32_t BitsForVocab(uint32_t vocab_size);
  uint32_t bits() const { return bits_; }
  size_t stride() const { return stride_; }
  // Bytes a packing buffer needs (stride plus room for word-sized reads past its end).
  size_t buffer_bytes() const { return stride_ + kSlack; }

  // Packs B tokens into out[0, buffer_bytes()). False when a token needs more than bits().
  bool Pack(std::span<const TokenId> tokens, uint8_t* out) const;
  // Unpacks entry e's B tokens into out.
  void Unpack(uint32_t e, TokenId* out) const;
  void Unpack(uint32_t e, std::vector<TokenId>* out) const;
  // How many leading tokens of entry e equal want[0..] (at most min(B, want.size())).
  uint32_t CommonPrefix(uint32_t e, std::span<const TokenId> want) const;
  // Entry e equals the packed block.
  bool Equals(uint32_t e, const uint8_t* packed) const;
  void Set(uint32_t e, const uint8_t* packed);
  void Copy(uint32_t from, uint32_t to);
  const uint8_t* data(uint32_t e) const { return &bytes_[size_t{e} * stride_]; }

  size_t MemoryBytes() const { return bytes_.capacity(); }

 private:
  static constexpr size_t kSlack = 8;  // Unpack reads 4-byte words that may run past an entry
  void UnpackFrom(const uint8_t* in, TokenId* out) const;

  uint32_t block_size_;
  uint32_t bits_;
  size_t stride_;
  uint64_t limit_;  // 2^bits
  HugeVector<uint8_t> bytes_;  // [entry][stride] + kSlack
};

}  // namespace kvfleet::kv
