// GlobalIndex under concurrency: readers (FindMatches, Holds) while writers store, move and
// remove blocks and the shards' tables grow and shrink (router/index/README.md,
// "Concurrency"). These cases carry the TSan label with the rest of global_index_test.
#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "router/index/global_index.h"

namespace kvfleet::router {
namespace {

using kv::Tier;

TEST_CASE("readers match while writers store, move and remove (TSan)") {
  SystemClock clock;
  GlobalIndex index({}, &clock);
  std::vector<BlockHash> chain;
  for (int i = 0; i < 256; ++i) chain.push_back(0xABC000 + i);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (WorkerId w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int op = 0; op < 20000; ++op) {
        BlockHash h = chain[rng() % chain.size()];
        switch (rng() % 4) {
          case 0: index.Store(w, h, Tier::kDevice); break;
          case 1: index.Remove(w, h, Tier::kDevice); break;
          case 2: index.Move(w, h, Tier::kHost); break;
          case 3: index.InsertPredicted(w, std::span(&h, 1), kNsPerMs); break;
        }
        if (op % 5000 == 0) index.RemoveWorker(w);
      }
    });
  }
  std::vector<std::thread> readers;
  std::atomic<uint64_t> matched{0};
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      std::vector<PrefixMatch> out;
      while (!stop.load()) {
        index.FindMatches(chain, &out);
        for (auto& m : out) matched += m.device_blocks + m.host_blocks;
        (void)index.BlockCount(0, Tier::kDevice);
      }
    });
  }
  for (auto& t : writers) t.join();
  stop = true;
  for (auto& t : readers) t.join();
  index.SweepExpired();
  index.CheckInvariants();
}

TEST_CASE("readers match while the tables grow and shrink under them (TSan)") {
  SystemClock clock;
  GlobalIndex index({}, &clock);
  // A chain two workers hold throughout: every answer must show it whole.
  std::vector<BlockHash> chain;
  for (int i = 0; i < 64; ++i) chain.push_back(0xC0FFEE000 + i);
  for (BlockHash h : chain) {
    index.Store(0, h, Tier::kDevice);
    index.Store(70, h, Tier::kHost);
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      std::vector<PrefixMatch> out;
      while (!stop.load()) {
        index.FindMatches(chain, &out);
        bool ok = out.size() == 2;
        for (const auto& m : out)
          ok &= (m.worker == 0 && m.device_blocks == 64) || (m.worker == 70 && m.host_blocks == 64);
        if (!ok || !index.Holds(0, chain[7])) bad.fetch_add(1);
      }
    });
  }
  // Growth of every shard's table several times, then removal of it all.
  std::vector<BlockOp> ops;
  for (BlockHash h = 1; h <= 60000; ++h) ops.push_back({h * 0x9E3779B97F4A7C15ull, BlockOp::kStore, Tier::kDevice});
  for (size_t k = 0; k < ops.size(); k += 500) index.Apply(k / 500 % 3 + 1, std::span(ops).subspan(k, 500));
  for (auto& op : ops) op.kind = BlockOp::kRemove;
  for (size_t k = 0; k < ops.size(); k += 500) index.Apply(k / 500 % 3 + 1, std::span(ops).subspan(k, 500));
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0);
  CHECK(index.EntryCount() == 2 * chain.size());
  index.CheckInvariants();
}

// The block hash whose mix (shard_table.h: murmur3's finaliser) is `mix`: the finaliser's
// inverse, so a test can place blocks on chosen slots.
BlockHash HashWithMix(uint64_t mix) {
  auto inverse = [](uint64_t c) {  // mod 2^64, by Newton's iteration
    uint64_t x = c;
    for (int i = 0; i < 6; ++i) x *= 2 - c * x;
    return x;
  };
  uint64_t h = mix;
  h ^= h >> 33;
  h *= inverse(0xc4ceb9fe1a85ec53ULL);
  h ^= h >> 33;
  h *= inverse(0xff51afd7ed558ccdULL);
  h ^= h >> 33;
  return h;
}

TEST_CASE("a reader never sees a slot torn between two blocks or two writes (TSan)") {
  SystemClock clock;
  GlobalIndex index({}, &clock);
  // Every block has the same shard and home slot, at every table size: one probe run in which
  // writers keep claiming slots, freeing them and shifting the rest back. Block b is only
  // ever held by owner(b), on tier(b). A slot read half before and half after a write (a
  // shifted slot's hash with its neighbour's masks) shows another worker or tier.
  constexpr uint32_t kChurned = 120, kGeneration = 8, kGenerations = 600;
  auto block_hash = [](uint32_t id) { return HashWithMix((uint64_t{id} + 1) << 24 | 0x5A5A5); };
  const WorkerId owners[3] = {3, 71, 130};  // a slot's masks, and two overflow groups
  auto owner = [&](uint32_t b) { return owners[b % 3]; };
  auto tier = [](uint32_t b) { return b % 2 == 0 ? Tier::kDevice : Tier::kHost; };
  // Pinned blocks, worker 200's: generation g (ids kChurned + g * kGeneration ...) is stored
  // at the end of the run, published as `current`, and removed once g + 1 is published. A
  // reader that sees `current` == g before and after its match must find the block: a probe
  // that overlapped a shift of the slots before it would miss it.
  constexpr WorkerId kPinOwner = 200;
  auto pinned = [&](uint32_t g, uint32_t j) { return block_hash(kChurned + g * kGeneration + j); };
  auto pin = [&](uint32_t g, BlockOp::Kind kind) {
    std::vector<BlockOp> ops;
    for (uint32_t j = 0; j < kGeneration; ++j) ops.push_back({pinned(g, j), kind, Tier::kDevice});
    index.Apply(kPinOwner, ops);
  };
  pin(0, BlockOp::kStore);
  std::atomic<uint32_t> current{0};
  std::atomic<int> writing{4};
  std::vector<std::thread> writers;
  for (uint32_t k = 0; k < 3; ++k) {
    writers.emplace_back([&, k] {
      std::mt19937 rng(k);
      std::vector<BlockOp> ops;
      for (int round = 0; round < 6000; ++round) {
        ops.clear();
        for (int j = 0; j < 16; ++j) {
          const uint32_t b = static_cast<uint32_t>(rng() % (kChurned / 3)) * 3 + k;
          ops.push_back({block_hash(b), rng() % 2 ? BlockOp::kStore : BlockOp::kRemove, tier(b)});
        }
        index.Apply(owners[k], ops);
      }
      writing.fetch_sub(1);
    });
  }
  writers.emplace_back([&] {
    for (uint32_t g = 1; g < kGenerations; ++g) {
      pin(g, BlockOp::kStore);
      current.store(g);
      pin(g - 1, BlockOp::kRemove);
      std::this_thread::yield();
    }
    writing.fetch_sub(1);
  });
  std::atomic<uint64_t> torn{0}, missed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(100 + r);
      std::vector<PrefixMatch> out;
      out.reserve(config::kMaxWorkers);
      std::vector<BlockHash> chain(kGeneration);
      while (writing.load() > 0) {
        const uint32_t b = static_cast<uint32_t>(rng() % kChurned);
        const BlockHash h = block_hash(b);
        index.FindMatches(std::span(&h, 1), &out);
        for (const PrefixMatch& m : out) {
          const bool device = tier(b) == Tier::kDevice;
          const bool right = m.worker == owner(b) && m.held_blocks == 1 &&
                             m.device_blocks == (device ? 1u : 0u) && m.host_blocks == (device ? 0u : 1u);
          if (!right) torn.fetch_add(1);
        }
        if (index.Holds(owners[(b + 1) % 3], h)) torn.fetch_add(1);
        for (int k = 0; k < 4; ++k) {
          const uint32_t g = current.load();
          for (uint32_t j = 0; j < kGeneration; ++j) chain[j] = pinned(g, j);
          index.FindMatches(chain, &out);
          const bool found = out.size() == 1 && out[0].worker == kPinOwner && out[0].device_blocks == kGeneration;
          if (!found && current.load() == g) missed.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  for (auto& t : readers) t.join();
  CHECK(torn.load() == 0);
  CHECK(missed.load() == 0);
  index.CheckInvariants();
}

}  // namespace
}  // namespace kvfleet::router
