#include "router/index/retention_estimate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"

namespace kvfleet::router {

RetentionEstimate::RetentionEstimate(const Clock* clock, double rate_window_s)
    : clock_(clock), window_s_(rate_window_s) {
  KVF_CHECK(rate_window_s > 0);
}

void RetentionEstimate::Evicted(WorkerBlocks* w, uint8_t priority, TimeNs now) {
  // An exponentially weighted event rate: each eviction adds 1/window, and the sum decays
  // by e per window, so a steady r evictions/s settles at r.
  Rate& r = w->evicted[priority];
  r.per_s = RateLocked(*w, priority, now) + 1.0 / window_s_;
  r.at = now;
}

void RetentionEstimate::Apply(WorkerId worker, std::span<const BlockOp> ops) {
  if (!enabled()) return;
  const TimeNs now = clock_->Now();
  std::lock_guard<std::mutex> lock(mu_);
  WorkerBlocks& w = workers_[worker];
  for (const BlockOp& op : ops) {
    const uint8_t p = std::min(op.priority, kv::kMaxPriority);
    switch (op.kind) {
      case BlockOp::kStore:
        if (op.tier != kv::Tier::kDevice) break;
        if (auto [it, fresh] = w.priority.try_emplace(op.hash, p); fresh) {
          ++w.held[p];
        } else if (it->second != p) {  // stored again at another priority
          --w.held[it->second];
          ++w.held[p];
          it->second = p;
        }
        break;
      case BlockOp::kMove:
        if (op.tier == kv::Tier::kDevice) {
          // Onboarded: its priority came with its first store; an unknown block gets the default.
          if (w.priority.try_emplace(op.hash, kv::kDefaultPriority).second) ++w.held[kv::kDefaultPriority];
          break;
        }
        [[fallthrough]];  // offloaded to the host: it left the device
      case BlockOp::kRemove: {
        if (op.tier != kv::Tier::kDevice && op.kind == BlockOp::kRemove) break;
        auto it = w.priority.find(op.hash);
        if (it == w.priority.end()) break;
        --w.held[it->second];
        Evicted(&w, it->second, now);
        w.priority.erase(it);
        break;
      }
      case BlockOp::kPriority: {
        auto it = w.priority.find(op.hash);
        if (it == w.priority.end() || it->second == p) break;
        --w.held[it->second];
        ++w.held[p];
        it->second = p;
        break;
      }
    }
  }
}

void RetentionEstimate::RemoveWorker(WorkerId worker) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_.erase(worker);
}

uint8_t RetentionEstimate::Priority(WorkerId worker, BlockHash hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end()) return kv::kDefaultPriority;
  auto it = w->second.priority.find(hash);
  return it == w->second.priority.end() ? kv::kDefaultPriority : it->second;
}

uint64_t RetentionEstimate::Held(WorkerId worker, uint8_t priority) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  return w == workers_.end() || priority > kv::kMaxPriority ? 0 : w->second.held[priority];
}

uint64_t RetentionEstimate::Held(WorkerId worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  return w == workers_.end() ? 0 : w->second.priority.size();
}

double RetentionEstimate::RateLocked(const WorkerBlocks& w, uint8_t priority, TimeNs now) const {
  const Rate& r = w.evicted[priority];
  if (r.per_s == 0) return 0;
  const double age_s = static_cast<double>(std::max<TimeNs>(0, now - r.at)) / kNsPerSec;
  return r.per_s * std::exp(-age_s / window_s_);
}

double RetentionEstimate::EvictionRate(WorkerId worker, uint8_t priority) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end() || priority > kv::kMaxPriority) return 0;
  return RateLocked(w->second, priority, clock_->Now());
}

double RetentionEstimate::LifetimeLocked(const WorkerBlocks& w, uint8_t priority, TimeNs now) const {
  const double rate = RateLocked(w, priority, now);
  if (rate <= 0) return std::numeric_limits<double>::infinity();
  // The block asked about is one of them, tracked or not.
  return static_cast<double>(std::max<uint64_t>(w.held[priority], 1)) / rate;
}

double RetentionEstimate::Lifetime(WorkerId worker, uint8_t priority) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end() || priority > kv::kMaxPriority) return std::numeric_limits<double>::infinity();
  return LifetimeLocked(w->second, priority, clock_->Now());
}

double RetentionEstimate::ExpectedSurvivingBlocks(WorkerId worker, std::span<const BlockHash> matched,
                                                  double horizon_s, double spare_blocks,
                                                  double demand_blocks) const {
  const double all = static_cast<double>(matched.size());
  if (matched.empty() || horizon_s <= 0 || demand_blocks <= spare_blocks) return all;
  const TimeNs now = clock_->Now();
  std::lock_guard<std::mutex> lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end()) return all;
  const WorkerBlocks& blocks = w->second;
  // Lifetimes per priority, computed once: a prefix has few distinct priorities.
  std::array<double, kv::kMaxPriority + 1> survival;
  survival.fill(-1);
  double expected = 0, run = 1;
  for (BlockHash h : matched) {
    auto it = blocks.priority.find(h);
    const uint8_t p = it == blocks.priority.end() ? kv::kDefaultPriority : it->second;
    if (survival[p] < 0) survival[p] = std::exp(-horizon_s / LifetimeLocked(blocks, p, now));
    run = std::min(run, survival[p]);
    expected += run;
  }
  return expected;
}

void RetentionEstimate::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, w] : workers_) {
    std::array<uint64_t, kv::kMaxPriority + 1> held{};
    for (const auto& [hash, p] : w.priority) {
      KVF_CHECK(p <= kv::kMaxPriority);
      ++held[p];
    }
    KVF_CHECK(held == w.held);
  }
}

}  // namespace kvfleet::router
