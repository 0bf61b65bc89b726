// routing_scale_bench: the time of one kv routing decision (Router::Route: hashing the prompt,
// the global index's match, every candidate's load and cost, the pick) as the fleet grows,
// over a global index that holds many blocks per worker, optionally while a writer thread
// applies the workers' events.
//
//   build/bench/routing_scale_bench [--workers 100,500,1000] [--blocks 10000] [--requests 2000]
//       [--rate 0] [--events-per-s 100] [--churn 0.1]
//
// The index, per fleet size N (workers 0..N-1, so ids past 63 take the overflow rows):
//   - 8 shared prefixes (system prompts) of 64 blocks, held by every worker;
//   - conversations on them, 32-256 blocks each, each held by 1-8 workers to different
//     depths (one holds it whole; a fifth of the holders keep their tail on the host tier),
//     added until the workers hold --blocks blocks each on average.
// Requests: 70% continue a conversation (the prefix, a random part of the conversation, 4
// fresh blocks), so several workers match to different depths and all N match the prefix;
// 30% start one (a prefix and 8 fresh blocks). Each decision is committed (its predicted
// entries), untimed. --rate paces them (requests/s, open loop; 0: back to back), so that two
// builds route over the same span of the writer's events. The router's and the index's clock
// is a manual one that advances 5 ms per request, so without the writer the decisions are the
// same at every run and build: their digest is printed. Loads: every worker has a report and this router's own counts; every
// worker serves pulls (one format), so the kv policy's pull options are costed.
//
// --events-per-s: a writer thread applies each worker's block events (stores and removes,
// in one batch per worker per 50 ms, as the simulated workers send them), and every
// 60 / (churn x N) s replaces a worker: its blocks forgotten and applied again as one
// snapshot. The rate reached is printed: a 2-core machine may not keep up with 1,000 workers.
//
// tests/bench/router/routing_scale_ab.sh runs it at two commits side by side.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <CLI/CLI.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/fleet/fleet.h"
#include "router/index/global_index.h"
#include "router/routing/router.h"

namespace kvfleet::router {
namespace {

using BenchClock = std::chrono::steady_clock;
constexpr uint32_t kBlockSize = 32;
constexpr uint32_t kPrefixes = 8;
constexpr uint32_t kPrefixBlocks = 64;
constexpr char kModel[] = "bench";

// Loads as the Fleet serves them: one lock for every candidate's view (with its transfer ids), one per
// Transfer.
class BenchLoads final : public WorkerLoads {
 public:
  explicit BenchLoads(size_t n, std::mt19937_64& rng) : views_(n), transfer_(n) {
    for (size_t w = 0; w < n; ++w) {
      LoadView& v = views_[w];
      v.own.requests = static_cast<double>(rng() % 4);
      v.own.waiting = v.own.requests > 0 ? 1 : 0;
      v.own.prefill_tokens = static_cast<double>(rng() % 4096);
      v.own.prompt_tokens = v.own.prefill_tokens;
      WorkerLoad r;
      r.active_requests = static_cast<uint32_t>(rng() % 32);
      r.queued_requests = static_cast<uint32_t>(rng() % 4);
      r.active_prefill_tokens = rng() % 16384;
      r.prefill_tokens_per_second = static_cast<float>(8'000 + rng() % 4'000);
      r.total_blocks = {100'000, 0};
      r.free_blocks = {rng() % 100'000, 0};
      r.received_at = 1;
      v.report = r;
      v.own_at_report = v.own;
      v.announced_prefill_rate = 10'000;
      transfer_[w] = std::make_shared<const TransferPeer>(
          TransferPeer{"w" + std::to_string(w), "tcp://10.0.0." + std::to_string(w % 250) + ":5559", "", "bf16", 64u << 10,
                       "host" + std::to_string(w / 8)});
      v.transfer_format = TransferNameId(transfer_[w]->format);
      v.transfer_host = TransferNameId(transfer_[w]->host_id);
    }
  }
  OwnLoadCounts OwnLoad(WorkerId w) const override { return views_[w].own; }
  OwnLoadCounts OwnLoadAt(WorkerId w, TimeNs) const override { return views_[w].own_at_report; }
  std::optional<WorkerLoad> ReportedLoad(WorkerId w) const override { return views_[w].report; }
  std::shared_ptr<const TransferPeer> Transfer(WorkerId w) const override {
    std::shared_lock lock(mu_);
    return transfer_[w];
  }
  void Loads(std::span<const WorkerId> ids, std::vector<LoadView>* out) const override {
    out->clear();
    std::shared_lock lock(mu_);
    for (WorkerId id : ids) out->push_back(views_[id]);
  }

 private:
  mutable std::shared_mutex mu_;
  std::vector<LoadView> views_;
  std::vector<std::shared_ptr<const TransferPeer>> transfer_;
};

struct Conversation {
  uint32_t prefix;
  uint64_t seed;    // its tokens: mt19937_64(seed)
  uint32_t blocks;  // its length
  std::vector<BlockHash> hashes;  // its own blocks' (after the prefix)
};

// One worker's share of a conversation: its first `depth` blocks, the last `host` on the host tier.
struct Holding {
  uint32_t conversation, depth, host;
};

std::vector<TokenId> RandomTokens(std::mt19937_64& rng, size_t n) {
  std::vector<TokenId> out(n);
  for (TokenId& t : out) t = static_cast<TokenId>(rng() % 32'000);
  return out;
}

struct Content {
  std::vector<std::vector<TokenId>> prefix_tokens;
  std::vector<std::vector<BlockHash>> prefix_hashes;
  std::vector<Conversation> conversations;
  std::vector<std::vector<Holding>> held;  // by worker

  std::vector<BlockOp> OpsOf(WorkerId w) const {
    std::vector<BlockOp> ops;
    for (const auto& p : prefix_hashes)
      for (BlockHash h : p) ops.push_back({h, BlockOp::kStore, kv::Tier::kDevice});
    for (const Holding& h : held[w]) {
      const Conversation& c = conversations[h.conversation];
      for (uint32_t b = 0; b < h.depth; ++b)
        ops.push_back({c.hashes[b], BlockOp::kStore, b + h.host >= h.depth ? kv::Tier::kHost : kv::Tier::kDevice});
    }
    return ops;
  }
};

Content MakeContent(size_t n, uint64_t blocks_per_worker, const BlockHasher& hasher, std::mt19937_64& rng) {
  Content c;
  for (uint32_t p = 0; p < kPrefixes; ++p) {
    c.prefix_tokens.push_back(RandomTokens(rng, kPrefixBlocks * kBlockSize));
    c.prefix_hashes.push_back(hasher.HashAll(c.prefix_tokens.back()));
  }
  c.held.resize(n);
  const uint64_t target = n * (blocks_per_worker > kPrefixes * kPrefixBlocks ? blocks_per_worker - kPrefixes * kPrefixBlocks : 0);
  uint64_t entries = 0;
  while (entries < target) {
    Conversation conv{static_cast<uint32_t>(rng() % kPrefixes), rng(), 32 + static_cast<uint32_t>(rng() % 225), {}};
    std::mt19937_64 tokens_rng(conv.seed);
    const std::vector<TokenId> tokens = RandomTokens(tokens_rng, size_t{conv.blocks} * kBlockSize);
    BlockHash parent = c.prefix_hashes[conv.prefix].back();
    for (uint32_t b = 0; b < conv.blocks; ++b) {
      parent = hasher.Next(parent, std::span(tokens).subspan(size_t{b} * kBlockSize, kBlockSize));
      conv.hashes.push_back(parent);
    }
    const uint32_t holders = 1 + static_cast<uint32_t>(rng() % 8);
    for (uint32_t k = 0; k < holders; ++k) {
      const WorkerId w = static_cast<WorkerId>(rng() % n);
      const uint32_t depth = k == 0 ? conv.blocks : 1 + static_cast<uint32_t>(rng() % conv.blocks);
      const uint32_t host = rng() % 5 == 0 ? static_cast<uint32_t>(rng() % depth) : 0;
      c.held[w].push_back({static_cast<uint32_t>(c.conversations.size()), depth, host});
      entries += depth;
    }
    c.conversations.push_back(std::move(conv));
  }
  return c;
}

// A request's tokens: see the file's comment.
std::vector<TokenId> MakeRequest(const Content& c, std::mt19937_64& rng) {
  std::vector<TokenId> tokens;
  if (rng() % 10 < 7) {
    const Conversation& conv = c.conversations[rng() % c.conversations.size()];
    tokens = c.prefix_tokens[conv.prefix];
    std::mt19937_64 tokens_rng(conv.seed);
    const uint32_t used = 1 + static_cast<uint32_t>(rng() % conv.blocks);
    const std::vector<TokenId> own = RandomTokens(tokens_rng, size_t{used} * kBlockSize);
    tokens.insert(tokens.end(), own.begin(), own.end());
    const std::vector<TokenId> fresh = RandomTokens(rng, 4 * kBlockSize);
    tokens.insert(tokens.end(), fresh.begin(), fresh.end());
  } else {
    tokens = c.prefix_tokens[rng() % kPrefixes];
    const std::vector<TokenId> fresh = RandomTokens(rng, 8 * kBlockSize);
    tokens.insert(tokens.end(), fresh.begin(), fresh.end());
  }
  return tokens;
}

// The workers' events while requests are routed; see the file's comment.
class Writer {
 public:
  Writer(GlobalIndex* index, const Content* content, size_t n, double events_per_s, double churn)
      : index_(index), content_(content), n_(n), events_per_s_(events_per_s), churn_(churn) {
    if (events_per_s_ > 0) thread_ = std::thread([this] { Run(); });
  }
  ~Writer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  double Seconds() const { return std::chrono::duration<double>(BenchClock::now() - start_).count(); }
  uint64_t events() const { return events_.load(); }
  uint64_t snapshots() const { return snapshots_.load(); }

 private:
  void Run() {
    constexpr auto kTick = std::chrono::milliseconds(50);
    std::mt19937_64 rng(99);
    std::vector<std::deque<BlockHash>> own(n_);  // each worker's recent blocks, oldest first
    const uint32_t per_batch = std::max<uint32_t>(1, static_cast<uint32_t>(events_per_s_ / 20));
    const double churn_every_s = churn_ > 0 ? 60.0 / (churn_ * static_cast<double>(n_)) : 1e300;
    double next_churn_s = churn_every_s;
    auto next = BenchClock::now();
    std::vector<BlockOp> ops;
    while (!stop_.load()) {
      for (WorkerId w = 0; w < n_ && !stop_.load(); ++w) {
        ops.clear();
        for (uint32_t k = 0; k < per_batch; ++k) {
          if (own[w].size() >= 256) {
            ops.push_back({own[w].front(), BlockOp::kRemove, kv::Tier::kDevice});
            own[w].pop_front();
          } else {
            own[w].push_back(rng());
            ops.push_back({own[w].back(), BlockOp::kStore, kv::Tier::kDevice});
          }
        }
        index_->Apply(w, ops);
        events_.fetch_add(ops.size());
      }
      if (Seconds() >= next_churn_s) {  // a worker replaced: its snapshot, 64K blocks a chunk
        const WorkerId w = static_cast<WorkerId>(rng() % n_);
        index_->ForgetStored(w);
        own[w].clear();
        const std::vector<BlockOp> all = content_->OpsOf(w);
        for (size_t at = 0; at < all.size(); at += 65'536)
          index_->Apply(w, std::span(all).subspan(at, std::min<size_t>(65'536, all.size() - at)));
        snapshots_.fetch_add(1);
        next_churn_s += churn_every_s;
      }
      next += kTick;
      std::this_thread::sleep_until(next);
    }
  }

  GlobalIndex* index_;
  const Content* content_;
  const size_t n_;
  const double events_per_s_, churn_;
  const BenchClock::time_point start_ = BenchClock::now();
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> events_{0}, snapshots_{0};
  std::thread thread_;
};

// This thread's CPU time: on a shared machine the wall time of a decision includes the time
// its thread waited for a core; the CPU time does not.
double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

struct Stats {
  double p50 = 0, p99 = 0, max = 0, mean = 0;
};

Stats Summarize(std::vector<double> us) {
  Stats s;
  std::sort(us.begin(), us.end());
  for (double v : us) s.mean += v;
  s.mean /= static_cast<double>(us.size());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  s.max = us.back();
  return s;
}

void RunFleet(size_t n, uint64_t blocks, int requests, double rate, double events_per_s, double churn) {
  ManualClock clock;  // 5 ms a request (see the file's comment)
  std::mt19937_64 rng(7 + n);
  const BlockHasher hasher(kBlockSize, HashNamespace{kModel, "", ""});
  auto t0 = BenchClock::now();
  const Content content = MakeContent(n, blocks, hasher, rng);
  GlobalIndex index(GlobalIndexOptions{}, &clock);
  for (WorkerId w = 0; w < n; ++w) {
    const std::vector<BlockOp> ops = content.OpsOf(w);
    for (size_t at = 0; at < ops.size(); at += 65'536)
      index.Apply(w, std::span(ops).subspan(at, std::min<size_t>(65'536, ops.size() - at)));
  }
  const double fill_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
  std::printf("N=%zu: %llu entries, %llu hashes, %.0f MiB, filled in %.1f s\n", n,
              static_cast<unsigned long long>(index.EntryCount()), static_cast<unsigned long long>(index.HashCount()),
              static_cast<double>(index.MemoryBytes()) / (1 << 20), fill_s);

  BenchLoads loads(n, rng);
  ModelFleet fleet;
  fleet.block_size = kBlockSize;
  for (WorkerId w = 0; w < n; ++w) fleet.routable.push_back(w);
  fleet.workers = n;

  Writer writer(&index, &content, n, events_per_s, churn);
  {
    Router router(RoutingOptions{}, &loads, &index, &index, nullptr, &clock);
    std::mt19937_64 request_rng(1234);  // the same requests at every commit
    std::vector<double> us, cpu_us;
    double matched = 0, pulls = 0;
    uint64_t digest = 0xcbf29ce484222325ull;  // FNV-1a over each decision's worker, blocks and pull
    auto mix = [&](uint64_t v) { digest = (digest ^ v) * 0x100000001b3ull; };
    const uint64_t events0 = writer.events(), snapshots0 = writer.snapshots();
    const double s0 = writer.Seconds();
    const auto begin = BenchClock::now();
    for (int i = 0; i < requests; ++i) {
      if (rate > 0) std::this_thread::sleep_until(begin + std::chrono::duration<double>(i / rate));
      const std::vector<TokenId> tokens = MakeRequest(content, request_rng);
      const Prompt prompt{kModel, tokens, "", Policy::kKv};
      const double cpu0 = ThreadCpuUs();
      const auto start = BenchClock::now();
      Result<Decision> d = router.Route(fleet, prompt);
      us.push_back(std::chrono::duration<double, std::micro>(BenchClock::now() - start).count());
      cpu_us.push_back(ThreadCpuUs() - cpu0);
      if (!d.ok()) {
        std::fprintf(stderr, "route failed: %s\n", d.status().ToString().c_str());
        std::exit(1);
      }
      mix(d->worker);
      mix(d->device_blocks);
      mix(d->host_blocks);
      mix(d->pull.source.empty() ? ~0ull : d->pull_from);
      matched += d->device_blocks + d->host_blocks;
      pulls += d->pull_from != 0 || !d->pull.source.empty() ? 1 : 0;
      router.Commit(*d);
      clock.AdvanceMs(5);
    }
    const Stats s = Summarize(us), c = Summarize(cpu_us);
    const double window_s = std::max(1e-9, writer.Seconds() - s0);
    const double events_rate = static_cast<double>(writer.events() - events0) / window_s;
    std::printf("  N=%-5zu route wall us: p50 %7.1f  p99 %7.1f  max %7.1f | cpu us: p50 %7.1f  p99 %7.1f  mean %7.1f\n"
                "           chosen matched %.0f blocks avg, %.0f%% pulls, decisions' digest %016llx; over %.1f s "
                "the writer applied %.0f ev/s and %llu snapshots\n",
                n, s.p50, s.p99, s.max, c.p50, c.p99, c.mean, matched / requests, 100 * pulls / requests,
                static_cast<unsigned long long>(digest), window_s, events_rate,
                static_cast<unsigned long long>(writer.snapshots() - snapshots0));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace kvfleet::router

int main(int argc, char** argv) {
  CLI::App app("routing_scale_bench: one kv routing decision's time against the fleet's size");
  std::vector<size_t> workers = {100, 500, 1000};
  uint64_t blocks = 10'000;
  int requests = 2'000;
  double rate = 0, events_per_s = 100, churn = 0.1;
  app.add_option("--workers", workers, "fleet sizes, one run each")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--blocks", blocks, "blocks each worker holds, on average")->check(CLI::Range(1, 1'000'000));
  app.add_option("--requests", requests, "routing decisions timed per fleet size")->check(CLI::PositiveNumber);
  app.add_option("--rate", rate, "requests per second, open loop (0: back to back)")->check(CLI::NonNegativeNumber);
  app.add_option("--events-per-s", events_per_s, "block events per worker per second (0: no writer thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--churn", churn, "workers replaced per minute, as a fraction of the fleet")->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  for (size_t n : workers) kvfleet::router::RunFleet(n, blocks, requests, rate, events_per_s, churn);
  return 0;
}
