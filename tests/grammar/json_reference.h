// A small JSON Schema validator and instance generator, for the tests only, written apart
// from grammar/json_schema*.cc so that the two can disagree. It covers the same subset
// (Debian 12 packages no C++ JSON Schema validator). Semantics that the grammar documents
// as its own are checked here as part of the "canonical text" the grammar generates:
// properties in schema order then additional ones, integers without fraction, compact.
#pragma once

#include <cmath>
#include <random>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace kvfleet::grammar::testing {

using Json = nlohmann::ordered_json;

class Reference {
 public:
  Reference(Json root, bool strict) : root_(std::move(root)), strict_(strict) {}

  bool Valid(const Json& x) const { return Valid(root_, x); }
  Json Generate(std::mt19937* rng) const { return Gen(root_, rng, 0); }

  // Strings the generator uses for "pattern" fields, matching or not.
  static const std::vector<std::string>& PatternPool() {
    static const std::vector<std::string> pool = {"abc-12", "ab-1", "xyz-99", "a-00", "abbbc", "ac", "zabcz", "",
                                                  "ABC-12", "abc-123", "q-7x", "abc", "xabcx-1", "-12"};
    return pool;
  }

 private:
  const Json& Resolve(const Json& s) const {
    if (s.is_object() && s.contains("$ref")) {
      return Resolve(root_.at(Json::json_pointer(s["$ref"].get<std::string>().substr(1))));
    }
    return s;
  }

  static size_t Codepoints(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  static bool TypeIs(const std::string& t, const Json& x) {
    if (t == "null") return x.is_null();
    if (t == "boolean") return x.is_boolean();
    if (t == "object") return x.is_object();
    if (t == "array") return x.is_array();
    if (t == "string") return x.is_string();
    if (t == "integer") return x.is_number_integer();
    if (t == "number") return x.is_number();
    return false;
  }

  bool Valid(const Json& schema, const Json& x) const {
    const Json& s = Resolve(schema);
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("anyOf")) {
      for (const auto& b : s["anyOf"]) if (Valid(b, x)) return true;
      return false;
    }
    if (s.contains("oneOf")) {
      int n = 0;
      for (const auto& b : s["oneOf"]) n += Valid(b, x);
      return n == 1;
    }
    if (s.contains("allOf")) {
      for (const auto& b : s["allOf"]) if (!Valid(b, x)) return false;
      return true;
    }
    if (s.contains("const") && !(s["const"] == x)) return false;
    if (s.contains("enum")) {
      bool any = false;
      for (const auto& v : s["enum"]) any = any || v == x;
      if (!any) return false;
    }
    if (s.contains("type")) {
      bool any = false;
      if (s["type"].is_string()) any = TypeIs(s["type"], x);
      else for (const auto& t : s["type"]) any = any || TypeIs(t, x);
      if (!any) return false;
    }
    if (x.is_number()) {
      double v = x.get<double>();
      if (s.contains("minimum") && v < s["minimum"].get<double>()) return false;
      if (s.contains("maximum") && v > s["maximum"].get<double>()) return false;
      if (s.contains("exclusiveMinimum") && v <= s["exclusiveMinimum"].get<double>()) return false;
      if (s.contains("exclusiveMaximum") && v >= s["exclusiveMaximum"].get<double>()) return false;
    }
    if (x.is_string()) {
      const std::string& v = x.get_ref<const std::string&>();
      if (s.contains("minLength") && Codepoints(v) < s["minLength"].get<size_t>()) return false;
      if (s.contains("maxLength") && Codepoints(v) > s["maxLength"].get<size_t>()) return false;
      if (s.contains("pattern") && !std::regex_search(v, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript))) {
        return false;
      }
    }
    if (x.is_object()) {
      const Json props = s.value("properties", Json::object());
      for (const auto& r : s.value("required", Json::array())) {
        if (!x.contains(r.get<std::string>())) return false;
      }
      Json additional = s.contains("additionalProperties") ? s["additionalProperties"] : Json(!strict_);
      // Canonical order: declared properties in schema order, then the others.
      auto next_declared = props.begin();
      bool seen_additional = false;
      for (const auto& [k, v] : x.items()) {
        if (props.contains(k)) {
          if (seen_additional) return false;
          while (next_declared != props.end() && next_declared.key() != k) ++next_declared;
          if (next_declared == props.end()) return false;
          ++next_declared;
          if (!Valid(props[k], v)) return false;
        } else {
          seen_additional = true;
          if (!Valid(additional, v)) return false;
        }
      }
    }
    if (x.is_array()) {
      if (s.contains("minItems") && x.size() < s["minItems"].get<size_t>()) return false;
      if (s.contains("maxItems") && x.size() > s["maxItems"].get<size_t>()) return false;
      const Json prefix = s.value("prefixItems", Json::array());
      Json items = s.contains("items") ? s["items"] : Json(!(strict_ && !prefix.empty()));
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Valid(i < prefix.size() ? prefix[i] : items, x[i])) return false;
      }
    }
    return true;
  }

  static std::string RandomString(std::mt19937* rng, size_t lo, size_t hi) {
    static const char* kChars[] = {"a", "b", "z", "Q", "0", "7", " ", "-", "_", "\"", "\\", "\n", "\t", "/",
                                   "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\x01"};
    size_t n = std::uniform_int_distribution<size_t>(lo, hi)(*rng);
    std::string out;
    for (size_t i = 0; i < n; ++i) out += kChars[std::uniform_int_distribution<size_t>(0, std::size(kChars) - 1)(*rng)];
    return out;
  }

  Json Gen(const Json& schema, std::mt19937* rng, int depth) const {
    const Json& s = Resolve(schema);
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(*rng); };
    auto coin = [&] { return pick(2) == 0; };
    if (s.is_boolean()) return pick(3) == 0 ? Json("any") : Json(static_cast<int>(pick(100)));
    if (s.contains("anyOf")) return Gen(s["anyOf"][pick(s["anyOf"].size())], rng, depth + 1);
    if (s.contains("oneOf")) return Gen(s["oneOf"][pick(s["oneOf"].size())], rng, depth + 1);
    if (s.contains("allOf")) return Gen(s["allOf"][0], rng, depth + 1);
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][pick(s["enum"].size())];
    std::string type = "null";
    if (s.contains("type")) type = s["type"].is_string() ? s["type"].get<std::string>() : s["type"][pick(s["type"].size())].get<std::string>();
    if (type == "boolean") return coin();
    if (type == "integer" || type == "number") {
      double lo = -1000, hi = 1000;
      if (s.contains("minimum")) lo = s["minimum"].get<double>();
      if (s.contains("exclusiveMinimum")) lo = s["exclusiveMinimum"].get<double>() + 1;
      if (s.contains("maximum")) hi = s["maximum"].get<double>();
      if (s.contains("exclusiveMaximum")) hi = s["exclusiveMaximum"].get<double>() - 1;
      if (!s.contains("maximum") && !s.contains("exclusiveMaximum")) hi = std::max(hi, lo + 1000);
      auto v = static_cast<int64_t>(std::ceil(lo)) + static_cast<int64_t>(pick(static_cast<size_t>(std::floor(hi) - std::ceil(lo) + 1)));
      if (type == "number" && coin()) return static_cast<double>(v) + (v < hi ? 0.25 * static_cast<double>(1 + pick(3)) : 0.0);
      return v;
    }
    if (type == "string") {
      if (s.contains("pattern")) {  // three times in four a string that matches
        std::vector<std::string> matching;
        std::regex re(s["pattern"].get<std::string>(), std::regex::ECMAScript);
        for (const auto& p : PatternPool()) if (std::regex_search(p, re)) matching.push_back(p);
        if (!matching.empty() && pick(4) != 0) return matching[pick(matching.size())];
        return PatternPool()[pick(PatternPool().size())];
      }
      size_t lo = s.value("minLength", size_t{0}), hi = s.value("maxLength", lo + 6);
      return RandomString(rng, lo, hi);
    }
    if (type == "array") {
      const Json prefix = s.value("prefixItems", Json::array());
      size_t lo = s.value("minItems", size_t{0});
      size_t hi = s.value("maxItems", lo + (depth > 3 ? 0 : 3));
      size_t n = lo + pick(hi - lo + 1);
      Json items = s.contains("items") ? s["items"] : Json(!(strict_ && !prefix.empty()));
      if (items.is_boolean() && !items.get<bool>()) n = std::min(n, prefix.size());
      Json out = Json::array();
      for (size_t i = 0; i < n; ++i) out.push_back(Gen(i < prefix.size() ? prefix[i] : items, rng, depth + 1));
      return out;
    }
    if (type == "object") {
      Json out = Json::object();
      std::set<std::string> required;
      for (const auto& r : s.value("required", Json::array())) required.insert(r.get<std::string>());
      const Json props = s.value("properties", Json::object());
      for (const auto& [k, v] : props.items()) {
        if (required.count(k) || (depth < 3 && coin())) out[k] = Gen(v, rng, depth + 1);
      }
      Json additional = s.contains("additionalProperties") ? s["additionalProperties"] : Json(!strict_);
      if (!(additional.is_boolean() && !additional.get<bool>()) && coin()) {
        std::string key = "k" + RandomString(rng, 0, 3);
        if (!out.contains(key)) out[key] = Gen(additional, rng, depth + 1);
      }
      return out;
    }
    return nullptr;
  }

  Json root_;
  bool strict_;
};

}  // namespace kvfleet::grammar::testing
