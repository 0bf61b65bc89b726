// The KV cache manager's configuration for a model: the one place that turns a model's
// shape, the worker's attention flags and its memory settings into kv::KvCacheConfig, so a
// backend sizing its pools and the worker building the manager cannot disagree. It lives
// with the backends because it reads both a model and a backend's pools; the KV manager
// knows neither.
//
// Attention flags (AttentionOptions, backend.h), following TensorRT-LLM's KvCacheConfig:
//   --max-attention-window N[,N...]  per-layer windows, repeated to the number of layers; a
//       window >= the context is full attention. kvfleet keeps one pool per distinct window
//       (TensorRT-LLM's variable sliding window attention), each sized by its own window, so
//       the largest window bounds what one sequence holds (the seed's single buffer sized
//       every layer by it). A window longer than config.json's sliding window for that layer
//       is refused: the model never saw that far.
//   --sink-tokens S   StreamingLLM's attention sinks, kept by every windowed layer.
//   --streaming-llm   position shift and the dense context phase (TensorRT-LLM's
//                     enable_pos_shift and dense_context_fmha) on the windowed layers.
//   --attention-chunk-size C  Llama 4 chunked attention (config.json's, when not given).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/backend/backend.h"
#include "worker/kv/kv_config.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend {

struct KvMemorySettings {
  uint32_t block_size = 32;         // tokens per block
  uint32_t max_context = 0;         // tokens; caps windows when splitting memory
  uint32_t dtype_bytes = 2;         // bytes per K/V element: bf16 = 2, fp32 = 4
  uint64_t device_bytes = 0;        // device KV budget
  uint64_t host_bytes = 0;          // host tier budget; 0: none
  uint8_t offload_min_priority = kv::config::kDefaultOffloadMinPriority;
  bool events_include_tokens = false;
  uint32_t routing_block_size = 0;  // tokens per event block (G); 0: kv::DefaultRoutingBlockSize
};

// Checks the attention flags against each other and the model: the error names the flag
// (and config.json's field where the model disagrees). A window shorter than the sinks, a
// chunk that is not a multiple of the block size, sinks or --streaming-llm without a
// window, sinks with chunked attention, or a window or chunk the model's config contradicts.
Status CheckAttentionOptions(const model::ModelConfig& model, const AttentionOptions& attention, uint32_t block_size,
                             uint32_t max_context);

// The manager's configuration. REQUIRES: CheckAttentionOptions(...).ok() for errors that
// name the flags (kv::KvCacheConfig::Validate still refuses what cannot work).
kv::KvCacheConfig KvCacheConfigFor(const model::ModelConfig& model, const KvMemorySettings& memory,
                                   const AttentionOptions& attention = {});

// The memory settings that reproduce a backend's pools: its block size, max context, element
// size and the bytes of its device and host blocks. Offload and event settings keep their
// defaults.
KvMemorySettings KvMemoryOf(const ModelBackend& backend);

// Checks that the manager's pools are the backend's: same count, and per pool the same
// window, sinks, dense context, chunk, heads, layers and block counts per tier. The message
// names the first difference.
Status CheckPoolsAgree(std::span<const kv::PoolLayout> kv_pools, std::span<const KvPoolInfo> backend_pools);

}  // namespace kvfleet::backend
