// The router's HTTP API end to end against fake workers: shapes, usage, streaming,
// every error code, retries, disconnects and registration.
#include "router/http/api.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include "common/http/metrics.h"
#include "router/routing/predicted_index.h"
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
using testing::WaitFor;

namespace {

// A router over static workers of model "m" (max context 4096).
FleetOptions WithStaticWorkers(std::vector<std::string> workers, FleetOptions o) {
  o.static_workers = std::move(workers);
  o.static_model = "m";
  o.static_max_context = 4096;
  return o;
}

struct RouterUnderTest : testing::ApiRouter {
  explicit RouterUnderTest(std::vector<std::string> workers, ApiOptions api_options = {},
                           RoutingOptions routing = {}, FleetOptions fleet_options = {},
                           ModelCodecs codecs = ModelCodecs(MakeByteCodec()))
      : ApiRouter(WithStaticWorkers(std::move(workers), std::move(fleet_options)), std::move(api_options), routing,
                  std::move(codecs)) {}
  void WaitRoutable(size_t n) {
    REQUIRE(WaitFor([&] {
      auto m = fleet->FindModel("m");
      return m && m->routable.size() == n;
    }));
  }
};

// The JSON objects of an SSE body, [DONE] excluded; *done says whether it came.
std::vector<json> Events(const std::string& response, bool* done) {
  std::vector<json> out;
  *done = false;
  size_t at = 0;
  while ((at = response.find("data: ", at)) != std::string::npos) {
    size_t end = response.find("\n\n", at);
    std::string data = response.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(data));
  }
  return out;
}

}  // namespace

TEST_CASE("a completion returns OpenAI's shape with the worker's usage and cached tokens") {
  FakeWorker w("hello world");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  std::string prompt(100, 'p');
  std::string body = json{{"model", "m"}, {"prompt", prompt}, {"max_tokens", 5}}.dump();
  auto first = r.Post("/v1/completions", body);
  REQUIRE(StatusOf(first) == 200);
  CHECK(first.find("\r\nx-kvfleet-worker: " + w.endpoint() + "\r\n") != std::string::npos);
  auto j = json::parse(BodyOf(first));
  CHECK(j["object"] == "text_completion");
  CHECK(j["choices"][0]["text"] == "hello");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == 100);
  CHECK(j["usage"]["completion_tokens"] == 5);
  CHECK(j["usage"]["total_tokens"] == 105);
  CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  // The same prompt again: the fake worker reports its 96 block-aligned tokens cached.
  auto second = json::parse(BodyOf(r.Post("/v1/completions", body)));
  CHECK(second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96);
  CHECK(w.last_params().sampling.max_tokens == 5);
}

TEST_CASE("chat streaming sends role, deltas, finish, usage and [DONE]") {
  FakeWorker w("hi there");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  std::string body = json{{"model", "m"},
                          {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}}
                         .dump();
  auto resp = r.Post("/v1/chat/completions", body);
  REQUIRE(StatusOf(resp) == 200);
  CHECK(resp.find("Content-Type: text/event-stream") != std::string::npos);
  CHECK(resp.find("\r\nx-kvfleet-worker: " + w.endpoint() + "\r\n") != std::string::npos);
  bool done = false;
  auto events = Events(resp, &done);
  CHECK(done);
  REQUIRE(events.size() >= 3);
  CHECK(events[0]["object"] == "chat.completion.chunk");
  CHECK(events[0]["choices"][0]["delta"]["role"] == "assistant");
  std::string text;
  std::string finish;
  for (const auto& e : events) {
    if (e["choices"].empty()) continue;
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  CHECK(text == "hi there");
  CHECK(finish == "stop");
  const json& usage = events.back();
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["completion_tokens"] == 8);
}

TEST_CASE("--report-timings: the usage carries the router's own timestamps, in the order of its hops") {
  FakeWorker w("hi there");
  std::string body = json{{"model", "m"},
                          {"prompt", std::string(64, 'p')},
                          {"max_tokens", 4},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}}
                         .dump();
  auto usage_of = [&](RouterUnderTest& r) {
    auto resp = r.Post("/v1/completions", body);
    REQUIRE(StatusOf(resp) == 200);
    bool done = false;
    auto events = Events(resp, &done);
    REQUIRE(done);
    REQUIRE(!events.empty());
    return events.back();
  };
  SUBCASE("on") {
    ApiOptions api;
    api.report_timings = true;
    RouterUnderTest r({w.endpoint()}, api);
    r.WaitRoutable(1);
    const TimeNs before = SystemClock::Default()->Now();
    json usage = usage_of(r);
    const TimeNs after = SystemClock::Default()->Now();
    REQUIRE(usage["kvfleet"].contains("router_timings_ns"));
    const json& t = usage["kvfleet"]["router_timings_ns"];
    TimeNs last = before;
    for (const char* hop : {"read", "routed", "sent", "first_delta", "first_chunk"}) {
      INFO(hop);
      REQUIRE(t[hop].is_number_integer());
      CHECK(t[hop].get<TimeNs>() >= last);
      last = t[hop].get<TimeNs>();
    }
    CHECK(last <= after);
  }
  SUBCASE("off (the default)") {
    RouterUnderTest r({w.endpoint()});
    r.WaitRoutable(1);
    json usage = usage_of(r);
    CHECK(usage["kvfleet"].contains("worker_ttft_ms"));
    CHECK_FALSE(usage["kvfleet"].contains("router_timings_ns"));
  }
}

TEST_CASE("a stop string spanning tokens ends the answer and cancels the worker") {
  FakeWorker w("one END two three");
  w.set_hang_after(8);  // still generating when the stop string appears
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto resp = r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 50},
                                             {"stop", "END"}}.dump());
  auto j = json::parse(BodyOf(resp));
  CHECK(j["choices"][0]["text"] == "one ");
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(WaitFor([&] { return w.cancels() == 1; }));
}

TEST_CASE("n=3: the worker gets n; choices come with index 0..2, each its own text and finish; usage sums them") {
  FakeWorker w("hi there");  // sequence i answers all but its last i bytes
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  const std::vector<std::string> texts = {"hi there", "hi ther", "hi the"};
  const std::vector<std::string> finishes = {"stop", "length", "length"};
  SUBCASE("completions, not streamed") {
    auto resp = r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "xyz"}, {"n", 3}}.dump());
    REQUIRE(StatusOf(resp) == 200);
    auto j = json::parse(BodyOf(resp));
    REQUIRE(j["choices"].size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(j["choices"][i]["index"] == i);
      CHECK(j["choices"][i]["text"] == texts[i]);
      CHECK(j["choices"][i]["finish_reason"] == finishes[i]);
    }
    CHECK(j["usage"]["prompt_tokens"] == 3);
    CHECK(j["usage"]["completion_tokens"] == 8 + 7 + 6);
    CHECK(w.last_params().sampling.n == 3);
  }
  SUBCASE("chat, streamed") {
    auto resp = r.Post("/v1/chat/completions", json{{"model", "m"},
                                                    {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                                                    {"n", 3},
                                                    {"stream", true},
                                                    {"stream_options", {{"include_usage", true}}}}
                                                   .dump());
    REQUIRE(StatusOf(resp) == 200);
    bool done = false;
    auto events = Events(resp, &done);
    CHECK(done);
    std::vector<std::string> text(3), finish(3);
    std::vector<int> roles(3), finish_chunks(3);
    for (const auto& e : events) {
      if (e["choices"].empty()) continue;
      REQUIRE(e["choices"].size() == 1);
      const json& c = e["choices"][0];
      const int i = c["index"].get<int>();
      REQUIRE((i >= 0 && i < 3));
      CHECK(finish[i].empty());  // nothing after a choice's finish
      if (c["delta"].contains("role")) ++roles[i];
      if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) {
        finish[i] = c["finish_reason"];
        ++finish_chunks[i];
      }
    }
    for (int i = 0; i < 3; ++i) {
      CHECK(text[i] == texts[i]);
      CHECK(finish[i] == finishes[i]);
      CHECK(roles[i] == 1);
      CHECK(finish_chunks[i] == 1);
    }
    const json& usage = events.back();
    CHECK(usage["choices"].empty());
    CHECK(usage["usage"]["completion_tokens"] == 8 + 7 + 6);
  }
}

TEST_CASE("n=2 with a stop string: each choice stops on its own; once both have, the worker is cancelled") {
  FakeWorker w("one END two three");
  w.set_hang_after(8);  // still generating when the stop string appears
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto resp = r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 50}, {"n", 2},
                                             {"stop", "END"}}.dump());
  REQUIRE(StatusOf(resp) == 200);
  auto j = json::parse(BodyOf(resp));
  REQUIRE(j["choices"].size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(j["choices"][i]["text"] == "one ");
    CHECK(j["choices"][i]["finish_reason"] == "stop");
  }
  CHECK(WaitFor([&] { return w.cancels() == 1; }));
}

TEST_CASE("stop_token_ids reach the worker on completions and chat; the worker's stop is finish_reason stop") {
  FakeWorker w("hello world");  // ends with finish reason stop once its reply runs out
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto c = json::parse(BodyOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 50},
                                                               {"stop_token_ids", {128009, 7}}}.dump())));
  CHECK(w.last_params().sampling.stop_token_ids == std::vector<TokenId>{128009, 7});
  CHECK(c["choices"][0]["finish_reason"] == "stop");
  auto chat = r.Post("/v1/chat/completions", json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                  {"stop_token_ids", {128009}}}.dump());
  CHECK(StatusOf(chat) == 200);
  CHECK(w.last_params().sampling.stop_token_ids == std::vector<TokenId>{128009});
  auto bad = r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"stop_token_ids", {-1}}}.dump());
  CHECK(StatusOf(bad) == 400);
  CHECK(json::parse(BodyOf(bad))["error"]["param"] == "stop_token_ids");
}

// A codec whose chats fail as a tokenizer's do: no template, or one that did not parse.
class NoTemplateCodec final : public TextCodec {
 public:
  explicit NoTemplateCodec(Status chat_error) : bytes_(MakeByteCodec()), chat_error_(std::move(chat_error)) {}
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override { return bytes_->EncodePrompt(text); }
  Result<std::vector<TokenId>> EncodeChat(std::string_view, const ChatTemplateOptions&) const override {
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
    std::string body = R"({"model":"m","prompt":"x","stream":true,"max_tokens":100})";
    c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body);
    c.ReadUntil("\"text\":\"h\"");
  }
  CHECK(WaitFor([&] { return w.cancels() == 1; }));
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
  std::string body = R"({"model":"m","prompt":"x","stream":true,"max_tokens":100})";
  c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body);
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
  fo.first_token_timeout = 300 * kNsPerMs;
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
  Result<std::vector<TokenId>> EncodeChat(std::string_view, const ChatTemplateOptions&) const override {
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
  CHECK(StatusOf(Roundtrip(r.port(), "GET", "/metrics")) == 200);
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

TEST_CASE("echo with logprobs and max_tokens 0 scores the prompt: tokens, null first logprob, text offsets") {
  FakeWorker w("hello");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto res = r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "abc"}, {"max_tokens", 0}, {"echo", true},
                                            {"logprobs", 2}}.dump());
  REQUIRE(StatusOf(res) == 200);
  const GenerateParams sent = w.last_params();
  CHECK(sent.sampling.max_tokens == 1);  // one sampled token, dropped
  CHECK(sent.sampling.prompt_logprobs);
  CHECK(sent.sampling.logprobs == 2);
  auto j = json::parse(BodyOf(res));
  const json& c = j["choices"][0];
  CHECK(c["text"] == "abc");
  CHECK(c["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 0);
  const json& lp = c["logprobs"];
  CHECK(lp["tokens"] == json({"a", "b", "c"}));
  CHECK(lp["token_logprobs"] == json({nullptr, -0.5, -0.5}));
  CHECK(lp["top_logprobs"][0].is_null());
  CHECK(lp["top_logprobs"][1] == json({{"b", -0.5}, {"z", -1.5}}));
  CHECK(lp["text_offset"] == json({0, 1, 2}));
}

TEST_CASE("echo with generated tokens: prompt then completion, offsets running through both") {
  FakeWorker w("hello");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto j = json::parse(BodyOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "ab"}, {"max_tokens", 2},
                                                              {"echo", true}, {"logprobs", 0}}.dump())));
  const json& c = j["choices"][0];
  CHECK(c["text"] == "abhe");
  CHECK(c["logprobs"]["tokens"] == json({"a", "b", "h", "e"}));
  CHECK(c["logprobs"]["token_logprobs"] == json({nullptr, -0.5, -1.0, -2.0}));
  CHECK(c["logprobs"]["top_logprobs"][2] == json({{"h", -1.0}}));  // the sampled token is always there
  CHECK(c["logprobs"]["text_offset"] == json({0, 1, 2, 3}));
  // Echo without logprobs: the text only, and no prompt logprobs asked of the worker.
  auto plain = json::parse(BodyOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "ab"}, {"max_tokens", 2},
                                                                  {"echo", true}}.dump())));
  CHECK(plain["choices"][0]["text"] == "abhe");
  CHECK(plain["choices"][0]["logprobs"].is_null());
  CHECK_FALSE(w.last_params().sampling.prompt_logprobs);
}

TEST_CASE("streamed completions carry each chunk's logprobs; chat's are content entries with bytes") {
  FakeWorker w("hey");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  bool done = false;
  auto events = Events(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 3},
                                                      {"logprobs", 1}, {"stream", true}}.dump()),
                       &done);
  CHECK(done);
  std::vector<std::string> tokens;
  std::vector<int> offsets;
  for (const json& e : events) {
    const json& lp = e["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const auto& t : lp["tokens"]) tokens.push_back(t);
    for (const auto& o : lp["text_offset"]) offsets.push_back(o);
  }
  CHECK(tokens == std::vector<std::string>{"h", "e", "y"});
  CHECK(offsets == std::vector<int>{0, 1, 2});

  auto chat = json::parse(BodyOf(r.Post("/v1/chat/completions",
                                        json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                             {"logprobs", true}, {"top_logprobs", 2}}.dump())));
  const json& content = chat["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 3);
  CHECK(content[0]["token"] == "h");
  CHECK(content[0]["logprob"] == -1.0);
  CHECK(content[0]["bytes"] == json({'h'}));
  CHECK(content[0]["top_logprobs"] == json({{{"token", "h"}, {"logprob", -1.0}, {"bytes", {'h'}}},
                                             {{"token", "z"}, {"logprob", -2.0}, {"bytes", {'z'}}}}));
  CHECK(chat["choices"][0]["logprobs"]["refusal"].is_null());
  CHECK(w.last_params().sampling.logprobs == 2);
  CHECK_FALSE(w.last_params().sampling.prompt_logprobs);
}

TEST_CASE("n=2 with echo and logprobs: every choice starts with the prompt and its logprobs, then its own tokens") {
  FakeWorker w("hey");  // sequence i answers all but its last i bytes
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto j = json::parse(BodyOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "ab"}, {"max_tokens", 3},
                                                              {"n", 2}, {"echo", true}, {"logprobs", 0}}.dump())));
  REQUIRE(j["choices"].size() == 2);
  const std::vector<std::string> texts = {"abhey", "abhe"};
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const json& c = j["choices"][i];
    CHECK(c["index"] == i);
    CHECK(c["text"] == texts[i]);
    const json& lp = c["logprobs"];
    std::vector<std::string> tokens = {"a", "b", "h", "e", "y"};
    tokens.resize(texts[i].size());
    CHECK(lp["tokens"] == json(tokens));
    CHECK(lp["token_logprobs"][0].is_null());
    CHECK(lp["token_logprobs"][1] == -0.5);
    CHECK(lp["token_logprobs"][2] == -1.0);
    CHECK(lp["text_offset"][3] == 3);
  }
}

TEST_CASE("penalties, min_p and logit_bias reach the worker as sent") {
  FakeWorker w("hello");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto res = r.Post("/v1/chat/completions",
                    json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                         {"presence_penalty", 0.5}, {"frequency_penalty", -1.0}, {"repetition_penalty", 1.2},
                         {"min_p", 0.1}, {"logit_bias", {{"42", -100}, {"7", 2.5}}}}.dump());
  CHECK(StatusOf(res) == 200);
  const SamplingParams s = w.last_params().sampling;
  CHECK(s.presence_penalty == 0.5f);
  CHECK(s.frequency_penalty == -1.0f);
  CHECK(s.repetition_penalty == 1.2f);
  CHECK(s.min_p == 0.1f);
  auto bias = s.logit_bias;
  std::sort(bias.begin(), bias.end());
  CHECK(bias == std::vector<std::pair<TokenId, float>>{{7, 2.5f}, {42, -100.0f}});
  CHECK(s.logprobs == -1);
}

}  // namespace kvfleet::router
