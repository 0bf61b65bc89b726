// JSON Schema (a draft 2020-12 subset) -> grammar IR: the walk, objects, arrays,
// combinators and $ref. Scalars live in json_schema_scalars.cc.
#include <set>

#include "grammar/json_schema_internal.h"

namespace kvfleet::grammar {

namespace {

// Keywords that change nothing a generator must respect.
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions"};
const std::set<std::string, std::less<>> kValidation = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "properties", "required", "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const char* const kAllTypes[] = {"null", "boolean", "object", "array", "string", "number"};

// A rule name part from a pointer segment or property name.
std::string RuleNamePart(std::string_view s) {
  std::string out;
  for (char c : s) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    out += ok ? c : '-';
    if (out.size() >= 32) break;
  }
  return out.empty() ? "x" : out;
}

}  // namespace

std::string PointerAppend(const std::string& path, const std::string& segment) {
  std::string out = path + "/";
  for (char c : segment) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

int32_t SchemaCompiler::NewRule(const std::string& base, int32_t body) {
  int32_t r = g_.AddRule(g_.FreshName(options_.rule_prefix + base));
  g_.SetBody(r, body);
  return g_.Ref(r);
}

Result<Grammar> SchemaCompiler::Run(std::string_view schema_json) {
  doc_ = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (doc_.is_discarded()) return InvalidArgument("json_schema: the schema is not valid JSON");
  int32_t root = g_.AddRule(options_.rule_prefix + "root");
  KVF_ASSIGN_OR_RETURN(int32_t body, Schema(doc_, "", 0));
  g_.SetBody(root, body);
  g_.set_root(root);
  if (g_.num_rules() > limits_.max_rules) {
    return InvalidArgument("grammar too large: the schema needs more than " + std::to_string(limits_.max_rules) + " rules");
  }
  return std::move(g_);
}

Result<int32_t> SchemaCompiler::Schema(const Json& s, const std::string& path, int depth) {
  if (depth > limits_.max_nesting_depth) {
    return Error(path, "grammar too large: schemas nested deeper than " + std::to_string(limits_.max_nesting_depth));
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue();
    return Error(path, "the schema 'false' matches nothing");
  }
  if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
  std::vector<std::string> validation;  // this schema's validation keywords, in order
  for (const auto& [key, value] : s.items()) {
    if (kAnnotations.count(key) || key.starts_with("x-")) continue;  // x-: vendor extensions
    if (!kValidation.count(key)) return Unsupported(path, key);
    validation.push_back(key);
  }
  auto alone = [&](const char* keyword) -> Status {
    for (const auto& k : validation) {
      if (k != keyword) return Unsupported(path, k, std::string("beside '") + keyword + "'");
    }
    return Status::Ok();
  };
  if (s.contains("$ref")) {
    KVF_RETURN_IF_ERROR(alone("$ref"));
    if (!s["$ref"].is_string()) return Error(PointerAppend(path, "$ref"), "$ref must be a string");
    return Ref(s["$ref"].get<std::string>(), PointerAppend(path, "$ref"), depth);
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    if (!s.contains(comb)) continue;
    KVF_RETURN_IF_ERROR(alone(comb));
    std::string p = PointerAppend(path, comb);
    const Json& branches = s[comb];
    if (!branches.is_array() || branches.empty()) return Error(p, std::string(comb) + " must be a non-empty array");
    std::vector<int32_t> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      KVF_ASSIGN_OR_RETURN(int32_t b, Schema(branches[i], PointerAppend(p, std::to_string(i)), depth + 1));
      alts.push_back(b);
    }
    return g_.Alt(std::move(alts));
  }
  if (s.contains("allOf")) {
    KVF_RETURN_IF_ERROR(alone("allOf"));
    const Json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) return Unsupported(path, "allOf", "only an allOf of one schema is supported");
    return Schema(all[0], PointerAppend(PointerAppend(path, "allOf"), "0"), depth + 1);
  }
  if (s.contains("enum") || s.contains("const")) {
    if (s.contains("enum") && s.contains("const")) return Unsupported(path, "const", "beside 'enum'");
    const char* key = s.contains("enum") ? "enum" : "const";
    Json values = s.contains("enum") ? s["enum"] : Json::array({s["const"]});
    if (!values.is_array()) return Error(PointerAppend(path, key), "enum must be an array");
    return EnumValues(values, s, path);
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) return Error(PointerAppend(path, "type"), "type must be a string or an array of strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Error(PointerAppend(path, "type"), "type must be a string or a non-empty array of strings");
    }
  } else {
    types.assign(std::begin(kAllTypes), std::end(kAllTypes));  // JSON Schema: no type, any type
  }
  std::vector<int32_t> alts;
  for (const auto& t : types) {
    KVF_ASSIGN_OR_RETURN(int32_t e, TypedSchema(t, s, path, depth));
    alts.push_back(e);
  }
  return g_.Alt(std::move(alts));
}

Result<int32_t> SchemaCompiler::TypedSchema(const std::string& type, const Json& s, const std::string& path, int depth) {
  if (type == "null") return Lit("null");
  if (type == "boolean") return g_.Alt({Lit("true"), Lit("false")});
  if (type == "object") return Object(s, path, depth);
  if (type == "array") return Array(s, path, depth);
  if (type == "string") return String(s, path);
  if (type == "integer") return Integer(s, path);
  if (type == "number") return Number(s, path);
  return Error(PointerAppend(path, "type"), "unknown type '" + type + "'");
}

Result<int32_t> SchemaCompiler::EnumValues(const Json& values, const Json& s, const std::string& path) {
  for (const auto& [key, value] : s.items()) {
    if (!kAnnotations.count(key) && !key.starts_with("x-") && key != "enum" && key != "const" && key != "type") {
      return Unsupported(path, key, "beside 'enum' or 'const'");
    }
  }
  std::set<std::string> types;
  if (s.contains("type")) {
    if (s["type"].is_string()) types.insert(s["type"].get<std::string>());
    else if (s["type"].is_array()) for (const auto& t : s["type"]) if (t.is_string()) types.insert(t.get<std::string>());
  }
  auto type_ok = [&](const Json& v) {
    if (types.empty()) return true;
    if (v.is_null()) return types.count("null") > 0;
    if (v.is_boolean()) return types.count("boolean") > 0;
    if (v.is_object()) return types.count("object") > 0;
    if (v.is_array()) return types.count("array") > 0;
    if (v.is_string()) return types.count("string") > 0;
    if (v.is_number_integer()) return types.count("integer") > 0 || types.count("number") > 0;
    return types.count("number") > 0;
  };
  std::vector<int32_t> alts;
  std::set<std::string> seen;
  for (const auto& v : values) {
    if (!type_ok(v)) continue;
    std::string text = v.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
    if (seen.insert(text).second) alts.push_back(Lit(std::move(text)));
  }
  if (alts.empty()) return Error(path, "enum/const has no value of the schema's type");
  return g_.Alt(std::move(alts));
}

Result<int32_t> SchemaCompiler::Ref(const std::string& ref, const std::string& path, int depth) {
  if (ref.empty() || ref[0] != '#') return Unsupported(path, "$ref", "only local references '#/...' are supported");
  std::string pointer = ref.substr(1);
  if (auto it = ref_rules_.find(pointer); it != ref_rules_.end()) return g_.Ref(it->second);
  const Json* target = nullptr;
  try {
    target = &doc_.at(Json::json_pointer(pointer));
  } catch (const Json::exception&) {
    return Error(path, "$ref '" + ref + "' does not resolve");
  }
  std::string base = pointer.empty() ? "root-ref" : RuleNamePart(pointer.substr(pointer.rfind('/') + 1));
  int32_t rule = g_.AddRule(g_.FreshName(options_.rule_prefix + base));
  ref_rules_[pointer] = rule;  // before the body, so a recursive $ref finds it
  KVF_ASSIGN_OR_RETURN(int32_t body, Schema(*target, pointer, depth + 1));
  g_.SetBody(rule, body);
  return g_.Ref(rule);
}

Result<int32_t> SchemaCompiler::Object(const Json& s, const std::string& path, int depth) {
  const Json empty = Json::object();
  const Json& props = s.contains("properties") ? s["properties"] : empty;
  if (!props.is_object()) return Error(PointerAppend(path, "properties"), "properties must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    const Json& req = s["required"];
    if (!req.is_array()) return Error(PointerAppend(path, "required"), "required must be an array of strings");
    for (const auto& r : req) {
      if (!r.is_string()) return Error(PointerAppend(path, "required"), "required must be an array of strings");
      if (!props.contains(r.get<std::string>())) {
        return Unsupported(PointerAppend(path, "required"), "required",
                           "'" + r.get<std::string>() + "' is not in properties");
      }
      required.insert(r.get<std::string>());
    }
  }
  // Declared properties, in the schema's order (generation follows it, as OpenAI and XGrammar do).
  std::vector<int32_t> pairs;
  std::vector<bool> is_required;
  std::vector<std::string> names;
  std::string props_path = PointerAppend(path, "properties");
  for (const auto& [name, sub] : props.items()) {
    KVF_ASSIGN_OR_RETURN(int32_t value, Schema(sub, PointerAppend(props_path, name), depth + 1));
    std::string key = Json(name).dump(-1, ' ', false, Json::error_handler_t::replace);
    pairs.push_back(g_.Seq({Lit(key), Punct(":"), value}));
    is_required.push_back(required.count(name) > 0);
    names.push_back(name);
  }
  int32_t extra = -1;  // one additional property, when allowed
  Json additional = s.contains("additionalProperties") ? s["additionalProperties"] : Json(!options_.strict);
  if (!(additional.is_boolean() && !additional.get<bool>())) {
    int32_t value;
    if (additional.is_boolean()) {
      value = AnyValue();
    } else {
      KVF_ASSIGN_OR_RETURN(value, Schema(additional, PointerAppend(path, "additionalProperties"), depth + 1));
    }
    extra = g_.Seq({KeyNotIn(names), Punct(":"), value});
  }
  // after[i]: the properties from i on once something was written (each starts with ',');
  // first[i]: from i with nothing written yet. first[i] keeps first[i+1] only when
  // property i is optional, so after[i+1] is used twice (by first[i] and after[i]) when
  // every property before i is optional: it becomes a rule there, else the expression
  // would grow with the square of the property count.
  size_t n = pairs.size();
  std::vector<bool> all_optional_before(n + 1, true);
  for (size_t i = 0; i < n; ++i) all_optional_before[i + 1] = all_optional_before[i] && !is_required[i];
  int32_t after = extra >= 0 ? g_.Star(g_.Seq({Punct(","), extra})) : g_.Empty();
  int32_t first = extra >= 0 ? g_.Optional(g_.Seq({extra, g_.Star(g_.Seq({Punct(","), extra}))})) : g_.Empty();
  for (size_t i = n; i-- > 0;) {
    int32_t after_next = after;
    if (i >= 1 && all_optional_before[i]) after_next = NewRule("obj-tail", after);
    int32_t with_pair = g_.Seq({pairs[i], after_next});
    if (is_required[i]) {
      after = g_.Seq({Punct(","), pairs[i], after_next});
      first = with_pair;
    } else {
      after = g_.Seq({g_.Optional(g_.Seq({Punct(","), pairs[i]})), after_next});
      first = g_.Alt({with_pair, first});
    }
  }
  return NewRule(path.empty() ? "object" : RuleNamePart(path.substr(path.rfind('/') + 1)),
                 g_.Seq({Punct("{"), first, Punct("}")}));
}

Result<int32_t> SchemaCompiler::Array(const Json& s, const std::string& path, int depth) {
  auto count = [&](const char* key, int64_t fallback) -> Result<int64_t> {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return Error(PointerAppend(path, key), std::string(key) + " must be a non-negative integer");
    return v.get<int64_t>();
  };
  KVF_ASSIGN_OR_RETURN(int64_t min, count("minItems", 0));
  KVF_ASSIGN_OR_RETURN(int64_t max, count("maxItems", -1));
  if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
    return Unsupported(path, "uniqueItems");
  }
  std::vector<int32_t> prefix;
  if (s.contains("prefixItems")) {
    const Json& p = s["prefixItems"];
    if (!p.is_array()) return Error(PointerAppend(path, "prefixItems"), "prefixItems must be an array");
    for (size_t i = 0; i < p.size(); ++i) {
      KVF_ASSIGN_OR_RETURN(int32_t e, Schema(p[i], PointerAppend(PointerAppend(path, "prefixItems"), std::to_string(i)), depth + 1));
      prefix.push_back(e);
    }
  }
  // The items after the prefix: a schema, none (false), or any (absent, unless strict with a prefix).
  int32_t item = -1;
  if (s.contains("items")) {
    const Json& it = s["items"];
    if (!(it.is_boolean() && !it.get<bool>())) {
      KVF_ASSIGN_OR_RETURN(item, Schema(it, PointerAppend(path, "items"), depth + 1));
    }
  } else if (prefix.empty() || !options_.strict) {
    item = AnyValue();
  }
  auto k = static_cast<int64_t>(prefix.size());
  if (max >= 0 && max < k) {
    prefix.resize(max);
    k = max;
  }
  if (item < 0 && min > k) return Error(path, "minItems exceeds the items the schema allows");
  if (max >= 0 && min > max) return Error(path, "minItems exceeds maxItems");
  auto limit = [&](int64_t v) -> Result<int32_t> {
    if (v > static_cast<int64_t>(limits_.max_states)) {
      return Error(path, "grammar too large: an item count of " + std::to_string(v));
    }
    return static_cast<int32_t>(v);
  };
  // tail: ", item" repeated for the items after the prefix (and after the first item when
  // there is no prefix).
  auto tail = [&](int64_t written) -> Result<int32_t> {
    if (item < 0) return g_.Empty();
    KVF_ASSIGN_OR_RETURN(int32_t lo, limit(std::max<int64_t>(min - written, 0)));
    int32_t hi = Expr::kUnbounded;
    if (max >= 0) { KVF_ASSIGN_OR_RETURN(hi, limit(max - written)); }
    return g_.Repeat(g_.Seq({Punct(","), item}), lo, hi);
  };
  int32_t body;
  if (k == 0) {
    if (item < 0 || max == 0) {
      body = g_.Empty();
    } else {
      KVF_ASSIGN_OR_RETURN(int32_t rest, tail(1));
      body = g_.Seq({item, rest});
      if (min == 0) body = g_.Optional(body);
    }
  } else {
    KVF_ASSIGN_OR_RETURN(body, tail(k));
    for (int64_t i = k - 1; i >= 1; --i) {
      body = g_.Seq({Punct(","), prefix[i], body});
      if (i >= min) body = g_.Optional(body);
    }
    body = g_.Seq({prefix[0], body});
    if (min == 0) body = g_.Optional(body);
  }
  return NewRule(path.empty() ? "array" : RuleNamePart(path.substr(path.rfind('/') + 1)),
                 g_.Seq({Punct("["), body, Punct("]")}));
}

Result<Grammar> JsonSchemaToGrammar(std::string_view schema_json, const JsonSchemaOptions& options, const Limits& limits) {
  return SchemaCompiler(options, limits).Run(schema_json);
}

}  // namespace kvfleet::grammar
