#include "router/events/worker_subscriber.h"

#include <doctest/doctest.h>

#include "router/index/retention_estimate.h"

namespace kvfleet::router {
namespace {

struct FakeIo : WorkerSubscriber::Io {
  struct Req {
    uint64_t epoch, from, id;
  };
  std::vector<Req> requests;
  void RequestReplay(WorkerId, uint64_t epoch, uint64_t from, uint64_t id) override {
    requests.push_back({epoch, from, id});
  }
  void OnApplied(WorkerId, double) override {}
};

kv::KvEvent Stored(BlockHash parent, std::vector<BlockHash> hashes, kv::Tier tier = kv::Tier::kDevice,
                   uint32_t window = 0) {
  kv::StoredEvent e;
  e.parent_hash = parent;
  for (BlockHash h : hashes) e.blocks.push_back({h, {}, tier, kv::kDefaultPriority});
  return kv::KvEvent{window, e};
}
kv::KvEvent Removed(BlockHash h) { return kv::KvEvent{0, kv::RemovedEvent{{h}, kv::Tier::kDevice}}; }

// Stamps `events` with the ids first, first + 1, ... as a publisher does.
std::vector<kv::KvEvent> Ids(uint64_t first, std::vector<kv::KvEvent> events) {
  for (kv::KvEvent& e : events) e.id = first++;
  return events;
}

events::DecodedBatch Batch(uint64_t epoch, uint64_t seq, std::vector<kv::KvEvent> events = {}) {
  events::DecodedBatch b;
  b.header = {"w", epoch, seq, 0};
  b.events = std::move(events);
  return b;
}

// A ReplayReply answering request `request_id`: a snapshot chunk, or replayed batches.
struct Reply {
  events::ReplayReply reply;
  Reply(uint64_t request_id, uint64_t epoch, bool last = true) : reply{{"w", epoch, request_id, last}, {}} {}
  Reply& Snapshot(uint64_t seq, std::vector<kv::KvEvent> events, uint64_t event_id = 0) {
    reply.body = events::SnapshotChunk{seq, event_id, std::move(events)};
    return *this;
  }
  Reply& Batches(uint64_t epoch, std::vector<std::pair<uint64_t, std::vector<kv::KvEvent>>> batches) {
    std::vector<events::DecodedBatch> list;
    for (auto& [seq, events] : batches) list.push_back(Batch(epoch, seq, std::move(events)));
    reply.body = std::move(list);
    return *this;
  }
};

struct Fixture {
  ManualClock clock;
  GlobalIndex index{{}, &clock};
  EventPlaneOptions options;
  FakeIo io;
  EventCounters counters;
  WorkerSubscriber sub{3, "w", options, &index, &clock, &io, &counters};
  std::vector<BlockHash> Device() { return index.BlocksOf(3, kv::Tier::kDevice); }
};

TEST_CASE("batches that arrive while syncing are applied after the snapshot, in seq order") {
  Fixture f;
  f.sub.Start();
  CHECK(f.sub.state() == WorkerState::kSyncing);
  REQUIRE(f.io.requests.size() == 1);
  CHECK(f.io.requests[0].epoch == 0);  // a snapshot request
  f.sub.OnBatch(Batch(7, 12, {Stored(2, {3})}));
  f.sub.OnBatch(Batch(7, 10, {Stored(0, {9})}));  // covered by the snapshot: skipped
  f.sub.OnBatch(Batch(7, 11, {Stored(1, {2})}));
  Reply r(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(r.Snapshot(10, {Stored(0, {1})}).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.applied_seq() == 12);
  CHECK(f.Device() == std::vector<BlockHash>{1, 2, 3});
}

TEST_CASE("duplicates and stale batches change nothing") {
  Fixture f;
  f.sub.Start();
  Reply r(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(r.Snapshot(0, {}).reply);
  f.sub.OnBatch(Batch(7, 1, {Stored(0, {1, 2})}));
  f.sub.OnBatch(Batch(7, 2, {Removed(2)}));
  f.sub.OnBatch(Batch(7, 1, {Stored(0, {1, 2})}));  // duplicate of an old batch
  CHECK(f.Device() == std::vector<BlockHash>{1});
  CHECK(f.counters.duplicates == 1);
  CHECK(f.sub.state() == WorkerState::kLive);
}

TEST_CASE("a gap sends the subscriber to REPLAYING and the replay brings it back to LIVE") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(5, {}).reply);
  f.sub.OnBatch(Batch(7, 8, {Stored(11, {12})}));
  CHECK(f.sub.state() == WorkerState::kReplaying);
  REQUIRE(f.io.requests.size() == 2);
  CHECK(f.io.requests[1].epoch == 7);
  CHECK(f.io.requests[1].from == 6);
  f.sub.OnBatch(Batch(7, 9, {Stored(12, {13})}));  // buffered meanwhile
  Reply stale(12345, 7);                           // an answer to some other request: ignored
  f.sub.OnReplayReply(stale.Batches(7, {{6, {Stored(0, {666})}}}).reply);
  Reply replay(f.io.requests[1].id, 7);
  f.sub.OnReplayReply(replay.Batches(7, {{6, {Stored(0, {10})}}, {7, {Stored(10, {11})}}}).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.applied_seq() == 9);
  CHECK(f.Device() == std::vector<BlockHash>{10, 11, 12, 13});
  CHECK(f.counters.gaps == 1);
}

TEST_CASE("a snapshot answering a replay replaces the worker's blocks") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {Stored(0, {1, 2, 3})}).reply);
  f.sub.OnBatch(Batch(7, 5));
  REQUIRE(f.sub.state() == WorkerState::kReplaying);
  // The worker's range is gone; it answers with a snapshot in two chunks.
  Reply a(f.io.requests.back().id, 7, /*last=*/false), b(f.io.requests.back().id, 7);
  f.sub.OnReplayReply(a.Snapshot(6, {Stored(0, {1})}).reply);
  f.sub.OnReplayReply(b.Snapshot(6, {Stored(1, {4})}).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.applied_seq() == 6);
  CHECK(f.Device() == std::vector<BlockHash>{1, 4});
}

TEST_CASE("a snapshot replaces the worker's stored blocks but keeps the router's predictions for it") {
  // Issue 34: the sync at a router's start and every resync dropped the predicted entries of
  // requests just sent there, whose blocks no snapshot holds yet, so kv matched less than
  // approx (the router's own decisions) until the stored events came.
  Fixture f;
  const std::vector<BlockHash> sent = {7, 8};
  f.index.InsertPredicted(3, sent, 2 * kNsPerSec);
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {Stored(0, {1, 2})}).reply);
  f.sub.OnBatch(Batch(7, 5));
  REQUIRE(f.sub.state() == WorkerState::kReplaying);
  Reply again(f.io.requests.back().id, 7);
  f.sub.OnReplayReply(again.Snapshot(6, {Stored(0, {1})}).reply);
  CHECK(f.Device() == std::vector<BlockHash>{1});  // block 2 is gone: the snapshot says so
  std::vector<PrefixMatch> out;
  f.index.FindMatches(sent, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].worker == 3);
  CHECK(out[0].device_blocks == 2);  // still predicted
  // The worker stores them, then evicts one: the events speak, the prediction ends.
  f.sub.OnBatch(Batch(7, 7, {Stored(0, {7, 8}), Removed(8)}));
  CHECK(f.Device() == std::vector<BlockHash>{1, 7});
  f.index.FindMatches(sent, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].device_blocks == 1);
}

TEST_CASE("a new epoch clears the worker's blocks and resyncs") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {Stored(0, {1, 2})}).reply);
  f.sub.OnBatch(Batch(8, 1, {Stored(0, {5})}));
  CHECK(f.sub.state() == WorkerState::kSyncing);
  CHECK(f.Device().empty());
  CHECK(f.counters.epoch_changes == 1);
  Reply snap2(f.io.requests.back().id, 8);
  f.sub.OnReplayReply(snap2.Snapshot(0, {}).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.Device() == std::vector<BlockHash>{5});
}

TEST_CASE("a snapshot of the previous life is not trusted when the worker already restarted") {
  Fixture f;
  f.sub.Start();
  f.sub.OnBatch(Batch(8, 3, {Stored(0, {5})}));  // new epoch heard while the snapshot is in flight
  Reply old(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(old.Snapshot(9, {Stored(0, {1})}).reply);
  CHECK(f.sub.state() == WorkerState::kSyncing);
  CHECK(f.io.requests.size() == 2);
  Reply fresh(f.io.requests[1].id, 8);
  f.sub.OnReplayReply(fresh.Snapshot(2, {}).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.Device() == std::vector<BlockHash>{5});
}

TEST_CASE("silence past the heartbeat timeout marks the worker DEAD; its next batch resyncs it") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {Stored(0, {1, 2})}).reply);
  f.clock.AdvanceMs(2000);
  f.sub.OnTick();
  CHECK(f.sub.state() == WorkerState::kLive);
  f.clock.AdvanceMs(1500);
  f.sub.OnTick();
  CHECK(f.sub.state() == WorkerState::kDead);
  CHECK(f.Device().empty());
  f.sub.OnBatch(Batch(7, 2));
  CHECK(f.sub.state() == WorkerState::kSyncing);
}

TEST_CASE("silence is not death while batches wait unread in the router's own socket") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {Stored(0, {1, 2})}).reply);
  f.clock.AdvanceMs(3500);  // the reader was busy past the heartbeat timeout
  f.sub.OnTick(/*batches_waiting=*/true);
  CHECK(f.sub.state() == WorkerState::kLive);
  f.sub.OnBatch(Batch(7, 2));  // the waiting heartbeat, read at last
  f.sub.OnTick(false);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.Device() == std::vector<BlockHash>{1, 2});
  f.clock.AdvanceMs(3500);  // then real silence, with nothing waiting
  f.sub.OnTick(false);
  CHECK(f.sub.state() == WorkerState::kDead);
}

TEST_CASE("an unanswered request is sent again after its timeout") {
  Fixture f;
  f.options.heartbeat_timeout = 60 * kNsPerSec;
  f.sub.Start();
  f.clock.AdvanceMs(9000);
  f.sub.OnTick();
  CHECK(f.io.requests.size() == 1);  // a snapshot may take a while
  f.clock.AdvanceMs(1500);
  f.sub.OnTick();
  REQUIRE(f.io.requests.size() == 2);
  CHECK(f.io.requests[1].id != f.io.requests[0].id);
  Reply snap(f.io.requests[1].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {}).reply);
  f.sub.OnBatch(Batch(7, 5));  // a gap: a replay request, with the shorter timeout
  REQUIRE(f.io.requests.size() == 3);
  f.clock.AdvanceMs(2100);
  f.sub.OnTick();
  REQUIRE(f.io.requests.size() == 4);
  CHECK(f.io.requests[3].from == 2);
}

TEST_CASE("a seq far in the future is counted and dropped, not replayed") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(1, {}).reply);
  f.sub.OnBatch(Batch(7, 1'000'000'000, {Stored(0, {1})}));
  CHECK(f.counters.seq_too_far == 1);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.io.requests.size() == 1);
  CHECK(f.Device().empty());
}

TEST_CASE("stored priorities, priority updates and removals reach the index's retention estimate") {
  Fixture f;
  f.index.retention().Enable();
  f.sub.Start();
  kv::KvEvent pinned = Stored(0, {1, 2});
  for (kv::StoredBlock& b : std::get<kv::StoredEvent>(pinned.data).blocks) b.priority = 100;
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(0, {pinned}).reply);  // through the capnp snapshot path
  CHECK(f.index.retention().Held(3, 100) == 2);
  f.sub.OnBatch(Batch(7, 1, {Stored(2, {3}), kv::KvEvent{0, kv::UpdatedEvent{1, std::nullopt, uint8_t{35}}}}));
  CHECK(f.index.retention().Held(3, 100) == 1);
  CHECK(f.index.retention().Held(3, kv::kDefaultPriority) == 2);
  f.clock.AdvanceMs(100);
  f.sub.OnBatch(Batch(7, 2, {Removed(3)}));
  CHECK(f.index.retention().Held(3) == 2);
  CHECK(f.index.retention().EvictionRate(3, kv::kDefaultPriority) > 0);
  CHECK(f.index.retention().EvictionRate(3, 100) == 0);
}

TEST_CASE("events of another attention window are not indexed; unknown parents are counted") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(0, {}).reply);
  f.sub.OnBatch(Batch(7, 1, {Stored(0, {1}, kv::Tier::kDevice, 4096), Stored(99, {2})}));
  CHECK(f.Device() == std::vector<BlockHash>{2});
  CHECK(f.counters.other_window == 1);
  CHECK(f.counters.unknown_parent == 1);
}

TEST_CASE("an all-windowed worker's announced pool is indexed; --routing-window-size overrides it for all") {
  // A Mistral-shaped worker: one pool, window 4096; its stored blocks are each sequence's first window.
  ManualClock clock;
  GlobalIndex index{{}, &clock};
  FakeIo io;
  EventCounters counters;
  EventPlaneOptions options;
  WorkerSubscriber windowed{4, "mistral", options, &index, &clock, &io, &counters, /*indexed_window=*/4096};
  CHECK(windowed.stats().indexed_window == 4096);
  windowed.Start();
  Reply snap(io.requests.back().id, 7);
  windowed.OnReplayReply(snap.Snapshot(0, {Stored(0, {1}, kv::Tier::kDevice, 4096), Stored(0, {9})}).reply);
  windowed.OnBatch(Batch(7, 1, {Stored(1, {2}, kv::Tier::kDevice, 4096), Stored(0, {8})}));
  CHECK(index.BlocksOf(4, kv::Tier::kDevice) == std::vector<BlockHash>{1, 2});
  CHECK(counters.other_window == 2);

  EventPlaneOptions forced;
  forced.routing_window_size = 0;  // the operator's override: full attention for every worker
  WorkerSubscriber overridden{5, "mistral-2", forced, &index, &clock, &io, &counters, 4096};
  CHECK(overridden.stats().indexed_window == 0);
  overridden.Start();
  Reply snap2(io.requests.back().id, 7);
  overridden.OnReplayReply(snap2.Snapshot(0, {Stored(0, {1}, kv::Tier::kDevice, 4096)}).reply);
  CHECK(index.BlocksOf(5, kv::Tier::kDevice).empty());
}

TEST_CASE("a batch whose event ids skip or repeat though its seq follows on is counted, and the worker resyncs "
          "from a snapshot") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(5, {Stored(0, {1})}, /*event_id=*/100).reply);
  CHECK(f.sub.last_event_id() == 100);
  f.sub.OnBatch(Batch(7, 6, Ids(101, {Stored(1, {2})})));
  f.sub.OnBatch(Batch(7, 7));  // a heartbeat: no ids to check
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.last_event_id() == 101);
  CHECK(f.Device() == std::vector<BlockHash>{1, 2});

  f.sub.OnBatch(Batch(7, 8, Ids(103, {Stored(2, {3})})));  // event 102 never came
  CHECK(f.counters.event_id_mismatches == 1);
  CHECK(f.sub.state() == WorkerState::kSyncing);
  CHECK(f.io.requests.back().epoch == 0);  // a snapshot request
  CHECK(f.Device().empty());
  f.sub.OnBatch(Batch(7, 9, Ids(104, {Stored(3, {4})})));  // buffered until the snapshot
  Reply resync(f.io.requests.back().id, 7);
  f.sub.OnReplayReply(resync.Snapshot(8, {Stored(0, {1, 2, 3})}, 103).reply);
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.applied_seq() == 9);
  CHECK(f.sub.last_event_id() == 104);
  CHECK(f.Device() == std::vector<BlockHash>{1, 2, 3, 4});

  f.sub.OnBatch(Batch(7, 10, Ids(104, {Removed(4)})));  // event 104 again
  CHECK(f.counters.event_id_mismatches == 2);
  CHECK(f.sub.state() == WorkerState::kSyncing);
  CHECK(f.sub.stats().event_id_mismatches == 2);
}

TEST_CASE("a replayed batch whose event ids do not follow on resyncs the worker too") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(5, {}, 50).reply);
  f.sub.OnBatch(Batch(7, 8, Ids(60, {Stored(0, {12})})));
  REQUIRE(f.sub.state() == WorkerState::kReplaying);
  Reply replay(f.io.requests.back().id, 7);
  f.sub.OnReplayReply(replay.Batches(7, {{6, Ids(51, {Stored(0, {10})})}, {7, Ids(57, {Stored(10, {11})})}}).reply);
  CHECK(f.counters.event_id_mismatches == 1);
  CHECK(f.sub.state() == WorkerState::kSyncing);
  CHECK(f.Device().empty());
}

TEST_CASE("an older worker's batches carry no event ids and are applied unchecked; ids that appear later are "
          "the new baseline") {
  Fixture f;
  f.sub.Start();
  Reply snap(f.io.requests[0].id, 7);
  f.sub.OnReplayReply(snap.Snapshot(0, {}).reply);  // consistentEventId 0: unknown
  f.sub.OnBatch(Batch(7, 1, {Stored(0, {1, 2})}));
  f.sub.OnBatch(Batch(7, 2, {Removed(2)}));
  CHECK(f.sub.state() == WorkerState::kLive);
  CHECK(f.sub.last_event_id() == 0);
  f.sub.OnBatch(Batch(7, 3, Ids(500, {Stored(1, {3})})));
  CHECK(f.sub.last_event_id() == 500);
  CHECK(f.Device() == std::vector<BlockHash>{1, 3});
  CHECK(f.counters.event_id_mismatches == 0);
  f.sub.OnBatch(Batch(7, 4, Ids(502, {Stored(3, {4})})));
  CHECK(f.counters.event_id_mismatches == 1);
}

TEST_CASE("a batch's pull totals are folded into the holder's fit: increments, once; a restart counts from zero") {
  Fixture f;
  f.sub.Start();
  auto with_pulls = [](uint64_t epoch, uint64_t seq, std::vector<PullTotals> pulls) {
    events::DecodedBatch b = Batch(epoch, seq);
    b.load.pulls = std::move(pulls);
    return b;
  };
  const PullCost prior{0.5, 1e-9};  // far from the data: 0.5 s set-up, 1 GB/s
  // Pulls of 20 ms set-up at 10 GB/s, of two sizes in turn, one per batch.
  PullTotals totals{"tcp://a:1", 0, 0, 0};
  uint64_t seq = 0;
  auto pull = [&](uint64_t bytes) {
    totals.pulls += 1;
    totals.bytes += bytes;
    totals.seconds += 0.02 + static_cast<double>(bytes) / 10e9;
    f.sub.OnBatch(with_pulls(7, ++seq, {totals}));
  };
  pull(1'000'000'000);
  pull(100'000'000);
  CHECK(f.sub.TakePullFitsChanged());
  CHECK_FALSE(f.sub.TakePullFitsChanged());
  REQUIRE(f.sub.load());
  CHECK(f.sub.load()->pulls.empty());  // the load every routing decision copies carries none
  // A duplicate and a reordered batch add nothing.
  f.sub.OnBatch(with_pulls(7, seq, {totals}));
  f.sub.OnBatch(with_pulls(7, seq - 1, {{"tcp://a:1", 1, 1'000'000'000, 0.12}}));
  CHECK_FALSE(f.sub.TakePullFitsChanged());
  for (int i = 0; i < 20; ++i) pull(i % 2 == 0 ? 1'000'000'000 : 100'000'000);
  REQUIRE(f.sub.pull_fits().count("tcp://a:1") == 1);
  const PullCost fit = f.sub.pull_fits().find("tcp://a:1")->second.Solve(prior, 1e9);
  CHECK(fit.setup_s == doctest::Approx(0.02).epsilon(0.15));
  CHECK(fit.Seconds(1e9) == doctest::Approx(0.12).epsilon(0.1));
  CHECK(fit.Seconds(1e8) == doctest::Approx(0.03).epsilon(0.1));
  // The worker restarted (another epoch): its totals count from zero, and are taken whole.
  f.sub.OnBatch(with_pulls(8, 1, {{"tcp://a:1", 1, 1'000'000'000, 0.12}}));
  CHECK(f.sub.TakePullFitsChanged());
  CHECK(f.sub.last_pull_failure() == 0);
}

TEST_CASE("a batch's failed pulls make the pair's failed share, which fades as they age") {
  Fixture f;
  f.sub.Start();
  auto with_pulls = [](uint64_t epoch, uint64_t seq, PullTotals pulls) {
    events::DecodedBatch b = Batch(epoch, seq);
    b.load.pulls = {std::move(pulls)};
    return b;
  };
  auto share = [&] { return f.sub.pull_fits().find("tcp://b:1")->second.FailedShare(f.clock.Now()); };
  f.clock.AdvanceMs(1'000);
  // Three good pulls, then two that failed after 0.4 s each (the holder went silent).
  f.sub.OnBatch(with_pulls(7, 1, {"tcp://b:1", 3, 3'000, 0.03}));
  CHECK(f.sub.last_pull_failure() == 0);
  CHECK(share() == 0);
  f.sub.OnBatch(with_pulls(7, 2, {"tcp://b:1", 3, 3'000, 0.03, 2, 0.8}));
  CHECK(f.sub.TakePullFitsChanged());
  CHECK(f.sub.last_pull_failure() == f.clock.Now());
  const PullFit& fit = f.sub.pull_fits().find("tcp://b:1")->second;
  CHECK(fit.FailedSeconds() == doctest::Approx(0.4));
  CHECK(share() == doctest::Approx(2.0 / (2 + 3 + config::kPullFailurePriorPulls)));
  CHECK(fit.pulls() == doctest::Approx(3));  // the fit of the pulls' time takes the good ones only
  // The same totals again (a duplicate) add nothing; more failures raise the share.
  f.sub.OnBatch(with_pulls(7, 3, {"tcp://b:1", 3, 3'000, 0.03, 2, 0.8}));
  CHECK_FALSE(f.sub.TakePullFitsChanged());
  for (uint64_t i = 0; i < 20; ++i) f.sub.OnBatch(with_pulls(7, 4 + i, {"tcp://b:1", 3, 3'000, 0.03, 3 + i, 0.8 + 0.4 * (1 + i)}));
  CHECK(share() > 0.8);
  // No pulls since: the failures fade, and the pair is worth trying again.
  f.clock.AdvanceMs(static_cast<int64_t>(1e3 * 8 * config::kPullFailureHalfLifeSeconds));
  CHECK(share() < 0.1);
}

}  // namespace
}  // namespace kvfleet::router
