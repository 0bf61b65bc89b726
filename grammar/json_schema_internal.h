// SchemaCompiler: the JSON Schema front end's state, shared by json_schema.cc (the walk,
// objects, arrays, combinators, $ref) and json_schema_scalars.cc (strings, formats,
// integers, numbers, the generic JSON rules).
//
// Thread safety: one compile, one thread.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/front_ends.h"

namespace kvfleet::grammar {

using Json = nlohmann::ordered_json;

class SchemaCompiler {
 public:
  SchemaCompiler(const JsonSchemaOptions& options, const Limits& limits) : options_(options), limits_(limits) {}

  Result<Grammar> Run(std::string_view schema_json);

 private:
  // The expression of schema `s` found at JSON pointer `path`.
  Result<int32_t> Schema(const Json& s, const std::string& path, int depth);
  Result<int32_t> TypedSchema(const std::string& type, const Json& s, const std::string& path, int depth);
  Result<int32_t> Object(const Json& s, const std::string& path, int depth);
  Result<int32_t> Array(const Json& s, const std::string& path, int depth);
  Result<int32_t> Ref(const std::string& ref, const std::string& path, int depth);
  Result<int32_t> EnumValues(const Json& values, const Json& s, const std::string& path);

  // json_schema_scalars.cc
  Result<int32_t> String(const Json& s, const std::string& path);
  Result<int32_t> Integer(const Json& s, const std::string& path);
  Result<int32_t> Number(const Json& s, const std::string& path);
  Result<int32_t> Format(const std::string& format, const std::string& path);
  // A key of additionalProperties: any string but the declared names.
  int32_t KeyNotIn(const std::vector<std::string>& names);
  // Any JSON value (a rule, made on first use), string, number, integer (expressions).
  int32_t AnyValue();
  int32_t AnyString();
  int32_t AnyNumber();
  int32_t AnyInteger();
  // Digits of an integer in [lo, hi] (no bound when absent), as JSON writes integers.
  // The decimal integers in [lo, hi]; "-0" too when negative_zero and 0 is in range.
  int32_t IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi, bool negative_zero);
  int32_t Lit(std::string s) { return g_.Bytes(std::move(s)); }
  // A structural character, with the whitespace JSON allows around it when the options ask
  // for any whitespace ("{" and "[" take it after, "}" and "]" before, "," and ":" both).
  int32_t Punct(const char* p) {
    if (!options_.any_whitespace) return Lit(p);
    auto ws = [&] { return g_.Star(g_.Class({{' ', ' '}, {'\t', '\n'}, {'\r', '\r'}})); };
    if (p[0] == '{' || p[0] == '[') return g_.Seq({Lit(p), ws()});
    if (p[0] == '}' || p[0] == ']') return g_.Seq({ws(), Lit(p)});
    return g_.Seq({ws(), Lit(p), ws()});
  }
  int32_t NewRule(const std::string& base, int32_t body);

  Status Error(const std::string& path, const std::string& what) const {
    return InvalidArgument("json_schema: " + what + " at #" + path);
  }
  Status Unsupported(const std::string& path, const std::string& keyword, const std::string& why = "") const {
    return InvalidArgument("json_schema: unsupported keyword '" + keyword + "' at #" + path + (why.empty() ? "" : " (" + why + ")"));
  }

  JsonSchemaOptions options_;
  const Limits& limits_;
  Grammar g_;
  Json doc_;
  std::map<std::string, int32_t> ref_rules_;  // $ref target pointer -> rule
  int32_t any_value_ = -1;
};

// Appends a JSON pointer segment, escaped (~ as ~0, / as ~1).
std::string PointerAppend(const std::string& path, const std::string& segment);

}  // namespace kvfleet::grammar
