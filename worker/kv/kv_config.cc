#include "worker/kv/kv_config.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "common/block_hash.h"

namespace kvfleet::kv {

Status KvCacheConfig::Validate() const {
  if (num_layers == 0) return InvalidArgument("kv: num_layers must be > 0");
  if (num_kv_heads.empty()) return InvalidArgument("kv: num_kv_heads is empty");
  if (std::find(num_kv_heads.begin(), num_kv_heads.end(), 0u) != num_kv_heads.end()) {
    return InvalidArgument("kv: num_kv_heads must be > 0");
  }
  if (head_dim == 0) return InvalidArgument("kv: head_dim must be > 0");
  if (dtype_bytes == 0) return InvalidArgument("kv: dtype_bytes must be > 0");
  if (max_seq_len == 0) return InvalidArgument("kv: max_seq_len must be > 0");
  if (!IsValidBlockSize(block_size)) {
    return InvalidArgument("kv: block_size " + std::to_string(block_size) + " is not a power of two");
  }
  if (routing_block_size != 0 && (!IsValidBlockSize(routing_block_size) || routing_block_size < block_size)) {
    return InvalidArgument("kv: routing_block_size " + std::to_string(routing_block_size) +
                           " is not a power of two >= block_size " + std::to_string(block_size));
  }
  if (offload_min_priority > kMaxPriority) return InvalidArgument("kv: offload_min_priority > 100");
  if (device_bytes == 0) return InvalidArgument("kv: device_bytes must be > 0");
  if (!chunked_layers.empty() && chunked_layers.size() != num_layers) {
    return InvalidArgument("kv: chunked_layers has " + std::to_string(chunked_layers.size()) + " entries for " +
                           std::to_string(num_layers) + " layers");
  }
  if (attention_chunk_size % block_size != 0) {
    return InvalidArgument("kv: attention_chunk_size " + std::to_string(attention_chunk_size) +
                           " is not a multiple of block_size " + std::to_string(block_size));
  }
  uint32_t windowed = 0;
  for (uint32_t l = 0; l < num_layers; ++l) {
    const uint32_t w = WindowOfLayer(l);
    if (w == 0) continue;
    ++windowed;
    if (w < sink_tokens) {
      return InvalidArgument("kv: layer " + std::to_string(l) + "'s window of " + std::to_string(w) +
                             " tokens is shorter than its " + std::to_string(sink_tokens) + " sink tokens");
    }
  }
  if ((sink_tokens > 0 || dense_context) && windowed == 0) {
    return InvalidArgument("kv: sink_tokens and dense_context need a layer with a window shorter than max_seq_len");
  }
  // A chunked mask hides the sinks, and a chunk ends the dense phase's view of the prompt.
  if ((sink_tokens > 0 || dense_context) && attention_chunk_size > 0) {
    return InvalidArgument("kv: sink_tokens and dense_context do not combine with attention_chunk_size");
  }
  return Status::Ok();
}

uint32_t KvCacheConfig::ChunkOfLayer(uint32_t layer) const {
  return chunked_layers.empty() || (layer < chunked_layers.size() && chunked_layers[layer]) ? attention_chunk_size : 0;
}

uint32_t KvCacheConfig::WindowOfLayer(uint32_t layer) const {
  if (attention_windows.empty()) return 0;
  const uint32_t w = attention_windows[layer % attention_windows.size()];
  return w >= max_seq_len ? 0 : w;  // a window as long as the context is full attention
}

uint32_t DefaultRoutingBlockSize(uint32_t block_size) {
  return block_size == 1 ? config::kTokenKvRoutingBlockSize : block_size;
}

uint32_t KvCacheConfig::EventBlockSize() const {
  return routing_block_size != 0 ? routing_block_size : DefaultRoutingBlockSize(block_size);
}

uint32_t KvCacheConfig::KvHeadsOfLayer(uint32_t layer) const { return num_kv_heads[layer % num_kv_heads.size()]; }

uint64_t DeviceBudgetFromFreeMemory(uint64_t free_bytes, double fraction) {
  if (fraction <= 0) return 0;
  if (fraction >= 1) return free_bytes;
  return static_cast<uint64_t>(static_cast<double>(free_bytes) * fraction);
}

Result<std::vector<PoolLayout>> ComputePools(const KvCacheConfig& c) {
  // Keyed by (window, chunk, heads): full attention (window 0, chunk 0) sorts first.
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, PoolLayout> by_key;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const uint32_t w = c.WindowOfLayer(l);
    const uint32_t h = c.KvHeadsOfLayer(l);
    const uint32_t chunk = c.ChunkOfLayer(l);
    PoolLayout& p = by_key[{w, chunk, h}];
    p.window = w;
    p.sink_tokens = w != 0 ? c.sink_tokens : 0;
    p.dense_context = w != 0 && c.dense_context;
    p.attention_chunk = chunk;
    p.num_kv_heads = h;
    p.layers.push_back(l);
  }
  std::vector<PoolLayout> pools;
  double total_weight = 0;
  for (auto& [key, p] : by_key) {
    p.bytes_per_block = uint64_t{p.layers.size()} * 2 * p.num_kv_heads * c.head_dim * c.dtype_bytes * c.block_size;
    pools.push_back(std::move(p));
  }
  // Weight = bytes per token x effective window x layers (bytes_per_block already holds layers).
  std::vector<double> weight;
  for (const auto& p : pools) {
    const double window = p.window == 0 ? c.max_seq_len : std::min(p.window, c.max_seq_len);
    weight.push_back(static_cast<double>(p.bytes_per_block) * window);
    total_weight += weight.back();
  }
  for (size_t i = 0; i < pools.size(); ++i) {
    const double share = weight[i] / total_weight;
    const uint64_t dev = static_cast<uint64_t>(static_cast<double>(c.device_bytes) * share) / pools[i].bytes_per_block;
    const uint64_t host = static_cast<uint64_t>(static_cast<double>(c.host_bytes) * share) / pools[i].bytes_per_block;
    // Block ids are 32-bit; node ids span both tiers.
    if (dev + host >= UINT32_MAX / 2) return InvalidArgument("kv: too many blocks for 32-bit block ids");
    if (dev == 0) {
      return ResourceExhausted("kv: device budget of " + std::to_string(c.device_bytes) +
                               " bytes gives pool (window " + std::to_string(pools[i].window) +
                               ") no block of " + std::to_string(pools[i].bytes_per_block) + " bytes");
    }
    pools[i].device_blocks = static_cast<uint32_t>(dev);
    pools[i].host_blocks = static_cast<uint32_t>(host);
  }
  return pools;
}

Status SizeForBlocksPerPool(KvCacheConfig* config, uint64_t blocks_per_pool) {
  KVF_RETURN_IF_ERROR(config->Validate());
  KVF_ASSIGN_OR_RETURN(auto probe, ComputePools(*config));
  uint64_t per_block = 0;
  for (const auto& p : probe) per_block += p.bytes_per_block;
  config->device_bytes = blocks_per_pool * per_block;
  return Status::Ok();
}

}  // namespace kvfleet::kv
