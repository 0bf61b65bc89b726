// Forced tool calls (forced_calls.h): tool_choice named and "required" streamed as the model
// writes them, split at every point and a byte at a time, each joining to the whole answer's
// calls byte for byte; then end to end through the router, against a fake worker that writes
// the grammar's JSON a byte per delta.
#include "router/http/forced_calls.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "schema/registration.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

namespace {

using http::testing::BodyOf;
using http::testing::StatusOf;
using nlohmann::json;

std::function<std::string()> Counter() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

struct Streamed {
  std::string content;
  std::vector<ParsedToolCall> calls;
  size_t fragments = 0;  // argument deltas
};

// The stream's deltas joined into whole calls, checking OpenAI's streaming shape on the way.
Streamed Joined(ToolChoice choice, const std::vector<std::string>& pieces, uint32_t max_calls = UINT32_MAX) {
  ForcedCallStream stream(choice, "get_weather", max_calls, Counter());
  Streamed out;
  auto take = [&](ToolStreamOut o) {
    out.content += o.content;
    for (ToolCallDelta& d : o.calls) {
      if (d.first) {
        CHECK(d.index == out.calls.size());
        CHECK(d.arguments.empty());
        out.calls.push_back(ParsedToolCall{d.id, d.name, ""});
      } else {
        REQUIRE(!out.calls.empty());
        CHECK(d.index == out.calls.size() - 1);
        CHECK(!d.arguments.empty());
        out.calls.back().arguments += d.arguments;
        ++out.fragments;
      }
    }
  };
  for (const std::string& p : pieces) take(stream.Push(p));
  take(stream.Finish());
  CHECK(stream.calls() == out.calls.size());
  return out;
}

// Whole, at every split into two pieces and a byte at a time: the same calls, whose
// arguments are the bytes the model wrote for them.
void CheckEverySplit(ToolChoice choice, const std::string& text, const std::vector<ParsedToolCall>& want,
                     uint32_t max_calls = UINT32_MAX) {
  CAPTURE(text);
  auto same = [&](const std::vector<ParsedToolCall>& got) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].id == "call_" + std::to_string(i));
      CHECK(got[i].name == want[i].name);
      CHECK(got[i].arguments == want[i].arguments);
    }
  };
  same(ParseForcedCalls(choice, "get_weather", max_calls, text, Counter()));
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    Streamed s = Joined(choice, {text.substr(0, cut), text.substr(cut)}, max_calls);
    CHECK(s.content.empty());
    same(s.calls);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Streamed s = Joined(choice, bytes, max_calls);
  same(s.calls);
  if (!want.empty() && want[0].arguments.size() > 2) CHECK(s.fragments > want.size());  // not one piece per call
}

ParsedToolCall Call(std::string name, std::string args) { return ParsedToolCall{"", std::move(name), std::move(args)}; }

}  // namespace

TEST_CASE("named: the whole text is the arguments, streamed from the '{' on, byte for byte as written") {
  // Escapes, a number's spelling and spaces stay as the model wrote them (no re-serialising).
  const std::string args = R"({"city": "Pa\u0072is \"}\"", "days": [1.50, 2e1], "x": {}})";
  CheckEverySplit(ToolChoice::kNamed, args, {Call("get_weather", args)});
  CheckEverySplit(ToolChoice::kNamed, " \n" + args + "\n ", {Call("get_weather", args)});
  // The header goes out with the '{', before the arguments end.
  ForcedCallStream stream(ToolChoice::kNamed, "get_weather", UINT32_MAX, Counter());
  CHECK(stream.Push(" ").empty());
  ToolStreamOut a = stream.Push("{\"ci");
  REQUIRE(a.calls.size() == 2);
  CHECK((a.calls[0].first && a.calls[0].id == "call_0" && a.calls[0].name == "get_weather"));
  CHECK(a.calls[1].arguments == "{\"ci");
  ToolStreamOut b = stream.Push("ty\": \"Paris\"}");
  REQUIRE(b.calls.size() == 1);
  CHECK(b.calls[0].arguments == "ty\": \"Paris\"}");
  CHECK(stream.Finish().empty());
}

TEST_CASE("required: each item's name opens its call, then its parameters stream as written") {
  CheckEverySplit(ToolChoice::kRequired,
                  R"([{"name":"get_weather","parameters":{"city":"Paris","n":[1,{"a":"]"}]}},)"
                  R"({"name":"now","parameters":{}}])",
                  {Call("get_weather", R"({"city":"Paris","n":[1,{"a":"]"}]})"), Call("now", "{}")});
  // parallel_tool_calls false: one call (the grammar's maxItems 1 makes it so; the parser agrees).
  CheckEverySplit(ToolChoice::kRequired,
                  R"([{"name":"a","parameters":{"x":1}},{"name":"b","parameters":{"y":2}}])",
                  {Call("a", R"({"x":1})")}, 1);
  // The header goes out once the name is read, before the parameters.
  ForcedCallStream stream(ToolChoice::kRequired, "", UINT32_MAX, Counter());
  ToolStreamOut a = stream.Push(R"([{"name":"get_weather","parameters":{"ci)");
  REQUIRE(a.calls.size() == 2);
  CHECK((a.calls[0].first && a.calls[0].name == "get_weather"));
  CHECK(a.calls[1].arguments == R"({"ci)");
}

TEST_CASE("a forced answer that is not the grammar's JSON is content whole; streamed, what went out stands") {
  for (ToolChoice choice : {ToolChoice::kNamed, ToolChoice::kRequired}) {
    CAPTURE(static_cast<int>(choice));
    // Cut at max_tokens.
    const std::string cut = choice == ToolChoice::kNamed ? R"({"city": "Pa)" : R"([{"name":"get_weather","param)";
    CHECK(ParseForcedCalls(choice, "get_weather", UINT32_MAX, cut).empty());
    Streamed s = Joined(choice, {cut});
    CHECK(s.calls.size() == 1);
    CHECK(s.content.empty());
    // Not JSON at all.
    CHECK(ParseForcedCalls(choice, "get_weather", UINT32_MAX, "hello").empty());
    Streamed t = Joined(choice, {"hel", "lo"});
    CHECK(t.calls.empty());
    CHECK(t.content == "hello");
  }
  // Valid JSON of the wrong shape: no call.
  CHECK(ParseForcedCalls(ToolChoice::kNamed, "f", UINT32_MAX, "[1]").empty());
  CHECK(ParseForcedCalls(ToolChoice::kRequired, "f", UINT32_MAX, R"([{"parameters":{}}])").empty());
  CHECK(ParseForcedCalls(ToolChoice::kRequired, "f", UINT32_MAX, R"({"name":"f","parameters":{}})").empty());
}

namespace {

// A router whose one worker (model "llama") offers constrained decoding and answers `reply`
// a byte per delta.
struct ForcedRouter {
  explicit ForcedRouter(std::string reply) : worker(std::move(reply)), router({}) {
    WorkerHello hello = worker.HelloOf("w1");
    hello.structured_outputs = true;
    testing::FakeWorker::Register(router.fleet->registration_endpoint(), EncodeHello(hello));
    REQUIRE(testing::WaitFor([&] {
      auto m = router.fleet->FindModel("llama");
      return m && m->routable.size() == 1;
    }));
  }
  // The chat's answer: whole, or its stream's events.
  json Whole(const std::string& tool_choice) {
    const std::string resp = router.Post("/v1/chat/completions", Body(tool_choice, false));
    REQUIRE(StatusOf(resp) == 200);
    return json::parse(BodyOf(resp));
  }
  std::vector<json> Stream(const std::string& tool_choice) {
    const std::string resp = router.Post("/v1/chat/completions", Body(tool_choice, true));
    REQUIRE(StatusOf(resp) == 200);
    bool done = false;
    std::vector<json> events = testing::Events(resp, &done);
    CHECK(done);
    return events;
  }
  static std::string Body(const std::string& tool_choice, bool stream) {
    return R"({"model":"llama","messages":[{"role":"user","content":"Weather?"}],"stream":)" +
           std::string(stream ? "true" : "false") +
           R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
           R"("properties":{"city":{"type":"string"}},"required":["city"]}}}],"tool_choice":)" +
           tool_choice + "}";
  }

  testing::FakeWorker worker;
  testing::RouterUnderTest router;
};

// The streamed calls as OpenAI's SDKs assemble them; `fragments` counts argument deltas.
std::vector<ParsedToolCall> Assemble(const std::vector<json>& events, size_t* fragments, std::string* finish) {
  std::vector<ParsedToolCall> calls;
  for (const json& e : events) {
    if (e["choices"].empty()) continue;
    const json& choice = e["choices"][0];
    if (!choice["finish_reason"].is_null()) *finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const json& d : choice["delta"]["tool_calls"]) {
      const size_t index = d["index"];
      if (d.contains("id")) {
        REQUIRE(index == calls.size());
        CHECK(d["type"] == "function");
        CHECK(d["function"]["arguments"] == "");  // the header carries the name only
        calls.push_back(ParsedToolCall{d["id"], d["function"]["name"], ""});
        continue;
      }
      REQUIRE(index + 1 == calls.size());
      calls.back().arguments += d["function"]["arguments"].get<std::string>();
      ++*fragments;
    }
  }
  return calls;
}

}  // namespace

TEST_CASE("a forced call streams through the router: its header first, then its arguments as they are decoded") {
  const std::string args = R"({"city": "Paris \"centre\""})";
  for (const auto& [choice, reply] :
       {std::pair<std::string, std::string>{R"({"type":"function","function":{"name":"get_weather"}})", args},
        {R"("required")", R"([{"name":"get_weather","parameters":)" + args + "}]"}}) {
    CAPTURE(choice);
    ForcedRouter f(reply);
    const json whole = f.Whole(choice);
    CHECK(whole["choices"][0]["finish_reason"] == "tool_calls");
    const json& message = whole["choices"][0]["message"];
    CHECK(message["content"].is_null());
    REQUIRE(message["tool_calls"].size() == 1);
    CHECK(message["tool_calls"][0]["function"]["name"] == "get_weather");
    CHECK(message["tool_calls"][0]["function"]["arguments"] == args);

    size_t fragments = 0;
    std::string finish;
    const std::vector<ParsedToolCall> streamed = Assemble(f.Stream(choice), &fragments, &finish);
    CHECK(finish == "tool_calls");
    REQUIRE(streamed.size() == 1);
    CHECK(streamed[0].name == "get_weather");
    CHECK(streamed[0].id.rfind("call_", 0) == 0);
    CHECK(streamed[0].arguments == message["tool_calls"][0]["function"]["arguments"]);  // byte for byte
    CHECK(fragments > args.size() / 2);  // about a byte per delta, not all at the end
  }
}

}  // namespace kvfleet::router
