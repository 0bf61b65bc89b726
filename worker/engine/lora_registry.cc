#include "worker/engine/lora_registry.h"

#include <algorithm>

#include "common/log.h"

namespace kvfleet::engine {

LoraRegistry::LoraRegistry(backend::ModelBackend* backend, const Clock* clock, int32_t max_rank)
    : backend_(backend), clock_(clock), max_rank_(max_rank), slots_(static_cast<size_t>(backend->max_loras())) {}

Status LoraRegistry::Add(std::shared_ptr<const model::LoraAdapter> adapter) {
  if (slots_.empty()) {
    return FailedPrecondition("LoRA adapter '" + adapter->name + "': this worker has no adapter slots (--max-loras 0, "
                              "or the " + std::string(backend_->name()) + " backend serves no adapters)");
  }
  if (adapters_.contains(adapter->name)) {
    return InvalidArgument("LoRA adapter '" + adapter->name + "' is already loaded (unload it first)");
  }
  if (adapter->rank > max_rank_) {
    return InvalidArgument("LoRA adapter '" + adapter->name + "': rank " + std::to_string(adapter->rank) +
                           " is above --max-lora-rank " + std::to_string(max_rank_));
  }
  const std::string name = adapter->name;
  adapters_.emplace(name, Entry{std::move(adapter)});
  return Status::Ok();
}

Status LoraRegistry::Remove(const std::string& name) {
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return NotFound("unknown LoRA adapter '" + name + "'");
  if (it->second.users > 0) {
    return FailedPrecondition("LoRA adapter '" + name + "' is in use by " + std::to_string(it->second.users) +
                              " running sequences");
  }
  if (it->second.slot >= 0) slots_[it->second.slot].clear();
  adapters_.erase(it);
  return Status::Ok();
}

int32_t LoraRegistry::SlotFor(const Entry& e) const {
  if (e.slot >= 0) return e.slot;
  int32_t best = -1;
  uint64_t best_tick = UINT64_MAX;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].empty()) return static_cast<int32_t>(s);
    const Entry& other = adapters_.find(slots_[s])->second;
    if (other.users == 0 && other.last_used < best_tick) {
      best = static_cast<int32_t>(s);
      best_tick = other.last_used;
    }
  }
  return best;
}

bool LoraRegistry::CanAcquire(const std::string& name) const {
  auto it = adapters_.find(name);
  return it != adapters_.end() && SlotFor(it->second) >= 0;
}

Result<int32_t> LoraRegistry::Acquire(const std::string& name) {
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return NotFound("unknown LoRA adapter '" + name + "'");
  Entry& e = it->second;
  const int32_t slot = SlotFor(e);
  if (slot < 0) return ResourceExhausted("every LoRA slot is held by running sequences");
  if (e.slot < 0) {
    const TimeNs t0 = clock_->Now();
    Status st = backend_->LoadLora(slot, *e.adapter);
    // The slot's previous adapter is gone either way (a failed copy may have half replaced it).
    if (!slots_[slot].empty()) adapters_.find(slots_[slot])->second.slot = -1;
    slots_[slot].clear();
    KVF_RETURN_IF_ERROR(st);
    const double us = static_cast<double>(clock_->Now() - t0) / 1e3;
    slots_[slot] = name;
    e.slot = slot;
    load_us_ = counters_.loads == 0 ? us : load_us_ + config::kLoadSmoothing * (us - load_us_);
    ++counters_.loads;
    counters_.load_seconds += us / 1e6;
    Logger("engine")->debug("LoRA adapter '{}' loaded into slot {} in {:.0f} us", name, slot, us);
  }
  ++e.users;
  e.last_used = ++tick_;
  return slot;
}

void LoraRegistry::Release(const std::string& name) {
  auto it = adapters_.find(name);
  if (it != adapters_.end() && it->second.users > 0) --it->second.users;
}

std::vector<LoraInfo> LoraRegistry::List() const {
  std::vector<LoraInfo> out;
  for (const auto& [name, e] : adapters_) {
    out.push_back({name, e.adapter->lora_id, e.adapter->rank, e.adapter->base_model, e.adapter->path, e.slot, e.users});
  }
  return out;
}

std::vector<uint64_t> LoraRegistry::Resident() const {
  std::vector<uint64_t> out;
  for (const std::string& name : slots_) {
    if (!name.empty()) out.push_back(adapters_.find(name)->second.adapter->lora_id);
  }
  return out;
}

uint64_t LoraRegistry::load_us() const {
  if (counters_.loads > 0) return static_cast<uint64_t>(load_us_);
  uint64_t bytes = 0;
  for (const auto& [name, e] : adapters_) bytes = std::max(bytes, e.adapter->Fp32Bytes());
  return static_cast<uint64_t>(static_cast<double>(bytes) / config::kPriorLoadBytesPerUs);
}

Status LoraRegistry::CheckInvariants(uint64_t holders) const {
  uint64_t users = 0;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].empty()) continue;
    auto it = adapters_.find(slots_[s]);
    if (it == adapters_.end()) return Internal("LoRA invariant 1: slot " + std::to_string(s) + " holds an unknown adapter");
    if (it->second.slot != static_cast<int32_t>(s)) {
      return Internal("LoRA invariant 1: adapter '" + slots_[s] + "' is in slot " + std::to_string(s) +
                      " but says slot " + std::to_string(it->second.slot));
    }
  }
  for (const auto& [name, e] : adapters_) {
    if (e.slot >= 0 && slots_[e.slot] != name) return Internal("LoRA invariant 1: adapter '" + name + "' lost its slot");
    if (e.users > 0 && e.slot < 0) return Internal("LoRA invariant 2: adapter '" + name + "' is used without a slot");
    users += e.users;
  }
  if (users != holders) {
    return Internal("LoRA invariant 3: " + std::to_string(users) + " uses of adapters, " + std::to_string(holders) +
                    " running sequences hold one");
  }
  return Status::Ok();
}

}  // namespace kvfleet::engine
