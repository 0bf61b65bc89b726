// Contract 2's KV events as plain C++: what a worker's KV cache manager says about the
// blocks it holds (worker/kv), carried by schema/event_codec.h in each EventBatch, and
// folded by routers into their global index (router/index). Modelled on TensorRT-LLM's KV
// cache event API; the wire form is schema/events.capnp's KvEvent. The names live in
// kvfleet::kv because the tiers and priorities are the KV cache's own vocabulary.
//
// Ordering contract: a parent is stored before its children, a child is removed before
// its parent, so any consumer can apply events in the order they come.
//
// Thread safety: values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "common/block_hash.h"

namespace kvfleet::kv {

enum class Tier : uint8_t {
  kDevice = 0,  // primary: GPU memory (or the cpu backend's arena)
  kHost = 1,    // secondary: host memory
};
constexpr int kNumTiers = 2;
constexpr const char* TierName(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

constexpr uint8_t kMinPriority = 0;
constexpr uint8_t kMaxPriority = 100;
constexpr uint8_t kDefaultPriority = 35;  // TensorRT-LLM's default retention priority

struct CreatedEvent {
  std::array<uint64_t, kNumTiers> blocks_per_tier{};
  uint32_t block_size = 0;
};

struct StoredBlock {
  BlockHash hash = 0;
  std::vector<TokenId> tokens;  // empty unless the manager's include_tokens is on
  Tier tier = Tier::kDevice;
  uint8_t priority = kDefaultPriority;
  uint64_t lora_id = 0;  // LoraId(loraName) of the adapter the KV was computed with; 0 = the base model
};

struct StoredEvent {
  BlockHash parent_hash = 0;  // 0: the root
  std::vector<StoredBlock> blocks;  // a chain: blocks[i] is the parent of blocks[i+1]
};

struct RemovedEvent {
  std::vector<BlockHash> hashes;
  Tier tier = Tier::kDevice;
};

struct UpdatedEvent {
  BlockHash hash = 0;
  std::optional<Tier> tier;         // set: the block moved to this tier
  std::optional<uint8_t> priority;  // set: its retention priority changed
};

struct ClearedEvent {};

struct KvEvent {
  uint32_t window_size = 0;  // the pool's attention window; 0 = full attention
  std::variant<CreatedEvent, StoredEvent, RemovedEvent, UpdatedEvent, ClearedEvent> data;
  // Contract 2's eventId (TensorRT-LLM's KVCacheEvent.event_id): stamped by the worker's
  // publisher as it seals the event, 1, 2, ... within an epoch; 0 = not stamped (the KV
  // manager's own events before publication, snapshot events, an older worker's).
  uint64_t id = 0;
};

}  // namespace kvfleet::kv
