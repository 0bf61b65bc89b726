// SimWorker: one worker process as far as the event plane can tell: an EventPublisher on
// real loopback ZMQ sockets, a KV source (the real KvCacheManager under a random request
// workload, or the ScriptedKvSource), and an engine thread that steps it and feeds the
// publisher as the worker loop does (PublishStep, ServeSnapshots). Tests and benchmarks use it.
//
// Thread safety: the control methods are for one test thread; the engine thread is internal.
#pragma once

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <prometheus/registry.h>

#include "common/check.h"
#include "router/events/event_plane.h"
#include "tests/router/events/scripted_kv_source.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/event_publisher.h"

namespace kvfleet::testing {

class NullCopier final : public kv::BlockCopier {
 public:
  void Copy(std::span<const kv::BlockCopy>) override {}
};

// The real KV cache manager behind a random request workload: prompts share a few long
// prefixes, so blocks are reused, evicted, offloaded and onboarded.
class KvWorkload {
 public:
  explicit KvWorkload(uint64_t seed) : rng_(seed) {
    kv::KvCacheConfig c;
    c.num_layers = 2;
    c.num_kv_heads = {1};
    c.head_dim = 4;
    c.dtype_bytes = 4;
    c.attention_windows = {0, 64};  // a full-attention pool and a windowed one
    c.max_seq_len = 1024;
    c.block_size = 4;
    const uint64_t bytes_per_token = 2 * 1 * 4 * 4;  // K+V x heads x head_dim x bytes
    c.device_bytes = bytes_per_token * 4 * 160 * 2;
    c.host_bytes = bytes_per_token * 4 * 96 * 2;
    auto m = kv::KvCacheManager::Make(c, &copier_, SystemClock::Default());
    KVF_CHECK(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    for (int p = 0; p < 12; ++p) {
      std::vector<TokenId> prefix;
      for (int t = 0; t < 24; ++t) prefix.push_back(static_cast<TokenId>(rng_() % 50000));
      prefixes_.push_back(prefix);
    }
  }

  // Runs a few requests to completion, as one engine step would.
  void Step() {
    for (int r = 0; r < 3; ++r) {
      kv::SequenceSpec spec;
      spec.prompt = prefixes_[rng_() % prefixes_.size()];
      spec.prompt.resize(4 + rng_() % spec.prompt.size());
      const size_t extra = rng_() % 24;
      for (size_t t = 0; t < extra; ++t) spec.prompt.push_back(static_cast<TokenId>(rng_() % 50000));
      spec.model = "m";
      spec.retention.decode_priority = static_cast<uint8_t>(rng_() % 2 ? 35 : 60);
      auto id = manager_->AddSequence(std::move(spec));
      KVF_CHECK(id.ok());
      (void)manager_->Match(*id);
      if (manager_->CanAllocate(*id) && manager_->Allocate(*id).ok()) manager_->Commit(*id, manager_->NumTokens(*id));
      manager_->Release(*id);
    }
  }
  kv::KvCacheManager& manager() { return *manager_; }
  events::LoadReport Load() const {
    events::LoadReport l;
    for (int t = 0; t < kv::kNumTiers; ++t) {
      l.free_blocks[t] = manager_->FreeBlocks(static_cast<kv::Tier>(t));
      l.total_blocks[t] = manager_->TotalBlocks(static_cast<kv::Tier>(t));
    }
    return l;
  }

 private:
  std::mt19937_64 rng_;
  NullCopier copier_;
  std::unique_ptr<kv::KvCacheManager> manager_;
  std::vector<std::vector<TokenId>> prefixes_;
};

// Blocks per tier of the full-attention pool, from a snapshot's stored events.
struct TierSets {
  std::vector<BlockHash> device, host;
  bool operator==(const TierSets&) const = default;
};
inline TierSets FromSnapshot(const std::vector<kv::KvEvent>& events, uint32_t window = 0) {
  TierSets s;
  for (const auto& e : events) {
    if (e.window_size != window) continue;
    for (const auto& b : std::get<kv::StoredEvent>(e.data).blocks)
      (b.tier == kv::Tier::kDevice ? s.device : s.host).push_back(b.hash);
  }
  std::sort(s.device.begin(), s.device.end());
  std::sort(s.host.begin(), s.host.end());
  return s;
}
inline TierSets FromIndex(const router::GlobalIndex& index, router::WorkerId id) {
  return TierSets{index.BlocksOf(id, kv::Tier::kDevice), index.BlocksOf(id, kv::Tier::kHost)};
}

class SimWorker {
 public:
  enum class Kind { kRealKv, kScripted };
  SimWorker(std::string name, uint64_t seed, Kind kind, size_t scripted_events_per_step = 20)
      : name_(std::move(name)), seed_(seed), kind_(kind), per_step_(scripted_events_per_step) {}
  ~SimWorker() { Kill(); }

  // Binds (the same ports again after a restart) and starts the engine thread.
  void Start() {
    events::EventPublisherOptions o;
    o.worker_id = name_;
    o.events_endpoint = endpoints_.events.empty() ? "tcp://127.0.0.1:*" : endpoints_.events;
    o.replay_endpoint = endpoints_.replay.empty() ? "tcp://127.0.0.1:*" : endpoints_.replay;
    o.curve = curve_;
    auto p = events::EventPublisher::Make(o, SystemClock::Default(), &registry_);
    KVF_CHECK(p.ok()) << p.status().ToString();
    publisher_ = std::move(*p);
    endpoints_ = {publisher_->events_endpoint(), publisher_->replay_endpoint()};
    ++lives_;
    if (kind_ == Kind::kRealKv) {
      kv_ = std::make_unique<KvWorkload>(seed_ * 1000 + lives_);
    } else {
      scripted_ = std::make_unique<ScriptedKvSource>(seed_ * 1000 + lives_);
    }
    stop_ = false;
    thread_ = std::thread([this] { Loop(); });
  }
  // The process dies: nothing more is published.
  void Kill() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
    total_events_ += life_events_.exchange(0);
    kv_.reset();
    scripted_.reset();
    publisher_.reset();
  }
  void Restart() {
    Kill();
    Start();
  }

  // CURVE settings for the next Start().
  void SetCurve(const events::EventPublisherCurve& curve) { curve_ = curve; }

  // Queues `n` engine steps that change the cache.
  void Run(uint64_t n) { steps_left_.fetch_add(n); }
  bool Idle() const { return steps_left_.load() == 0; }
  // What the worker holds now (full-attention pool), taken on the engine thread.
  TierSets Holdings() {
    std::promise<TierSets> p;
    auto f = p.get_future();
    {
      std::lock_guard lock(mu_);
      holdings_request_ = &p;
    }
    return f.get();
  }
  uint64_t block_events() const { return total_events_ + life_events_.load(std::memory_order_relaxed); }
  const router::WorkerEndpoints& endpoints() const { return endpoints_; }
  const std::string& name() const { return name_; }
  events::EventPublisher* publisher() { return publisher_.get(); }

 private:
  void Loop() {
    if (kv_) {
      Loop(kv_->manager(), [this] { kv_->Step(); });
    } else {
      Loop(*scripted_, [this] { scripted_->Step(per_step_); });
    }
  }
  template <typename Kv, typename StepFn>
  void Loop(Kv& kv, StepFn step) {
    while (!stop_.load()) {
      if (steps_left_.load() > 0) {
        step();
        steps_left_.fetch_sub(1);
      }
      std::vector<kv::KvEvent> step_events = kv.TakeEvents();
      life_events_.fetch_add(events::BlockEventCount(step_events), std::memory_order_relaxed);
      publisher_->Publish(std::move(step_events), kv_ ? kv_->Load() : events::LoadReport{}, kv.events_dropped());
      ServeSnapshots(*publisher_, kv);  // no event since the Publish: block_events() stays exact
      {
        std::lock_guard lock(mu_);
        if (holdings_request_) {
          holdings_request_->set_value(FromSnapshot(kv.Snapshot()));
          holdings_request_ = nullptr;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  }

  const std::string name_;
  const uint64_t seed_;
  const Kind kind_;
  const size_t per_step_;
  prometheus::Registry registry_;
  router::WorkerEndpoints endpoints_;
  events::EventPublisherCurve curve_;
  std::unique_ptr<events::EventPublisher> publisher_;
  std::unique_ptr<KvWorkload> kv_;
  std::unique_ptr<ScriptedKvSource> scripted_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> steps_left_{0};
  std::thread thread_;
  std::mutex mu_;
  std::promise<TierSets>* holdings_request_ = nullptr;
  std::atomic<uint64_t> life_events_{0};  // block events published in this life
  uint64_t total_events_ = 0;
  uint64_t lives_ = 0;
};

}  // namespace kvfleet::testing
