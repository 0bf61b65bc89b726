// Block hashing: Contract 1 of docs/DESIGN.md. The router and every worker must
// compute the same hash for the same prefix; schema/README.md holds test vectors.
//
//   seed    = XXH3_64(model ‖ 0x00 ‖ lora ‖ 0x00 ‖ cache_salt)
//   local_i = XXH3_64_withSeed(tokens[i·B, (i+1)·B) as little-endian u32, seed)
//   seq_0   = XXH3_64(le64(seed) ‖ le64(local_0))
//   seq_i   = XXH3_64(le64(seq_{i-1}) ‖ le64(local_i))
//
// Only full blocks are hashed; a trailing partial block has no hash.
//
// Thread safety: BlockHasher is immutable after construction and may be shared.
// BlockHashChain is a value owned by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvfleet {

using TokenId = uint32_t;
using BlockHash = uint64_t;

// The cache namespace of a request: blocks hash alike only within the same one.
struct HashNamespace {
  std::string_view model;
  std::string_view lora;        // empty when absent
  std::string_view cache_salt;  // empty when absent
};

// XXH3_64(model ‖ 0x00 ‖ lora ‖ 0x00 ‖ cache_salt).
uint64_t HashSeed(const HashNamespace& ns);

// Contract 2's StoredBlock.loraId of an adapter: XXH3_64(lora) (0 is sent as 1); 0 for the
// base model (an empty name).
uint64_t LoraId(std::string_view lora);

// local_i for one block of tokens.
uint64_t LocalBlockHash(std::span<const TokenId> block_tokens, uint64_t seed);

// seq_i from seq_{i-1} (or the seed, for block 0) and local_i.
BlockHash ChainBlockHash(uint64_t parent, uint64_t local);

// REQUIRES: block_size is a power of two.
bool IsValidBlockSize(uint32_t block_size);

class BlockHasher {
 public:
  // REQUIRES: IsValidBlockSize(block_size).
  BlockHasher(uint32_t block_size, const HashNamespace& ns);
  static Result<BlockHasher> Make(uint32_t block_size, const HashNamespace& ns);

  uint32_t block_size() const { return block_size_; }
  uint64_t seed() const { return seed_; }

  // The sequence hashes of every full block of `tokens`, in order.
  std::vector<BlockHash> HashAll(std::span<const TokenId> tokens) const;
  // Appends to `out` the hashes of full blocks beyond the `out->size()` already there.
  // Extending a prompt re-hashes only its new blocks.
  void Extend(std::span<const TokenId> tokens, std::vector<BlockHash>* out) const;
  // The hash of the block following `parent` (the seed for block 0).
  BlockHash Next(uint64_t parent, std::span<const TokenId> block_tokens) const {
    return ChainBlockHash(parent, LocalBlockHash(block_tokens, seed_));
  }

 private:
  uint32_t block_size_;
  uint64_t seed_;
};

}  // namespace kvfleet
