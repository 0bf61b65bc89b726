// The router's HTTP API and the fleet behind it: registration and its refusals, tokenizer
// digests, several models each with its own codec, static and DNS workers, predicted entries,
// API keys, and the per-model metrics.
#include "router/http/api.h"

#include <algorithm>
#include <fstream>
#include <thread>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "common/http/metrics.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

using http::testing::BodyOf;
using http::testing::Roundtrip;
using http::testing::StatusOf;
using nlohmann::json;
using testing::FakeWorker;
using testing::RouterUnderTest;
using testing::WaitFor;

TEST_CASE("registration refuses a prefill worker whose KV no decode worker can take") {
  FakeWorker decode, fp8, none, same;
  RouterUnderTest r({});
  auto hello_of = [](std::string name, const FakeWorker& w, WorkerRole role, std::string format) {
    WorkerHello h;
    h.name = std::move(name);
    h.model = "llama";
    h.block_size = 16;
    h.max_context = 2048;
    h.requests_endpoint = w.endpoint();
    h.backend = "mock";
    h.role = role;
    if (!format.empty()) {
      h.transfer_endpoint = "tcp://10.0.0.5:" + std::to_string(5560 + h.name.size());
      h.transfer_format = std::move(format);
      h.transfer_bytes_per_block = 4u << 20;
    }
    return h;
  };
  auto refused = [&](const std::string& name) {
    for (const RefusedWorker& w : r.fleet->Refused()) {
      if (w.info.name == name) return w.reason;
    }
    return std::string();
  };
  // Before any decode worker: nothing to compare with, so a prefill worker joins.
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello_of("p-same", same, WorkerRole::kPrefill, "bf16")));
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("llama") && r.fleet->FindModel("llama")->workers == 1; }));
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello_of("d", decode, WorkerRole::kDecode, "bf16")));
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("llama")->routable.size() == 2; }));
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello_of("p-fp8", fp8, WorkerRole::kPrefill, "fp8e4m3")));
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello_of("p-none", none, WorkerRole::kPrefill, "")));
  REQUIRE(WaitFor([&] { return r.fleet->Refused().size() == 2; }));
  CHECK(refused("p-fp8") == "kv-layout-mismatch");
  CHECK(refused("p-none") == "kv-layout-mismatch");
  for (const RefusedWorker& w : r.fleet->Refused()) {
    if (w.info.name == "p-fp8") CHECK(w.why.find("fp8e4m3") != std::string::npos);
    if (w.info.name == "p-fp8") CHECK(w.why.find("d holds bf16") != std::string::npos);
    if (w.info.name == "p-none") CHECK(w.why.find("must serve KV transfer") != std::string::npos);
  }
  CHECK(r.fleet->FindModel("llama")->workers == 2);
  CHECK(http::SerializeMetrics(*r.registry).find("reason=\"kv-layout-mismatch\"") != std::string::npos);
}

TEST_CASE("registration adds workers per model and refuses a block-size mismatch") {
  FakeWorker w1, w2;
  RouterUnderTest r({});
  WorkerHello hello;
  hello.name = "w1";
  hello.model = "llama";
  hello.block_size = 16;
  hello.max_context = 2048;
  hello.requests_endpoint = w1.endpoint();
  hello.backend = "mock";
  hello.tensor_parallel = 4;
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello));
  REQUIRE(WaitFor([&] {
    auto m = r.fleet->FindModel("llama");
    return m && m->routable.size() == 1;
  }));
  hello.name = "w2";
  hello.block_size = 32;
  hello.requests_endpoint = w2.endpoint();
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello));
  REQUIRE(WaitFor([&] {
    return http::SerializeMetrics(*r.registry).find("reason=\"block-size-mismatch\"") != std::string::npos;
  }));
  CHECK(r.fleet->FindModel("llama")->workers == 1);
  auto models = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/v1/models")));
  CHECK(models["data"][0]["id"] == "llama");
  auto fleet = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/fleet")));
  CHECK(fleet["workers"][0]["block_size"] == 16);
  CHECK(fleet["workers"][0]["kv_block_size"] == 16);  // no kvBlockSize: KV blocks are block_size tokens
  CHECK(fleet["workers"][0]["tensor_parallel"] == 4);
  CHECK(fleet["workers"][0]["role"] == "both");  // its Hello names none
  CHECK(fleet["workers"][0]["transfer"].is_null());  // its Hello announces no transfer service
  CHECK(fleet["workers"][0]["device_id"].is_null());  // nor a device
  const WorkerId id = r.fleet->FindModel("llama")->routable.at(0);
  CHECK(r.fleet->Transfer(id) == nullptr);
  std::vector<WorkerLoads::LoadView> before;
  r.fleet->Loads(std::span(&id, 1), &before);
  CHECK(before.at(0).transfer_format == 0);  // serves no pulls
  // A later Hello that announces one: routing reads it, and /fleet shows it.
  hello.name = "w1";
  hello.block_size = 16;
  hello.requests_endpoint = w1.endpoint();
  hello.transfer_endpoint = "tcp://10.0.0.5:5559";
  hello.transfer_format = "bf16";
  hello.transfer_bytes_per_block = 4u << 20;
  hello.transfer_host_id = "boot-1";
  hello.role = WorkerRole::kDecode;
  hello.device_id = "GPU-5e1c";
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello));
  REQUIRE(WaitFor([&] { return r.fleet->Transfer(id) != nullptr; }));
  CHECK(r.fleet->Role(id) == WorkerRole::kDecode);
  CHECK(r.fleet->Transfer(id)->endpoint == "tcp://10.0.0.5:5559");
  CHECK(r.fleet->Transfer(id)->name == "w1");
  CHECK(r.fleet->Transfer(id)->bytes_per_block == 4u << 20);
  CHECK(r.fleet->Transfer(id)->host_id == "boot-1");
  // Routing compares it to a pull's source by ids read with its load, not by its TransferPeer.
  std::vector<WorkerLoads::LoadView> views;
  r.fleet->Loads(std::span(&id, 1), &views);
  REQUIRE(views.size() == 1);
  CHECK(views[0].transfer_format == TransferNameId("bf16"));
  CHECK(views[0].transfer_host == TransferNameId("boot-1"));
  CHECK(TransferNameId("boot-1") != TransferNameId("bf16"));
  fleet = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/fleet")));
  CHECK(fleet["workers"][0]["transfer"]["format"] == "bf16");
  CHECK(fleet["workers"][0]["transfer"]["curve"] == false);
  CHECK(fleet["workers"][0]["transfer"]["host_id"] == "boot-1");
  CHECK(fleet["workers"][0]["role"] == "decode");
  CHECK(fleet["workers"][0]["device_id"] == "GPU-5e1c");
  // Bye takes it out of routing at once.
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeBye({"w1", 0}));
  CHECK(WaitFor([&] { return r.fleet->FindModel("llama")->routable.empty(); }));
}

namespace {

WorkerHello HelloOf(const std::string& name, const FakeWorker& w, uint64_t tokenizer_digest,
                    const std::string& backend = "cpu") {
  WorkerHello hello;
  hello.name = name;
  hello.model = "llama";
  hello.block_size = 16;
  hello.max_context = 2048;
  hello.requests_endpoint = w.endpoint();
  hello.backend = backend;
  hello.tokenizer_digest = tokenizer_digest;
  return hello;
}

size_t RoutableLlama(const RouterUnderTest& r) {
  auto m = r.fleet->FindModel("llama");
  return m ? m->routable.size() : 0;
}

}  // namespace

TEST_CASE("a worker whose tokenizer digest differs from the router's is refused, shown and counted") {
  FakeWorker stranger, same, unknown;
  FleetOptions fo;
  fo.tokenizer_digest = 0x1111;
  RouterUnderTest r({}, {}, {}, fo);
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("stranger", stranger, 0x2222)));
  REQUIRE(WaitFor([&] {
    return http::SerializeMetrics(*r.registry).find("reason=\"tokenizer-mismatch\"") != std::string::npos;
  }));
  auto fleet = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/fleet")));
  CHECK(fleet["workers"].empty());
  REQUIRE(fleet["refused"].size() == 1);
  CHECK(fleet["refused"][0]["name"] == "stranger");
  CHECK(fleet["refused"][0]["reason"] == "tokenizer-mismatch");
  CHECK(fleet["refused"][0]["refused"].get<std::string>().find(
            "tokenizer digest 0x0000000000002222 differs from the router's 0x0000000000001111") == 0);

  // The same digest, or none (a mock, an old worker), is accepted.
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("same", same, 0x1111)));
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("unknown", unknown, 0, "mock")));
  REQUIRE(WaitFor([&] { return RoutableLlama(r) == 2; }));
  fleet = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/fleet")));
  CHECK(fleet["refused"].size() == 1);
  for (const auto& w : fleet["workers"]) {
    CHECK(w["tokenizer_digest"] == (w["name"] == "same" ? json("0x0000000000001111") : json(nullptr)));
  }

  // An accepted worker that comes back with another tokenizer leaves routing.
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("same", same, 0x3333)));
  REQUIRE(WaitFor([&] { return RoutableLlama(r) == 1 && r.fleet->Refused().size() == 2; }));

  // The stranger restarted on the right model directory: accepted, no longer listed.
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("stranger", stranger, 0x1111)));
  REQUIRE(WaitFor([&] { return RoutableLlama(r) == 2; }));
  fleet = json::parse(BodyOf(Roundtrip(r.port(), "GET", "/fleet")));
  REQUIRE(fleet["refused"].size() == 1);
  CHECK(fleet["refused"][0]["name"] == "same");
}

TEST_CASE("a router without a tokenizer refuses text for cpu/cuda workers, and passes token ids") {
  FakeWorker w("hello world");
  RouterUnderTest r({});  // the byte codec
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(HelloOf("real", w, 0x1111, "cpu")));
  REQUIRE(WaitFor([&] { return RoutableLlama(r) == 1; }));
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/completions", R"({"model":"llama","prompt":"hello","max_tokens":2})"},
           {"/v1/chat/completions", R"({"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true})"}}) {
    CAPTURE(path);
    auto resp = r.Post(path, body);
    CHECK(StatusOf(resp) == 500);
    auto j = json::parse(BodyOf(resp));
    CHECK(j["error"]["type"] == "server_error");
    CHECK(j["error"]["code"] == "tokenizer_missing");
    CHECK(j["error"]["message"].get<std::string>().find("--tokenizer MODEL_DIR") != std::string::npos);
  }
  CHECK(w.generates() == 0);
  auto ids = r.Post("/v1/completions", R"({"model":"llama","prompt":[1,2,3],"max_tokens":2})");
  CHECK(StatusOf(ids) == 200);
  CHECK(w.generates() == 1);
}

TEST_CASE("each model's workers are compared with that model's tokenizer digest") {
  FakeWorker llama, qwen, qwen_stranger, other;
  FleetOptions fo;
  fo.tokenizer_digests = {{"llama", 0x1111}, {"qwen", 0x2222}};  // no default: other models compare nothing
  RouterUnderTest r({}, {}, {}, fo);
  auto hello = [](const std::string& name, const std::string& model, const FakeWorker& w, uint64_t digest) {
    WorkerHello h = HelloOf(name, w, digest);
    h.model = model;
    return EncodeHello(h);
  };
  FakeWorker::Register(r.fleet->registration_endpoint(), hello("llama-0", "llama", llama, 0x1111));
  FakeWorker::Register(r.fleet->registration_endpoint(), hello("qwen-0", "qwen", qwen, 0x2222));
  FakeWorker::Register(r.fleet->registration_endpoint(), hello("qwen-1", "qwen", qwen_stranger, 0x1111));
  FakeWorker::Register(r.fleet->registration_endpoint(), hello("other-0", "other", other, 0x9999));
  REQUIRE(WaitFor([&] {
    auto q = r.fleet->FindModel("qwen");
    auto o = r.fleet->FindModel("other");
    return RoutableLlama(r) == 1 && q && q->routable.size() == 1 && o && o->routable.size() == 1 &&
           r.fleet->Refused().size() == 1;
  }));
  auto refused = r.fleet->Refused();
  CHECK(refused[0].info.name == "qwen-1");
  CHECK(refused[0].why.find("differs from the router's 0x0000000000002222 for model 'qwen'") != std::string::npos);
}

// A codec that is a model's tokenizer (not bytes) and marks its ids, so a test sees which
// model's codec encoded a prompt.
class MarkedCodec final : public TextCodec {
 public:
  explicit MarkedCodec(TokenId mark) : bytes_(MakeByteCodec()), mark_(mark) {}
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override {
    KVF_ASSIGN_OR_RETURN(auto ids, bytes_->EncodePrompt(text));
    ids.insert(ids.begin(), mark_);
    return ids;
  }
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json&, const ChatTemplateOptions&) const override {
    return EncodePrompt("chat");
  }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return bytes_->NewDecoder(); }
  std::vector<TokenId> eos_token_ids() const override { return {}; }
  std::string name() const override { return "marked"; }

 private:
  std::unique_ptr<TextCodec> bytes_;
  TokenId mark_;
};

TEST_CASE("each model's prompts are tokenized by its own codec; a model without one gets the default") {
  FakeWorker llama("ok"), qwen("ok"), bare("ok");
  ModelCodecs codecs(MakeByteCodec());
  codecs.Set("llama", std::make_shared<MarkedCodec>(1001));
  codecs.Set("qwen", std::make_shared<MarkedCodec>(2002));
  RouterUnderTest r({}, {}, {}, {}, std::move(codecs));
  auto hello = [](const std::string& model, const FakeWorker& w) {
    WorkerHello h = HelloOf(model + "-0", w, 0, "cpu");
    h.model = model;
    return EncodeHello(h);
  };
  for (auto [model, w] : {std::pair{"llama", &llama}, std::pair{"qwen", &qwen}, std::pair{"bare", &bare}}) {
    FakeWorker::Register(r.fleet->registration_endpoint(), hello(model, *w));
  }
  REQUIRE(WaitFor([&] {
    for (const char* m : {"llama", "qwen", "bare"}) {
      auto f = r.fleet->FindModel(m);
      if (!f || f->routable.size() != 1) return false;
    }
    return true;
  }));
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"llama","prompt":"hi","max_tokens":1})")) == 200);
  CHECK(llama.last_params().tokens == std::vector<TokenId>{1001, 'h', 'i'});
  CHECK(StatusOf(r.Post("/v1/chat/completions",
                        R"({"model":"qwen","messages":[{"role":"user","content":"x"}],"max_tokens":1})")) == 200);
  CHECK(qwen.last_params().tokens == std::vector<TokenId>{2002, 'c', 'h', 'a', 't'});
  // "bare" runs on cpu workers and has no tokenizer of its own: the default byte codec
  // refuses its text, naming the per-model fix.
  auto resp = r.Post("/v1/completions", R"({"model":"bare","prompt":"hi","max_tokens":1})");
  CHECK(StatusOf(resp) == 500);
  auto j = json::parse(BodyOf(resp));
  CHECK(j["error"]["code"] == "tokenizer_missing");
  CHECK(j["error"]["message"].get<std::string>().find("--tokenizer bare=MODEL_DIR") != std::string::npos);
  CHECK(bare.generates() == 0);
}

TEST_CASE("static and DNS workers of several models each serve only their own model") {
  FakeWorker a("a"), b("b"), d("d");
  auto port = d.endpoint().substr(d.endpoint().rfind(':') + 1);
  FleetOptions fo;
  StaticFleet llama, qwen;
  llama.model = "llama";
  llama.block_size = 16;
  llama.workers = {a.endpoint()};
  qwen.model = "qwen";
  qwen.max_context = 2048;
  qwen.workers = {b.endpoint()};
  qwen.dns_names = {"127.0.0.1:" + port};
  fo.static_fleets = {llama, qwen};
  RouterUnderTest r({}, {}, {}, fo);
  REQUIRE(WaitFor([&] {
    auto l = r.fleet->FindModel("llama");
    auto q = r.fleet->FindModel("qwen");
    return l && l->routable.size() == 1 && q && q->routable.size() == 2;
  }));
  CHECK(r.fleet->FindModel("llama")->block_size == 16);
  CHECK(r.fleet->FindModel("qwen")->max_context == 2048);
  for (int i = 0; i < 6; ++i) {
    CHECK(StatusOf(r.Post("/v1/completions", json{{"model", i % 2 ? "llama" : "qwen"}, {"prompt", "p" + std::to_string(i)},
                                                  {"max_tokens", 1}}.dump())) == 200);
  }
  CHECK(a.generates() == 3);
  CHECK(b.generates() + d.generates() == 3);
}

TEST_CASE("/ready stays 200 while some model serves, and names each model's state") {
  // Regression: /ready went 503 for good once any one model lost its last worker, though the
  // other models still served; on Kubernetes that took every router out of service.
  FakeWorker a("a"), b("b");
  FleetOptions fo;
  StaticFleet llama, qwen;
  llama.model = "llama";
  llama.workers = {a.endpoint()};
  qwen.model = "qwen";
  qwen.workers = {b.endpoint()};
  fo.static_fleets = {llama, qwen};
  RouterUnderTest r({}, {}, {}, fo);
  auto routable = [&](const char* model) { return r.fleet->FindModel(model)->routable.size(); };
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("llama") && r.fleet->FindModel("qwen") &&
                               routable("llama") == 1 && routable("qwen") == 1; }));
  auto ready = r.Get("/ready");
  CHECK(StatusOf(ready) == 200);
  CHECK(json::parse(BodyOf(ready)) ==
        json{{"status", "ready"},
             {"models", {{"llama", {{"state", "serving"}, {"workers", 1}, {"routable_workers", 1}}},
                         {"qwen", {{"state", "serving"}, {"workers", 1}, {"routable_workers", 1}}}}}});
  b.Crash();
  REQUIRE(WaitFor([&] { return routable("qwen") == 0; }));
  ready = r.Get("/ready");
  CHECK(StatusOf(ready) == 200);
  auto j = json::parse(BodyOf(ready));
  CHECK(j["status"] == "degraded");
  CHECK(j["models"]["llama"]["state"] == "serving");
  CHECK(j["models"]["qwen"] == json{{"state", "unavailable"}, {"workers", 1}, {"routable_workers", 0}});
  CHECK(json::parse(BodyOf(r.Get("/fleet")))["ready"] == true);
  // The model without a worker is refused on its own; the other serves.
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"qwen","prompt":"x","max_tokens":1})")) == 503);
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"llama","prompt":"x","max_tokens":1})")) == 200);
  a.Crash();
  REQUIRE(WaitFor([&] { return routable("llama") == 0; }));
  ready = r.Get("/ready");
  CHECK(StatusOf(ready) == 503);
  CHECK(json::parse(BodyOf(ready))["status"] == "no live worker");
}

TEST_CASE("/ready waits for a worker that decodes: prefill workers alone serve nothing") {
  // Regression: a P/D fleet whose prefill worker registered first was ready, and its first
  // requests got 503 (no worker can decode) until the decode worker came.
  FakeWorker p, d;
  RouterUnderTest r({});
  WorkerHello hello;
  hello.name = "p";
  hello.model = "llama";
  hello.block_size = 16;
  hello.max_context = 2048;
  hello.requests_endpoint = p.endpoint();
  hello.backend = "mock";
  hello.role = WorkerRole::kPrefill;
  hello.transfer_endpoint = "tcp://10.0.0.5:5559";
  hello.transfer_format = "bf16";
  hello.transfer_bytes_per_block = 4u << 20;
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello));
  REQUIRE(WaitFor([&] {
    auto m = r.fleet->FindModel("llama");
    return m && m->routable.size() == 1;
  }));
  auto ready = r.Get("/ready");
  CHECK(StatusOf(ready) == 503);
  CHECK(json::parse(BodyOf(ready))["models"]["llama"] ==
        json{{"state", "unavailable"}, {"workers", 1}, {"routable_workers", 0}});
  hello.name = "d";
  hello.requests_endpoint = d.endpoint();
  hello.role = WorkerRole::kDecode;
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(hello));
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("llama")->routable.size() == 2; }));
  ready = r.Get("/ready");
  CHECK(StatusOf(ready) == 200);
  CHECK(json::parse(BodyOf(ready))["models"]["llama"] ==
        json{{"state", "serving"}, {"workers", 2}, {"routable_workers", 1}});
}

TEST_CASE("predicted entries send a burst sharing a new prefix to one worker") {
  FakeWorker a("ok"), b("ok"), c("ok");
  RouterUnderTest r({a.endpoint(), b.endpoint(), c.endpoint()});
  r.WaitRoutable(3);
  std::string shared(2000, 's');
  std::vector<std::thread> clients;
  // The first request picks a worker; the rest find its predicted blocks.
  CHECK(StatusOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", shared + "0"}}.dump())) == 200);
  for (int i = 1; i < 20; ++i) {
    clients.emplace_back([&, i] {
      r.Post("/v1/completions", json{{"model", "m"}, {"prompt", shared + std::to_string(i)}}.dump());
    });
  }
  for (auto& t : clients) t.join();
  std::vector<int> counts = {a.generates(), b.generates(), c.generates()};
  CHECK(std::count(counts.begin(), counts.end(), 20) == 1);
}

TEST_CASE("workers found through a DNS name serve requests") {
  FakeWorker w("dns");
  auto port = w.endpoint().substr(w.endpoint().rfind(':') + 1);
  FleetOptions fo;
  fo.dns_name = "localhost:" + port;  // 127.0.0.1 (and ::1, where nothing listens)
  RouterUnderTest r({}, {}, {}, fo);
  REQUIRE(WaitFor([&] {
    auto m = r.fleet->FindModel("m");
    return m && !m->routable.empty();
  }));
  auto resp = r.Post("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":3})");
  CHECK(StatusOf(resp) == 200);
  CHECK(json::parse(BodyOf(resp))["kvfleet"]["worker"] == "tcp://127.0.0.1:" + port);
}

TEST_CASE("API keys load from a file") {
  std::string path = "/tmp/kvfleet_api_keys_test.txt";
  {
    std::ofstream out(path);
    out << "# keys\n\nsk-one\n  sk-two  \n";
  }
  auto keys = LoadApiKeys(path);
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<std::string>{"sk-one", "sk-two"});
  CHECK_FALSE(LoadApiKeys("/nonexistent/keys").ok());
}

TEST_CASE("with an API key, /fleet, /tokenize and /detokenize need it; /version, /health and /metrics do not") {
  FakeWorker w;
  ApiOptions api;
  api.api_keys = {"sk-good"};
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  const std::string auth = "Authorization: Bearer sk-good\r\n";
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/fleet")) == 401);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/fleet", "", "Authorization: Bearer sk-bad\r\n")) == 401);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/fleet", "", auth)) == 200);
  const std::string tokenize = R"({"model":"m","prompt":"ab"})";
  CHECK(StatusOf(r.Post("/tokenize", tokenize)) == 401);
  auto t = r.Post("/tokenize", tokenize, auth);
  REQUIRE(StatusOf(t) == 200);
  auto tokens = json::parse(BodyOf(t));
  CHECK(tokens["tokens"] == json::array({'a', 'b'}));
  CHECK(tokens["max_model_len"] == 4096);
  const std::string detokenize = json{{"model", "m"}, {"tokens", tokens["tokens"]}}.dump();
  CHECK(StatusOf(r.Post("/detokenize", detokenize)) == 401);
  CHECK(json::parse(BodyOf(r.Post("/detokenize", detokenize, auth)))["prompt"] == "ab");
  auto version = Roundtrip(r.port(), "GET", "/version");
  REQUIRE(StatusOf(version) == 200);
  CHECK(json::parse(BodyOf(version))["version"].is_string());
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/health")) == 200);
  const std::string metrics = Roundtrip(r.port(), "GET", "/metrics");
  CHECK(StatusOf(metrics) == 200);
  CHECK(metrics.find(R"(kvfleet_router_ttft_coefficient{term="queue"} 1)") != std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_prefill_ttft_coefficient{term="queue"} 1)") != std::string::npos);
  CHECK(metrics.find("kvfleet_router_pull_bias_seconds 0\n") != std::string::npos);  // no pulls seen
}

TEST_CASE("with --cache-salt-per-key, each API key's requests hash in their own cache namespace") {
  FakeWorker w;
  ApiOptions api;
  api.api_keys = {"sk-alice", "sk-bob"};
  api.cache_salt_per_key = true;
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  auto salt_of = [&](const std::string& key, const std::string& body) {
    auto resp = r.Post("/v1/completions", body, "Authorization: Bearer " + key + "\r\n");
    REQUIRE(StatusOf(resp) == 200);
    return w.last_params().cache_salt;
  };
  const std::string plain = R"({"model":"m","prompt":"the same prompt","max_tokens":2})";
  const std::string alice = salt_of("sk-alice", plain);
  CHECK(salt_of("sk-alice", plain) == alice);  // a tenant keeps its own hits
  const std::string bob = salt_of("sk-bob", plain);
  CHECK(bob != alice);
  CHECK(alice.find("sk-alice") == std::string::npos);  // the key itself never reaches a worker
  // A request's own cache_salt narrows further within its tenant.
  const std::string salted = salt_of("sk-alice", R"({"model":"m","prompt":"x","max_tokens":2,"cache_salt":"s1"})");
  CHECK(salted == alice + "s1");
}

TEST_CASE("with --metrics-need-key, /metrics needs an API key too") {
  FakeWorker w;
  ApiOptions api;
  api.api_keys = {"sk-good"};
  api.metrics_need_key = true;
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/metrics")) == 401);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/metrics", "", "Authorization: Bearer sk-bad\r\n")) == 401);
  auto metrics = Roundtrip(r.port(), "GET", "/metrics", "", "Authorization: Bearer sk-good\r\n");
  REQUIRE(StatusOf(metrics) == 200);
  CHECK(BodyOf(metrics).find("kvfleet_router_") != std::string::npos);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/health")) == 200);  // probes stay open
}

TEST_CASE("answered requests are counted in tokens per model and timed; admitted unknown fields are counted") {
  FakeWorker w("hello world");
  ApiOptions api;
  api.limits.fields.allow_unknown = true;
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  for (int i = 0; i < 2; ++i) {
    auto resp = r.Post("/v1/completions", R"({"model":"m","prompt":"abc","max_tokens":4,"x_client_tag":"a"})");
    REQUIRE(StatusOf(resp) == 200);
  }
  const std::string metrics = http::SerializeMetrics(*r.registry);
  CHECK(metrics.find(R"(kvfleet_router_prompt_tokens_total{model="m"} 6)") != std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_generation_tokens_total{model="m"} 8)") != std::string::npos);
  CHECK(metrics.find("kvfleet_router_request_duration_seconds_count 2") != std::string::npos);
  CHECK(metrics.find("kvfleet_router_queue_time_seconds_count 2") != std::string::npos);
  CHECK(metrics.find("kvfleet_router_unknown_fields_total 2") != std::string::npos);
  CHECK(metrics.find("kvfleet_build_info{") != std::string::npos);
  // Without the flag the same body is a 400 naming the field, and nothing is counted.
  RouterUnderTest strict({w.endpoint()});
  strict.WaitRoutable(1);
  auto refused = strict.Post("/v1/completions", R"({"model":"m","prompt":"abc","x_client_tag":"a"})");
  CHECK(StatusOf(refused) == 400);
  CHECK(json::parse(BodyOf(refused))["error"]["param"] == "x_client_tag");
  CHECK(http::SerializeMetrics(*strict.registry).find("kvfleet_router_prompt_tokens_total{") == std::string::npos);
}

// ---- Logprobs, echo and logit controls ------------------------------------------------
// The fake worker's logprobs (tests/router/fake_worker.h): reply token i at -(i + 1), its
// top entries the token itself then 'z', 'y', ...; prompt tokens at -0.5.

TEST_CASE("a worker id holding control characters is refused; it never reaches a header or a log") {
  // Regression: a worker registered as "w\r\nSet-Cookie: x=1" gave its clients a real
  // Set-Cookie header. The HTTP server also drops control bytes from header values
  // (server_hardening_test.cc); the fleet refuses such an id outright.
  FakeWorker w, good;
  RouterUnderTest r({});
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(w.HelloOf("w\r\nSet-Cookie: x=1")));
  FakeWorker::Register(r.fleet->registration_endpoint(), EncodeHello(good.HelloOf("good", "other")));
  REQUIRE(WaitFor([&] {
    return http::SerializeMetrics(*r.registry).find("reason=\"invalid-name\"") != std::string::npos;
  }));
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("other").has_value(); }));
  CHECK(!r.fleet->FindModel("llama"));
  const std::string resp = r.Post("/v1/completions", R"({"model":"llama","prompt":"x"})");
  CHECK(StatusOf(resp) != 200);
  CHECK(resp.find("Set-Cookie") == std::string::npos);
}

}  // namespace kvfleet::router
