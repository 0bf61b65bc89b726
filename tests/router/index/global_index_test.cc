#include "router/index/global_index.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <new>
#include <random>
#include <set>
#include <span>
#include <thread>

#include <doctest/doctest.h>

// Counts allocations so a test can show that FindMatches makes none. GCC cannot see that
// the replaced new and delete pair up (malloc/free) and warns at every inlined delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<uint64_t> g_allocations{0};
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace kvfleet::router {
namespace {

using kv::Tier;

// The reference: per worker, hash -> tier bits, and predicted hash -> expiry.
struct Model {
  std::map<WorkerId, std::map<BlockHash, uint8_t>> held;
  std::map<WorkerId, std::map<BlockHash, TimeNs>> predicted;

  std::vector<PrefixMatch> Match(const std::vector<BlockHash>& hashes, TimeNs now) const {
    std::vector<PrefixMatch> out;
    std::set<WorkerId> workers;
    for (auto& [w, m] : held) workers.insert(w);
    for (auto& [w, m] : predicted) workers.insert(w);
    for (WorkerId w : workers) {
      PrefixMatch m{w, 0, 0};
      bool host_phase = false;
      bool held_run = true;  // every block so far held by events (predictions excluded)
      for (BlockHash h : hashes) {
        uint8_t bits = 0;
        if (auto it = held.find(w); it != held.end())
          if (auto b = it->second.find(h); b != it->second.end()) bits = b->second;
        bool pred = false;
        if (auto it = predicted.find(w); it != predicted.end())
          if (auto p = it->second.find(h); p != it->second.end()) pred = p->second > now;
        if (!bits && !pred) break;
        held_run = held_run && bits != 0;
        if (held_run) ++m.held_blocks;
        if (!host_phase && ((bits & 1) || pred)) {
          ++m.device_blocks;
        } else {
          host_phase = true;
          ++m.host_blocks;
        }
      }
      if (m.device_blocks + m.host_blocks > 0) out.push_back(m);
    }
    return out;
  }
};

std::vector<PrefixMatch> Sorted(std::vector<PrefixMatch> v) {
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.worker < b.worker; });
  return v;
}

void ExpectSame(const std::vector<PrefixMatch>& got, const std::vector<PrefixMatch>& want) {
  auto g = Sorted(got), w = Sorted(want);
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    CHECK(g[i].worker == w[i].worker);
    CHECK(g[i].device_blocks == w[i].device_blocks);
    CHECK(g[i].host_blocks == w[i].host_blocks);
    CHECK(g[i].held_blocks == w[i].held_blocks);
  }
}

TEST_CASE("FindMatches agrees with a brute-force reference on random indexes") {
  ManualClock clock;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    GlobalIndex index({}, &clock);
    Model model;
    // A few prompt trees: chains of 64 blocks, which workers hold prefixes of, on tiers.
    std::vector<std::vector<BlockHash>> chains;
    for (int c = 0; c < 8; ++c) {
      std::vector<BlockHash> chain;
      for (int i = 0; i < 64; ++i) chain.push_back(rng() | 1);
      chains.push_back(chain);
    }
    const WorkerId workers = 1 + rng() % 40;  // past 16 holders a block goes dense
    for (int op = 0; op < 3000; ++op) {
      const WorkerId w = static_cast<WorkerId>(rng() % workers) * 23;  // sparse ids over many words
      const auto& chain = chains[rng() % chains.size()];
      const size_t at = rng() % chain.size();
      const BlockHash h = chain[at];
      const Tier tier = rng() % 3 == 0 ? Tier::kHost : Tier::kDevice;
      const uint8_t bit = tier == Tier::kDevice ? 1 : 2;
      switch (rng() % 6) {
        case 0:
        case 1:
        case 2:  // store a prefix run ending at `at`
          for (size_t i = 0; i <= at; ++i) {
            index.Store(w, chain[i], tier);
            model.held[w][chain[i]] |= bit;
            model.predicted[w].erase(chain[i]);
          }
          break;
        case 3:
          index.Remove(w, h, tier);
          if (auto it = model.held[w].find(h); it != model.held[w].end()) {
            it->second &= ~bit;
            if (!it->second) model.held[w].erase(it);
          }
          break;
        case 4:
          if (index.Move(w, h, tier)) {
            CHECK(model.held[w].count(h));
            model.held[w][h] = bit;
          } else {
            CHECK(!model.held[w].count(h));
          }
          break;
        case 5: {
          std::vector<BlockHash> run(chain.begin(), chain.begin() + at + 1);
          const DurationNs ttl = static_cast<DurationNs>(rng() % 3) * kNsPerSec;
          index.InsertPredicted(w, run, ttl);
          for (BlockHash p : run)
            if (!model.held[w].count(p)) model.predicted[w][p] = clock.Now() + ttl;
          break;
        }
      }
      if (op % 500 == 0) clock.AdvanceMs(700);
    }
    index.CheckInvariants();
    std::vector<PrefixMatch> got;
    for (const auto& chain : chains) {
      for (size_t len : {size_t{1}, size_t{5}, size_t{64}}) {
        std::vector<BlockHash> q(chain.begin(), chain.begin() + len);
        index.FindMatches(q, &got);
        ExpectSame(got, model.Match(q, clock.Now()));
        // The pull source's run (Router::AddPulls) is read from the match; it was one
        // HeldRun per candidate, which it must equal.
        for (const PrefixMatch& m : got) {
          const auto matched = std::span<const BlockHash>(q).first(m.device_blocks + m.host_blocks);
          CHECK(m.held_blocks == index.HeldRun(m.worker, matched));
        }
      }
    }
    for (WorkerId w = 0; w < workers * 23; w += 23) {
      for (Tier t : {Tier::kDevice, Tier::kHost}) {
        uint64_t want = 0;
        for (auto& [h, bits] : model.held[w]) want += (bits & (t == Tier::kDevice ? 1 : 2)) ? 1 : 0;
        CHECK(index.BlockCount(w, t) == want);
      }
    }
    // Expired predictions are swept without changing any answer.
    clock.AdvanceMs(5000);
    index.SweepExpired();
    index.CheckInvariants();
    for (const auto& chain : chains) {
      index.FindMatches(chain, &got);
      ExpectSame(got, model.Match(chain, clock.Now()));
    }
  }
}

TEST_CASE("a match counts leading device blocks, then the host blocks after them") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockHash> h = {11, 12, 13, 14, 15};
  index.Store(1, 11, Tier::kDevice);
  index.Store(1, 12, Tier::kDevice);
  index.Store(1, 13, Tier::kHost);
  index.Store(1, 14, Tier::kDevice);  // after the device run: counts as host
  index.Store(2, 11, Tier::kHost);
  index.Store(3, 12, Tier::kDevice);  // does not hold block 0: no match
  std::vector<PrefixMatch> out;
  index.FindMatches(h, &out);
  ExpectSame(out, {{1, 2, 2, 4}, {2, 0, 1, 1}});
}

TEST_CASE("FindMatches stops at the first block nobody still matching holds") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  index.Store(1, 1, Tier::kDevice);
  index.Store(2, 2, Tier::kDevice);  // 2 holds block 1 but not block 0
  index.Store(2, 3, Tier::kDevice);
  std::vector<PrefixMatch> out;
  std::vector<BlockHash> q = {1, 2, 3};
  index.FindMatches(q, &out);
  ExpectSame(out, {{1, 1, 0, 1}});
}

TEST_CASE("FindMatches allocates nothing once the output has capacity") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockHash> chain;
  for (int i = 0; i < 1024; ++i) chain.push_back(1000 + i);
  for (WorkerId w = 0; w < 64; ++w)
    for (int i = 0; i < 1024 - static_cast<int>(w); ++i) index.Store(w, chain[i], Tier::kDevice);
  std::vector<PrefixMatch> out;
  out.reserve(config::kMaxWorkers);
  index.FindMatches(chain, &out);  // warms the thread's scratch
  const uint64_t before = g_allocations.load();
  for (int i = 0; i < 100; ++i) index.FindMatches(chain, &out);
  CHECK(g_allocations.load() == before);
  REQUIRE(out.size() == 64);
  for (const PrefixMatch& m : out) CHECK(m.device_blocks == 1024 - m.worker);  // dense blocks
  index.CheckInvariants();
}

TEST_CASE("a predicted entry counts until its TTL passes or a stored event confirms it") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockHash> run = {5, 6, 7};
  index.InsertPredicted(4, run, 2 * kNsPerSec);
  std::vector<PrefixMatch> out;
  index.FindMatches(run, &out);
  ExpectSame(out, {{4, 3, 0, 0}});  // held: none, by its events
  CHECK(out[0].predicted_ms_left == 2000);  // when the prediction runs out
  CHECK(index.BlockCount(4, Tier::kDevice) == 0);  // predictions are not holdings
  index.Store(4, 5, Tier::kDevice);                  // confirms block 5 only
  clock.AdvanceMs(300);
  index.InsertPredicted(4, std::span(run).subspan(2), 3 * kNsPerSec);  // a later request's: the latest counts
  index.FindMatches(run, &out);
  ExpectSame(out, {{4, 3, 0, 1}});
  CHECK(out[0].predicted_ms_left == 3000);
  index.Store(4, 6, Tier::kDevice);
  index.Store(4, 7, Tier::kDevice);
  index.FindMatches(run, &out);
  ExpectSame(out, {{4, 3, 0, 3}});
  CHECK(out[0].predicted_ms_left == 0);  // held whole: nothing predicted
  index.Remove(4, 6, Tier::kDevice);
  index.Remove(4, 7, Tier::kDevice);
  index.InsertPredicted(4, std::span(run).subspan(1), 2 * kNsPerSec);
  clock.AdvanceMs(2500);
  index.FindMatches(run, &out);
  ExpectSame(out, {{4, 1, 0, 1}});
  CHECK(index.SweepExpired() == 2);
  CHECK(index.EntryCount() == 1);
  index.CheckInvariants();
}

TEST_CASE("RemoveWorker drops every entry of that worker and no other") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  for (BlockHash h = 1; h <= 5000; ++h) {
    index.Store(1, h, Tier::kDevice);
    if (h % 2) index.Store(2, h, Tier::kHost);
  }
  std::vector<BlockHash> pred = {9001, 9002};
  index.InsertPredicted(1, pred, kNsPerSec);
  index.RemoveWorker(1);
  index.CheckInvariants();
  CHECK(index.BlockCount(1, Tier::kDevice) == 0);
  CHECK(index.BlockCount(2, Tier::kHost) == 2500);
  CHECK(index.EntryCount() == 2500);
  CHECK(index.HashCount() == 2500);
}

TEST_CASE("a snapshot's reset (ForgetStored) drops what the events said and keeps the router's predictions") {
  // Issue 34: a resync dropped the predicted entries of requests on their way to the worker,
  // so for a moment the event-fed index knew less than the router's own decisions.
  ManualClock clock;
  GlobalIndex index({}, &clock);
  for (BlockHash h = 1; h <= 3000; ++h) {
    index.Store(1, h, Tier::kDevice);
    index.Store(2, h, Tier::kDevice);
  }
  index.Remove(1, 7, Tier::kDevice);  // lost and regained: listed twice in the reverse list
  index.Store(1, 7, Tier::kDevice);
  std::vector<BlockHash> pred = {9001, 9002, 9003};
  index.InsertPredicted(1, pred, 2 * kNsPerSec);
  index.ForgetStored(1);
  index.CheckInvariants();
  CHECK(index.BlockCount(1, Tier::kDevice) == 0);
  CHECK(!index.Holds(1, 7));
  CHECK(index.BlockCount(2, Tier::kDevice) == 3000);
  CHECK(index.EntryCount() == 3000 + 3);
  std::vector<PrefixMatch> out;
  index.FindMatches(pred, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].worker == 1);
  CHECK(out[0].device_blocks == 3);
  // The snapshot's stored blocks confirm a prediction; the worker's removal ends it.
  index.Store(1, 9001, Tier::kDevice);
  index.Remove(1, 9001, Tier::kDevice);
  index.FindMatches(pred, &out);
  CHECK(out.empty());
  // A second reset keeps the rest, and RemoveWorker (the worker is gone) drops them.
  index.ForgetStored(1);
  index.CheckInvariants();
  CHECK(index.EntryCount() == 3000 + 2);
  index.RemoveWorker(1);
  index.CheckInvariants();
  CHECK(index.EntryCount() == 3000);
}

TEST_CASE("a capped index trims the least recently used blocks") {
  ManualClock clock;
  GlobalIndexOptions options;
  options.max_entries = config::kShards * 100;  // 100 per shard
  GlobalIndex index(options, &clock);
  for (BlockHash h = 1; h <= 5000; ++h) index.Store(1, h, Tier::kDevice);
  clock.AdvanceMs(10);
  for (BlockHash h = 100001; h <= 105000; ++h) {
    index.Store(1, h, Tier::kDevice);
    clock.AdvanceMs(1);
  }
  CHECK(index.EntryCount() <= options.max_entries);
  index.CheckInvariants();
  // The newest blocks survive; the oldest are gone.
  CHECK(index.Holds(1, 105000));
  CHECK(!index.Holds(1, 1));
}

TEST_CASE("a fleet of more than 64 workers matches exactly (overflow groups)") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  Model model;
  std::mt19937_64 rng(11);
  std::vector<BlockHash> chain;
  for (int i = 0; i < 96; ++i) chain.push_back(rng() | 1);
  constexpr WorkerId kFleet = 200;
  for (WorkerId w = 0; w < kFleet; ++w) {
    const size_t len = 1 + rng() % chain.size();
    const size_t dev = rng() % (len + 1);
    std::vector<BlockOp> ops;
    for (size_t i = 0; i < len; ++i) {
      const Tier t = i < dev ? Tier::kDevice : Tier::kHost;
      ops.push_back({chain[i], BlockOp::kStore, t});
      model.held[w][chain[i]] |= t == Tier::kDevice ? 1 : 2;
    }
    index.Apply(w, ops);
  }
  // Predictions for high ids count too.
  index.InsertPredicted(700, std::span<const BlockHash>(chain).first(10), kNsPerSec);
  for (int i = 0; i < 10; ++i) model.predicted[700][chain[i]] = clock.Now() + kNsPerSec;
  index.CheckInvariants();
  std::vector<PrefixMatch> got;
  for (size_t len : {size_t{1}, size_t{7}, size_t{96}}) {
    std::vector<BlockHash> q(chain.begin(), chain.begin() + len);
    index.FindMatches(q, &got);
    ExpectSame(got, model.Match(q, clock.Now()));
  }
  // Removing workers on either side of the 64 boundary leaves the others intact.
  for (WorkerId w : {WorkerId{3}, WorkerId{64}, WorkerId{150}}) {
    index.RemoveWorker(w);
    model.held.erase(w);
  }
  index.CheckInvariants();
  index.FindMatches(chain, &got);
  ExpectSame(got, model.Match(chain, clock.Now()));
  CHECK(index.BlockCount(150, Tier::kDevice) + index.BlockCount(150, Tier::kHost) == 0);
  CHECK(index.Holds(199, chain[0]));
  CHECK(!index.Holds(150, chain[0]));
}

TEST_CASE("a block's overflow row keeps each 64-worker group's holders as groups come and go") {
  // One row holds every group's masks (inline for one group, an array for more): groups
  // added and removed out of order must keep the others' masks and tiers.
  ManualClock clock;
  GlobalIndex index({}, &clock);
  Model model;
  const std::vector<BlockHash> run = {31, 32};
  const std::vector<WorkerId> order = {700, 64, 1023, 130, 65, 200, 5};  // groups 10, 1, 15, 2, 1, 3, 0
  for (size_t k = 0; k < order.size(); ++k) {
    const Tier t = k % 2 == 0 ? Tier::kDevice : Tier::kHost;
    for (BlockHash h : run) {
      index.Store(order[k], h, t);
      model.held[order[k]][h] = t == Tier::kDevice ? 1 : 2;
    }
    index.CheckInvariants();
  }
  std::vector<PrefixMatch> got;
  index.FindMatches(run, &got);
  ExpectSame(got, model.Match(run, clock.Now()));
  for (WorkerId w : {WorkerId{130}, WorkerId{700}, WorkerId{64}, WorkerId{1023}}) {
    index.Remove(w, run[1], w == 700 || w == 1023 ? Tier::kDevice : Tier::kHost);
    model.held[w].erase(run[1]);
    index.CheckInvariants();
    index.FindMatches(run, &got);
    ExpectSame(got, model.Match(run, clock.Now()));
  }
  CHECK(index.Holds(65, run[1]));
  CHECK(!index.Holds(64, run[1]));
  CHECK(index.Move(200, run[0], Tier::kHost));
  model.held[200][run[0]] = 2;
  index.RemoveWorker(65);
  model.held.erase(65);
  index.CheckInvariants();
  index.FindMatches(run, &got);
  ExpectSame(got, model.Match(run, clock.Now()));
}

TEST_CASE("a prediction of a worker past 63 counts on a block no such worker stores") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockHash> run = {21, 22, 23};
  for (BlockHash h : run) index.Store(1, h, Tier::kDevice);
  index.InsertPredicted(130, run, kNsPerSec);
  std::vector<PrefixMatch> out;
  index.FindMatches(run, &out);
  ExpectSame(out, {{1, 3, 0, 3}, {130, 3, 0, 0}});
  index.CheckInvariants();
}

TEST_CASE("Apply keeps each block's ops in order and ignores moves of blocks not held") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockOp> ops = {
      {1, BlockOp::kStore, Tier::kDevice}, {1, BlockOp::kRemove, Tier::kDevice},  // gone
      {2, BlockOp::kRemove, Tier::kDevice}, {2, BlockOp::kStore, Tier::kDevice},  // held
      {3, BlockOp::kStore, Tier::kDevice},  {3, BlockOp::kMove, Tier::kHost},     // moved
      {4, BlockOp::kMove, Tier::kHost},                                           // not held: ignored
  };
  for (WorkerId w : {WorkerId{5}, WorkerId{300}}) {
    index.Apply(w, ops);
    CHECK(!index.Holds(w, 1));
    CHECK(index.Holds(w, 2));
    CHECK(index.BlocksOf(w, Tier::kHost) == std::vector<BlockHash>{3});
    CHECK(index.BlocksOf(w, Tier::kDevice) == std::vector<BlockHash>{2});
    CHECK(!index.Holds(w, 4));
  }
  CHECK(index.EntryCount() == 4);
  index.CheckInvariants();
}

TEST_CASE("reverse lists stay bounded under store/remove churn, and RemoveWorker still clears all") {
  ManualClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockOp> store, remove;
  for (BlockHash h = 1; h <= 2000; ++h) {
    store.push_back({h, BlockOp::kStore, Tier::kDevice});
    remove.push_back({h, BlockOp::kRemove, Tier::kDevice});
  }
  index.Store(2, 1, Tier::kHost);  // another worker shares block 1
  index.Apply(1, store);
  const uint64_t after_one = index.MemoryBytes();
  for (int round = 0; round < 50; ++round) {
    index.Apply(1, remove);
    index.Apply(1, store);  // the same blocks again: duplicates in the lists until compacted
  }
  index.CheckInvariants();
  // Tables keep their size; the lists are compacted back to about one hash per entry.
  CHECK(index.MemoryBytes() <= after_one * 2);
  CHECK(index.BlockCount(1, Tier::kDevice) == 2000);
  index.RemoveWorker(1);
  index.CheckInvariants();
  CHECK(index.EntryCount() == 1);
  CHECK(index.Holds(2, 1));
}

}  // namespace
}  // namespace kvfleet::router
