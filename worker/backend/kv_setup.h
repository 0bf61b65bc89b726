// The KV cache manager's configuration for a model: the one place that turns a model's
// shape and the worker's memory settings into kv::KvCacheConfig, so a backend sizing its
// pools and the worker building the manager cannot disagree. It lives with the backends
// because it reads both a model and a backend's pools; the KV manager knows neither.
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
};

kv::KvCacheConfig KvCacheConfigFor(const model::ModelConfig& model, const KvMemorySettings& memory);

// The memory settings that reproduce a backend's pools: its block size, max context, element
// size and the bytes of its device and host blocks. Offload and event settings keep their
// defaults.
KvMemorySettings KvMemoryOf(const ModelBackend& backend);

// Checks that the manager's pools are the backend's: same count, windows, heads and
// block counts per tier. The message names the first difference.
Status CheckPoolsAgree(std::span<const kv::PoolLayout> kv_pools, std::span<const KvPoolInfo> backend_pools);

}  // namespace kvfleet::backend
