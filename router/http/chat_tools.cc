#include "router/http/chat_tools.h"

#include <algorithm>

#include "router/http/request_fields.h"

namespace kvfleet::router {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

const ojson* FindFunction(const ojson& tools, std::string_view name) {
  for (const ojson& t : tools) {
    if (t["function"]["name"] == name) return &t["function"];
  }
  return nullptr;
}

// The parameters of a function, or the empty object schema OpenAI assumes without them.
ojson ParametersOf(const ojson& function) {
  auto p = function.find("parameters");
  return p == function.end() || p->is_null() ? ojson{{"type", "object"}, {"properties", ojson::object()}} : *p;
}

}  // namespace

bool IsValidToolName(std::string_view name) {
  if (name.empty() || name.size() > config::kMaxToolNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

Result<ojson> ValidateTools(const ojson& tools, std::string_view at, bool flat) {
  const std::string field(at);
  if (!tools.is_array()) return FieldError("'" + field + "' must be an array of function tools", field);
  if (tools.size() > config::kMaxTools) {
    return FieldError("'" + field + "' may hold at most " + std::to_string(config::kMaxTools) + " tools", field);
  }
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string path = field + "[" + std::to_string(i) + "]";
    if (!t.is_object()) return FieldError("'" + path + "' must be an object", path);
    auto type = t.find("type");
    if (type == t.end() || *type != "function") {
      return FieldError("'" + path + ".type' must be \"function\" (kvfleet serves function tools only)", path + ".type");
    }
    // The function's fields: the chat shape nests them, the Responses shape does not.
    ojson function = ojson::object();
    const std::string fpath = flat ? path : path + ".function";
    if (flat) {
      for (const char* key : {"name", "description", "parameters", "strict"}) {
        if (auto it = t.find(key); it != t.end()) function[key] = *it;
      }
    } else {
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) return FieldError("'" + fpath + "' must be an object", fpath);
      function = *fn;
    }
    auto name = function.find("name");
    if (name == function.end() || !name->is_string() || !IsValidToolName(name->get_ref<const std::string&>())) {
      return FieldError("'" + fpath + ".name' must be 1 to 64 letters, digits, underscores or dashes", fpath + ".name");
    }
    if (auto d = function.find("description"); d != function.end() && !d->is_null() && !d->is_string()) {
      return FieldError("'" + fpath + ".description' must be a string", fpath + ".description");
    }
    if (auto p = function.find("parameters"); p != function.end() && !p->is_null()) {
      auto ptype = p->is_object() ? p->find("type") : p->end();
      if (!p->is_object() || (ptype != p->end() && *ptype != "object")) {
        return FieldError("'" + fpath + ".parameters' must be a JSON Schema object (\"type\": \"object\")",
                   fpath + ".parameters");
      }
    }
    if (auto s = function.find("strict"); s != function.end() && !s->is_null() && !s->is_boolean()) {
      return FieldError("'" + fpath + ".strict' must be a boolean", fpath + ".strict");
    }
    for (const ojson& seen : out) {
      if (seen["function"]["name"] == *name) return FieldError("two tools are named '" + name->get<std::string>() + "'", fpath + ".name");
    }
    out.push_back(flat ? ojson{{"type", "function"}, {"function", std::move(function)}} : t);
  }
  return out;
}

Status ParseChatTools(const json& body, const ojson* ordered_tools, ChatTools* out) {
  if (ordered_tools != nullptr && !ordered_tools->is_null()) {
    KVF_ASSIGN_OR_RETURN(ojson tools, ValidateTools(*ordered_tools, "tools", false));
    if (!tools.empty()) out->tools = std::make_shared<const ojson>(std::move(tools));
  }
  out->choice = out->tools ? ToolChoice::kAuto : ToolChoice::kNone;
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") out->choice = ToolChoice::kNone;
      else if (c == "auto") out->choice = out->tools ? ToolChoice::kAuto : ToolChoice::kNone;
      else if (c == "required") out->choice = ToolChoice::kRequired;
      else return FieldError("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function", "tool_choice");
    } else if (choice->is_object()) {
      auto fn = choice->find("function");
      if (choice->value("type", "") != "function" || fn == choice->end() || !fn->is_object() ||
          !fn->contains("name") || !(*fn)["name"].is_string()) {
        return FieldError("'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
      }
      out->choice = ToolChoice::kNamed;
      out->named = (*fn)["name"].get<std::string>();
    } else {
      return FieldError("'tool_choice' must be a string or an object", "tool_choice");
    }
    if (out->choice == ToolChoice::kRequired || out->choice == ToolChoice::kNamed) {
      if (!out->tools) return FieldError("'tool_choice' forces a call but the request has no 'tools'", "tool_choice");
      if (out->choice == ToolChoice::kNamed && FindFunction(*out->tools, out->named) == nullptr) {
        return FieldError("'tool_choice' names '" + out->named + "', which is not in 'tools'", "tool_choice");
      }
    }
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) return FieldError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    out->parallel = p->get<bool>();
  }
  return Status::Ok();
}

std::string ForcedCallSchema(const ChatTools& tools) {
  if (tools.choice == ToolChoice::kNamed) return ParametersOf(*FindFunction(*tools.tools, tools.named)).dump();
  ojson variants = ojson::array();
  for (const ojson& t : *tools.tools) {
    const ojson& fn = t["function"];
    variants.push_back({{"type", "object"},
                        {"properties", {{"name", {{"type", "string"}, {"enum", {fn["name"]}}}}, {"parameters", ParametersOf(fn)}}},
                        {"required", {"name", "parameters"}}});
  }
  ojson schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(variants)}}}};
  if (!tools.parallel) schema["maxItems"] = 1;
  return schema.dump();
}

}  // namespace kvfleet::router
