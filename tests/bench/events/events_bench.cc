// Event plane and global index benchmark (issue 4). Prints:
//   1. index apply rate on one core (stored/removed block events per second), raw and through
//      the subscriber state machine, and decode + apply from wire bytes;
//   2. FindMatches p50/p99 for 128- and 1,024-block requests, 64 workers, ~1 M blocks, idle
//      and with a concurrent writer;
//   3. bytes per (block, worker) entry;
//   4. end to end over loopback ZMQ: a worker's Stored to the router index, p50/p99, and the
//      sustained rate before loss;
//   5. snapshot sync of 1 M blocks: AddWorker to LIVE.
// Usage: events_bench [--quick] [--only=N]   (quick: 10x fewer blocks, for a smoke run)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include <time.h>

#include <prometheus/registry.h>

#include "common/check.h"
#include "router/events/event_plane.h"
#include "router/events/worker_subscriber.h"
#include "tests/router/events/scripted_kv_source.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/event_publisher.h"

using namespace kvfleet;
using Steady = std::chrono::steady_clock;

namespace {

double Seconds(Steady::time_point a, Steady::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// This thread's CPU time: on a shared, oversubscribed machine it leaves out the time the
// thread waited for a core, so "per core" figures stay meaningful.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

uint64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * 4096;
}

struct NullIo : router::WorkerSubscriber::Io {
  uint64_t last = 0;
  void RequestReplay(router::WorkerId, uint64_t, uint64_t, uint64_t id) override { last = id; }
  void OnApplied(router::WorkerId, double) override {}
};

constexpr int kWorkers = 64;
constexpr size_t kChain = 64;  // blocks per stored event (one request's prompt)

// 1 M distinct blocks as chains of 64; each chain held by 2 workers (a shared prefix).
struct Workload {
  std::vector<std::vector<BlockHash>> chains;
  std::vector<std::array<int, 2>> holders;
  explicit Workload(size_t blocks) {
    std::mt19937_64 rng(42);
    for (size_t c = 0; c < blocks / kChain; ++c) {
      std::vector<BlockHash> chain(kChain);
      for (auto& h : chain) h = rng() | 1;
      chains.push_back(std::move(chain));
      int a = static_cast<int>(rng() % kWorkers), b = static_cast<int>((a + 1 + rng() % (kWorkers - 1)) % kWorkers);
      holders.push_back({a, b});
    }
  }
};

// kWorkers subscribers brought to LIVE by an empty snapshot (epoch 1, consistent at seq 0).
std::vector<std::unique_ptr<router::WorkerSubscriber>> LiveSubscribers(const router::EventPlaneOptions& options,
                                                                        router::GlobalIndex* index, Clock* clock,
                                                                        NullIo* io, router::EventCounters* counters) {
  std::vector<std::unique_ptr<router::WorkerSubscriber>> subs;
  for (int i = 0; i < kWorkers; ++i) {
    subs.push_back(std::make_unique<router::WorkerSubscriber>(i, "w", options, index, clock, io, counters));
    subs.back()->Start();
    subs.back()->OnReplayReply({{"w", 1, io->last, true}, events::SnapshotChunk{}});
  }
  return subs;
}

void BenchApply(const Workload& w) {
  ManualClock clock;
  std::printf("\n== 1. apply rate, one core (%d workers, %zu blocks, %zu entries) ==\n", kWorkers,
              w.chains.size() * kChain, w.chains.size() * kChain * 2);
  {
    router::GlobalIndex index({}, &clock);
    auto t0 = Steady::now();
    double c0 = CpuSeconds();
    for (size_t c = 0; c < w.chains.size(); ++c)
      for (int k = 0; k < 2; ++k)
        for (BlockHash h : w.chains[c]) index.Store(w.holders[c][k], h, kv::Tier::kDevice);
    auto t1 = Steady::now();
    double c1 = CpuSeconds();
    const double n = static_cast<double>(index.EntryCount());
    std::printf("GlobalIndex::Store (1 call/block) %7.2f M block events/s wall, %7.2f per CPU-second\n",
                n / Seconds(t0, t1) / 1e6, n / (c1 - c0) / 1e6);
    t0 = Steady::now();
    c0 = CpuSeconds();
    for (size_t c = 0; c < w.chains.size(); ++c)
      for (int k = 0; k < 2; ++k)
        for (BlockHash h : w.chains[c]) index.Remove(w.holders[c][k], h, kv::Tier::kDevice);
    t1 = Steady::now();
    c1 = CpuSeconds();
    std::printf("GlobalIndex::Remove (1 call/block)%7.2f M block events/s wall, %7.2f per CPU-second\n",
                n / Seconds(t0, t1) / 1e6, n / (c1 - c0) / 1e6);
  }
  {
    // GlobalIndex::Apply, the event thread's path: one call per batch of 8 stored events
    // x 64 blocks (512 block events), then the same batches as removals.
    router::GlobalIndex index({}, &clock);
    std::vector<std::pair<int, std::vector<router::BlockOp>>> stores, removes;
    for (size_t c = 0; c + 8 <= w.chains.size(); c += 8) {
      for (int k = 0; k < 2; ++k) {
        std::vector<router::BlockOp> s, r;
        for (size_t j = 0; j < 8; ++j) {
          for (BlockHash h : w.chains[c + j]) {
            s.push_back({h, router::BlockOp::kStore, kv::Tier::kDevice});
            r.push_back({h, router::BlockOp::kRemove, kv::Tier::kDevice});
          }
        }
        stores.emplace_back(w.holders[c][k], std::move(s));
        removes.emplace_back(w.holders[c][k], std::move(r));
      }
    }
    auto t0 = Steady::now();
    double c0 = CpuSeconds();
    for (auto& [wk, ops] : stores) index.Apply(wk, ops);
    auto t1 = Steady::now();
    double c1 = CpuSeconds();
    const double n = static_cast<double>(index.EntryCount());
    std::printf("GlobalIndex::Apply stores    %7.2f M block events/s wall, %7.2f per CPU-second (512 per call)\n",
                n / Seconds(t0, t1) / 1e6, n / (c1 - c0) / 1e6);
    t0 = Steady::now();
    c0 = CpuSeconds();
    for (auto& [wk, ops] : removes) index.Apply(wk, ops);
    t1 = Steady::now();
    c1 = CpuSeconds();
    std::printf("GlobalIndex::Apply removes   %7.2f M block events/s wall, %7.2f per CPU-second (512 per call, %llu left)\n",
                n / Seconds(t0, t1) / 1e6, n / (c1 - c0) / 1e6, static_cast<unsigned long long>(index.EntryCount()));
  }
  {
    // Through the subscriber state machine (what the event thread does per decoded batch):
    // 64 LIVE workers, batches of 8 stored events x 64 blocks.
    router::GlobalIndex index({}, &clock);
    router::EventPlaneOptions options;
    NullIo io;
    router::EventCounters counters;
    auto subs = LiveSubscribers(options, &index, &clock, &io, &counters);
    std::vector<std::pair<int, events::DecodedBatch>> batches;
    std::vector<uint64_t> seq(kWorkers, 0);
    size_t blocks = 0;
    for (size_t c = 0; c + 8 <= w.chains.size(); c += 8) {
      for (int k = 0; k < 2; ++k) {
        const int wk = w.holders[c][k];
        events::DecodedBatch b;
        b.header = {"w", 1, ++seq[wk], 0};
        for (size_t j = 0; j < 8; ++j) {
          kv::StoredEvent e;
          for (BlockHash h : w.chains[c + j]) e.blocks.push_back({h, {}, kv::Tier::kDevice, 35});
          b.events.push_back({0, std::move(e)});
          blocks += kChain;
        }
        batches.emplace_back(wk, std::move(b));
      }
    }
    auto t0 = Steady::now();
    const double c0 = CpuSeconds();
    for (auto& [wk, b] : batches) subs[wk]->OnBatch(std::move(b));
    auto t1 = Steady::now();
    const double c1 = CpuSeconds();
    std::printf("WorkerSubscriber::OnBatch    %7.2f M block events/s wall, %7.2f per CPU-second (%llu applied)\n",
                static_cast<double>(blocks) / Seconds(t0, t1) / 1e6, static_cast<double>(blocks) / (c1 - c0) / 1e6,
                static_cast<unsigned long long>(counters.applied_stored));
  }
  {
    // Decode + apply from wire bytes, the event thread's whole job per live batch:
    // DecodeBatch, then the LIVE subscriber's OnBatch. Batches of 8 stored events x 64 blocks.
    router::GlobalIndex index({}, &clock);
    router::EventPlaneOptions options;
    NullIo io;
    router::EventCounters counters;
    auto subs = LiveSubscribers(options, &index, &clock, &io, &counters);
    std::vector<std::string> frames;
    std::vector<int> owner;
    std::vector<uint64_t> seq(kWorkers, 0);
    size_t blocks = 0;
    for (size_t c = 0; c + 8 <= w.chains.size(); c += 8) {
      std::vector<kv::KvEvent> evs;
      for (size_t j = 0; j < 8; ++j) {
        kv::StoredEvent e;
        e.parent_hash = j == 0 ? 0 : w.chains[c + j - 1].back();
        for (BlockHash h : w.chains[c + j]) e.blocks.push_back({h, {}, kv::Tier::kDevice, 35});
        evs.push_back({0, std::move(e)});
        blocks += kChain;
      }
      const int wk = w.holders[c][0];
      frames.push_back(events::EncodeBatch({"w", 1, ++seq[wk], 0}, evs, {}));
      owner.push_back(wk);
    }
    auto t0 = Steady::now();
    const double c0 = CpuSeconds();
    for (size_t i = 0; i < frames.size(); ++i) {
      auto b = events::DecodeBatch(frames[i].data(), frames[i].size());
      subs[owner[i]]->OnBatch(std::move(*b));
    }
    auto t1 = Steady::now();
    const double c1 = CpuSeconds();
    std::printf("decode + OnBatch (wire bytes) %6.2f M block events/s wall, %7.2f per CPU-second (%llu applied)\n",
                static_cast<double>(blocks) / Seconds(t0, t1) / 1e6, static_cast<double>(blocks) / (c1 - c0) / 1e6,
                static_cast<unsigned long long>(counters.applied_stored));
  }
}

void BenchFindMatches(const Workload& w) {
  ManualClock clock;
  router::GlobalIndex index({}, &clock);
  const uint64_t rss0 = RssBytes();
  for (size_t c = 0; c < w.chains.size(); ++c)
    for (int k = 0; k < 2; ++k)
      for (BlockHash h : w.chains[c]) index.Store(w.holders[c][k], h, kv::Tier::kDevice);
  // Hot prefixes: 32 chains of 1,024 blocks that every worker holds a prefix of (worst case:
  // 64 workers still matching deep into the request).
  std::mt19937_64 rng(7);
  std::vector<std::vector<BlockHash>> hot(32, std::vector<BlockHash>(1024));
  for (auto& chain : hot) {
    for (auto& h : chain) h = rng() | 1;
    for (int wk = 0; wk < kWorkers; ++wk) {
      const size_t len = 128 + rng() % 897;
      for (size_t i = 0; i < len; ++i)
        index.Store(wk, chain[i], i < len * 3 / 4 ? kv::Tier::kDevice : kv::Tier::kHost);
    }
  }
  const uint64_t rss1 = RssBytes();
  std::printf("\n== 3. memory ==\n");
  std::printf("entries %llu, hashes %llu: %.1f bytes per (block, worker) entry by capacity, %.1f by RSS growth (only meaningful with --only=2)\n",
              static_cast<unsigned long long>(index.EntryCount()), static_cast<unsigned long long>(index.HashCount()),
              static_cast<double>(index.MemoryBytes()) / static_cast<double>(index.EntryCount()),
              static_cast<double>(rss1 - rss0) / static_cast<double>(index.EntryCount()));

  std::printf("\n== 2. FindMatches latency (64 workers all matching the hot prefixes) ==\n");
  auto measure = [&](size_t len, const char* label) {
    std::vector<router::PrefixMatch> out;
    out.reserve(router::config::kMaxWorkers);
    std::vector<double> us, cpu_us;
    uint64_t sink = 0;
    for (int q = 0; q < 50'000; ++q) {
      const auto& chain = hot[q % hot.size()];
      std::span<const BlockHash> req(chain.data(), len);
      const double c0 = CpuSeconds();
      auto t0 = Steady::now();
      index.FindMatches(req, &out);
      auto t1 = Steady::now();
      const double c1 = CpuSeconds();
      us.push_back(Seconds(t0, t1) * 1e6);
      cpu_us.push_back((c1 - c0) * 1e6);
      sink += out.size();
    }
    std::printf("%-26s %4zu blocks: wall p50 %6.2f us p99 %8.2f us | CPU p50 %6.2f us p99 %6.2f us (%llu matches)\n",
                label, len, Percentile(us, 0.5), Percentile(us, 0.99), Percentile(cpu_us, 0.5),
                Percentile(cpu_us, 0.99), static_cast<unsigned long long>(sink / 50'000));
  };
  measure(128, "idle");
  measure(1024, "idle");
  // A writer on the other core: unthrottled (as fast as one thread can store and remove,
  // ~7 M block events/s, far past any fleet), then paced at 1 M block events/s (64 workers
  // each storing or removing ~16 K blocks a second: a busy fleet).
  auto with_writer = [&](double events_per_s, const char* label) {
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      std::mt19937_64 r(9);
      auto next = Steady::now();
      while (!stop.load(std::memory_order_relaxed)) {
        const auto& chain = w.chains[r() % w.chains.size()];
        const int wk = static_cast<int>(r() % kWorkers);
        for (BlockHash h : chain) index.Store(wk, h, kv::Tier::kDevice);
        for (BlockHash h : chain) index.Remove(wk, h, kv::Tier::kDevice);
        if (events_per_s > 0) {
          next += std::chrono::nanoseconds(static_cast<int64_t>(2e9 * static_cast<double>(chain.size()) / events_per_s));
          std::this_thread::sleep_until(next);
        }
      }
    });
    measure(128, label);
    measure(1024, label);
    stop = true;
    writer.join();
  };
  with_writer(0, "unthrottled writer");
  with_writer(1e6, "writer at 1 M events/s");
}

// A worker with a publisher whose engine thread is driven by the bench.
struct BenchWorker {
  prometheus::Registry registry;
  std::unique_ptr<events::EventPublisher> pub;
  explicit BenchWorker(const std::string& name) {
    events::EventPublisherOptions o;
    o.worker_id = name;
    o.events_endpoint = "tcp://127.0.0.1:*";
    o.replay_endpoint = "tcp://127.0.0.1:*";
    pub = std::move(events::EventPublisher::Make(o, SystemClock::Default(), &registry).value());
  }
};

// A KV manager that holds nothing: the end-to-end bench publishes its own events.
struct EmptyKv {
  std::vector<kv::KvEvent> TakeEvents() { return {}; }
  uint64_t events_dropped() const { return 0; }
  std::vector<kv::KvEvent> Snapshot() const { return {}; }
};

// One step's events: moved in, as the KV manager's list is.
std::vector<kv::KvEvent> StepOf(kv::KvEvent event) {
  std::vector<kv::KvEvent> events;
  events.push_back(std::move(event));
  return events;
}

void BenchEndToEnd() {
  std::printf("\n== 4. end to end over loopback ZMQ (Stored -> Publish -> PUB -> SUB -> index) ==\n");
  BenchWorker worker("e2e");
  prometheus::Registry registry;
  router::EventPlane plane({}, SystemClock::Default(), &registry);
  (void)plane.AddWorker(0, "e2e", {worker.pub->events_endpoint(), worker.pub->replay_endpoint()});
  EmptyKv src;
  std::atomic<bool> stop{false};
  // The engine thread answers the sync snapshot while the plane starts.
  std::thread engine([&] {
    while (!stop) {
      testing::ServeSnapshots(*worker.pub, src);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  while (plane.State(0) != router::WorkerState::kLive) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  engine.join();
  // Latency: one stored block per step, measured until the index holds it.
  std::vector<double> us;
  for (int i = 0; i < 2000; ++i) {
    const BlockHash h = 0x5000000 + i;
    auto t0 = Steady::now();
    worker.pub->Publish(StepOf(kv::KvEvent{0, kv::StoredEvent{0, {{h, {}, kv::Tier::kDevice, 35}}}}), {}, 0);
    while (!plane.index().Holds(0, h)) {
    }
    us.push_back(Seconds(t0, Steady::now()) * 1e6);
  }
  std::printf("latency, 1 block per batch: p50 %.1f us  p99 %.1f us\n", Percentile(us, 0.5), Percentile(us, 0.99));

  // Sustained rate: batches of 64 stored blocks at a paced rate for 1 s each; loss shows as a
  // gap at the router (the PUB or SUB queue overflowed) or a backlog that does not drain.
  std::printf("sustained rate (batches of 64 blocks, 1 s each):\n");
  uint64_t next = 0x9000000;
  for (double rate : {0.25e6, 0.5e6, 1e6, 2e6, 4e6}) {
    auto gaps_before = plane.Stats()[0].gaps;
    const double batches_per_s = rate / 64;
    auto start = Steady::now();
    uint64_t sent = 0;
    while (Seconds(start, Steady::now()) < 1.0) {
      const double due = Seconds(start, Steady::now()) * batches_per_s;
      while (static_cast<double>(sent) < due) {
        kv::StoredEvent e;
        for (int b = 0; b < 64; ++b) e.blocks.push_back({next++, {}, kv::Tier::kDevice, 35});
        worker.pub->Publish(StepOf(kv::KvEvent{0, std::move(e)}), {}, 0);
        ++sent;
      }
    }
    const double send_s = Seconds(start, Steady::now());
    const BlockHash last = next - 1;
    auto t_drain = Steady::now();
    bool held = false;
    while (Seconds(t_drain, Steady::now()) < 3.0 && !(held = plane.index().Holds(0, last))) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double total_s = Seconds(start, Steady::now());
    auto gaps = plane.Stats()[0].gaps - gaps_before;
    std::printf("  offered %5.2f M/s: sent %.2f M blocks in %.2f s, applied by %.2f s (%.2f M/s), gaps %llu%s\n",
                rate / 1e6, static_cast<double>(sent) * 64 / 1e6, send_s, total_s,
                static_cast<double>(sent) * 64 / total_s / 1e6, static_cast<unsigned long long>(gaps),
                held ? "" : ", NOT drained in 3 s");
    // Free the index for the next round.
    plane.index().RemoveWorker(0);
  }
}

// Times a router's sync of `blocks` blocks that `kv` (publishing through `worker`) holds.
template <typename Kv>
void SyncFrom(BenchWorker& worker, Kv& kv, size_t blocks) {
  testing::PublishStep(*worker.pub, kv);  // one big batch before any router listens: lost, as intended
  std::atomic<bool> stop{false};
  std::atomic<double> snapshot_s{0};
  std::atomic<Steady::rep> handed_over{0};  // when ServeSnapshots returned with the job queued
  std::thread engine([&] {
    while (!stop) {
      auto t0 = Steady::now();
      testing::ServeSnapshots(*worker.pub, kv);
      auto t1 = Steady::now();
      if (Seconds(t0, t1) > 0.01) {
        snapshot_s = Seconds(t0, t1);
        handed_over = t1.time_since_epoch().count();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  prometheus::Registry registry;
  router::EventPlane plane({}, SystemClock::Default(), &registry);
  auto t0 = Steady::now();
  (void)plane.AddWorker(0, "snap", {worker.pub->events_endpoint(), worker.pub->replay_endpoint()});
  while (!(plane.State(0) == router::WorkerState::kLive &&
           plane.index().BlockCount(0, kv::Tier::kDevice) + plane.index().BlockCount(0, kv::Tier::kHost) == blocks)) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (Seconds(t0, Steady::now()) > 30) break;
  }
  auto t1 = Steady::now();
  stop = true;
  engine.join();
  const Steady::time_point t_handed{Steady::duration(handed_over.load())};
  std::printf("synced %llu blocks in %.3f s: engine-thread ServeSnapshots (the source's Snapshot() + seal) "
              "%.3f s, then encode + send + decode + apply %.3f s\n",
              static_cast<unsigned long long>(plane.index().BlockCount(0, kv::Tier::kDevice) +
                                              plane.index().BlockCount(0, kv::Tier::kHost)),
              Seconds(t0, t1), snapshot_s.load(), Seconds(t_handed, t1));
}

// A real KvCacheManager holding `blocks` cached device blocks (B=32, Llama 3's vocabulary),
// filled by 64-block requests that share nothing, as a worker's engine would leave it.
std::unique_ptr<kv::KvCacheManager> FilledManager(size_t blocks, kv::BlockCopier* copier) {
  constexpr uint32_t kB = 32, kBlocksPerRequest = 64, kVocab = 128'256;
  kv::KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = {1};
  c.head_dim = 1;
  c.dtype_bytes = 1;
  c.max_seq_len = 1u << 20;
  c.block_size = kB;
  c.vocab_size = kVocab;
  c.device_bytes = uint64_t{blocks} * 2 * kB;
  auto m = kv::KvCacheManager::Make(c, copier, SystemClock::Default());
  KVF_CHECK(m.ok()) << m.status().ToString();
  auto mgr = std::move(m).value();
  std::mt19937_64 rng(7);
  for (size_t r = 0; r < blocks / kBlocksPerRequest; ++r) {
    kv::SequenceSpec spec;
    spec.prompt.resize(kB * kBlocksPerRequest);
    for (auto& t : spec.prompt) t = static_cast<TokenId>(rng() % kVocab);
    spec.model = "bench";
    auto id = mgr->AddSequence(std::move(spec));
    KVF_CHECK(id.ok());
    mgr->Match(*id);
    KVF_CHECK(mgr->Allocate(*id).ok());
    mgr->Commit(*id, kB * kBlocksPerRequest);
    mgr->Release(*id);
  }
  return mgr;
}

void BenchSnapshot(size_t blocks) {
  std::printf("\n== 5. snapshot sync of %zu blocks (AddWorker -> LIVE) ==\n", blocks);
  {
    // What a worker sends: the real KV manager's Snapshot(), every block with its tokens.
    BenchWorker worker("snap");
    class NoCopies final : public kv::BlockCopier {
     public:
      void Copy(std::span<const kv::BlockCopy>) override {}
    } copier;
    auto mgr = FilledManager(blocks, &copier);
    std::printf("KvCacheManager (B=32, tokens included):   ");
    SyncFrom(worker, *mgr, blocks);
  }
  {
    // The wire's worst case: one stored event per block (tests/router/events/scripted_kv_source.h).
    BenchWorker worker("snap");
    testing::ScriptedKvSource kv(3, /*other_window=*/0);
    while (kv.size() < blocks) kv.StoreChain(std::min<size_t>(64, blocks - kv.size()));
    std::printf("scripted source, one event per block:     ");
    SyncFrom(worker, kv, blocks);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick |= std::strcmp(argv[i], "--quick") == 0;
  const size_t blocks = quick ? 100'000 : 1'000'000;
  spdlog::set_level(spdlog::level::warn);
  double load = 0;
  std::ifstream("/proc/loadavg") >> load;
  std::printf("kvfleet events bench: %u hardware threads, load average %.1f%s\n",
              std::thread::hardware_concurrency(), load, quick ? " (quick)" : "");
  // --only=N runs one section (1: apply, 2: FindMatches and memory, 4: end to end, 5: snapshot).
  int only = 0;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = std::atoi(argv[i] + 7);
  Workload w(blocks);
  if (!only || only == 1) BenchApply(w);
  if (!only || only == 2 || only == 3) BenchFindMatches(w);
  if (!only || only == 4) BenchEndToEnd();
  if (!only || only == 5) BenchSnapshot(blocks);
  return 0;
}
