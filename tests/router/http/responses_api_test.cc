// The Responses API mapped onto a chat completion and back (responses_api.h).
#include "router/http/responses_api.h"

#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {

namespace {
using nlohmann::json;

ApiError Refused(std::string_view body) {
  auto r = ParseResponsesRequest(body, RequestLimits{});
  REQUIRE_FALSE(r.ok());
  return ErrorFromStatus(r.status());
}

class Recorder final : public AnswerWriter {
 public:
  void Reply(http::Response r) override { reply = std::move(r); }
  void StartStream(int, std::string_view, http::Headers) override { started = true; }
  void Write(std::string_view d) override { data += d; }
  void Finish() override { finished = true; }
  http::Response reply;
  std::string data;
  bool started = false, finished = false;
};

// The events' types in order, and their payloads.
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    size_t end = sse.find("\n\n", at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}
}  // namespace

TEST_CASE("a Responses request becomes a chat: instructions, input items, flat tools, text.format") {
  auto r = ParseResponsesRequest(R"({"model":"m","instructions":"be brief","max_output_tokens":32,"temperature":0.5,
    "input":[{"role":"user","content":[{"type":"input_text","text":"weather?"}]},
             {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
             {"type":"function_call_output","call_id":"call_1","output":"20C"},
             {"type":"reasoning","id":"rs_1","summary":[]}],
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"store":false})",
                                 RequestLimits{});
  REQUIRE_MESSAGE(r.ok(), r.status().message());
  const auto& m = r->chat.messages;
  REQUIRE(m.size() == 4);
  CHECK(m[0]["role"] == "system");
  CHECK(m[0]["content"] == "be brief");
  CHECK(m[1]["content"] == "weather?");
  CHECK(m[2]["role"] == "assistant");
  CHECK(m[2]["tool_calls"][0]["function"]["arguments"]["city"] == "Paris");  // a mapping for the template
  CHECK(m[3]["role"] == "tool");
  CHECK(m[3]["tool_call_id"] == "call_1");
  CHECK(*r->chat.max_tokens == 32);
  CHECK(r->chat.sampling.temperature == 0.5f);
  REQUIRE(r->chat.tools.tools);
  CHECK((*r->chat.tools.tools)[0]["function"]["name"] == "get_weather");
  CHECK(r->echo["store"] == false);
  CHECK_FALSE(r->stream);
  // A plain string input, store absent: served.
  auto plain = ParseResponsesRequest(R"({"model":"m","input":"hi","stream":true})", RequestLimits{});
  REQUIRE(plain.ok());
  CHECK(plain->stream);
  CHECK(plain->chat.include_usage);
}

TEST_CASE("Responses fields kvfleet cannot serve are 400s naming them") {
  CHECK(Refused(R"({"model":"m","input":"hi","store":true})").param == "store");
  ApiError prev = Refused(R"({"model":"m","input":"hi","previous_response_id":"resp_1"})");
  CHECK(prev.param == "previous_response_id");
  CHECK(prev.message.find("stateless") != std::string::npos);
  CHECK(Refused(R"({"model":"m","input":"hi","prompt":{"id":"p"}})").param == "prompt");
  CHECK(Refused(R"({"model":"m","input":"hi","reasoning":{"effort":"high"}})").param == "reasoning");
  CHECK(Refused(R"({"model":"m"})").param == "input");
  CHECK(Refused(R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})").param ==
        "input");
  CHECK(Refused(R"({"model":"m","input":[{"type":"web_search_call"}]})").param == "input");
  CHECK(Refused(R"({"model":"m","input":"hi","max_output_tokens":0})").param == "max_output_tokens");
  CHECK(Refused(R"({"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":3}]})").param ==
        "tools[0].parameters");
  ApiError format = Refused(
      R"({"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":{"not":{}}}}})");
  CHECK(format.param == "text.format");  // parsed, then refused by the grammar engine
  CHECK(format.message.find("not") != std::string::npos);
  CHECK(ParseResponsesRequest(R"({"model":"m","input":"hi","truncation":"disabled","include":[],"reasoning":null})",
                              RequestLimits{})
            .ok());
}

TEST_CASE("a whole chat answer becomes a response with reasoning, message and function_call items") {
  auto r = ParseResponsesRequest(R"({"model":"m","input":"hi"})", RequestLimits{});
  REQUIRE(r.ok());
  auto rec = std::make_shared<Recorder>();
  auto writer = NewResponsesWriter(rec, "resp_1", 7, *r);
  http::Response chat;
  chat.body = json{{"choices", {{{"index", 0}, {"finish_reason", "tool_calls"},
                                  {"message", {{"role", "assistant"}, {"content", "Checking."}, {"reasoning_content", "think"},
                                               {"tool_calls", {{{"id", "call_9"}, {"type", "function"},
                                                                {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}}}},
                   {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 3}, {"prompt_tokens_details", {{"cached_tokens", 4}}}}}}
                  .dump();
  writer->Reply(chat);
  json resp = json::parse(rec->reply.body);
  CHECK(resp["id"] == "resp_1");
  CHECK(resp["object"] == "response");
  CHECK(resp["status"] == "completed");
  CHECK(resp["store"] == false);
  REQUIRE(resp["output"].size() == 3);
  CHECK(resp["output"][0]["type"] == "reasoning");
  CHECK(resp["output"][1]["content"][0]["text"] == "Checking.");
  CHECK(resp["output"][2]["type"] == "function_call");
  CHECK(resp["output"][2]["call_id"] == "call_9");
  CHECK(resp["usage"]["input_tokens"] == 5);
  CHECK(resp["usage"]["input_tokens_details"]["cached_tokens"] == 4);
  CHECK(resp["usage"]["total_tokens"] == 8);
}

TEST_CASE("a streamed chat answer becomes OpenAI's Responses event sequence") {
  auto r = ParseResponsesRequest(R"({"model":"m","input":"hi","stream":true})", RequestLimits{});
  REQUIRE(r.ok());
  auto rec = std::make_shared<Recorder>();
  auto writer = NewResponsesWriter(rec, "resp_2", 7, *r);
  writer->StartStream(200, "text/event-stream", {});
  auto chunk = [](json delta, json finish = nullptr) {
    return "data: " + json{{"choices", {{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish}}}}}.dump() +
           "\n\n";
  };
  writer->Write(chunk({{"role", "assistant"}, {"content", ""}}));
  writer->Write(chunk({{"content", "Hel"}}));
  writer->Write(chunk({{"content", "lo"}}));
  writer->Write(chunk({{"tool_calls", {{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                        {"function", {{"name", "f"}, {"arguments", ""}}}}}}}));
  writer->Write(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "{\"a\":"}}}}}}}));
  writer->Write(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "1}"}}}}}}}));
  writer->Write(chunk(json::object(), "tool_calls"));
  writer->Write("data: " + json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 2}, {"completion_tokens", 6}}}}.dump() +
                "\n\ndata: [DONE]\n\n");
  writer->Finish();
  std::vector<json> events = Events(rec->data);
  std::vector<std::string> types;
  for (const json& e : events) types.push_back(e["type"]);
  const std::vector<std::string> want = {
      "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done", "response.output_item.added",
      "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  CHECK(types == want);
  for (size_t i = 0; i < events.size(); ++i) CHECK(events[i]["sequence_number"] == i);
  const json& done = events.back()["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["output"][0]["content"][0]["text"] == "Hello");
  CHECK(done["output"][1]["arguments"] == "{\"a\":1}");
  CHECK(done["usage"]["output_tokens"] == 6);
  CHECK(rec->finished);
}

}  // namespace kvfleet::router
