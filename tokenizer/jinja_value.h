// Runtime values of the Jinja engine (jinja.h) and the conversions the reference
// (@huggingface/jinja's runtime.ts) applies to them: truthiness, JS-style equality and
// number formatting, tojson, output. Only the interpreter (jinja_interpreter.h and its
// three .cc files) and jinja_value.cc use this.
//
// Thread safety: values belong to one Render call; the shared singletons (Undefined,
// Null) are immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvfleet::tok::jinja {

// Objects keep their keys in input order, as Python's dicts do for transformers' templates
// (nlohmann::json would sort them, and tojson and items() would print them sorted).
using json = nlohmann::ordered_json;

// Render errors travel as exceptions inside the engine and become a Status at Render.
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;

using ValuePtr = std::shared_ptr<Value>;

class Env;

using Function = std::function<ValuePtr(std::vector<ValuePtr>& args, Env& scope)>;

enum class Kind { kUndefined, kNull, kBool, kInt, kFloat, kString, kArray, kTuple, kObject, kKwargs, kNamespace, kFunction };

// An insertion-ordered map, as a JS Map.
struct Object {
  std::vector<std::pair<std::string, ValuePtr>> entries;
  ValuePtr Get(const std::string& k) const {
    for (const auto& [key, v] : entries) {
      if (key == k) return v;
    }
    return nullptr;
  }
  void Set(const std::string& k, ValuePtr v) {
    for (auto& [key, old] : entries) {
      if (key == k) {
        old = std::move(v);
        return;
      }
    }
    entries.emplace_back(k, std::move(v));
  }
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string str;
  std::vector<ValuePtr> items;      // kArray, kTuple
  std::shared_ptr<Object> object;   // kObject, kKwargs, kNamespace
  Function fn;                      // kFunction
};

ValuePtr Undefined();

ValuePtr Null();

ValuePtr Bool(bool b);

ValuePtr Int(int64_t i);

ValuePtr Float(double d);

// Integers are 64-bit: arithmetic that leaves that range (Python's would grow) and a
// float that does not fit are render errors, never wrapped or undefined.
int64_t IntFromFloat(double d);
int64_t CheckedAdd(int64_t a, int64_t b);
int64_t CheckedSub(int64_t a, int64_t b);
int64_t CheckedMul(int64_t a, int64_t b);

ValuePtr Str(std::string s);

ValuePtr Array(std::vector<ValuePtr> items, Kind kind = Kind::kArray);

ValuePtr MakeObject(std::shared_ptr<Object> o, Kind kind = Kind::kObject);

ValuePtr Fn(Function f);

bool IsArray(const Value& v);

bool IsObject(const Value& v);

bool IsNumber(const Value& v);

double NumberOf(const Value& v);

const char* TypeName(const Value& v);

bool Truthy(const Value& v);

// JavaScript's Number.prototype.toString for a double.
std::string JsNumber(double d);

std::string JsonString(std::string_view s, bool ensure_ascii);

struct JsonOptions {
  std::optional<int64_t> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
};

std::string ToJson(const Value& v, const JsonOptions& o, int depth, bool undefined_to_null);

// What the reference's toString() gives when a value is output.
std::string Display(const Value& v);

// `a + b` / `a ~ b` stringify the raw JS values.
std::string RawString(const Value& v);

// JS's loose == on the raw values.
bool LooseEquals(const Value& a, const Value& b);

// JS's === on the raw values (array membership).
bool StrictEquals(const Value& a, const Value& b);

ValuePtr FromJson(const json& j);

size_t Utf16Length(std::string_view s);

std::vector<std::string> CodePoints(std::string_view s);

std::string MapCase(std::string_view s, bool upper);

// titleCase: /\b\w/g upper-cased (ASCII word characters, as JS's \w).
std::string TitleCase(std::string_view s);

std::vector<std::string> SplitString(const std::string& s, const std::string& sep);

std::vector<ValuePtr> Slice(const std::vector<ValuePtr>& a, std::optional<int64_t> start, std::optional<int64_t> stop,
                            int64_t step);

std::string StrftimeNow(const std::string& format);

}  // namespace kvfleet::tok::jinja
