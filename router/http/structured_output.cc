#include "router/http/structured_output.h"

#include <array>
#include <string>

#include "router/http/chat_messages.h"
#include "router/http/request_fields.h"

namespace kvfleet::router {

using ojson = nlohmann::ordered_json;
using Kind = StructuredOutput::Kind;

namespace {

constexpr std::array<const char*, 6> kFields = {"response_format", "guided_json",   "guided_regex",
                                                "guided_choice",   "guided_grammar", "structured_outputs"};

// A JSON schema given as an object, or as its JSON text (guided_json's older form).
Status Schema(const ojson& v, const std::string& at, StructuredOutput* out) {
  ojson schema = v;
  if (v.is_string()) {
    auto parsed = ParseOrderedJson(v.get_ref<const std::string&>());
    if (!parsed.ok()) return FieldError("'" + at + "' is not valid JSON", at);
    schema = std::move(parsed).value();
  }
  if (!schema.is_object()) return FieldError("'" + at + "' must be a JSON Schema object", at);
  *out = {Kind::kJsonSchema, schema.dump()};
  return Status::Ok();
}

Status Text(const ojson& v, const std::string& at, Kind kind, StructuredOutput* out) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) return FieldError("'" + at + "' must be a non-empty string", at);
  *out = {kind, v.get<std::string>()};
  return Status::Ok();
}

Status Choice(const ojson& v, const std::string& at, StructuredOutput* out) {
  if (!v.is_array() || v.empty()) return FieldError("'" + at + "' must be a non-empty array of strings", at);
  for (const ojson& c : v) {
    if (!c.is_string()) return FieldError("'" + at + "' must be a non-empty array of strings", at);
  }
  *out = {Kind::kChoice, v.dump()};
  return Status::Ok();
}

Status ResponseFormat(const ojson& v, StructuredOutput* out) {
  const std::string at = "response_format";
  if (!v.is_object()) return FieldError("'response_format' must be an object", at);
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) return FieldError("'response_format.type' must be a string", at + ".type");
  if (*type == "text") return Status::Ok();
  if (*type == "json_object") {
    *out = {Kind::kJsonObject, ""};
    return Status::Ok();
  }
  if (*type != "json_schema") {
    return FieldError("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", at + ".type");
  }
  auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object()) return FieldError("'response_format.json_schema' must be an object", at + ".json_schema");
  if (auto name = js->find("name"); name == js->end() || !name->is_string()) {
    return FieldError("'response_format.json_schema.name' must be a string", at + ".json_schema.name");
  }
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
    return FieldError("'response_format.json_schema.strict' must be a boolean", at + ".json_schema.strict");
  }
  auto schema = js->find("schema");
  if (schema == js->end()) return FieldError("'response_format.json_schema.schema' is required", at + ".json_schema.schema");
  if (!schema->is_object()) {
    return FieldError("'response_format.json_schema.schema' must be a JSON Schema object", at + ".json_schema.schema");
  }
  *out = {Kind::kJsonSchema, schema->dump()};
  return Status::Ok();
}

Status StructuredOutputs(const ojson& v, StructuredOutput* out, std::string* field) {
  if (!v.is_object()) return FieldError("'structured_outputs' must be an object", "structured_outputs");
  bool seen = false;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.value().is_null()) continue;
    const std::string at = "structured_outputs." + it.key();
    if (seen) return FieldError("'structured_outputs' may hold one constraint; '" + at + "' is another", at);
    seen = true;
    *field = at;
    if (it.key() == "json") KVF_RETURN_IF_ERROR(Schema(it.value(), at, out));
    else if (it.key() == "regex") KVF_RETURN_IF_ERROR(Text(it.value(), at, Kind::kRegex, out));
    else if (it.key() == "choice") KVF_RETURN_IF_ERROR(Choice(it.value(), at, out));
    else if (it.key() == "grammar") KVF_RETURN_IF_ERROR(Text(it.value(), at, Kind::kEbnf, out));
    else if (it.key() == "json_object") {
      if (!it.value().is_boolean()) return FieldError("'" + at + "' must be a boolean", at);
      if (it.value().get<bool>()) *out = {Kind::kJsonObject, ""};
    } else {
      return FieldError("'" + at + "' is not supported (json, regex, choice, grammar or json_object)", at);
    }
  }
  return Status::Ok();
}

}  // namespace

bool HasStructuredOutputField(const nlohmann::json& body) {
  for (const char* f : kFields) {
    if (auto it = body.find(f); it != body.end() && !it->is_null()) return true;
  }
  return false;
}

Status ParseStructuredOutput(const ojson& body, StructuredOutput* out, std::string* field) {
  *out = {};
  for (const char* f : kFields) {
    auto it = body.find(f);
    if (it == body.end() || it->is_null()) continue;
    StructuredOutput one;
    std::string at = f;
    const std::string name = f;
    if (name == "response_format") KVF_RETURN_IF_ERROR(ResponseFormat(*it, &one));
    else if (name == "guided_json") KVF_RETURN_IF_ERROR(Schema(*it, name, &one));
    else if (name == "guided_regex") KVF_RETURN_IF_ERROR(Text(*it, name, Kind::kRegex, &one));
    else if (name == "guided_choice") KVF_RETURN_IF_ERROR(Choice(*it, name, &one));
    else if (name == "guided_grammar") KVF_RETURN_IF_ERROR(Text(*it, name, Kind::kEbnf, &one));
    else KVF_RETURN_IF_ERROR(StructuredOutputs(*it, &one, &at));
    if (one.kind == Kind::kNone) continue;
    if (out->kind != Kind::kNone) return FieldError("a request may carry one constraint; '" + at + "' is a second", at);
    if (one.spec.size() > sampling::config::kMaxStructuredSpecBytes) {
      return FieldError("'" + at + "' must be at most " + std::to_string(sampling::config::kMaxStructuredSpecBytes) + " bytes",
                 at);
    }
    *out = std::move(one);
    *field = at;
  }
  return Status::Ok();
}

grammar::Spec GrammarSpecOf(const StructuredOutput& s) {
  grammar::Spec spec;
  spec.text = s.spec;
  switch (s.kind) {
    case Kind::kJsonSchema: spec.kind = grammar::Kind::kJsonSchema; break;
    case Kind::kJsonObject: spec.kind = grammar::Kind::kJsonObject; break;
    case Kind::kRegex: spec.kind = grammar::Kind::kRegex; break;
    case Kind::kChoice: spec.kind = grammar::Kind::kChoice; break;
    case Kind::kEbnf: spec.kind = grammar::Kind::kEbnf; break;
    case Kind::kNone: break;
  }
  return spec;
}

Status ValidateStructuredOutput(const StructuredOutput& s, const std::string& field) {
  if (s.kind == Kind::kNone) return Status::Ok();
  Status st = grammar::Validate(GrammarSpecOf(s));
  if (!st.ok()) return FieldError("'" + field + "': " + st.message(), field);
  return Status::Ok();
}

}  // namespace kvfleet::router
