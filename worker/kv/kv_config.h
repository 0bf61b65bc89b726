// KvCacheConfig: every setting of the KV cache manager, with its default and unit, and
// PoolLayout: the pools it derives from the model shape and the byte budget.
//
// Pools (TensorRT-LLM's variable sliding window attention): one pool per distinct
// (attention window, kv heads) pair among the layers. A block holds B tokens for every layer
// of its pool. The device budget is split between pools in proportion to
// per-token bytes x effective window x layers, where a full-attention layer's window is
// max_seq_len. The host budget is split the same way.
//
// Bytes per block of a pool = layers_in_pool x 2 (K, V) x num_kv_heads x head_dim x
// dtype_bytes x B (block_copier.h gives the memory layout). The backend supplies the byte
// budget: a number of bytes, or DeviceBudgetFromFreeMemory(free, fraction).
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "schema/kv_event.h"

namespace kvfleet::kv {

namespace config {
// TensorRT-LLM's default tokens_per_block is 64, vLLM's 16; 32 keeps per-block bookkeeping
// well under the KV it describes while losing at most 31 tokens of reuse per request.
constexpr uint32_t kDefaultBlockSize = 32;
// Token-level KV (B = 1) publishes its events and is hashed by routers in groups of this
// many tokens: one event block per token would cost the routers' index 16x the entries of
// B = 16 for no better routing (a request's reuse is decided within a few blocks).
constexpr uint32_t kTokenKvRoutingBlockSize = 16;
// TensorRT-LLM's secondary_offload_min_priority default: only default-or-higher blocks
// are worth a host copy.
constexpr uint8_t kDefaultOffloadMinPriority = 35;
// Enough for several seconds of engine steps between two TakeEvents(); past it the router
// recovers by snapshot.
constexpr size_t kDefaultEventBufferMaxSize = 10'000;
// Partial reuse scans at most this many children of the last matched block: a hot system
// prompt can have thousands of children, and a miss here only costs recomputation.
constexpr uint32_t kMaxPartialReuseCandidates = 64;
}  // namespace config

struct KvCacheConfig {
  // --- model shape ---
  uint32_t num_layers = 0;                // layers of the model
  std::vector<uint32_t> num_kv_heads;     // per layer; a shorter list repeats to num_layers
  uint32_t head_dim = 0;                  // elements per head
  uint32_t dtype_bytes = 2;               // bytes per KV element (bf16 = 2, fp32 = 4)
  std::vector<uint32_t> attention_windows;  // tokens, per layer; 0 = full attention; repeats
  uint32_t max_seq_len = 0;               // tokens; caps windows when splitting memory
  uint32_t sink_tokens = 0;               // StreamingLLM: first S tokens kept by windowed layers
  bool dense_context = false;             // StreamingLLM's dense context phase: windowed pools keep
                                          // the whole prompt until it is computed
  uint32_t attention_chunk_size = 0;      // Llama-4 chunked attention, tokens (a multiple of B); 0 = off
  std::vector<bool> chunked_layers;       // [num_layers]: the layers the chunk bounds (Llama 4: its
                                          // RoPE layers); empty: every layer
  uint32_t vocab_size = 0;                // token ids are < vocab_size; sets the bits each cached
                                          // token is stored in (17 for 128K); 0 = unknown (32 bits)

  // --- cache ---
  uint32_t block_size = config::kDefaultBlockSize;  // tokens per block (B): power of two
  uint64_t device_bytes = 0;              // device KV budget in bytes (from the backend)
  uint64_t host_bytes = 0;                // host tier budget in bytes; 0 = no host tier
  bool enable_block_reuse = true;         // radix reuse tree across requests
  bool enable_partial_reuse = true;       // copy the matching tokens of a partly matching block
  uint32_t partial_reuse_max_candidates = config::kMaxPartialReuseCandidates;  // children scanned
  bool enable_offload = true;             // evicted device blocks go to the host tier
  uint8_t offload_min_priority = config::kDefaultOffloadMinPriority;  // 0..100

  // --- events ---
  size_t event_buffer_max_size = config::kDefaultEventBufferMaxSize;  // events; 0 = events off
  bool events_include_tokens = false;     // stored events carry each block's tokens
  // Tokens per event block (G, Contract 1's B as routers see it): a power of two >= B; the
  // events describe groups of G / B blocks (event_list.h). 0: RoutingBlockSize(block_size).
  uint32_t routing_block_size = 0;

  Status Validate() const;
  // The layer's window after repetition; 0 = full attention.
  uint32_t WindowOfLayer(uint32_t layer) const;
  // The attention chunk of a layer (attention_chunk_size where chunked_layers has it); 0: none.
  uint32_t ChunkOfLayer(uint32_t layer) const;
  uint32_t KvHeadsOfLayer(uint32_t layer) const;
  // G: routing_block_size, else its default for block_size.
  uint32_t EventBlockSize() const;
};

// The default routing block size for KV blocks of `block_size` tokens: the block size
// itself, or config::kTokenKvRoutingBlockSize for token-level KV.
uint32_t DefaultRoutingBlockSize(uint32_t block_size);

// fraction x free_bytes, the usual way to size a GPU cache after loading weights.
uint64_t DeviceBudgetFromFreeMemory(uint64_t free_bytes, double fraction);

struct PoolLayout {
  uint32_t window = 0;          // tokens; 0 = full attention (also the events' window_size)
  uint32_t sink_tokens = 0;     // StreamingLLM sinks (windowed pools only)
  bool dense_context = false;   // StreamingLLM's dense context phase (windowed pools only)
  uint32_t attention_chunk = 0; // chunked attention, tokens; 0 = off
  uint32_t num_kv_heads = 0;
  std::vector<uint32_t> layers;  // model layers in this pool, ascending
  uint64_t bytes_per_block = 0;
  uint32_t device_blocks = 0;
  uint32_t host_blocks = 0;
  bool windowed() const { return window != 0; }
};

// The pools of `config`, ordered by (window, kv heads) with full attention first.
// REQUIRES: config.Validate().ok(). Fails when the budget gives a pool no block.
Result<std::vector<PoolLayout>> ComputePools(const KvCacheConfig& config);

// Sets config->device_bytes to exactly `blocks_per_pool` blocks of every pool, split by the
// same weights as any budget (exact when there is one pool, as in tests).
Status SizeForBlocksPerPool(KvCacheConfig* config, uint64_t blocks_per_pool);

}  // namespace kvfleet::kv
