#include "worker/kv/block_copier.h"

#include <cstring>

#include "common/check.h"

namespace kvfleet::kv {

void MemcpyBlockCopier::Copy(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    KVF_CHECK_LT(c.pool, arenas_.size());
    const Arena& a = arenas_[c.pool];
    std::byte* src_base = c.src_tier == Tier::kDevice ? a.device : a.host;
    std::byte* dst_base = c.dst_tier == Tier::kDevice ? a.device : a.host;
    KVF_CHECK(src_base != nullptr && dst_base != nullptr) << "copy to or from a tier without memory";
    std::memmove(dst_base + size_t{c.dst} * a.bytes_per_block, src_base + size_t{c.src} * a.bytes_per_block,
                 a.bytes_per_block);
  }
}

}  // namespace kvfleet::kv
