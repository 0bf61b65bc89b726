// Static and DNS workers describe themselves: the fleet asks each for its Hello over the
// requests connection (a Describe) and records the answer, so the router knows their id,
// block size and context length from them, not from its --block-size and --max-context.
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <doctest/doctest.h>
#include <zmq.hpp>

#include "router/fleet/discovery.h"
#include "router/fleet/fleet.h"
#include "schema/describe.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {

using testing::WaitFor;
using testing::WaitTicking;

namespace {

// A worker's requests socket that answers Describes with the Hello set_described() gives,
// and leaves them unanswered before (as a worker older than Describe does).
class DescribingWorker {
 public:
  DescribingWorker() : socket_(ctx_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~DescribingWorker() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  void set_described(const WorkerHello& hello) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = EncodeDescribed(hello);
  }
  int describes() const { return describes_.load(); }
  int others() const { return others_.load(); }  // frames that were not a Describe

 private:
  void Loop() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t id, body;
      if (!socket_.recv(id) || !socket_.recv(body)) continue;
      if (!IsDescribe(body.data(), body.size())) {
        ++others_;
        continue;
      }
      ++describes_;
      std::string answer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        answer = answer_;
      }
      if (answer.empty()) continue;
      socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(answer), zmq::send_flags::none);
    }
    socket_.close();
  }

  zmq::context_t ctx_{1};
  zmq::socket_t socket_;  // the loop's
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> describes_{0};
  std::atomic<int> others_{0};
  std::mutex mu_;
  std::string answer_;  // GUARDED_BY(mu_); empty: Describes go unanswered
};

// What the fleet tells the event plane: the name (events topic) each worker is followed by.
class RecordingSignals : public WorkerSignals {
 public:
  void AddWorker(WorkerId id, const WorkerHello& info) override {
    std::lock_guard<std::mutex> lock(mu_);
    names_[id] = info.name;
  }
  void RemoveWorker(WorkerId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    names_.erase(id);
  }
  WorkerState State(WorkerId) const override { return WorkerState::kUnknown; }
  std::optional<WorkerLoad> Load(WorkerId) const override { return std::nullopt; }
  std::string Name(WorkerId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = names_.find(id);
    return it == names_.end() ? "" : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<WorkerId, std::string> names_;
};

// A worker's own Hello, advertising a host name the router does not use.
WorkerHello Described(const std::string& name, const std::string& model, uint32_t block_size, uint32_t max_context) {
  WorkerHello h;
  h.name = name;
  h.model = model;
  h.block_size = block_size;
  h.max_context = max_context;
  h.requests_endpoint = "tcp://" + name + ".internal:5556";
  h.events_endpoint = "tcp://" + name + ".internal:7001";
  h.replay_endpoint = "tcp://" + name + ".internal:7002";
  h.http_endpoint = "http://" + name + ".internal:9400";
  h.backend = "cuda";
  h.epoch = 5;
  return h;
}

// A fleet of static workers of model "llama" with the flags' defaults (block size 32, max
// context 8192).
std::unique_ptr<Fleet> StaticFleetOf(std::vector<std::string> workers, WorkerSignals* signals = nullptr,
                                     const Clock* clock = SystemClock::Default()) {
  FleetOptions o;
  o.registration_endpoint = "";
  o.static_workers = std::move(workers);
  o.static_model = "llama";
  return std::move(Fleet::Start(o, signals, clock, nullptr)).value();
}

}  // namespace

TEST_CASE("static workers that describe themselves are known by their own id, block size and context length") {
  // Regression: a static worker got --max-context's default 8192 whatever its model supports,
  // and its KV events were dropped as an unknown topic unless its --worker-id was its requests
  // endpoint (deploy/k8s/router.yaml capped every request at 8192 tokens).
  DescribingWorker a, b;
  a.set_described(Described("gpu-a", "llama", 16, 131072));
  b.set_described(Described("gpu-b", "llama", 16, 65536));
  RecordingSignals signals;
  auto fleet = StaticFleetOf({a.endpoint(), b.endpoint()}, &signals);
  // Both are accepted with block size 16: the flags' 32 is a guess that refuses nobody. (The
  // model's figures are already b's while a's answer is on its way: wait for both names.)
  REQUIRE(WaitFor([&] {
    auto m = fleet->FindModel("llama");
    return m && m->routable.size() == 2 && m->block_size == 16 && m->max_context == 65536 &&
           fleet->WorkerName(0) == "gpu-a" && fleet->WorkerName(1) == "gpu-b";
  }));
  const std::vector<WorkerStatus> workers = fleet->Workers();
  REQUIRE(workers.size() == 2);
  const WorkerHello& info = workers[0].info;
  CHECK(info.max_context == 131072);
  CHECK(info.backend == "cuda");
  CHECK(info.requests_endpoint == a.endpoint());  // where the router reaches it, not what it advertises
  const std::string host = a.endpoint().substr(0, a.endpoint().rfind(':'));
  CHECK(info.events_endpoint == host + ":7001");  // its port, at the address the router was given
  CHECK(info.replay_endpoint == host + ":7002");
  CHECK(info.http_endpoint == "http://127.0.0.1:9400");
  // The event plane follows each worker's events under its own id.
  CHECK(WaitFor([&] { return signals.Name(0) == "gpu-a" && signals.Name(1) == "gpu-b"; }));
  CHECK(fleet->Refused().empty());
  CHECK(a.others() == 0);  // the fleet sends a worker nothing but Describes until a request
}

TEST_CASE("a static worker serving another model than it is listed for is refused until it serves that one") {
  DescribingWorker w;
  w.set_described(Described("gpu-q", "qwen", 32, 4096));
  auto fleet = StaticFleetOf({w.endpoint()});
  REQUIRE(WaitFor([&] { return fleet->Refused().size() == 1; }));
  const RefusedWorker refused = fleet->Refused()[0];
  CHECK(refused.reason == "model-mismatch");
  CHECK(refused.info.name == "gpu-q");
  CHECK(refused.why.find("listed for model 'llama'") != std::string::npos);
  CHECK(refused.why.find("serves 'qwen'") != std::string::npos);
  CHECK(WaitFor([&] { return fleet->FindModel("llama")->routable.empty(); }));
  CHECK_FALSE(fleet->FindModel("qwen"));  // nor does it make a fleet of its own
  // Restarted on the listed model: the next Describe (every 2 s) finds it.
  w.set_described(Described("gpu-q", "llama", 32, 4096));
  REQUIRE(WaitFor([&] { return fleet->FindModel("llama")->routable.size() == 1; }, 6000));
  CHECK(fleet->Refused().empty());
  CHECK(fleet->FindModel("llama")->max_context == 4096);
}

TEST_CASE("a static worker that does not answer a Describe (older than it) keeps the router's flags") {
  DescribingWorker w;
  auto fleet = StaticFleetOf({w.endpoint()});
  REQUIRE(WaitFor([&] { return w.describes() >= 1; }));  // asked on connecting
  auto m = fleet->FindModel("llama");
  REQUIRE(m);
  CHECK(m->routable.size() == 1);
  CHECK(m->block_size == 32);
  CHECK(m->max_context == 8192);
  CHECK(fleet->WorkerName(0) == w.endpoint());
  CHECK(w.others() == 0);
}

TEST_CASE("the flags' context length is a guess while a first Describe is unanswered, final after the second") {
  // Regression: with --routers N, a router that had just listed the workers refused prompts
  // over --max-context's 8192 with 400 context_length_exceeded before their answers came; the
  // client is now told to retry (ModelFleet::max_context_guessed: 503). A worker that leaves
  // two Describes unanswered is older than Describe, and the flags are its context length.
  ManualClock clock;
  DescribingWorker w;
  auto fleet = StaticFleetOf({w.endpoint()}, nullptr, &clock);
  REQUIRE(WaitTicking(clock, [&] {  // short of the second Describe (2 s on the fleet's clock)
    auto m = fleet->FindModel("llama");
    return w.describes() >= 1 && m && m->routable.size() == 1;
  }, 1500 * kNsPerMs));
  auto m = fleet->FindModel("llama");
  CHECK(m->max_context == 8192);
  CHECK(m->max_context_guessed);
  clock.Advance(3 * kNsPerSec);  // the next Describe is due: unanswered too
  REQUIRE(WaitFor([&] { return w.describes() >= 2; }));
  REQUIRE(WaitFor([&] { return !fleet->FindModel("llama")->max_context_guessed; }));
  CHECK(fleet->FindModel("llama")->max_context == 8192);
}

TEST_CASE("a listed worker not yet described does not cap the context of one that described itself") {
  // Regression: with --routers N, the routers beside the first know the workers from the
  // static list; until every one had answered its Describe, the flags' 8192 was the fleet's
  // context length and longer prompts got 400 context_length_exceeded.
  DescribingWorker a, silent;
  a.set_described(Described("gpu-a", "llama", 32, 131072));
  auto fleet = StaticFleetOf({a.endpoint(), silent.endpoint()});
  REQUIRE(WaitFor([&] { return silent.describes() >= 1; }));
  REQUIRE(WaitFor([&] {
    auto m = fleet->FindModel("llama");
    return m && m->routable.size() == 2 && m->max_context == 131072;
  }));
  CHECK_FALSE(fleet->FindModel("llama")->max_context_guessed);
}

TEST_CASE("a described Hello is reached at the address the router was given") {
  WorkerHello listed = StaticHello("tcp://10.1.2.3:5556", StaticFleet{});
  WorkerHello got = DescribedHello(listed, Described("pod-7", "default", 16, 32768));
  CHECK(got.name == "pod-7");
  CHECK(got.requests_endpoint == "tcp://10.1.2.3:5556");
  CHECK(got.events_endpoint == "tcp://10.1.2.3:7001");
  CHECK(got.replay_endpoint == "tcp://10.1.2.3:7002");
  CHECK(got.http_endpoint == "http://10.1.2.3:9400");
  listed = StaticHello("tcp://[fd00::7]:5556", StaticFleet{});
  got = DescribedHello(listed, Described("pod-8", "default", 16, 32768));
  CHECK(got.events_endpoint == "tcp://[fd00::7]:7001");
}

}  // namespace kvfleet::router
