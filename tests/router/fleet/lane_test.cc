// Lanes (router/fleet/lane.h): requests forwarded from one thread, answers read and
// delivered on that same thread, cancels racing answers, failures the fleet saw, and a
// lane destroyed with requests in flight.
#include "router/fleet/lane.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include <doctest/doctest.h>

#include "router/fleet/poll_loop.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {
namespace {

using testing::FakeWorker;
using testing::WaitFor;

// Runs `fn` on the loop's thread and waits for it.
void RunOn(PollLoop& loop, std::function<void()> fn) {
  std::promise<void> done;
  loop.Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// Records every call with the thread it came on; optionally cancels after the first delta
// (as a stop string does), through the lane it was given.
class Recorder final : public ResponseSink {
 public:
  void OnDelta(WorkerId, const WorkerDelta& d) override {
    Note();
    tokens += d.tokens.size();
    if (after_cancel) ++calls_after_cancel;
    if (cancel_on_first && lane != nullptr && !after_cancel) {
      lane->Cancel(handle);
      after_cancel = true;
      return;
    }
    if (d.finish != FinishReason::kNone) Finish(Status::Ok());
  }
  void OnError(WorkerId, const Status& s, bool) override {
    Note();
    if (after_cancel) ++calls_after_cancel;
    Finish(s);
  }

  void Note() {
    std::lock_guard<std::mutex> lock(mu);
    threads.push_back(std::this_thread::get_id());
  }
  void Finish(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;
    finished = true;
    outcome.set_value(s);
  }

  std::mutex mu;
  std::vector<std::thread::id> threads;  // GUARDED_BY(mu)
  bool finished = false;                 // GUARDED_BY(mu)
  std::promise<Status> outcome;
  // The lane thread only.
  size_t tokens = 0;
  bool cancel_on_first = false;
  bool after_cancel = false;
  int calls_after_cancel = 0;
  Lane* lane = nullptr;
  uint64_t handle = 0;
};

struct Setup {
  explicit Setup(std::vector<std::string> workers, DurationNs first_token_timeout = 60 * kNsPerSec) {
    FleetOptions o;
    o.registration_endpoint = "";
    o.static_workers = std::move(workers);
    o.static_model = "m";
    o.first_token_timeout = first_token_timeout;
    fleet = std::move(Fleet::Start(o, nullptr, SystemClock::Default(), nullptr)).value();
    REQUIRE(WaitFor([&] {
      auto m = fleet->FindModel("m");
      return m && m->routable.size() == o.static_workers.size();
    }));
    RunOn(loop, [&] {
      lane = fleet->NewLane(&loop);
      loop_thread = std::this_thread::get_id();
    });
  }
  ~Setup() {
    RunOn(loop, [&] { lane.reset(); });
    fleet->Stop();
  }
  // Submits on the lane thread; returns the handle.
  uint64_t Submit(WorkerId worker, std::shared_ptr<Recorder> sink, uint32_t max_tokens = 4,
                  std::function<Result<WorkerId>(std::span<const WorkerId>)> reroute = nullptr) {
    uint64_t handle = 0;
    RunOn(loop, [&] {
      ForwardRequest r;
      r.worker = worker;
      r.params.tokens = std::vector<TokenId>(64, 7);
      r.params.sampling.max_tokens = max_tokens;
      r.sink = sink;
      r.reroute = std::move(reroute);
      handle = lane->NewHandle();
      sink->lane = lane.get();
      sink->handle = handle;
      lane->Submit(handle, std::move(r));
    });
    return handle;
  }
  // Submits a split request (ForwardRequest::prefill): prefilled on `prefill`, decoded on
  // `decode`, whose pull names the prefill worker by its id (source "tcp://prefill-<id>").
  uint64_t SubmitSplit(WorkerId prefill, WorkerId decode, std::shared_ptr<Recorder> sink,
                       std::function<Result<WorkerId>(std::span<const WorkerId>)> prefill_reroute = nullptr,
                       std::function<Result<WorkerId>(std::span<const WorkerId>)> reroute = nullptr,
                       std::function<void(double)> on_done = nullptr) {
    uint64_t handle = 0;
    RunOn(loop, [&] {
      ForwardRequest r;
      r.worker = decode;
      r.params.tokens = std::vector<TokenId>(64, 7);
      r.params.sampling.max_tokens = 4;
      r.params.sampling.logprobs = 2;
      r.sink = sink;
      r.reroute = std::move(reroute);
      r.prefill = PrefillStage{prefill, 64, std::move(prefill_reroute),
                               [](WorkerId w) {
                                 return PullHint{"tcp://prefill-" + std::to_string(w), "", 2, "p", 50};
                               },
                               0, std::move(on_done)};
      handle = lane->NewHandle();
      sink->lane = lane.get();
      sink->handle = handle;
      lane->Submit(handle, std::move(r));
    });
    return handle;
  }
  int64_t Inflight(WorkerId id) { return fleet->Workers()[id].inflight_requests; }

  std::unique_ptr<Fleet> fleet;
  PollLoop loop;
  std::unique_ptr<Lane> lane;  // the loop thread only
  std::thread::id loop_thread;
};

}  // namespace

TEST_CASE("a lane delivers every answer on its own thread and releases its in-flight counts") {
  FakeWorker w("hello");
  Setup s({w.endpoint()});
  std::vector<std::shared_ptr<Recorder>> sinks;
  for (int i = 0; i < 20; ++i) {
    sinks.push_back(std::make_shared<Recorder>());
    s.Submit(0, sinks.back());
  }
  for (auto& sink : sinks) {
    auto f = sink->outcome.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(f.get().ok());
    std::lock_guard<std::mutex> lock(sink->mu);
    CHECK(sink->threads.size() == 4);
    for (auto t : sink->threads) CHECK(t == s.loop_thread);
  }
  CHECK(s.Inflight(0) == 0);
  CHECK(s.fleet->Workers()[0].inflight_prefill_tokens == 0);
}

TEST_CASE("a cancel from inside a delta (racing the rest of the answer) ends the sink's calls") {
  FakeWorker w("hello world");
  Setup s({w.endpoint()});
  std::vector<std::shared_ptr<Recorder>> sinks;
  for (int i = 0; i < 20; ++i) {
    sinks.push_back(std::make_shared<Recorder>());
    sinks.back()->cancel_on_first = true;  // the worker has already sent the rest
    s.Submit(0, sinks.back(), 8);
  }
  REQUIRE(WaitFor([&] { return w.cancels() == 20; }));
  // Let the answers already on the wire arrive: none may reach a sink.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  RunOn(s.loop, [&] {
    for (auto& sink : sinks) {
      CHECK(sink->tokens == 1);
      CHECK(sink->calls_after_cancel == 0);
    }
  });
  CHECK(s.Inflight(0) == 0);
}

TEST_CASE("a cancel right after submit, before any answer, releases the request") {
  FakeWorker w("hello");
  w.set_mode(FakeWorker::Mode::kHang);
  Setup s({w.endpoint()});
  auto sink = std::make_shared<Recorder>();
  uint64_t h = s.Submit(0, sink);
  CHECK(s.Inflight(0) == 1);
  RunOn(s.loop, [&] { s.lane->Cancel(h); });
  CHECK(s.Inflight(0) == 0);
  REQUIRE(WaitFor([&] { return w.cancels() == 1; }));
  std::lock_guard<std::mutex> lock(sink->mu);
  CHECK(sink->threads.empty());
}

TEST_CASE("a worker that crashes before the first token: the lane retries on the next one") {
  FakeWorker dying("hello"), healthy("hello");
  dying.set_mode(FakeWorker::Mode::kHang);
  Setup s({dying.endpoint(), healthy.endpoint()});
  auto sink = std::make_shared<Recorder>();
  s.Submit(0, sink, 4, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{1}; });
  REQUIRE(WaitFor([&] { return dying.generates() == 1; }));
  dying.Crash();
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());
  CHECK(healthy.generates() == 1);
  CHECK(s.Inflight(0) == 0);
  CHECK(s.Inflight(1) == 0);
}

TEST_CASE("no first token in time, and nowhere to retry: the sink gets DeadlineExceeded") {
  FakeWorker w("hello");
  w.set_mode(FakeWorker::Mode::kHang);
  Setup s({w.endpoint()}, 100 * kNsPerMs);
  auto sink = std::make_shared<Recorder>();
  s.Submit(0, sink);
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().code() == StatusCode::kDeadlineExceeded);
  CHECK(s.Inflight(0) == 0);
}

TEST_CASE("a worker refusing (queue full, another model): retried on the next; refused everywhere, the sink hears why") {
  for (WorkerErrorCode code : {WorkerErrorCode::kOverloaded, WorkerErrorCode::kUnknownModel}) {
    CAPTURE(static_cast<int>(code));
    FakeWorker full("hello"), open("hello");
    full.set_mode(FakeWorker::Mode::kRefuse);
    full.set_refusal(code);
    Setup s({full.endpoint(), open.endpoint()});
    auto sink = std::make_shared<Recorder>();
    s.Submit(0, sink, 4, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{1}; });
    auto f = sink->outcome.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(f.get().ok());
    CHECK(open.generates() == 1);

    open.set_mode(FakeWorker::Mode::kRefuse);
    open.set_refusal(code);
    auto refused = std::make_shared<Recorder>();
    s.Submit(0, refused, 4, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{1}; });
    auto g = refused->outcome.get_future();
    REQUIRE(g.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    // A full queue is the client's to retry later (429); a stale registry is ours (503).
    CHECK(g.get().code() == (code == WorkerErrorCode::kOverloaded ? StatusCode::kResourceExhausted
                                                                  : StatusCode::kUnavailable));
    CHECK(s.Inflight(0) == 0);
    CHECK(s.Inflight(1) == 0);
  }
}

TEST_CASE("a worker that ends a request with finish error: retried before its first token, an error after it") {
  FakeWorker failing("hello"), healthy("hello");
  failing.set_mode(FakeWorker::Mode::kFail);
  failing.set_hang_after(0);  // fails it at once, no token
  Setup s({failing.endpoint(), healthy.endpoint()});
  auto sink = std::make_shared<Recorder>();
  s.Submit(0, sink, 4, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{1}; });
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());  // the whole answer, from the healthy worker
  CHECK(healthy.generates() == 1);
  RunOn(s.loop, [&] { CHECK(sink->tokens == 4); });

  // Two tokens, then the failure: the sink has the two, then an error, never a normal end.
  failing.set_hang_after(2);
  auto mid = std::make_shared<Recorder>();
  s.Submit(0, mid, 4, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{1}; });
  auto g = mid->outcome.get_future();
  REQUIRE(g.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(g.get().code() == StatusCode::kInternal);
  RunOn(s.loop, [&] { CHECK(mid->tokens == 2); });
  CHECK(healthy.generates() == 1);  // not retried: tokens had gone out
  CHECK(s.Inflight(0) == 0);
}

TEST_CASE("a split request: the prompt as one dropped token on the prefill worker, then the decode pulls from it") {
  FakeWorker prefill("xyz"), decode("hello");
  Setup s({prefill.endpoint(), decode.endpoint()});
  auto sink = std::make_shared<Recorder>();
  std::vector<double> stages;  // the lane's thread reports the stage's time (the router's calibration)
  s.SubmitSplit(0, 1, sink, nullptr, nullptr, [&](double seconds) { stages.push_back(seconds); });
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());
  RunOn(s.loop, [&] {
    CHECK(sink->tokens == 4);  // the decode's "hell", none of the prefill's
    REQUIRE(stages.size() == 1);
    CHECK(stages[0] > 0);
    CHECK(stages[0] < 10);
  });
  REQUIRE(prefill.generates() == 1);
  const GenerateParams pre = prefill.last_params();
  CHECK(pre.sampling.max_tokens == 1);
  CHECK(pre.sampling.logprobs == -1);  // nothing asked of it but the prompt
  CHECK(pre.pull.source.empty());
  CHECK(pre.tokens.size() == 64);
  REQUIRE(decode.generates() == 1);
  const GenerateParams dec = decode.last_params();
  CHECK(dec.sampling.max_tokens == 4);
  CHECK(dec.sampling.logprobs == 2);
  CHECK(dec.pull.source == "tcp://prefill-0");
  CHECK(s.Inflight(0) == 0);
  CHECK(s.Inflight(1) == 0);
}

TEST_CASE("a split request's prefill worker crashes mid-prompt: another prefill worker, else the decode computes it") {
  FakeWorker dying("xyz"), other("xyz"), decode("hello");
  dying.set_mode(FakeWorker::Mode::kHang);
  Setup s({dying.endpoint(), other.endpoint(), decode.endpoint()});
  SUBCASE("retried on another prefill worker, whose KV the decode then pulls") {
    auto sink = std::make_shared<Recorder>();
    int stages = 0;  // a retried prefill's time is not its first worker's: not reported
    s.SubmitSplit(
        0, 2, sink,
        [](std::span<const WorkerId> tried) -> Result<WorkerId> {
          CHECK(tried.size() == 1);  // the prefill's own attempts, not the decode's
          return WorkerId{1};
        },
        nullptr, [&](double) { ++stages; });
    REQUIRE(WaitFor([&] { return dying.generates() == 1; }));
    dying.Crash();
    auto f = sink->outcome.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(f.get().ok());
    CHECK(other.generates() == 1);
    REQUIRE(decode.generates() == 1);
    CHECK(decode.last_params().pull.source == "tcp://prefill-1");
    RunOn(s.loop, [&] { CHECK(stages == 0); });
  }
  SUBCASE("no prefill worker left: the decode worker gets the request without a pull") {
    auto sink = std::make_shared<Recorder>();
    s.SubmitSplit(0, 2, sink, [](std::span<const WorkerId>) -> Result<WorkerId> { return Unavailable("none"); });
    REQUIRE(WaitFor([&] { return dying.generates() == 1; }));
    dying.Crash();
    auto f = sink->outcome.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(f.get().ok());
    REQUIRE(decode.generates() == 1);
    CHECK(decode.last_params().pull.source.empty());
  }
  CHECK(s.Inflight(0) == 0);
  CHECK(s.Inflight(2) == 0);
}

TEST_CASE("a silent prefill worker costs a split request one first-token timeout, then the decode computes the prompt") {
  FakeWorker silent("xyz"), decode("hello");
  silent.set_mode(FakeWorker::Mode::kHang);
  // The timeout holds for the decode's attempt too: long enough that a loaded machine's
  // scheduling delays do not make the healthy decode worker miss it.
  Setup s({silent.endpoint(), decode.endpoint()}, kNsPerSec);
  auto sink = std::make_shared<Recorder>();
  s.SubmitSplit(0, 1, sink);
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());
  // Told to stop, as any timed-out attempt; the cancel is sent as the retry starts, so it may
  // reach the worker after the answer has ended.
  CHECK(WaitFor([&] { return silent.cancels() == 1; }));
  REQUIRE(decode.generates() == 1);
  CHECK(decode.last_params().pull.source.empty());
  CHECK(s.Inflight(0) == 0);
}

TEST_CASE("a split request's decode worker lost after the pull: retried before its first token, an error after it") {
  FakeWorker prefill("xyz"), dying("hello"), healthy("hello");
  dying.set_mode(FakeWorker::Mode::kHang);
  Setup s({prefill.endpoint(), dying.endpoint(), healthy.endpoint()});
  auto sink = std::make_shared<Recorder>();
  s.SubmitSplit(0, 1, sink, nullptr, [](std::span<const WorkerId>) -> Result<WorkerId> { return WorkerId{2}; });
  REQUIRE(WaitFor([&] { return dying.generates() == 1; }));
  dying.Crash();
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());
  REQUIRE(healthy.generates() == 1);
  CHECK(healthy.last_params().pull.source == "tcp://prefill-0");  // the prompt is still there to pull
  CHECK(prefill.generates() == 1);                                // not prefilled again

  FakeWorker failing("hello");
  failing.set_mode(FakeWorker::Mode::kFail);
  failing.set_hang_after(2);
  Setup t({prefill.endpoint(), failing.endpoint()});
  auto mid = std::make_shared<Recorder>();
  t.SubmitSplit(0, 1, mid);
  auto g = mid->outcome.get_future();
  REQUIRE(g.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(g.get().code() == StatusCode::kInternal);
  RunOn(t.loop, [&] { CHECK(mid->tokens == 2); });
}

// Regression: a lane's tick took a worker that said Bye for one that is gone and failed its
// requests in flight; one past its first token ended 503 "worker sim-1 is not live" (the router
// scale bench, with churn), though the leaving worker was finishing it.
TEST_CASE("a worker that says Bye finishes the requests it has; new ones avoid it") {
  FakeWorker leaving("hello"), staying("hello");
  leaving.set_token_delay(std::chrono::milliseconds(60));  // several lane ticks between tokens
  FleetOptions o;
  o.registration_endpoint = "tcp://127.0.0.1:*";
  auto fleet = std::move(Fleet::Start(o, nullptr, SystemClock::Default(), nullptr)).value();
  const std::string reg = fleet->registration_endpoint();
  FakeWorker::Register(reg, EncodeHello(leaving.HelloOf("leaving", "m")));
  REQUIRE(WaitFor([&] { return fleet->FindModel("m") && fleet->FindModel("m")->routable.size() == 1; }));
  FakeWorker::Register(reg, EncodeHello(staying.HelloOf("staying", "m")));
  REQUIRE(WaitFor([&] { return fleet->FindModel("m")->routable.size() == 2; }));
  const WorkerId gone = fleet->FindModel("m")->routable[0], other = fleet->FindModel("m")->routable[1];
  PollLoop loop;
  std::unique_ptr<Lane> lane;
  RunOn(loop, [&] { lane = fleet->NewLane(&loop); });
  auto submit = [&](std::shared_ptr<Recorder> sink) {
    RunOn(loop, [&] {
      ForwardRequest r;
      r.worker = gone;
      r.params.tokens = std::vector<TokenId>(64, 7);
      r.params.sampling.max_tokens = 5;
      r.sink = sink;
      r.reroute = [other](std::span<const WorkerId>) -> Result<WorkerId> { return other; };
      lane->Submit(lane->NewHandle(), std::move(r));
    });
  };
  auto draining = std::make_shared<Recorder>();
  submit(draining);
  REQUIRE(WaitFor([&] { return leaving.generates() == 1; }));
  FakeWorker::Register(reg, EncodeBye({"leaving", 0}));
  REQUIRE(WaitFor([&] { return fleet->FindModel("m")->routable.size() == 1; }));
  auto f = draining->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.get().ok());  // all five tokens, from the worker that said Bye
  RunOn(loop, [&] { CHECK(draining->tokens == 5); });
  CHECK(leaving.cancels() == 0);
  CHECK(staying.generates() == 0);
  // Sent after the Bye, to the same worker: retried where `reroute` says, before any token.
  auto late = std::make_shared<Recorder>();
  submit(late);
  auto g = late->outcome.get_future();
  REQUIRE(g.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(g.get().ok());
  CHECK(leaving.generates() == 1);
  CHECK(staying.generates() == 1);
  RunOn(loop, [&] { lane.reset(); });
  fleet->Stop();
}

TEST_CASE("the fleet remembers this router's in-flight counts as they were at a past time") {
  FakeWorker w("hello");
  w.set_mode(FakeWorker::Mode::kHang);
  Setup s({w.endpoint()});
  const Clock* clock = SystemClock::Default();  // the fleet's
  const TimeNs before = clock->Now();
  auto sink = std::make_shared<Recorder>();
  const uint64_t h = s.Submit(0, sink);  // 64 prompt tokens (Submit leaves the expected prefill at 0)
  REQUIRE(WaitFor([&] { return s.Inflight(0) == 1; }));
  const TimeNs during = clock->Now();  // after the send, before the cancel
  RunOn(s.loop, [&] { s.lane->Cancel(h); });
  CHECK(s.Inflight(0) == 0);
  const TimeNs after = clock->Now();

  const OwnLoadCounts in_flight{1, 0, 64, 1};  // one request, waiting for its first token
  CHECK(s.fleet->OwnLoadAt(0, before) == OwnLoadCounts{});
  CHECK(s.fleet->OwnLoadAt(0, during) == in_flight);  // what a report received then counted
  CHECK(s.fleet->OwnLoadAt(0, after) == OwnLoadCounts{});
  CHECK(s.fleet->OwnLoad(0) == OwnLoadCounts{});
}

TEST_CASE("a lane destroyed with requests in flight ends them with Unavailable") {
  FakeWorker w("hello");
  w.set_mode(FakeWorker::Mode::kHang);
  Setup s({w.endpoint()});
  auto sink = std::make_shared<Recorder>();
  s.Submit(0, sink);
  RunOn(s.loop, [&] { s.lane.reset(); });
  auto f = sink->outcome.get_future();
  REQUIRE(f.wait_for(std::chrono::seconds(1)) == std::future_status::ready);
  CHECK(f.get().code() == StatusCode::kUnavailable);
  CHECK(s.Inflight(0) == 0);
}

}  // namespace kvfleet::router

namespace kvfleet::router {
namespace {

// Sends one LoRA control on the lane thread; the future gets its outcome, and *calls counts
// the calls of `done` (exactly one expected, on the lane thread).
std::future<Result<WorkerLoraResult>> SendControl(Setup& s, ToWorkerMessage::Kind kind, const std::string& name,
                                                  DurationNs timeout, std::shared_ptr<std::atomic<int>> calls) {
  auto promise = std::make_shared<std::promise<Result<WorkerLoraResult>>>();
  auto future = promise->get_future();
  RunOn(s.loop, [&] {
    s.lane->SendLoraControl(0, kind, LoraControl{name, "/adapters/" + name}, timeout,
                            [promise, calls, &s](Result<WorkerLoraResult> r) {
                              // A call on another thread counts 100: `calls == 1` fails.
                              const int n = std::this_thread::get_id() == s.loop_thread ? 1 : 100;
                              if (calls->fetch_add(n) == 0) promise->set_value(std::move(r));
                            });
  });
  return future;
}

}  // namespace

TEST_CASE("LoRA control: each gets its worker's LoraResult under its own id, a silent worker times out, once each") {
  FakeWorker w("hello");
  Setup s({w.endpoint()});
  auto calls = std::make_shared<std::atomic<int>>(0);
  // A request in flight on the same DEALER: its deltas are not mistaken for a control's answer.
  auto sink = std::make_shared<Recorder>();
  s.Submit(0, sink, 4);
  auto loaded = SendControl(s, ToWorkerMessage::Kind::kLoadLora, "sql", 10 * kNsPerSec, calls);
  REQUIRE(loaded.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto r = loaded.get();
  REQUIRE(r.ok());
  CHECK(r->ok);
  CHECK(w.loras() == std::vector<std::string>{"sql"});
  auto outcome = sink->outcome.get_future();
  REQUIRE(outcome.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(outcome.get().ok());
  auto calls2 = std::make_shared<std::atomic<int>>(0);
  auto unknown = SendControl(s, ToWorkerMessage::Kind::kUnloadLora, "chat", 10 * kNsPerSec, calls2);
  REQUIRE(unknown.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto u = unknown.get();
  REQUIRE(u.ok());
  CHECK(!u->ok);
  CHECK(u->code == WorkerErrorCode::kUnknownLora);
  // No answer: DeadlineExceeded at the lane's tick after the timeout; a late answer is dropped.
  w.set_lora_mode(FakeWorker::LoraMode::kHang);
  auto calls3 = std::make_shared<std::atomic<int>>(0);
  auto hung = SendControl(s, ToWorkerMessage::Kind::kLoadLora, "slow", 100 * kNsPerMs, calls3);
  REQUIRE(hung.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(hung.get().status().code() == StatusCode::kDeadlineExceeded);
  RunOn(s.loop, [&] { CHECK(s.lane->pending_controls() == 0); });
  CHECK(calls->load() == 1);
  CHECK(calls2->load() == 1);
  CHECK(calls3->load() == 1);
}

TEST_CASE("LoRA control to a crashed worker ends Unavailable; one pending when the lane goes ends Unavailable too") {
  FakeWorker gone("x"), silent("y");
  Setup s({gone.endpoint()});
  silent.set_lora_mode(FakeWorker::LoraMode::kHang);
  gone.set_lora_mode(FakeWorker::LoraMode::kHang);
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto pending = SendControl(s, ToWorkerMessage::Kind::kLoadLora, "sql", 60 * kNsPerSec, calls);
  REQUIRE(WaitFor([&] { return gone.lora_controls() == 1; }));
  gone.Crash();
  REQUIRE(pending.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(pending.get().status().code() == StatusCode::kUnavailable);
  // Not live any more: refused at once.
  auto calls2 = std::make_shared<std::atomic<int>>(0);
  auto refused = SendControl(s, ToWorkerMessage::Kind::kUnloadLora, "sql", 60 * kNsPerSec, calls2);
  REQUIRE(refused.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(refused.get().status().code() == StatusCode::kUnavailable);
  CHECK(calls->load() == 1);
  CHECK(calls2->load() == 1);
  // A lane destroyed while a control waits ends it.
  Setup t({silent.endpoint()});
  auto calls3 = std::make_shared<std::atomic<int>>(0);
  auto waiting = SendControl(t, ToWorkerMessage::Kind::kLoadLora, "sql", 60 * kNsPerSec, calls3);
  REQUIRE(WaitFor([&] { return silent.lora_controls() == 1; }));
  CHECK(waiting.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  RunOn(t.loop, [&] { t.lane.reset(); });
  REQUIRE(waiting.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(waiting.get().status().code() == StatusCode::kUnavailable);
  CHECK(calls3->load() == 1);
}

}  // namespace kvfleet::router
