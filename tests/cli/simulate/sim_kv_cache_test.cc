#include "cli/simulate/sim_kv_cache.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kvfleet::sim {
namespace {

SimKvCacheOptions Small() {
  SimKvCacheOptions o;
  o.capacity_blocks = 600;
  o.shared_prefixes = 4;
  o.prefix_blocks = 8;
  o.max_turn_blocks = 16;
  o.max_conversation_blocks = 64;
  return o;
}

// What a router's index would hold after applying the events, checking their order: a
// block is stored under a parent held (or the root) and removed only with no child held.
class Model {
 public:
  void Apply(const kv::KvEvent& e) {
    if (const auto* s = std::get_if<kv::StoredEvent>(&e.data)) {
      BlockHash parent = s->parent_hash;
      for (const kv::StoredBlock& b : s->blocks) {
        REQUIRE((parent == 0 || parent_of_.count(parent) == 1));
        REQUIRE(parent_of_.count(b.hash) == 0);
        parent_of_[b.hash] = parent;
        ++children_[parent];
        parent = b.hash;
      }
    } else if (const auto* r = std::get_if<kv::RemovedEvent>(&e.data)) {
      for (BlockHash h : r->hashes) {
        REQUIRE(parent_of_.count(h) == 1);
        REQUIRE(children_[h] == 0);
        --children_[parent_of_[h]];
        parent_of_.erase(h);
      }
    } else {
      FAIL("a simulated cache stores and removes only");
    }
  }
  std::unordered_set<BlockHash> Blocks() const {
    std::unordered_set<BlockHash> out;
    for (const auto& [h, p] : parent_of_) out.insert(h);
    return out;
  }

 private:
  std::unordered_map<BlockHash, BlockHash> parent_of_;
  std::unordered_map<BlockHash, int> children_;
};

std::unordered_set<BlockHash> SnapshotBlocks(const SimKvCache& cache) {
  Model m;
  for (const kv::KvEvent& e : cache.Snapshot()) m.Apply(e);
  return m.Blocks();
}

TEST_CASE("a simulated cache's events, applied in order, hold what its snapshot holds, within its capacity") {
  SimKvCache cache(Small(), 7);
  Model model;
  size_t counted = 0, seen = 0;
  for (int r = 0; r < 3000; ++r) {
    std::vector<kv::KvEvent> events;
    counted += cache.Request(&events);
    for (const kv::KvEvent& e : events) model.Apply(e);
    for (const kv::KvEvent& e : events) {
      if (const auto* s = std::get_if<kv::StoredEvent>(&e.data)) seen += s->blocks.size();
      if (const auto* d = std::get_if<kv::RemovedEvent>(&e.data)) seen += d->hashes.size();
    }
    cache.CheckInvariants();
  }
  CHECK(counted == seen);
  CHECK(cache.blocks() > Small().capacity_blocks - Small().max_conversation_blocks - Small().max_turn_blocks);
  CHECK(model.Blocks() == SnapshotBlocks(cache));
  CHECK(model.Blocks().size() == cache.blocks());
}

TEST_CASE("a filled cache starts near its capacity and its snapshot chains every block to the root") {
  SimKvCache cache(Small(), 3);
  cache.Fill(1.0);
  cache.CheckInvariants();
  CHECK(cache.blocks() + Small().max_turn_blocks > Small().capacity_blocks);
  CHECK(SnapshotBlocks(cache).size() == cache.blocks());
}

TEST_CASE("workers of one model share the hashes of their shared prefixes, and no other") {
  SimKvCache a(Small(), 1), b(Small(), 2);
  a.Fill(0.5);
  b.Fill(0.5);
  const auto sa = SnapshotBlocks(a), sb = SnapshotBlocks(b);
  size_t common = 0;
  for (BlockHash h : sa) common += sb.count(h);
  CHECK(common == Small().shared_prefixes * Small().prefix_blocks);
}

}  // namespace
}  // namespace kvfleet::sim
