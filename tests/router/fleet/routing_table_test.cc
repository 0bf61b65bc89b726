// The fleet's routing table (router/fleet/routing_table.h): what routing reads of each worker,
// kept in dense rows beside the worker records. Its answers (Fleet::Loads, Resolve) must equal
// what the records give worker by worker (the WorkerLoads calls) after any mix of Hellos,
// re-registrations with other attributes, Byes, refusals, DEAD event streams, reports and
// requests in flight; and its own counts are read without a lock while lanes change them.
#include <algorithm>
#include <chrono>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <zmq.hpp>

#include "router/fleet/fleet.h"
#include "router/fleet/own_load_history.h"
#include "schema/registration.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {

using testing::WaitFor;

namespace {

// Liveness and load reports the test sets (the event plane's, as the fleet reads them).
class FakeSignals final : public WorkerSignals {
 public:
  void AddWorker(WorkerId, const WorkerHello&) override {}
  void RemoveWorker(WorkerId) override {}
  WorkerState State(WorkerId id) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = dead_.find(id);
    return it != dead_.end() && it->second ? WorkerState::kDead : WorkerState::kLive;
  }
  std::optional<WorkerLoad> Load(WorkerId id) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = loads_.find(id);
    if (it == loads_.end()) return std::nullopt;
    return it->second;
  }
  void Set(WorkerId id, bool dead, std::optional<WorkerLoad> load) {
    std::lock_guard<std::mutex> lock(mu_);
    dead_[id] = dead;
    if (load) loads_[id] = *load;
    else loads_.erase(id);
  }

 private:
  mutable std::mutex mu_;
  std::map<WorkerId, bool> dead_;         // GUARDED_BY(mu_)
  std::map<WorkerId, WorkerLoad> loads_;  // GUARDED_BY(mu_)
};

class Ignore final : public ResponseSink {
 public:
  void OnDelta(WorkerId, const WorkerDelta&) override {}
  void OnError(WorkerId, const Status&, bool) override {}
};

bool Same(const WorkerLoads::LoadView& a, const WorkerLoads::LoadView& b) {
  return a.own == b.own && a.report.has_value() == b.report.has_value() && a.own_at_report == b.own_at_report &&
         a.announced_prefill_rate == b.announced_prefill_rate && a.role == b.role &&
         a.structured_outputs == b.structured_outputs && a.peers == b.peers &&
         a.peers_at_report == b.peers_at_report && a.device_mates == b.device_mates &&
         a.transfer_format == b.transfer_format && a.transfer_host == b.transfer_host;
}

void CheckEqual(const WorkerLoads::LoadView& dense, const WorkerLoads::LoadView& record, WorkerId id) {
  INFO("worker " << id);
  CHECK(dense.own == record.own);
  CHECK(dense.report.has_value() == record.report.has_value());
  if (dense.report && record.report) CHECK(dense.report->received_at == record.report->received_at);
  CHECK(dense.own_at_report == record.own_at_report);
  CHECK(dense.announced_prefill_rate == record.announced_prefill_rate);
  CHECK(dense.role == record.role);
  CHECK(dense.structured_outputs == record.structured_outputs);
  CHECK(dense.peers == record.peers);
  CHECK(dense.peers_at_report == record.peers_at_report);
  CHECK(dense.device_mates == record.device_mates);
  CHECK(dense.transfer_format == record.transfer_format);
  CHECK(dense.transfer_host == record.transfer_host);
}

}  // namespace

TEST_CASE("the routing table answers as the worker records do after random updates") {
  constexpr int kWorkers = 8;
  FakeSignals signals;
  FleetOptions o;
  o.registration_endpoint = "tcp://127.0.0.1:*";
  o.max_workers = 16;
  auto fleet = std::move(Fleet::Start(o, &signals, SystemClock::Default(), nullptr)).value();
  const std::string ep = fleet->registration_endpoint();
  zmq::context_t ctx{1};
  zmq::socket_t registrar(ctx, zmq::socket_type::dealer);
  registrar.set(zmq::sockopt::linger, 0);
  registrar.connect("tcp://127.0.0.1:" + ep.substr(ep.rfind(':') + 1));
  // Reachable workers that never answer (requests stay in flight: this router's counts
  // grow), and two that nobody listens for (never connected, never routable).
  std::vector<std::unique_ptr<testing::FakeWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<testing::FakeWorker>());
    workers.back()->set_mode(testing::FakeWorker::Mode::kHang);
  }
  std::mt19937 rng(3);
  auto pick = [&](auto... options) {
    const std::vector<std::string> all{options...};
    return all[rng() % all.size()];
  };
  for (int round = 1; round <= 12; ++round) {
    INFO("round " << round);
    std::map<std::string, uint32_t> sent;  // worker name: the max_context its last Hello said
    std::vector<std::string> said_bye;
    for (int i = 0; i < kWorkers + 2; ++i) {
      const std::string name = "w" + std::to_string(i);
      WorkerHello h = workers[0]->HelloOf(name, "m");
      h.requests_endpoint = i < kWorkers ? workers[i]->endpoint() : "tcp://127.0.0.1:" + std::to_string(9 + i);
      h.epoch = 1;
      if (round > 1 && rng() % 4 == 0) {  // gone: a Bye (back at a later round's Hello)
        registrar.send(zmq::buffer(EncodeBye(WorkerBye{name, h.epoch})), zmq::send_flags::none);
        said_bye.push_back(name);
        continue;
      }
      h.max_context = 1000 * static_cast<uint32_t>(round) + static_cast<uint32_t>(rng() % 900);
      h.backend = pick("mock", "cpu", "cuda");
      h.structured_outputs = rng() % 2 == 0;
      h.prefill_tokens_per_second = static_cast<float>(rng() % 4) * 1000.0f;
      h.device_id = pick("", "", "gpu0", "gpu1");
      h.role = rng() % 3 == 0 ? WorkerRole::kDecode : WorkerRole::kBoth;
      if (rng() % 2 == 0) {
        h.transfer_endpoint = "tcp://127.0.0.1:1";
        h.transfer_format = pick("bf16", "fp8e4m3");
        h.transfer_bytes_per_block = 4096;
        h.transfer_host_id = pick("", "host-a", "host-b");
      }
      registrar.send(zmq::buffer(EncodeHello(h)), zmq::send_flags::none);
      sent[name] = h.max_context;
    }
    // Every Hello and Bye applied.
    REQUIRE(WaitFor([&] {
      std::map<std::string, bool> seen;
      for (const WorkerStatus& w : fleet->Workers()) {
        auto it = sent.find(w.info.name);
        if (it != sent.end() && w.info.max_context == it->second && !w.said_bye) seen[w.info.name] = true;
        if (std::find(said_bye.begin(), said_bye.end(), w.info.name) != said_bye.end() && w.said_bye) {
          seen[w.info.name] = true;
        }
      }
      return seen.size() == sent.size() + said_bye.size();
    }));
    std::vector<WorkerId> ids;
    for (const WorkerStatus& w : fleet->Workers()) ids.push_back(w.id);
    std::sort(ids.begin(), ids.end());
    // Event streams DEAD now and then; reports stamped before or after this router's last change.
    const TimeNs now = SystemClock::Default()->Now();
    for (WorkerId id : ids) {
      std::optional<WorkerLoad> load;
      if (rng() % 3 != 0) {
        load.emplace();
        load->active_requests = rng() % 5;
        load->received_at = now - static_cast<TimeNs>(rng() % 50) * kNsPerMs;
      }
      signals.Set(id, rng() % 6 == 0, load);
    }
    // Requests in flight on some routable workers (they hang: the counts stay).
    const std::optional<ModelFleet> model = fleet->FindModel("m");
    REQUIRE(model.has_value());
    for (WorkerId id : model->routable) {
      for (int n = static_cast<int>(rng() % 3); n > 0; --n) {
        ForwardRequest r;
        r.worker = id;
        r.params.tokens = std::vector<TokenId>(8 + rng() % 64, 7);
        r.params.sampling.max_tokens = 4;
        r.prefill_tokens = static_cast<uint32_t>(r.params.tokens.size());
        r.sink = std::make_shared<Ignore>();
        fleet->Submit(fleet->NewHandle(), std::move(r));
      }
    }
    // Dense against worker by worker. The lane changes the counts meanwhile (it sends the
    // requests, and fails those on workers now DEAD at its next tick): the two agree once it is
    // done, and for good.
    std::vector<WorkerLoads::LoadView> dense, record;
    auto read = [&] {
      fleet->Loads(ids, &dense);
      fleet->WorkerLoads::Loads(ids, &record);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!Same(dense[i], record[i])) return false;
      }
      return true;
    };
    WaitFor(read, 2000);
    REQUIRE(dense.size() == ids.size());
    REQUIRE(record.size() == ids.size());
    for (size_t i = 0; i < ids.size(); ++i) CheckEqual(dense[i], record[i], ids[i]);
    // Resolve's list against each record's routability and Hello.
    ModelFleet want;
    uint32_t least = 0;
    for (const WorkerStatus& w : fleet->Workers()) {
      if (w.info.model != "m") continue;
      ++want.workers;
      want.needs_tokenizer = want.needs_tokenizer || w.info.backend == "cpu" || w.info.backend == "cuda";
      if (!fleet->Routable(w.id)) continue;
      want.routable.push_back(w.id);
      if (least == 0 || (w.info.max_context > 0 && w.info.max_context < least)) least = w.info.max_context;
    }
    std::sort(want.routable.begin(), want.routable.end());
    const std::optional<ModelFleet> got = fleet->FindModel("m");
    REQUIRE(got.has_value());
    std::vector<WorkerId> routable = got->routable;
    std::sort(routable.begin(), routable.end());
    CHECK(routable == want.routable);
    CHECK(got->workers == want.workers);
    CHECK(got->needs_tokenizer == want.needs_tokenizer);
    CHECK(got->max_context == least);
  }
  fleet->Stop();
}

TEST_CASE("a slot read while another thread changes the counts is one change's counts, never a mix") {
  OwnLoadSlot slot;
  OwnLoadCounter<4> counter(&slot);
  ManualClock clock;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 20000; ++i) {
      clock.Advance(1);
      // Every change moves all four counts together: a torn read would see them differ.
      counter.Add(&clock, OwnLoadDelta{i % 2 == 0 ? 1 : -1, i % 2 == 0 ? 1 : -1, i % 2 == 0 ? 1 : -1,
                                       i % 2 == 0 ? 1 : -1});
    }
    done = true;
  });
  size_t reads = 0;
  while (!done.load() || reads == 0) {
    const OwnLoadSlot::Snapshot s = slot.Read();
    REQUIRE(s.counts.requests == s.counts.waiting);
    REQUIRE(s.counts.requests == s.counts.prefill_tokens);
    REQUIRE(s.counts.requests == s.counts.prompt_tokens);
    REQUIRE(s.changes % 2 == static_cast<uint64_t>(s.counts.requests));
    ++reads;
  }
  writer.join();
}


}  // namespace kvfleet::router
