// CURVE on Contract 3's request path: a worker whose requests socket is a CURVE server
// answers only routers that hold its public key (and, with authorized keys, only those
// routers); an unkeyed router's requests never reach it.
#include <filesystem>
#include <future>
#include <thread>

#include <doctest/doctest.h>

#include "common/curve_keys.h"
#include "router/fleet/fleet.h"
#include "tests/router/fleet/mock_worker_config.h"
#include "worker/server/worker.h"

namespace kvfleet::router {
namespace {

namespace fs = std::filesystem;

// Records the first terminal outcome of one request.
class OneAnswer final : public ResponseSink {
 public:
  void OnDelta(WorkerId, const WorkerDelta& d) override {
    tokens_ += d.tokens.size();
    if (d.finish != FinishReason::kNone) done_.set_value(Status::Ok());
  }
  void OnError(WorkerId, const Status& status, bool) override { done_.set_value(status); }
  std::future<Status> Done() { return done_.get_future(); }
  size_t tokens() const { return tokens_; }

 private:
  std::promise<Status> done_;
  size_t tokens_ = 0;  // fleet thread only, read after Done()
};

struct Keys {
  explicit Keys(const fs::path& dir) : dir(dir) {
    fs::create_directories(dir);
    server = *GenerateCurveKeyPair();
    router = *GenerateCurveKeyPair();
    stranger = *GenerateCurveKeyPair();
    REQUIRE(WriteCurveKeyPair(Path("server.key"), server).ok());
    REQUIRE(WriteCurveKeyPair(Path("router.key"), router).ok());
    REQUIRE(WriteCurveKeyPair(Path("stranger.key"), stranger).ok());
    Write("server.pub", server.public_key + "\n");
    Write("authorized", "# routers\n" + router.public_key + "\n");
  }
  ~Keys() { fs::remove_all(dir); }
  std::string Path(const std::string& name) const { return (dir / name).string(); }
  void Write(const std::string& name, const std::string& text) const {
    FILE* f = std::fopen(Path(name).c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  fs::path dir;
  CurveKeyPair server, router, stranger;
};

// Sends one request through a fresh Fleet with `curve` to `endpoint`; the request's status.
Status Ask(const std::string& endpoint, const FleetCurve& curve, size_t* tokens) {
  FleetOptions o;
  o.registration_endpoint = "";
  o.static_workers = {endpoint};
  o.static_model = "mock";
  o.static_block_size = 16;
  o.first_token_timeout = 1 * kNsPerSec;  // an unanswered request ends in a second
  o.max_attempts = 1;
  o.curve = curve;
  auto fleet = Fleet::Start(o, nullptr, SystemClock::Default(), nullptr);
  REQUIRE_MESSAGE(fleet.ok(), fleet.status().ToString());
  // A CURVE client's TCP connect succeeds whatever the keys: wait for it, then ask.
  for (int i = 0; i < 400; ++i) {
    auto m = (*fleet)->FindModel("mock");
    if (m && !m->routable.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto sink = std::make_shared<OneAnswer>();
  auto done = sink->Done();
  ForwardRequest req;
  req.worker = 0;
  req.params.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  req.params.sampling.max_tokens = 3;
  req.params.sampling.ignore_eos = true;
  req.params.sampling.temperature = 0;
  req.sink = sink;
  uint64_t h = (*fleet)->NewHandle();
  (*fleet)->Submit(h, std::move(req));
  REQUIRE(done.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  Status st = done.get();
  (*fleet)->Stop();
  *tokens = sink->tokens();
  return st;
}

}  // namespace

TEST_CASE("a keyed worker answers only routers holding its public key and an authorized key pair") {
  Keys keys(fs::temp_directory_path() / ("kvfleet-curve-" + std::to_string(::getpid())));
  zmq::context_t context;
  server::WorkerConfig config = testing::MockWorkerConfig("mock");
  config.curve_keypair = keys.Path("server.key");
  config.curve_authorized_keys = keys.Path("authorized");
  auto started = server::Worker::Start(config, context);
  REQUIRE_MESSAGE(started.ok(), started.status().ToString());
  std::unique_ptr<server::Worker> worker = std::move(*started);
  // Keyed, with no list of the workers that may pull from it: it moves no KV, rather than
  // serve its cache over plain TCP.
  CHECK(worker->transfer_endpoint().empty());
  std::thread engine([&] { worker->Run(); });
  const std::string endpoint = worker->requests_endpoint();

  size_t tokens = 0;
  SUBCASE("the authorized router gets its answer") {
    Status st = Ask(endpoint, {keys.Path("router.key"), keys.Path("server.pub")}, &tokens);
    CHECK_MESSAGE(st.ok(), st.ToString());
    CHECK(tokens == 3);
  }
  SUBCASE("an unkeyed (plaintext) router gets nothing") {
    Status st = Ask(endpoint, {}, &tokens);
    CHECK(!st.ok());
    CHECK(tokens == 0);
  }
  SUBCASE("a router with the server key but an unlisted key pair gets nothing") {
    Status st = Ask(endpoint, {keys.Path("stranger.key"), keys.Path("server.pub")}, &tokens);
    CHECK(!st.ok());
    CHECK(tokens == 0);
  }
  worker->RequestStop();
  engine.join();
}

TEST_CASE("request CURVE settings are checked when the fleet starts") {
  FleetOptions o;
  o.registration_endpoint = "";
  o.curve.client_keypair_file = "/nonexistent/router.key";
  CHECK(!Fleet::Start(o, nullptr, SystemClock::Default(), nullptr).ok());  // half set
  o.curve.server_public_key_file = "/nonexistent/server.pub";
  CHECK(!Fleet::Start(o, nullptr, SystemClock::Default(), nullptr).ok());  // unreadable
}

}  // namespace kvfleet::router
