#include "router/http/chat_messages.h"

#include <algorithm>
#include <string>
#include <utility>

#include "router/http/json_body.h"
#include "router/http/request_fields.h"

namespace kvfleet::router {

using ojson = nlohmann::ordered_json;

namespace {

Status Bad(std::string message) { return FieldError(std::move(message), "messages"); }

std::string At(size_t i) { return "messages[" + std::to_string(i) + "]"; }

// Rule 1: a string, or text parts joined with "\n".
Status JoinContent(ojson* content, const std::string& where) {
  if (content->is_string()) return Status::Ok();
  if (!content->is_array()) return Bad(where + ".content must be a string or an array of text parts");
  std::string joined;
  for (size_t j = 0; j < content->size(); ++j) {
    const ojson& part = (*content)[j];
    const std::string path = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) return Bad(path + " must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return Bad(path + " needs a string 'type'");
    if (*type != "text") {
      return Bad(path + ": content part type '" + type->get<std::string>() +
                 "' is not supported (kvfleet serves text parts only)");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return Bad(path + " needs a string 'text'");
    if (j > 0) joined += '\n';
    joined += text->get_ref<const std::string&>();
  }
  *content = std::move(joined);
  return Status::Ok();
}

// Rule 3.
Status NormalizeToolCalls(ojson* calls, const std::string& where) {
  if (calls->is_null()) return Status::Ok();
  if (!calls->is_array()) return Bad(where + ".tool_calls must be an array");
  if (calls->size() > config::kMaxToolCallsPerMessage) {
    return Bad(where + ".tool_calls holds more than " + std::to_string(config::kMaxToolCallsPerMessage) + " calls");
  }
  for (size_t j = 0; j < calls->size(); ++j) {
    ojson& call = (*calls)[j];
    const std::string path = where + ".tool_calls[" + std::to_string(j) + "]";
    if (!call.is_object()) return Bad(path + " must be an object");
    if (auto id = call.find("id"); id != call.end() && !id->is_string()) return Bad(path + ".id must be a string");
    if (auto type = call.find("type"); type != call.end() && *type != "function") {
      return Bad(path + ".type must be \"function\"");
    }
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) return Bad(path + ".function must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) return Bad(path + ".function.name must be a string");
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null() || (args->is_string() && args->get_ref<const std::string&>().empty())) {
      (*fn)["arguments"] = ojson::object();
    } else if (args->is_string()) {
      auto parsed = ParseOrderedJson(args->get_ref<const std::string&>());
      if (!parsed.ok()) return Bad(path + ".function.arguments is not valid JSON");
      *args = std::move(parsed).value();
    } else if (!args->is_object()) {
      return Bad(path + ".function.arguments must be a JSON string");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ojson> ParseOrderedJson(std::string_view text) {
  if (!JsonDepthWithin(text, config::kMaxJsonBodyDepth)) return InvalidArgument(std::string(kJsonTooDeep));
  ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string(kJsonInvalid));
  return j;
}

Status NormalizeChatMessages(ojson* messages) {
  if (!messages->is_array() || messages->empty()) return Bad("'messages' must be a non-empty array");
  static constexpr const char* kRoles[] = {"system", "user", "assistant", "tool", "developer", "function"};
  for (size_t i = 0; i < messages->size(); ++i) {
    ojson& m = (*messages)[i];
    const std::string where = At(i);
    if (!m.is_object()) return Bad(where + " must be an object");
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) return Bad(where + " needs a string 'role'");
    const std::string role = role_it->get<std::string>();
    if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return role == r; })) {
      return Bad("unknown message role '" + role + "' (" + where + ")");
    }
    if (auto name = m.find("name"); name != m.end() && !name->is_null() && !name->is_string()) {
      return Bad(where + ".name must be a string");
    }
    if (role == "assistant") {
      if (auto calls = m.find("tool_calls"); calls != m.end()) KVF_RETURN_IF_ERROR(NormalizeToolCalls(&*calls, where));
    } else if (m.contains("tool_calls")) {
      return Bad(where + ": only assistant messages carry 'tool_calls'");
    }
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) return Bad(where + ": a tool message needs a string 'tool_call_id'");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (role != "assistant") return Bad("a " + role + " message needs 'content' (" + where + ")");
      m["content"] = "";  // vLLM: null content renders as no text
      continue;
    }
    KVF_RETURN_IF_ERROR(JoinContent(&*content, where));
  }
  return Status::Ok();
}

}  // namespace kvfleet::router
