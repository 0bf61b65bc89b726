// LoraRegistry: the LoRA adapters a worker serves, and which of them sit in the backend's
// device slots (vLLM's --max-loras / --max-cpu-loras split, with host memory unbounded).
//
// Adapters live in host memory (fp32, model::LoraAdapter) from Add to Remove. A sequence
// that runs with an adapter holds it (Acquire → Release): the adapter then has a slot and
// keeps it. An adapter no running sequence holds keeps its slot too, until another adapter
// needs one: slots go to the least recently acquired idle adapter (LRU), and Acquire copies
// the newcomer in (backend->LoadLora), timing the copy. The scheduler pairs the check with
// the action: CanAcquire / Acquire.
//
// Thread safety: thread-compatible; owned by the engine thread (adapters are read from disk
// elsewhere and handed over whole).
//
// Invariants (CheckInvariants):
//   1. An adapter is in at most one slot, and a slot's adapter is registered.
//   2. An adapter with users > 0 has a slot.
//   3. The users of all adapters sum to the sequences holding one (the scheduler's running
//      sequences with an adapter).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/backend/backend.h"
#include "worker/model/lora_adapter.h"

namespace kvfleet::engine {

namespace config {
// The load time reported before any load was measured: the adapter's fp32 bytes over a
// host-to-device copy of ~10 GB/s (pinned PCIe 4.0 x16 reaches 20-25, pageable about half),
// so a router charges a cold adapter something plausible from the start.
inline constexpr double kPriorLoadBytesPerUs = 10e3;
// Weight of the newest load in the smoothed load time (as the engine's step rates).
inline constexpr double kLoadSmoothing = 0.2;
}  // namespace config

// What the registry reports of one adapter (Hello.loras, /metrics).
struct LoraInfo {
  std::string name;
  uint64_t lora_id = 0;
  int32_t rank = 0;
  std::string base_model;
  std::string path;
  int32_t slot = -1;   // -1: host memory only
  uint32_t users = 0;  // running sequences
};

struct LoraCounters {
  uint64_t loads = 0;           // copies into a slot
  double load_seconds = 0;      // their total time
};

class LoraRegistry {
 public:
  // REQUIRES: backend and clock outlive the registry. The slots are backend->max_loras();
  // adapters above max_rank (--max-lora-rank) are refused.
  LoraRegistry(backend::ModelBackend* backend, const Clock* clock, int32_t max_rank);

  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  bool Has(const std::string& name) const { return adapters_.contains(name); }
  size_t size() const { return adapters_.size(); }

  // Registers an adapter. InvalidArgument for a name already registered or a rank above
  // max_rank; FailedPrecondition when the backend has no slots.
  Status Add(std::shared_ptr<const model::LoraAdapter> adapter);
  // Forgets an adapter. FailedPrecondition while a running sequence holds it (the engine
  // also refuses while one waits for it); NotFound for an unknown name.
  Status Remove(const std::string& name);

  // True when `name` has a slot, or one can be freed for it (an empty slot or an idle adapter's).
  // REQUIRES: Has(name).
  bool CanAcquire(const std::string& name) const;
  // Takes a use of `name` for a running sequence and returns its slot, loading it there first
  // when it has none. REQUIRES: CanAcquire(name). Fails only when the backend's LoadLora does.
  Result<int32_t> Acquire(const std::string& name);
  // Gives back a use taken by Acquire. The adapter keeps its slot.
  void Release(const std::string& name);

  // Every adapter, by name; the loraIds of those in a slot.
  std::vector<LoraInfo> List() const;
  std::vector<uint64_t> Resident() const;
  // The smoothed measured time of a load into a slot (µs); before the first, the prior of
  // the largest adapter registered (config::kPriorLoadBytesPerUs); 0 with none.
  uint64_t load_us() const;
  const LoraCounters& counters() const { return counters_; }

  // `holders`: the number of running sequences holding an adapter (invariant 3).
  Status CheckInvariants(uint64_t holders) const;

 private:
  struct Entry {
    std::shared_ptr<const model::LoraAdapter> adapter;
    int32_t slot = -1;
    uint32_t users = 0;
    uint64_t last_used = 0;  // tick of the latest Acquire
  };
  // The slot `name` would get: its own, an empty one, or the LRU idle adapter's; -1: none.
  int32_t SlotFor(const Entry& e) const;

  backend::ModelBackend* const backend_;
  const Clock* const clock_;
  const int32_t max_rank_;
  std::map<std::string, Entry, std::less<>> adapters_;
  std::vector<std::string> slots_;  // [slot] → the adapter in it; empty: none
  uint64_t tick_ = 0;
  double load_us_ = 0;  // smoothed; 0 before the first load
  LoraCounters counters_;
};

}  // namespace kvfleet::engine
