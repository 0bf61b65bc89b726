// CompletionStream without a fleet: a parsed request, the byte codec, deltas as a worker
// sends them, and a recorder for what reaches the client.
#include "router/http/completion_stream.h"

#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include "common/http/metrics.h"
#include "tests/router/http/api_router.h"  // Events

namespace kvfleet::router {
namespace {

using nlohmann::json;

// What a stream wrote, as the client would see it.
struct Recorder final : AnswerWriter {
  void Reply(http::Response r) override {
    ++replies;
    status = r.status;
    body = std::move(r.body);
    headers = std::move(r.headers);
  }
  void StartStream(int s, std::string_view, http::Headers h) override {
    ++replies;
    status = s;
    headers = std::move(h);
  }
  void Write(std::string_view data) override { body += data; }
  void Finish() override { finished = true; }

  int replies = 0;  // Reply or StartStream: exactly one per answer
  int status = 0;
  std::string body;
  http::Headers headers;
  bool finished = false;
};

struct StreamFixture {
  StreamFixture() : metrics(registry), codec(MakeByteCodec()), out(std::make_shared<Recorder>()) {
    context = std::make_shared<StreamContext>();
    context->metrics = &metrics;
    context->clock = &clock;
    context->worker_name = [](WorkerId w) { return "w" + std::to_string(w); };
  }

  // A stream for `body` (a /v1/completions body); echo as PrepareCompletion makes it.
  std::shared_ptr<CompletionStream> Start(const std::string& body) {
    auto req = ParseCompletionRequest(body, false);
    REQUIRE(req.ok());
    StreamSetup setup;
    setup.id = "cmpl-test";
    setup.arrived = clock.Now();
    setup.routed = clock.Now();
    setup.cancel = [this] { ++cancels; };
    if (req->echo) {
      setup.echo.on = true;
      setup.echo.text = *req->prompt_text;
      setup.echo.drop_generated = req->max_tokens == 0u;
      if (req->sampling.logprobs >= 0) setup.echo.prompt.assign(req->prompt_text->begin(), req->prompt_text->end());
    }
    setup.prompt_tokens = static_cast<uint32_t>(req->prompt_text->size());
    return std::make_shared<CompletionStream>(context, out, std::move(req).value(), codec, std::move(setup));
  }

  prometheus::Registry registry;
  ApiMetrics metrics;
  ManualClock clock;
  std::shared_ptr<const TextCodec> codec;
  std::shared_ptr<StreamContext> context;
  std::shared_ptr<Recorder> out;
  int cancels = 0;
};

TokenLogprob Lp(char token, float logprob) { return TokenLogprob{static_cast<TokenId>(token), logprob, {}}; }

WorkerDelta Delta(std::string tokens, FinishReason finish = FinishReason::kNone, uint32_t index = 0) {
  WorkerDelta d;
  d.index = index;
  d.tokens.assign(tokens.begin(), tokens.end());
  d.finish = finish;
  return d;
}

TEST_CASE("a whole answer collects each delta's text, ends with the finish reason and names its worker") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"hi","max_tokens":3})");
  s->OnDelta(7, Delta("ab"));
  CHECK(f.out->replies == 0);
  WorkerDelta last = Delta("c", FinishReason::kLength);
  last.usage.prompt_tokens = 2;
  s->OnDelta(7, last);
  REQUIRE(f.out->replies == 1);
  CHECK(f.out->status == 200);
  auto j = json::parse(f.out->body);
  CHECK(j["id"] == "cmpl-test");
  CHECK(j["choices"][0]["text"] == "abc");
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 3);
  CHECK(j["kvfleet"]["worker"] == "w7");
  CHECK(f.out->headers == http::Headers{{std::string(kWorkerHeader), "w7"}});
  s->OnDelta(7, Delta("d"));  // nothing after the end
  CHECK(f.out->replies == 1);
}

TEST_CASE("a stop string ends the choice without its text and cancels the rest on the worker") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"hi","max_tokens":9,"stop":"cd","stream":true})");
  s->OnDelta(1, Delta("abc"));
  s->OnDelta(1, Delta("de"));
  CHECK(f.cancels == 1);
  CHECK(f.out->finished);
  bool done = false;
  auto events = testing::Events(f.out->body, &done);
  CHECK(done);
  std::string text;
  std::string finish;
  for (const json& e : events) {
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  CHECK(text == "ab");
  CHECK(finish == "stop");
}

TEST_CASE("a worker's failure before the first token is an OpenAI error naming the worker; after it, an error event") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"hi"})");
  s->OnError(3, ResourceExhausted("queue full"), false);
  CHECK(f.out->status == 429);
  CHECK(json::parse(f.out->body)["error"]["code"] == "overloaded");
  CHECK(f.out->headers == http::Headers{{"Retry-After", "1"}, {std::string(kWorkerHeader), "w3"}});

  StreamFixture g;
  auto t = g.Start(R"({"model":"m","prompt":"hi","stream":true})");
  t->OnDelta(3, Delta("a"));
  t->OnError(3, Unavailable("worker lost"), true);
  CHECK(g.out->replies == 1);
  CHECK(g.out->finished);
  CHECK(g.out->body.find(R"("code":"service_unavailable")") != std::string::npos);
  CHECK(g.out->body.ends_with(std::string(kDoneEvent)));
}

TEST_CASE("a delta for a sequence the request did not ask for is the worker's fault: 500 and a cancel") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"hi","n":2})");
  s->OnDelta(4, Delta("a", FinishReason::kNone, 2));
  CHECK(f.cancels == 1);
  CHECK(f.out->status == 500);
  CHECK(json::parse(f.out->body)["error"]["message"] == "worker w4 sent sequence 2 of a request of n=2");
}

TEST_CASE("echo with logprobs of a one-token prompt keeps the prompt's entry and offsets the generated token") {
  // Regression: with a one-token prompt the worker sends no prompt logprobs (it scores tokens
  // 1..n-1), and the prompt's own entry was dropped: one entry instead of two, and the
  // generated token at text offset 0.
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"a","max_tokens":1,"echo":true,"logprobs":0})");
  WorkerDelta d = Delta("h", FinishReason::kLength);
  d.logprobs = {Lp('h', -1.0f)};
  s->OnDelta(1, d);
  auto j = json::parse(f.out->body);
  const json& lp = j["choices"][0]["logprobs"];
  CHECK(j["choices"][0]["text"] == "ah");
  CHECK(lp["tokens"] == json({"a", "h"}));
  CHECK(lp["token_logprobs"] == json({nullptr, -1.0}));
  CHECK(lp["text_offset"] == json({0, 1}));
}

TEST_CASE("echo with logprobs and max_tokens 0 of a one-token prompt scores that token alone") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"a","max_tokens":0,"echo":true,"logprobs":0})");
  WorkerDelta d = Delta("h", FinishReason::kLength);
  d.logprobs = {Lp('h', -1.0f)};
  s->OnDelta(1, d);  // the one sampled token, dropped
  auto j = json::parse(f.out->body);
  CHECK(j["choices"][0]["text"] == "a");
  CHECK(j["choices"][0]["logprobs"]["tokens"] == json({"a"}));
  CHECK(j["choices"][0]["logprobs"]["token_logprobs"] == json({nullptr}));
  CHECK(j["usage"]["completion_tokens"] == 0);
}

TEST_CASE("echo with logprobs of a longer prompt takes the worker's prompt entries once, for every choice") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"ab","max_tokens":1,"echo":true,"logprobs":0,"n":2})");
  WorkerDelta first = Delta("x", FinishReason::kLength, 0);
  first.logprobs = {Lp('x', -1.0f)};
  first.prompt_logprobs = {Lp('b', -0.5f)};
  WorkerDelta second = Delta("y", FinishReason::kLength, 1);
  second.logprobs = {Lp('y', -2.0f)};
  second.prompt_logprobs = {Lp('z', -9.0f)};  // only the first Delta's count
  s->OnDelta(1, first);
  s->OnDelta(1, second);
  auto j = json::parse(f.out->body);
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const json& lp = j["choices"][i]["logprobs"];
    CHECK(lp["tokens"] == json({"a", "b", i == 0 ? "x" : "y"}));
    CHECK(lp["token_logprobs"] == json({nullptr, -0.5, i == 0 ? -1.0 : -2.0}));
    CHECK(lp["text_offset"] == json({0, 1, 2}));
  }
}

TEST_CASE("the metrics count the answer: status, tokens and time to first token") {
  StreamFixture f;
  auto s = f.Start(R"({"model":"m","prompt":"hi","max_tokens":2})");
  f.clock.AdvanceMs(30);
  WorkerDelta d = Delta("ab", FinishReason::kLength);
  d.usage.prompt_tokens = 2;
  s->OnDelta(2, d);
  const std::string m = http::SerializeMetrics(f.registry);
  CHECK(m.find(R"(kvfleet_router_requests_total{model="m",status="200",worker="w2"} 1)") != std::string::npos);
  CHECK(m.find(R"(kvfleet_router_generation_tokens_total{model="m"} 2)") != std::string::npos);
  CHECK(m.find("kvfleet_router_time_to_first_token_seconds_count 1") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::router
