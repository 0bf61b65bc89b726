// The router's HTTP API end to end against fake workers: the answers' shapes and usage,
// streaming, timings, X-Request-Id, stops, n choices, echo and logprobs, and the sampling fields. Errors
// are in api_errors_test.cc, registration, models and keys in api_fleet_test.cc.
#include "router/http/api.h"

#include <algorithm>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

using http::testing::BodyOf;
using http::testing::StatusOf;
using nlohmann::json;
using testing::Events;
using testing::FakeWorker;
using testing::RouterUnderTest;
using testing::WaitFor;

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

TEST_CASE("X-Request-Id is echoed on the answer, streamed or not, and on an error; a malformed one is a 400") {
  FakeWorker w("hello world");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  const std::string body = json{{"model", "m"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump();
  auto plain = r.Post("/v1/completions", body, "X-Request-Id: job-7/a.b:c+d=_-\r\n");
  REQUIRE(StatusOf(plain) == 200);
  CHECK(plain.find("\r\nx-request-id: job-7/a.b:c+d=_-\r\n") != std::string::npos);
  const std::string chat =
      json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"stream", true}}
          .dump();
  auto streamed = r.Post("/v1/chat/completions", chat, "x-request-id: s1\r\n");
  REQUIRE(StatusOf(streamed) == 200);
  CHECK(streamed.find("\r\nx-request-id: s1\r\n") != std::string::npos);
  // Without one, none comes back.
  CHECK(r.Post("/v1/completions", body).find("x-request-id") == std::string::npos);
  // A request the router refuses names it too.
  auto refused = r.Post("/v1/completions", json{{"model", "m"}}.dump(), "X-Request-Id: e1\r\n");
  CHECK(StatusOf(refused) == 400);
  CHECK(refused.find("\r\nx-request-id: e1\r\n") != std::string::npos);
  // An id that could split a log line or a header, or a long one, is refused before routing,
  // and not echoed.
  const int sent = w.generates();
  for (const std::string& bad : {std::string("a b"), std::string("a\"b"), std::string(129, 'x'), std::string("ü")}) {
    CAPTURE(bad);
    auto answer = r.Post("/v1/completions", body, "X-Request-Id: " + bad + "\r\n");
    CHECK(StatusOf(answer) == 400);
    auto j = json::parse(BodyOf(answer));
    CHECK(j["error"]["code"] == "invalid_request_id");
    CHECK(j["error"]["message"].get<std::string>().find("X-Request-Id must be 1 to 128 characters") == 0);
    CHECK(answer.find("x-request-id:") == std::string::npos);
  }
  CHECK(StatusOf(r.Post("/v1/completions", body, "X-Request-Id: " + std::string(128, 'x') + "\r\n")) == 200);
  CHECK(w.generates() == sent + 1);
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

TEST_CASE("echo with logprobs of a one-token prompt: the prompt's entry, then the generated token at its offset") {
  // Regression: one logprobs entry came back instead of two, the generated token at offset 0
  // (the worker sends no prompt logprobs for a one-token prompt, and the prompt's was dropped).
  FakeWorker w("hello");
  RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  auto j = json::parse(BodyOf(r.Post("/v1/completions", json{{"model", "m"}, {"prompt", "a"}, {"max_tokens", 1},
                                                              {"echo", true}, {"logprobs", 0}}.dump())));
  const json& lp = j["choices"][0]["logprobs"];
  CHECK(j["choices"][0]["text"] == "ah");
  CHECK(lp["tokens"] == json({"a", "h"}));
  CHECK(lp["token_logprobs"] == json({nullptr, -1.0}));
  CHECK(lp["text_offset"] == json({0, 1}));
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
