// LoRA adapters through the router's API against fake workers: a request's model selects an
// adapter and goes only to workers serving it, /v1/models and /fleet list adapters, Hellos
// change what is served, and /v1/load_lora_adapter and /v1/unload_lora_adapter reach every
// target worker and answer with their outcome. And what else /fleet shows of the load
// reports: each worker's KV pulls per holder.
#include <algorithm>
#include <cstdio>
#include <map>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include "common/http/metrics.h"
#include "router/http/api.h"
#include "router/routing/predicted_index.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

using http::testing::BodyOf;
using http::testing::Roundtrip;
using http::testing::StatusOf;
using nlohmann::json;
using testing::FakeWorker;
using testing::WaitFor;

namespace {

// Load reports set by hand, every worker live: the fleet's view of which adapters are resident.
class FakeSignals final : public WorkerSignals {
 public:
  void AddWorker(WorkerId, const WorkerHello&) override {}
  void RemoveWorker(WorkerId) override {}
  WorkerState State(WorkerId) const override { return WorkerState::kLive; }
  std::optional<WorkerLoad> Load(WorkerId id) const override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = loads.find(id);
    if (it == loads.end()) return std::nullopt;
    return it->second;
  }
  std::map<std::string, PullFit, std::less<>> PullFits(WorkerId id) const override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pulls.find(id);
    return it == pulls.end() ? std::map<std::string, PullFit, std::less<>>{} : it->second;
  }
  mutable std::mutex mu;
  std::map<WorkerId, WorkerLoad> loads;
  std::map<WorkerId, std::map<std::string, PullFit, std::less<>>> pulls;
};

// The router has not just restarted: an unknown model is 404 at once.
ApiOptions NoUnknownModelGrace(ApiOptions o) {
  o.unknown_model_grace = 0;
  return o;
}

// A router whose workers register with Hellos (no static ones).
struct LoraRouter : testing::ApiRouter {
  explicit LoraRouter(ApiOptions api_options = {}, WorkerSignals* signals = nullptr)
      : ApiRouter({}, NoUnknownModelGrace(std::move(api_options)), {}, ModelCodecs(MakeByteCodec()), signals) {}
  // Registers `hello` and waits until the fleet holds it as sent (its adapters included).
  void Register(const WorkerHello& hello) {
    FakeWorker::Register(fleet->registration_endpoint(), EncodeHello(hello));
    REQUIRE(WaitFor([&] {
      for (const WorkerStatus& w : fleet->Workers()) {
        if (w.info.name == hello.name && w.routable && w.info.loras == hello.loras) return true;
      }
      return false;
    }));
  }
  std::string Complete(const std::string& model) {
    return Post("/v1/completions", json{{"model", model}, {"prompt", "hello there"}, {"max_tokens", 3}}.dump());
  }
};

std::string ErrorMessage(const std::string& response) {
  return json::parse(BodyOf(response))["error"]["message"].get<std::string>();
}

}  // namespace

TEST_CASE("a model naming an adapter goes only to workers serving it, as the base model with loraName") {
  FakeWorker holder, other;
  holder.set_loras({"sql"});
  LoraRouter r;
  r.Register(holder.HelloOf("holder"));
  r.Register(other.HelloOf("other"));
  for (int i = 0; i < 6; ++i) {
    auto resp = r.Complete("sql");
    REQUIRE(StatusOf(resp) == 200);
    CHECK(json::parse(BodyOf(resp))["model"] == "sql");  // the name asked for, as vLLM answers
  }
  CHECK(holder.generates() == 6);
  CHECK(other.generates() == 0);
  CHECK(holder.last_params().lora == "sql");
  CHECK(holder.last_params().model == "llama");
  // The base model's requests carry no adapter.
  REQUIRE(StatusOf(r.Complete("llama")) == 200);
  const GenerateParams base = holder.generates() == 7 ? holder.last_params() : other.last_params();
  CHECK(base.lora.empty());
  CHECK(base.model == "llama");
  // /tokenize knows the adapter's name too, with its base model's tokenizer and context.
  auto t = r.Post("/tokenize", R"({"model":"sql","prompt":"ab"})");
  REQUIRE(StatusOf(t) == 200);
  CHECK(json::parse(BodyOf(t))["max_model_len"] == 2048);
  CHECK(StatusOf(r.Post("/tokenize", R"({"model":"poetry","prompt":"ab"})")) == 404);
}

TEST_CASE("an adapter no worker serves is 404 like an unknown model, saying so") {
  FakeWorker w;
  w.set_loras({"sql"});
  LoraRouter r;
  r.Register(w.HelloOf("w"));
  auto resp = r.Complete("poetry");
  CHECK(StatusOf(resp) == 404);
  CHECK(json::parse(BodyOf(resp))["error"]["code"] == "model_not_found");
  CHECK(ErrorMessage(resp).find("LoRA adapter") != std::string::npos);
  CHECK(w.generates() == 0);
}

TEST_CASE("/v1/models lists each adapter with its base model; /fleet lists each worker's adapters") {
  FakeWorker a, b;
  a.set_loras({"sql", "chat"});
  b.set_loras({"sql"});
  LoraRouter r;
  r.Register(a.HelloOf("a", "llama", 2500));
  r.Register(b.HelloOf("b"));
  auto models = json::parse(BodyOf(r.Get("/v1/models")))["data"];
  REQUIRE(models.size() == 3);  // llama, then chat and sql once each
  CHECK(models[0]["id"] == "llama");
  CHECK(models[0]["parent"].is_null());
  CHECK(models[1]["id"] == "chat");
  CHECK(models[2]["id"] == "sql");
  for (int i : {1, 2}) {
    CHECK(models[i]["parent"] == "llama");
    CHECK(models[i]["root"] == "llama-hf");  // the adapter's base_model_name_or_path
    CHECK(models[i]["object"] == "model");
  }
  auto workers = json::parse(BodyOf(r.Get("/fleet")))["workers"];
  REQUIRE(workers.size() == 2);
  const json& wa = workers[0]["name"] == "a" ? workers[0] : workers[1];
  REQUIRE(wa["loras"].size() == 2);
  CHECK(wa["loras"][0]["name"] == "sql");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(LoraId("sql")));
  CHECK(wa["loras"][0]["lora_id"] == hex);
  CHECK(wa["loras"][0]["rank"] == 8);
  CHECK(wa["loras"][0]["resident"] == false);  // no load report says so
  CHECK(wa["max_loras"] == 4);
  CHECK(wa["lora_load_us"] == 2500);
}

TEST_CASE("a worker whose Hello drops the adapter stops getting its requests") {
  FakeWorker first, second;
  first.set_loras({"sql"});
  LoraRouter r;
  r.Register(first.HelloOf("first"));
  r.Register(second.HelloOf("second"));
  REQUIRE(StatusOf(r.Complete("sql")) == 200);
  CHECK(first.generates() == 1);
  // Its next Hello no longer lists it; the second worker's now does.
  first.set_loras({});
  second.set_loras({"sql"});
  r.Register(first.HelloOf("first"));
  CHECK(StatusOf(r.Complete("sql")) == 404);
  r.Register(second.HelloOf("second"));
  for (int i = 0; i < 4; ++i) REQUIRE(StatusOf(r.Complete("sql")) == 200);
  CHECK(first.generates() == 1);
  CHECK(second.generates() == 4);
}

TEST_CASE("a worker that no longer has the adapter refuses it; the request is retried on one that has") {
  FakeWorker stale, good;
  stale.set_loras({"sql"});
  good.set_loras({"sql"});
  LoraRouter r;
  r.Register(stale.HelloOf("stale", "llama"));
  r.Register(good.HelloOf("good", "llama", 1));  // charged 1 µs: the stale one is picked first
  stale.set_loras({});  // unloaded behind the router's back; its Hello is not re-sent
  auto resp = r.Complete("sql");
  REQUIRE(StatusOf(resp) == 200);
  CHECK(stale.generates() == 1);
  CHECK(good.generates() == 1);
}

TEST_CASE("an adapter costs a worker its Hello's load time until a load report lists it resident") {
  FakeWorker w;
  w.set_loras({"sql"});
  FakeSignals signals;
  LoraRouter r({}, &signals);
  r.Register(w.HelloOf("w", "llama", 40'000));
  const WorkerId id = r.fleet->Workers().at(0).id;
  CHECK(r.fleet->AdapterLoadSeconds(id, LoraId("sql")) == doctest::Approx(0.04));
  CHECK(!r.fleet->AdapterLoadSeconds(id, LoraId("chat")));  // not served at all
  {
    std::lock_guard<std::mutex> lock(signals.mu);
    signals.loads[id].resident_loras = {LoraId("sql")};
  }
  CHECK(r.fleet->AdapterLoadSeconds(id, LoraId("sql")) == 0);
  auto fleet = json::parse(BodyOf(r.Get("/fleet")));
  CHECK(fleet["workers"][0]["loras"][0]["resident"] == true);
}

TEST_CASE("loading an adapter at run time reaches every worker of the model; unloading ends it") {
  FakeWorker a, b;
  LoraRouter r;
  r.Register(a.HelloOf("a"));
  r.Register(b.HelloOf("b"));
  CHECK(StatusOf(r.Complete("poetry")) == 404);
  auto load = r.Post("/v1/load_lora_adapter", R"({"lora_name":"poetry","lora_path":"/adapters/poetry"})");
  REQUIRE(StatusOf(load) == 200);
  CHECK(BodyOf(load) == "Success: LoRA adapter 'poetry' added successfully.");
  CHECK(a.loras() == std::vector<std::string>{"poetry"});
  CHECK(b.loras() == std::vector<std::string>{"poetry"});
  // Served at once, ahead of the workers' next Hellos.
  REQUIRE(StatusOf(r.Complete("poetry")) == 200);
  auto models = json::parse(BodyOf(r.Get("/v1/models")))["data"];
  CHECK(models.size() == 2);
  // Unload from one worker only, by name: the other keeps it.
  auto one = r.Post("/v1/unload_lora_adapter", R"({"lora_name":"poetry","workers":["a"]})");
  REQUIRE(StatusOf(one) == 200);
  CHECK(BodyOf(one) == "Success: LoRA adapter 'poetry' removed successfully.");
  CHECK(a.loras().empty());
  const int b_before = b.generates();
  for (int i = 0; i < 3; ++i) REQUIRE(StatusOf(r.Complete("poetry")) == 200);
  CHECK(b.generates() == b_before + 3);
  // Unload everywhere (the model found from the adapter); then it is gone.
  REQUIRE(StatusOf(r.Post("/v1/unload_lora_adapter", R"({"lora_name":"poetry"})")) == 200);
  CHECK(b.loras().empty());
  CHECK(StatusOf(r.Complete("poetry")) == 404);
  auto again = r.Post("/v1/unload_lora_adapter", R"({"lora_name":"poetry"})");
  CHECK(StatusOf(again) == 404);
  const std::string metrics = r.Metrics();
  CHECK(metrics.find(R"(kvfleet_router_lora_requests_total{op="load",outcome="ok"} 1)") != std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_lora_requests_total{op="unload",outcome="ok"} 2)") != std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_lora_requests_total{op="unload",outcome="not_found"} 1)") != std::string::npos);
}

TEST_CASE("load and unload refuse bad input with a 400 naming the field") {
  FakeWorker w;
  LoraRouter r;
  r.Register(w.HelloOf("w"));
  struct Case {
    const char* path;
    const char* body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/load_lora_adapter", R"({"lora_path":"/x"})", 400, "lora_name"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a"})", 400, "lora_path"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":""})", 400, "lora_path"},
      {"/v1/load_lora_adapter", R"({"lora_name":7,"lora_path":"/x"})", 400, "lora_name"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x","load_inplace":true})", 400, "load_inplace"},
      {"/v1/load_lora_adapter", R"({"lora_name":"llama","lora_path":"/x"})", 400, "lora_name"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x","model":"qwen"})", 404, "model"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x","workers":["nobody"]})", 400, "workers"},
      {"/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x","workers":[]})", 400, "workers"},
      {"/v1/unload_lora_adapter", R"({"lora_name":"a","lora_path":"/x"})", 400, "lora_path"},
      {"/v1/unload_lora_adapter", R"({})", 400, "lora_name"},
      {"/v1/unload_lora_adapter", R"([1])", 400, ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    auto resp = r.Post(c.path, c.body);
    CHECK(StatusOf(resp) == c.status);
    auto err = json::parse(BodyOf(resp))["error"];
    if (*c.param) CHECK(err["param"] == c.param);
    CHECK(!err["message"].get<std::string>().empty());
  }
  CHECK(w.lora_controls() == 0);
}

TEST_CASE("a fleet of several models needs the model to load into") {
  FakeWorker l, q;
  LoraRouter r;
  r.Register(l.HelloOf("l", "llama"));
  r.Register(q.HelloOf("q", "qwen"));
  auto resp = r.Post("/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x"})");
  CHECK(StatusOf(resp) == 400);
  CHECK(ErrorMessage(resp).find("llama, qwen") != std::string::npos);
  REQUIRE(StatusOf(r.Post("/v1/load_lora_adapter", R"({"lora_name":"a","lora_path":"/x","model":"qwen"})")) == 200);
  CHECK(l.loras().empty());
  CHECK(q.loras() == std::vector<std::string>{"a"});
  REQUIRE(StatusOf(r.Complete("a")) == 200);
  CHECK(q.last_params().model == "qwen");
  CHECK(q.last_params().lora == "a");
}

TEST_CASE("a load refused by every worker is 400, partly refused 502, unanswered 504, each worker named") {
  FakeWorker a, b;
  ApiOptions api;
  api.lora_control_timeout = 300 * kNsPerMs;
  LoraRouter r(api);
  r.Register(a.HelloOf("a"));
  r.Register(b.HelloOf("b"));
  const std::string body = R"({"lora_name":"bad","lora_path":"/adapters/bad"})";
  a.set_lora_mode(FakeWorker::LoraMode::kRefuse);
  b.set_lora_mode(FakeWorker::LoraMode::kRefuse);
  auto refused = r.Post("/v1/load_lora_adapter", body);
  CHECK(StatusOf(refused) == 400);
  CHECK(ErrorMessage(refused).find("worker a: bad adapter at /adapters/bad") != std::string::npos);
  CHECK(ErrorMessage(refused).find("worker b: bad adapter at /adapters/bad") != std::string::npos);
  CHECK(StatusOf(r.Complete("bad")) == 404);
  b.set_lora_mode(FakeWorker::LoraMode::kOk);
  auto partly = r.Post("/v1/load_lora_adapter", body);
  CHECK(StatusOf(partly) == 502);
  CHECK(ErrorMessage(partly).find("worker a:") != std::string::npos);
  CHECK(ErrorMessage(partly).find("worker b:") == std::string::npos);
  CHECK(StatusOf(r.Complete("bad")) == 200);  // b has it
  a.set_lora_mode(FakeWorker::LoraMode::kHang);
  auto hung = r.Post("/v1/load_lora_adapter", R"({"lora_name":"slow","lora_path":"/x"})");
  CHECK(StatusOf(hung) == 504);
  CHECK(ErrorMessage(hung).find("worker a: worker a did not answer in time") != std::string::npos);
  const std::string metrics = r.Metrics();
  CHECK(metrics.find(R"(outcome="refused"} 1)") != std::string::npos);
  CHECK(metrics.find(R"(outcome="failed"} 1)") != std::string::npos);
  CHECK(metrics.find(R"(outcome="timeout"} 1)") != std::string::npos);
}

TEST_CASE("with an API key, loading and unloading adapters need it") {
  FakeWorker w;
  ApiOptions api;
  api.api_keys = {"sk-good"};
  LoraRouter r(api);
  r.Register(w.HelloOf("w"));
  const std::string body = R"({"lora_name":"a","lora_path":"/x"})";
  CHECK(StatusOf(r.Post("/v1/load_lora_adapter", body)) == 401);
  CHECK(StatusOf(r.Post("/v1/unload_lora_adapter", R"({"lora_name":"a"})")) == 401);
  CHECK(w.lora_controls() == 0);
  CHECK(StatusOf(r.Post("/v1/load_lora_adapter", body, "Authorization: Bearer sk-good\r\n")) == 200);
}

TEST_CASE("/fleet shows each worker's KV pulls per holder: totals, bandwidth and the failed share") {
  FakeWorker w;
  FakeSignals signals;
  LoraRouter r({}, &signals);
  r.Register(w.HelloOf("w"));
  const WorkerId id = r.fleet->Workers().at(0).id;
  CHECK(json::parse(BodyOf(r.Get("/fleet")))["workers"][0]["pulls"].empty());  // none reported
  // Three pulls of 1 GB in 0.5 s each, then one that failed after 0.4 s.
  PullFit fit;
  fit.Add(3, 3e9, 1.5);
  fit.AddOutcomes(SystemClock::Default()->Now(), 3, 1, 0.4);
  {
    std::lock_guard<std::mutex> lock(signals.mu);
    signals.pulls[id]["tcp://10.0.0.7:5559"] = fit;
  }
  const json pulls = json::parse(BodyOf(r.Get("/fleet")))["workers"][0]["pulls"];
  REQUIRE(pulls.size() == 1);
  CHECK(pulls[0]["holder"] == "tcp://10.0.0.7:5559");
  CHECK(pulls[0]["pulls"].is_number_unsigned());
  CHECK(pulls[0]["pulls"] == 3);
  CHECK(pulls[0]["bytes"] == 3'000'000'000);
  CHECK(pulls[0]["bytes_per_second"].get<double>() == doctest::Approx(2e9));
  CHECK(pulls[0]["failed"] == 1);
  CHECK(pulls[0]["failed_seconds"].get<double>() == doctest::Approx(0.4));
  // One failed of four, against one good pull before any (router/core/pull_fit.h).
  CHECK(pulls[0]["failed_share"].get<double>() ==
        doctest::Approx(1.0 / (1 + 3 + config::kPullFailurePriorPulls)).epsilon(0.01));
}

}  // namespace kvfleet::router
