#include "common/block_hash.h"

#include <bit>
#include <cstring>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/check.h"

namespace kvfleet {

static_assert(std::endian::native == std::endian::little,
              "Contract 1 hashes little-endian u32 tokens; a big-endian port must byte-swap them");

uint64_t HashSeed(const HashNamespace& ns) {
  std::string buf;
  buf.reserve(ns.model.size() + ns.lora.size() + ns.cache_salt.size() + 2);
  buf.append(ns.model);
  buf.push_back('\0');
  buf.append(ns.lora);
  buf.push_back('\0');
  buf.append(ns.cache_salt);
  return XXH3_64bits(buf.data(), buf.size());
}

uint64_t LoraId(std::string_view lora) {
  if (lora.empty()) return 0;
  const uint64_t id = XXH3_64bits(lora.data(), lora.size());
  return id == 0 ? 1 : id;
}

uint64_t LocalBlockHash(std::span<const TokenId> block_tokens, uint64_t seed) {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), seed);
}

BlockHash ChainBlockHash(uint64_t parent, uint64_t local) {
  unsigned char buf[16];
  std::memcpy(buf, &parent, 8);
  std::memcpy(buf + 8, &local, 8);
  return XXH3_64bits(buf, sizeof(buf));
}

bool IsValidBlockSize(uint32_t block_size) { return std::has_single_bit(block_size); }

BlockHasher::BlockHasher(uint32_t block_size, const HashNamespace& ns)
    : block_size_(block_size), seed_(HashSeed(ns)) {
  KVF_CHECK(IsValidBlockSize(block_size)) << "block size " << block_size << " is not a power of two";
}

Result<BlockHasher> BlockHasher::Make(uint32_t block_size, const HashNamespace& ns) {
  if (!IsValidBlockSize(block_size)) {
    return InvalidArgument("block size " + std::to_string(block_size) + " is not a power of two");
  }
  return BlockHasher(block_size, ns);
}

std::vector<BlockHash> BlockHasher::HashAll(std::span<const TokenId> tokens) const {
  std::vector<BlockHash> out;
  out.reserve(tokens.size() / block_size_);
  Extend(tokens, &out);
  return out;
}

void BlockHasher::Extend(std::span<const TokenId> tokens, std::vector<BlockHash>* out) const {
  const size_t full = tokens.size() / block_size_;
  uint64_t parent = out->empty() ? seed_ : out->back();
  for (size_t i = out->size(); i < full; ++i) {
    parent = Next(parent, tokens.subspan(i * block_size_, block_size_));
    out->push_back(parent);
  }
}

}  // namespace kvfleet
