#include "worker/backend/kv_setup.h"

#include <string>

namespace kvfleet::backend {

kv::KvCacheConfig KvCacheConfigFor(const model::ModelConfig& model, const KvMemorySettings& memory) {
  kv::KvCacheConfig c;
  c.num_layers = static_cast<uint32_t>(model.num_layers);
  c.num_kv_heads = {static_cast<uint32_t>(model.num_kv_heads)};
  c.head_dim = static_cast<uint32_t>(model.head_dim);
  c.dtype_bytes = memory.dtype_bytes;
  c.attention_windows.clear();
  for (int64_t w : model.layer_window) c.attention_windows.push_back(static_cast<uint32_t>(w));
  if (c.attention_windows.empty()) c.attention_windows = {0};
  c.max_seq_len = memory.max_context;
  c.attention_chunk_size = static_cast<uint32_t>(model.attention_chunk_size);
  c.vocab_size = static_cast<uint32_t>(model.vocab_size);  // cached tokens are stored in just the bits it needs
  c.block_size = memory.block_size;
  c.device_bytes = memory.device_bytes;
  c.host_bytes = memory.host_bytes;
  c.offload_min_priority = memory.offload_min_priority;
  c.enable_offload = memory.host_bytes > 0;
  c.events_include_tokens = memory.events_include_tokens;
  return c;
}

KvMemorySettings KvMemoryOf(const ModelBackend& backend) {
  KvMemorySettings m;
  m.block_size = static_cast<uint32_t>(backend.block_size());
  m.max_context = static_cast<uint32_t>(backend.max_context());
  const auto pools = backend.pools();
  if (!pools.empty()) {
    const KvPoolInfo& p = pools[0];
    const uint64_t elements = static_cast<uint64_t>(p.layers.size()) * 2 * static_cast<uint64_t>(p.num_kv_heads) *
                              static_cast<uint64_t>(p.head_dim) * m.block_size;
    if (elements > 0) m.dtype_bytes = static_cast<uint32_t>(p.bytes_per_block / elements);
  }
  for (const KvPoolInfo& p : pools) {
    m.device_bytes += static_cast<uint64_t>(p.device_blocks) * p.bytes_per_block;
    m.host_bytes += static_cast<uint64_t>(p.host_blocks) * p.bytes_per_block;
  }
  return m;
}

Status CheckPoolsAgree(std::span<const kv::PoolLayout> kv_pools, std::span<const KvPoolInfo> backend_pools) {
  if (kv_pools.size() != backend_pools.size()) {
    return Internal("the KV manager has " + std::to_string(kv_pools.size()) + " pools, the backend " +
                    std::to_string(backend_pools.size()));
  }
  for (size_t i = 0; i < kv_pools.size(); ++i) {
    const kv::PoolLayout& k = kv_pools[i];
    const KvPoolInfo& b = backend_pools[i];
    if (static_cast<int64_t>(k.window) != b.window || static_cast<int64_t>(k.num_kv_heads) != b.num_kv_heads ||
        static_cast<int64_t>(k.device_blocks) != b.device_blocks || static_cast<int64_t>(k.host_blocks) != b.host_blocks) {
      return Internal("KV pool " + std::to_string(i) + ": the manager has window " + std::to_string(k.window) + ", " +
                      std::to_string(k.device_blocks) + "+" + std::to_string(k.host_blocks) +
                      " blocks; the backend window " + std::to_string(b.window) + ", " +
                      std::to_string(b.device_blocks) + "+" + std::to_string(b.host_blocks));
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::backend
