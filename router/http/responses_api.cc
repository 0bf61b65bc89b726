#include "router/http/responses_api.h"

#include <array>
#include <random>

#include "router/http/chat_messages.h"
#include "router/http/chat_tools.h"
#include "router/http/json_body.h"
#include "router/http/request_fields.h"

namespace kvfleet::router {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// The Responses fields and what becomes of each.
constexpr std::array<std::string_view, 14> kServed = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stream", "store", "metadata", "user"};
// Hints with no effect on the answer, or values that ask for nothing.
constexpr std::array<std::string_view, 7> kIgnorable = {"prompt_cache_key", "safety_identifier", "truncation",
                                                        "service_tier", "background", "include", "reasoning"};

// Each Responses field the chat request's error names comes from.
std::string ResponsesParam(const std::string& chat_param) {
  if (chat_param == "max_completion_tokens") return "max_output_tokens";
  if (chat_param.rfind("response_format", 0) == 0) return "text.format";
  if (chat_param == "messages") return "input";
  return chat_param;
}

// A message item's content: a string, or input_text / output_text parts joined with "\n".
Status ItemText(const ojson& content, const std::string& at, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return Status::Ok();
  }
  if (!content.is_array()) return FieldError("'" + at + ".content' must be a string or an array of text parts", "input");
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string path = at + ".content[" + std::to_string(j) + "]";
    const std::string type = part.is_object() ? part.value("type", std::string()) : std::string();
    if (type != "input_text" && type != "output_text") {
      return FieldError("'" + path + "': content part type '" + type + "' is not supported (kvfleet serves text only)", "input");
    }
    if (!part.contains("text") || !part["text"].is_string()) return FieldError("'" + path + ".text' must be a string", "input");
    if (j > 0) *out += '\n';
    *out += part["text"].get<std::string>();
  }
  return Status::Ok();
}

Status InputMessages(const ojson& body, ojson* messages) {
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) return FieldError("'instructions' must be a string", "instructions");
    messages->push_back({{"role", "system"}, {"content", *ins}});
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) return FieldError("'input' is required", "input");
  if (input->is_string()) {
    messages->push_back({{"role", "user"}, {"content", *input}});
    return Status::Ok();
  }
  if (!input->is_array()) return FieldError("'input' must be a string or an array of items", "input");
  for (size_t i = 0; i < input->size(); ++i) {
    const ojson& item = (*input)[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return FieldError("'" + at + "' must be an object", "input");
    const std::string type = item.value("type", item.contains("role") ? std::string("message") : std::string());
    if (type == "message") {
      const std::string role = item.value("role", std::string());
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return FieldError("'" + at + ".role' must be user, system, developer or assistant", "input");
      }
      std::string text;
      KVF_RETURN_IF_ERROR(ItemText(item.contains("content") ? item["content"] : ojson(), at, &text));
      messages->push_back({{"role", role}, {"content", std::move(text)}});
    } else if (type == "function_call") {
      for (const char* f : {"call_id", "name", "arguments"}) {
        if (!item.contains(f) || !item[f].is_string()) return FieldError("'" + at + "." + f + "' must be a string", "input");
      }
      // Calls of one turn join one assistant message, as the chat shape carries them.
      if (messages->empty() || messages->back()["role"] != "assistant" || !messages->back().contains("tool_calls")) {
        messages->push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array()}});
      }
      messages->back()["tool_calls"].push_back(
          {{"id", item["call_id"]}, {"type", "function"}, {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string()) return FieldError("'" + at + ".call_id' must be a string", "input");
      std::string output;
      KVF_RETURN_IF_ERROR(ItemText(item.contains("output") ? item["output"] : ojson(), at, &output));
      messages->push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", std::move(output)}});
    } else if (type == "reasoning") {
      continue;  // not rendered: templates drop earlier turns' reasoning
    } else {
      return FieldError("'" + at + "': item type '" + type + "' is not supported (message, function_call, "
                 "function_call_output, reasoning)", "input");
    }
  }
  if (messages->empty()) return FieldError("'input' holds no message", "input");
  return Status::Ok();
}

// The Responses fields into a chat completion body.
Status ChatBody(const ojson& body, ojson* chat) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(kServed.begin(), kServed.end(), k) != kServed.end()) continue;
    const ojson& v = it.value();
    const bool nothing = v.is_null() || (k == "truncation" && v == "disabled") || (k == "background" && v == false) ||
                         (k == "service_tier" && (v == "auto" || v == "default")) ||
                         ((k == "include" || k == "reasoning") && v.empty()) || k == "prompt_cache_key" ||
                         k == "safety_identifier";
    if (std::find(kIgnorable.begin(), kIgnorable.end(), k) != kIgnorable.end() && nothing) continue;
    if (k == "previous_response_id" || k == "conversation") {
      return FieldError("'" + k + "' is not supported: kvfleet keeps no responses (stateless); send the whole "
                 "conversation as input items",
                 k);
    }
    return FieldError("'" + k + "' is not supported by kvfleet's /v1/responses", k);
  }
  if (auto store = body.find("store"); store != body.end() && !store->is_null()) {
    if (!store->is_boolean()) return FieldError("'store' must be a boolean", "store");
    if (store->get<bool>()) {
      return FieldError("'store': true is not supported: kvfleet keeps no responses (stateless); send store: false or "
                 "leave it out",
                 "store");
    }
  }
  ojson messages = ojson::array();
  KVF_RETURN_IF_ERROR(InputMessages(body, &messages));
  (*chat)["model"] = body.contains("model") ? body["model"] : ojson();
  (*chat)["messages"] = std::move(messages);
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    KVF_ASSIGN_OR_RETURN(ojson chat_tools, ValidateTools(*tools, "tools", /*flat=*/true));
    (*chat)["tools"] = std::move(chat_tools);
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    if (choice->is_object() && choice->value("type", "") == "function") {
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice->value("name", "")}}}};
    } else {
      (*chat)["tool_choice"] = *choice;
    }
  }
  for (const auto& [from, to] : std::array<std::pair<const char*, const char*>, 5>{
           {{"parallel_tool_calls", "parallel_tool_calls"}, {"max_output_tokens", "max_completion_tokens"},
            {"temperature", "temperature"}, {"top_p", "top_p"}, {"user", "user"}}}) {
    if (auto v = body.find(from); v != body.end() && !v->is_null()) (*chat)[to] = *v;
  }
  if (auto text = body.find("text"); text != body.end() && !text->is_null()) {
    if (!text->is_object()) return FieldError("'text' must be an object", "text");
    for (auto it = text->begin(); it != text->end(); ++it) {
      if (it.key() != "format" && !(it.key() == "verbosity" && (it.value().is_null() || it.value() == "medium"))) {
        return FieldError("'text." + it.key() + "' is not supported", "text." + it.key());
      }
    }
    if (auto format = text->find("format"); format != text->end() && !format->is_null()) {
      if (!format->is_object()) return FieldError("'text.format' must be an object", "text.format");
      if (format->value("type", "") == "json_schema") {
        ojson js = ojson::object();
        for (const char* f : {"name", "schema", "strict", "description"}) {
          if (format->contains(f)) js[f] = (*format)[f];
        }
        (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else {
        (*chat)["response_format"] = *format;
      }
    }
  }
  if (auto m = body.find("metadata"); m != body.end() && !m->is_null() && !m->is_object()) {
    return FieldError("'metadata' must be an object", "metadata");
  }
  return Status::Ok();
}

std::string NewItemId(std::string_view prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(prefix) + buf;
}

ojson Usage(const json& u) {
  const uint64_t in = u.value("prompt_tokens", 0), out = u.value("completion_tokens", 0);
  uint64_t cached = 0;
  if (auto d = u.find("prompt_tokens_details"); d != u.end() && d->is_object()) cached = d->value("cached_tokens", 0);
  return {{"input_tokens", in},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", in + out}};
}

ojson ResponseObject(std::string_view id, int64_t created, const ojson& echo, std::string_view model,
                     std::string_view status) {
  ojson r = {{"id", std::string(id)}, {"object", "response"}, {"created_at", created}, {"status", std::string(status)},
             {"error", nullptr}, {"incomplete_details", nullptr}, {"model", std::string(model)},
             {"output", ojson::array()}, {"usage", nullptr}};
  for (auto it = echo.begin(); it != echo.end(); ++it) r[it.key()] = it.value();
  return r;
}

ojson OutputText(std::string text) {
  return {{"type", "output_text"}, {"text", std::move(text)}, {"annotations", ojson::array()}};
}

ojson MessageItem(std::string id, std::string text, std::string_view status) {
  return {{"type", "message"}, {"id", std::move(id)}, {"status", std::string(status)}, {"role", "assistant"},
          {"content", ojson::array({OutputText(std::move(text))})}};
}

// A chat stream's chunks as Responses events: items open as their first delta comes
// (reasoning, message, function_call) and close when another kind starts or the choice ends.
class ResponsesWriter final : public AnswerWriter {
 public:
  ResponsesWriter(std::shared_ptr<AnswerWriter> out, std::string id, int64_t created, ResponsesRequest request)
      : out_(std::move(out)), id_(std::move(id)), created_(created), req_(std::move(request)) {}

  void Reply(http::Response response) override {
    if (response.status == 200) {
      json chat = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
      if (chat.is_object() && chat.contains("choices") && !chat["choices"].empty()) {
        response.body = ResponseFromChat(chat, id_, created_, req_.echo, req_.chat.model).dump(
            -1, ' ', false, json::error_handler_t::replace);
      }
    }
    out_->Reply(std::move(response));
  }
  void StartStream(int status, std::string_view content_type, http::Headers headers) override {
    out_->StartStream(status, content_type, std::move(headers));
    Event("response.created", {{"response", ResponseObject(id_, created_, req_.echo, req_.chat.model, "in_progress")}});
    Event("response.in_progress", {{"response", ResponseObject(id_, created_, req_.echo, req_.chat.model, "in_progress")}});
  }
  void Write(std::string_view data) override {
    // CompletionStream writes whole SSE events: "data: {...}\n\n" or "data: [DONE]\n\n".
    while (!data.empty()) {
      size_t end = data.find("\n\n");
      std::string_view event = data.substr(0, end);
      data = end == std::string_view::npos ? std::string_view() : data.substr(end + 2);
      if (event.substr(0, 6) != "data: ") continue;
      event.remove_prefix(6);
      if (event == "[DONE]") {
        Complete();
        continue;
      }
      json chunk = json::parse(event, nullptr, /*allow_exceptions=*/false);
      if (chunk.is_object()) OnChunk(chunk);
    }
  }
  void Finish() override { out_->Finish(); }

 private:
  enum class Open : uint8_t { kNone, kReasoning, kMessage, kCall };

  void Event(const char* type, ojson fields) {
    ojson e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = fields.begin(); it != fields.end(); ++it) e[it.key()] = std::move(it.value());
    out_->Write(std::string("event: ") + type + "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
  }

  size_t index() const { return output_.size() - 1; }

  void Close() {
    if (open_ == Open::kNone) return;
    ojson& item = output_.back();
    const std::string item_id = item["id"];
    if (open_ == Open::kReasoning) {
      item["content"] = ojson::array({{{"type", "reasoning_text"}, {"text", text_}}});
      Event("response.reasoning_text.done", {{"item_id", item_id}, {"output_index", index()}, {"content_index", 0}, {"text", text_}});
    } else if (open_ == Open::kMessage) {
      item["content"] = ojson::array({OutputText(text_)});
      item["status"] = "completed";
      Event("response.output_text.done", {{"item_id", item_id}, {"output_index", index()}, {"content_index", 0}, {"text", text_}});
      Event("response.content_part.done", {{"item_id", item_id}, {"output_index", index()}, {"content_index", 0}, {"part", OutputText(text_)}});
    } else {
      item["arguments"] = text_;
      item["status"] = "completed";
      Event("response.function_call_arguments.done", {{"item_id", item_id}, {"output_index", index()}, {"arguments", text_}});
    }
    Event("response.output_item.done", {{"output_index", index()}, {"item", item}});
    open_ = Open::kNone;
    text_.clear();
  }

  void OpenItem(Open kind, ojson item) {
    Close();
    open_ = kind;
    output_.push_back(item);
    Event("response.output_item.added", {{"output_index", index()}, {"item", std::move(item)}});
    if (kind == Open::kMessage) {
      Event("response.content_part.added", {{"item_id", output_.back()["id"]}, {"output_index", index()}, {"content_index", 0}, {"part", OutputText("")}});
    }
  }

  void OnChunk(const json& chunk) {
    if (chunk.contains("error")) {
      Close();
      failed_ = true;
      ojson response = ResponseObject(id_, created_, req_.echo, req_.chat.model, "failed");
      response["error"] = {{"code", "server_error"}, {"message", chunk["error"].value("message", "")}};
      response["output"] = output_;
      Event("response.failed", {{"response", std::move(response)}});
      return;
    }
    if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) usage_ = Usage(*u);
    if (!chunk.contains("choices") || chunk["choices"].empty()) return;
    const json& choice = chunk["choices"][0];
    if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) {
      Close();
      finish_ = f->get<std::string>();
    }
    const json& delta = choice.contains("delta") ? choice["delta"] : json::object();
    if (auto r = delta.find("reasoning_content"); r != delta.end() && r->is_string() && !r->get_ref<const std::string&>().empty()) {
      if (open_ != Open::kReasoning) {
        OpenItem(Open::kReasoning, {{"type", "reasoning"}, {"id", NewItemId("rs_")}, {"summary", ojson::array()}});
      }
      text_ += r->get<std::string>();
      Event("response.reasoning_text.delta", {{"item_id", output_.back()["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", *r}});
    }
    if (auto c = delta.find("content"); c != delta.end() && c->is_string() && !c->get_ref<const std::string&>().empty()) {
      if (open_ != Open::kMessage) {
        OpenItem(Open::kMessage, {{"type", "message"}, {"id", NewItemId("msg_")}, {"status", "in_progress"},
                                  {"role", "assistant"}, {"content", ojson::array()}});
      }
      text_ += c->get<std::string>();
      Event("response.output_text.delta", {{"item_id", output_.back()["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", *c}});
    }
    if (auto calls = delta.find("tool_calls"); calls != delta.end() && calls->is_array()) {
      for (const json& call : *calls) {
        const json& fn = call.contains("function") ? call["function"] : json::object();
        if (call.contains("id")) {
          OpenItem(Open::kCall, {{"type", "function_call"}, {"id", NewItemId("fc_")}, {"call_id", call["id"]},
                                 {"name", fn.value("name", "")}, {"arguments", ""}, {"status", "in_progress"}});
        }
        const std::string args = fn.value("arguments", "");
        if (open_ == Open::kCall && !args.empty()) {
          text_ += args;
          Event("response.function_call_arguments.delta", {{"item_id", output_.back()["id"]}, {"output_index", index()}, {"delta", args}});
        }
      }
    }
  }

  void Complete() {
    Close();
    if (failed_) return;
    const bool cut = finish_ == "length";
    ojson response = ResponseObject(id_, created_, req_.echo, req_.chat.model, cut ? "incomplete" : "completed");
    if (cut) response["incomplete_details"] = {{"reason", "max_output_tokens"}};
    response["output"] = output_;
    response["usage"] = usage_;
    Event(cut ? "response.incomplete" : "response.completed", {{"response", std::move(response)}});
  }

  std::shared_ptr<AnswerWriter> out_;
  std::string id_;
  int64_t created_;
  ResponsesRequest req_;
  uint64_t seq_ = 0;
  ojson output_ = ojson::array();
  Open open_ = Open::kNone;
  std::string text_;  // the open item's text so far
  std::string finish_;
  ojson usage_;
  bool failed_ = false;
};

}  // namespace

std::shared_ptr<AnswerWriter> NewResponsesWriter(std::shared_ptr<AnswerWriter> out, std::string id, int64_t created,
                                                 ResponsesRequest request) {
  return std::make_shared<ResponsesWriter>(std::move(out), std::move(id), created, std::move(request));
}

Result<ResponsesRequest> ParseResponsesRequest(std::string_view body, const RequestLimits& limits) {
  auto parsed = ParseOrderedJson(body);
  if (!parsed.ok()) return FieldError(parsed.status().message(), "");
  const ojson& j = *parsed;
  if (!j.is_object()) return FieldError("the body must be a JSON object", "");
  ResponsesRequest out;
  ojson chat = ojson::object();
  KVF_RETURN_IF_ERROR(ChatBody(j, &chat));
  if (auto s = j.find("stream"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return FieldError("'stream' must be a boolean", "stream");
    out.stream = s->get<bool>();
  }
  // The chat stream carries usage, which response.completed reports.
  chat["stream"] = out.stream;
  if (out.stream) chat["stream_options"] = {{"include_usage", true}};
  auto r = ParseCompletionRequest(chat.dump(), /*chat=*/true, limits);
  if (!r.ok()) {
    ApiError e = ErrorFromStatus(r.status());
    return FieldError(e.message, ResponsesParam(e.param));
  }
  out.chat = std::move(r).value();
  out.echo = {{"instructions", j.contains("instructions") ? j["instructions"] : ojson()},
              {"metadata", j.contains("metadata") && !j["metadata"].is_null() ? j["metadata"] : ojson::object()},
              {"parallel_tool_calls", out.chat.tools.parallel},
              {"previous_response_id", nullptr},
              {"store", false},
              {"temperature", j.contains("temperature") ? j["temperature"] : ojson(1.0)},
              {"text", j.contains("text") && !j["text"].is_null() ? j["text"] : ojson{{"format", {{"type", "text"}}}}},
              {"tool_choice", j.contains("tool_choice") && !j["tool_choice"].is_null() ? j["tool_choice"] : ojson("auto")},
              {"tools", j.contains("tools") && !j["tools"].is_null() ? j["tools"] : ojson::array()},
              {"top_p", j.contains("top_p") ? j["top_p"] : ojson(1.0)},
              {"max_output_tokens", j.contains("max_output_tokens") ? j["max_output_tokens"] : ojson()}};
  return out;
}

ojson ResponseFromChat(const json& chat, std::string_view id, int64_t created, const ojson& echo,
                       std::string_view model) {
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  const bool cut = choice.value("finish_reason", json()) == "length";
  ojson r = ResponseObject(id, created, echo, model, cut ? "incomplete" : "completed");
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (auto rc = message.find("reasoning_content"); rc != message.end() && rc->is_string()) {
    r["output"].push_back({{"type", "reasoning"}, {"id", NewItemId("rs_")}, {"summary", ojson::array()},
                           {"content", ojson::array({{{"type", "reasoning_text"}, {"text", *rc}}})}});
  }
  if (auto c = message.find("content"); c != message.end() && c->is_string() && !c->get_ref<const std::string&>().empty()) {
    r["output"].push_back(MessageItem(NewItemId("msg_"), c->get<std::string>(), "completed"));
  }
  if (auto calls = message.find("tool_calls"); calls != message.end() && calls->is_array()) {
    for (const json& c : *calls) {
      r["output"].push_back({{"type", "function_call"}, {"id", NewItemId("fc_")}, {"call_id", c["id"]},
                             {"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]},
                             {"status", "completed"}});
    }
  }
  if (auto u = chat.find("usage"); u != chat.end() && u->is_object()) r["usage"] = Usage(*u);
  return r;
}

}  // namespace kvfleet::router
