// The router's HTTP API against fake workers when something goes wrong: every error code
// with its OpenAI error object, refusals at capacity (429/503 and Retry-After), client
// disconnects, workers that die or stall, and the retries those allow.
#include "router/http/api.h"

#include <chrono>
#include <thread>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "common/http/metrics.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

using http::testing::BodyOf;
using http::testing::Client;
using http::testing::Roundtrip;
using http::testing::StatusOf;
using nlohmann::json;
using testing::FakeWorker;
using testing::ApiRouter;
using testing::RouterUnderTest;
using testing::WithStaticWorkers;
using testing::WaitFor;
using testing::WaitTicking;

namespace {

// A codec whose chats fail as a tokenizer's do: no template, or one that did not parse.
class NoTemplateCodec final : public TextCodec {
 public:
  explicit NoTemplateCodec(Status chat_error) : bytes_(MakeByteCodec()), chat_error_(std::move(chat_error)) {}
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override { return bytes_->EncodePrompt(text); }
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json&, const ChatTemplateOptions&) const override {
    return chat_error_;
  }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return bytes_->NewDecoder(); }
  std::vector<TokenId> eos_token_ids() const override { return {}; }
  std::string name() const override { return "no-template"; }

 private:
  std::unique_ptr<TextCodec> bytes_;
  Status chat_error_;
};

// The status and error object of a chat to a router whose codec fails chats with `chat_error`;
// and whether a completion on that router still succeeds.
struct ChatFailure {
  int status = 0;
  json error;
  bool completions_work = false;
};
ChatFailure ChatWith(const FakeWorker& w, Status chat_error) {
  RouterUnderTest r({w.endpoint()}, {}, {}, {}, ModelCodecs(std::make_shared<NoTemplateCodec>(std::move(chat_error))));
  r.WaitRoutable(1);
  auto resp = r.Post("/v1/chat/completions",
                     json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  ChatFailure out;
  out.status = StatusOf(resp);
  out.error = json::parse(BodyOf(resp))["error"];
  out.completions_work = StatusOf(r.Post("/v1/completions", R"({"model":"m","prompt":"x"})")) == 200;
  return out;
}

// Sends a completion request on an open connection without waiting for its answer.
void PostCompletion(Client& c, const std::string& body) {
  c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
}

}  // namespace

TEST_CASE("a chat to a model without a chat template is a 500 naming the fix, not a 400 on messages") {
  FakeWorker w;
  ChatFailure missing = ChatWith(w, FailedPrecondition("the model has no chat template"));
  CHECK(missing.status == 500);
  CHECK(missing.error["code"] == "chat_template_missing");
  CHECK(missing.error["type"] == "server_error");
  CHECK(missing.error["param"].is_null());
  const std::string message = missing.error["message"].get<std::string>();
  CHECK(message.find("--chat-template FILE") != std::string::npos);
  CHECK(message.find("chat_template.jinja") != std::string::npos);
  CHECK(missing.completions_work);
  CHECK(w.generates() == 1);  // the completion's only

  ChatFailure broken = ChatWith(w, Unimplemented("chat_template: unknown tag"));
  CHECK(broken.status == 500);
  CHECK(broken.error["code"] == "chat_template_invalid");
  // A template that refuses these messages (raise_exception) blames the request.
  ChatFailure refusing = ChatWith(w, InvalidArgument("chat template: roles must alternate"));
  CHECK(refusing.status == 400);
  CHECK(refusing.error["param"] == "messages");
}

TEST_CASE("a prompt over the flags' context guess is retried (503), not refused, until the workers answer") {
  // Regression: routers beside the first of `kvfleet up --routers N` list the workers before
  // their Describe answers come, and answered 400 context_length_exceeded to prompts their
  // models take.
  ManualClock clock;
  FakeWorker w;
  ApiRouter r(WithStaticWorkers({w.endpoint()}, {}), {}, {}, ModelCodecs(MakeByteCodec()), nullptr, &clock);
  // Short of the second Describe (2 s on the fleet's clock).
  REQUIRE(WaitTicking(clock, [&] {
    auto m = r.fleet->FindModel("m");
    return m && m->routable.size() == 1;
  }, 1500 * kNsPerMs));
  const std::string body = json{{"model", "m"}, {"prompt", std::string(4000, 'a')}, {"max_tokens", 200}}.dump();
  auto resp = r.Post("/v1/completions", body);
  CHECK(StatusOf(resp) == 503);
  CHECK(resp.find("Retry-After: 1") != std::string::npos);
  CHECK(resp.find("--max-context 4096") != std::string::npos);
  clock.Advance(3 * kNsPerSec);  // its second Describe goes unanswered: the flags are final
  REQUIRE(WaitFor([&] { return !r.fleet->FindModel("m")->max_context_guessed; }));
  resp = r.Post("/v1/completions", body);
  CHECK(StatusOf(resp) == 400);
  CHECK(resp.find("context_length_exceeded") != std::string::npos);
}

TEST_CASE("every error has its status code and OpenAI error object") {
  FakeWorker w;
  ApiOptions api;
  api.api_keys = {"sk-good"};
  api.unknown_model_grace = 0;  // the grace after start has its own test
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  const std::string auth = "Authorization: Bearer sk-good\r\n";
  auto check = [&](const std::string& body, int status, const std::string& headers) {
    auto resp = r.Post("/v1/completions", body, headers);
    CHECK(StatusOf(resp) == status);
    auto j = json::parse(BodyOf(resp), nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["error"]["message"].is_string());
    CHECK(j["error"]["type"].is_string());
    return resp;
  };
  check(R"({"model":"m","prompt":"x"})", 401, "");
  check(R"({"model":"m","prompt":"x"})", 401, "Authorization: Bearer sk-bad\r\n");
  check("{oops", 400, auth);
  check(R"({"model":"m","prompt":7})", 400, auth);
  check(R"({"model":"m","prompt":"x","n":17})", 400, auth);
  // The static FakeWorker never answers a Describe: --max-context is final after the second.
  REQUIRE(WaitFor([&] { return !r.fleet->FindModel("m")->max_context_guessed; }));
  auto ctx = check(json{{"model", "m"}, {"prompt", std::string(4000, 'a')}, {"max_tokens", 200}}.dump(), 400, auth);
  CHECK(ctx.find("context_length_exceeded") != std::string::npos);
  auto unknown = check(R"({"model":"nope","prompt":"x"})", 404, auth);
  CHECK(unknown.find("model_not_found") != std::string::npos);
  check(json{{"model", "m"}, {"prompt", std::string(70 * 1024, 'a')}}.dump(), 413, auth);
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"m","prompt":"x"})", auth)) == 200);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/v1/models", "", auth)) == 200);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/v1/models")) == 401);
  // No live worker: 503 with Retry-After.
  w.Crash();
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("m")->routable.empty(); }));
  auto none = check(R"({"model":"m","prompt":"x"})", 503, auth);
  CHECK(none.find("Retry-After: 1") != std::string::npos);
  // With nothing routable, an unknown model may simply not have registered yet: 503, not 404.
  auto unknown_now = check(R"({"model":"nope","prompt":"x"})", 503, auth);
  CHECK(unknown_now.find("Retry-After: 1") != std::string::npos);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/ready")) == 503);
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/health")) == 200);
}

TEST_CASE("a model unknown to a router that just started is 503 with Retry-After, not 404") {
  // Regression: a restarted router answered 404 model_not_found until the model's workers
  // re-registered.
  FakeWorker w;
  ApiOptions api;
  api.unknown_model_grace = 600 * kNsPerSec;  // the whole test runs inside it
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  auto resp = r.Post("/v1/completions", R"({"model":"other","prompt":"x"})");
  CHECK(StatusOf(resp) == 503);
  CHECK(resp.find("Retry-After: 1") != std::string::npos);
  auto j = json::parse(BodyOf(resp), nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  CHECK(j["error"]["code"] == "service_unavailable");
  CHECK(j["error"]["message"].get<std::string>().find("still registering") != std::string::npos);
  // The model that is known is served all the same.
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"m","prompt":"x"})")) == 200);
}

TEST_CASE("a saturated fleet answers 429 with Retry-After") {
  FakeWorker w;
  w.set_mode(FakeWorker::Mode::kHang);
  RoutingOptions routing;
  routing.max_queued_requests = 1;
  RouterUnderTest r({w.endpoint()}, {}, routing);
  r.WaitRoutable(1);
  Client hanging(r.port());
  std::string body = R"({"model":"m","prompt":"x"})";
  hanging.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
               "\r\n\r\n" + body);
  REQUIRE(WaitFor([&] { return w.generates() == 1; }));
  auto resp = r.Post("/v1/completions", body);
  CHECK(StatusOf(resp) == 429);
  CHECK(resp.find("Retry-After:") != std::string::npos);
}

TEST_CASE("a request no worker would start in time is refused at once: 429, Retry-After from the predicted wait") {
  FakeWorker w;
  w.set_mode(FakeWorker::Mode::kHang);
  RoutingOptions routing;
  routing.default_prefill_tokens_per_s = 1000;  // no load reports here: the router's prior
  routing.admission_ttft_s = 3;
  RouterUnderTest r({w.endpoint()}, {}, routing);
  r.WaitRoutable(1);
  const std::string body = R"({"model":"m","prompt":")" + std::string(2000, 'a') + R"("})";
  Client first(r.port());  // 2,000 tokens: first token predicted in 2 s, admitted; it hangs there
  first.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body);
  REQUIRE(WaitFor([&] { return w.generates() == 1; }));
  // The next one (another prompt: no prefix to share) would wait for the first: ~4 s > 3 s.
  // Refused now, not after 3 s.
  const std::string other = R"({"model":"m","prompt":")" + std::string(2000, 'c') + R"("})";
  const auto start = std::chrono::steady_clock::now();
  auto resp = r.Post("/v1/completions", other);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK(StatusOf(resp) == 429);
  CHECK(resp.find("Retry-After: 2\r\n") != std::string::npos);  // 4.0 s predicted - 3 s, rounded up
  auto j = json::parse(BodyOf(resp));
  CHECK(j["error"]["type"] == "rate_limit_error");
  CHECK(j["error"]["code"] == "overloaded");
  CHECK(w.generates() == 1);  // it never reached the worker
  const std::string metrics = http::SerializeMetrics(*r.registry);
  CHECK(metrics.find(R"(kvfleet_router_requests_refused_total{model="m",reason="predicted_ttft"} 1)") !=
        std::string::npos);
  // A short prompt still fits in: 2,000 + 100 tokens, ~2.1 s.
  const std::string small = R"({"model":"m","prompt":")" + std::string(100, 'b') + R"("})";
  std::thread admitted([&] { r.Post("/v1/completions", small); });
  CHECK(WaitFor([&] { return w.generates() == 2; }));
  w.Crash();
  admitted.join();
}

TEST_CASE("a prompt no idle worker could start in time is 503 without Retry-After: waiting would not help") {
  FakeWorker w;
  RoutingOptions routing;
  routing.default_prefill_tokens_per_s = 1000;
  routing.admission_ttft_s = 2;
  RouterUnderTest r({w.endpoint()}, {}, routing);
  r.WaitRoutable(1);
  auto resp = r.Post("/v1/completions", R"({"model":"m","prompt":")" + std::string(3000, 'a') + R"("})");
  CHECK(StatusOf(resp) == 503);
  CHECK(resp.find("Retry-After") == std::string::npos);
  auto j = json::parse(BodyOf(resp));
  CHECK(j["error"]["code"] == "service_unavailable");
  CHECK(j["error"]["message"].get<std::string>().find("--first-token-timeout-s") != std::string::npos);
  CHECK(w.generates() == 0);
  CHECK(http::SerializeMetrics(*r.registry).find(R"(reason="unattainable"} 1)") != std::string::npos);
}

TEST_CASE("workers that refuse a request (queue full) make it a 429 with Retry-After, counted") {
  FakeWorker a, b;
  a.set_mode(FakeWorker::Mode::kRefuse);
  b.set_mode(FakeWorker::Mode::kRefuse);
  RouterUnderTest r({a.endpoint(), b.endpoint()});
  r.WaitRoutable(2);
  auto resp = r.Post("/v1/completions", R"({"model":"m","prompt":"x"})");
  CHECK(StatusOf(resp) == 429);
  CHECK(resp.find("Retry-After: 1\r\n") != std::string::npos);
  CHECK(json::parse(BodyOf(resp))["error"]["type"] == "rate_limit_error");
  CHECK(a.generates() + b.generates() == 2);  // tried on one, retried on the other
  CHECK(http::SerializeMetrics(*r.registry).find(R"(reason="worker_queue_full"} 1)") != std::string::npos);
}

TEST_CASE("a client that disconnects mid-stream cancels its request on the worker") {
  FakeWorker w;
  w.set_mode(FakeWorker::Mode::kFirstTokenThenHang);
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  {
    Client c(r.port());
    PostCompletion(c, R"({"model":"m","prompt":"x","stream":true,"max_tokens":100})");
    c.ReadUntil("\"text\":\"h\"");
  }
  CHECK(WaitFor([&] { return w.cancels() == 1; }));
}

TEST_CASE("a client that leaves before any answer cancels its request, counted abandoned, not as a dropped 500") {
  FakeWorker w;
  w.set_mode(FakeWorker::Mode::kHang);
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  {
    Client c(r.port());
    PostCompletion(c, R"({"model":"m","prompt":"x","max_tokens":3})");
    REQUIRE(WaitFor([&] { return w.generates() == 1; }));
  }
  CHECK(WaitFor([&] { return w.cancels() == 1; }));
  CHECK(WaitFor([&] {
    return http::SerializeMetrics(*r.registry).find("kvfleet_router_requests_abandoned_total 1") != std::string::npos;
  }));
  const std::string metrics = http::SerializeMetrics(*r.registry);
  CHECK(metrics.find("kvfleet_http_dropped_exchanges_total 0") != std::string::npos);
  CHECK(metrics.find("status=\"500\"") == std::string::npos);
}

TEST_CASE("a worker that dies before the first token: the request is retried on another") {
  FakeWorker a, b;
  a.set_mode(FakeWorker::Mode::kHang);
  b.set_mode(FakeWorker::Mode::kHang);
  RouterUnderTest r({a.endpoint(), b.endpoint()});
  r.WaitRoutable(2);
  std::string result;
  std::thread client([&] { result = r.Post("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":3})"); });
  REQUIRE(WaitFor([&] { return a.generates() + b.generates() == 1; }));
  FakeWorker& first = a.generates() == 1 ? a : b;
  FakeWorker& second = a.generates() == 1 ? b : a;
  second.set_mode(FakeWorker::Mode::kAnswer);
  first.Crash();
  client.join();
  CHECK(StatusOf(result) == 200);
  CHECK(json::parse(BodyOf(result))["choices"][0]["text"] == "hel");
  // The header names the worker that answered, not the one that died.
  CHECK(result.find("\r\nx-kvfleet-worker: " + second.endpoint() + "\r\n") != std::string::npos);
  CHECK(json::parse(BodyOf(result))["kvfleet"]["worker"] == second.endpoint());
  CHECK(http::SerializeMetrics(*r.registry).find("kvfleet_router_retries_total 1") != std::string::npos);
}

TEST_CASE("a worker that dies after the first token ends the stream with an error event") {
  FakeWorker w;
  w.set_mode(FakeWorker::Mode::kFirstTokenThenHang);
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  Client c(r.port());
  PostCompletion(c, R"({"model":"m","prompt":"x","stream":true,"max_tokens":100})");
  c.ReadUntil("\"text\":\"h\"");
  w.Crash();
  std::string rest = c.ReadUntil("0\r\n\r\n");
  CHECK(rest.find("\"error\"") != std::string::npos);
  CHECK(rest.find("data: [DONE]") != std::string::npos);
}

TEST_CASE("no first token within the timeout: the request moves to another worker") {
  FakeWorker a, b;
  a.set_mode(FakeWorker::Mode::kHang);
  b.set_mode(FakeWorker::Mode::kHang);
  FleetOptions fo;
  // The retry's attempt has the same timeout: long enough that the answering worker cannot
  // miss it on a loaded machine.
  fo.first_token_timeout = kNsPerSec;
  RouterUnderTest r({a.endpoint(), b.endpoint()}, {}, {}, fo);
  r.WaitRoutable(2);
  std::string result;
  std::thread client([&] { result = r.Post("/v1/completions", R"({"model":"m","prompt":"x","max_tokens":2})"); });
  REQUIRE(WaitFor([&] { return a.generates() + b.generates() == 1; }));
  FakeWorker& first = a.generates() == 1 ? a : b;
  (&first == &a ? b : a).set_mode(FakeWorker::Mode::kAnswer);
  client.join();
  CHECK(StatusOf(result) == 200);
  CHECK(WaitFor([&] { return first.cancels() == 1; }));  // the slow worker was told to stop
}

TEST_CASE("requests for unknown models are counted under model=\"other\", not each under its name") {
  // Regression: every model name a client sent became a label value on the 404 and 503 paths;
  // 100 requests naming 1 MB models grew the router by 108 MB and /metrics stopped answering.
  FakeWorker w;
  ApiOptions api;
  api.unknown_model_grace = 0;
  RouterUnderTest r({w.endpoint()}, api);
  r.WaitRoutable(1);
  for (int i = 0; i < 50; ++i) {
    const auto resp = r.Post("/v1/completions", json{{"model", "made-up-" + std::to_string(i)}, {"prompt", "x"}}.dump());
    CHECK(StatusOf(resp) == 404);
  }
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"m","prompt":"x"})")) == 200);
  // A 503 for want of a worker: refused, counted by reason, still under "other".
  w.Crash();
  REQUIRE(WaitFor([&] { return r.fleet->FindModel("m")->routable.empty(); }));
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"made-up-x","prompt":"x"})")) == 503);
  CHECK(StatusOf(r.Post("/v1/completions", R"({"model":"m","prompt":"x"})")) == 503);
  const std::string metrics = r.Metrics();
  CHECK(metrics.find("made-up") == std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_requests_total{model="other",status="404",worker="none"} 50)") !=
        std::string::npos);
  CHECK(metrics.find(R"(kvfleet_router_requests_refused_total{model="other",reason="no_worker"} 1)") !=
        std::string::npos);
  // A model the fleet knows keeps its label.
  CHECK(metrics.find(R"(kvfleet_router_requests_refused_total{model="m",reason="no_worker"} 1)") !=
        std::string::npos);
}

}  // namespace kvfleet::router
