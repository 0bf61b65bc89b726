#include "router/http/json_body.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include <simdjson.h>

namespace kvfleet::router {

using nlohmann::json;

namespace {

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// A "-0" token ('-', '0', then no digit, '.', 'e' or 'E'). Matches inside strings too; those
// only send the body down nlohmann's slower path.
bool MayHoldNegativeZero(std::string_view s) {
  for (size_t at = s.find("-0"); at != std::string_view::npos; at = s.find("-0", at + 2)) {
    if (at + 2 == s.size()) return true;
    char next = s[at + 2];
    if (!(next >= '0' && next <= '9') && next != '.' && next != 'e' && next != 'E') return true;
  }
  return false;
}

// Bodies whose bytes simdjson reads as nlohmann does (see the header).
bool SimdjsonReadsAsNlohmann(std::string_view body) {
  return body.substr(0, kUtf8Bom.size()) != kUtf8Bom && std::memchr(body.data(), '\0', body.size()) == nullptr &&
         !MayHoldNegativeZero(body);
}

// simdjson's errors for bytes nlohmann refuses too. Any other error (numbers above all)
// goes to nlohmann for its own verdict.
bool RefusedByBoth(simdjson::error_code e) {
  switch (e) {
    case simdjson::TAPE_ERROR:
    case simdjson::DEPTH_ERROR:
    case simdjson::STRING_ERROR:
    case simdjson::T_ATOM_ERROR:
    case simdjson::F_ATOM_ERROR:
    case simdjson::N_ATOM_ERROR:
    case simdjson::UTF8_ERROR:
    case simdjson::EMPTY:
    case simdjson::UNESCAPED_CHARS:
    case simdjson::UNCLOSED_STRING:
    case simdjson::INCOMPLETE_ARRAY_OR_OBJECT:
    case simdjson::TRAILING_CONTENT:
      return true;
    default:
      return false;
  }
}

template <class J>
J FromDom(simdjson::dom::element e);

// The object's fields, `skip` left out. The last of duplicated keys wins, as nlohmann's
// parser assigns each in turn (an ordered_json keeps the key where it first came).
template <class J>
J ObjectFromDom(simdjson::dom::object object, std::optional<std::string_view> skip) {
  J out = J::object();
  auto& fields = out.template get_ref<typename J::object_t&>();
  for (simdjson::dom::key_value_pair field : object) {
    if (field.key == skip) continue;
    if constexpr (std::is_same_v<J, json>) {
      fields.insert_or_assign(typename J::string_t(field.key), FromDom<J>(field.value));
    } else {
      fields[typename J::string_t(field.key)] = FromDom<J>(field.value);  // ordered_map: no insert_or_assign
    }
  }
  return out;
}

// Recursion is bounded by the parser's max depth (config::kMaxJsonBodyDepth).
template <class J>
J FromDom(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY: {
      simdjson::dom::array array = e.get_array().value_unsafe();
      J out = J::array();
      auto& items = out.template get_ref<typename J::array_t&>();
      items.reserve(array.size());
      for (simdjson::dom::element item : array) {
        // Token-id prompts are thousands of integers: construct those in place.
        if (item.type() == simdjson::dom::element_type::INT64 && item.get_int64().value_unsafe() >= 0) {
          items.emplace_back(static_cast<uint64_t>(item.get_int64().value_unsafe()));
        } else {
          items.push_back(FromDom<J>(item));
        }
      }
      return out;
    }
    case simdjson::dom::element_type::OBJECT:
      return ObjectFromDom<J>(e.get_object().value_unsafe(), std::nullopt);
    case simdjson::dom::element_type::INT64: {
      int64_t v = e.get_int64().value_unsafe();
      // nlohmann keeps non-negative integers unsigned (token ids check for that).
      return v >= 0 ? J(static_cast<uint64_t>(v)) : J(v);
    }
    case simdjson::dom::element_type::UINT64:
      return J(e.get_uint64().value_unsafe());
    case simdjson::dom::element_type::DOUBLE:
      return J(e.get_double().value_unsafe());
    case simdjson::dom::element_type::STRING:
      return J(typename J::string_t(e.get_string().value_unsafe()));
    case simdjson::dom::element_type::BOOL:
      return J(e.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE:
      return J(nullptr);
  }
  return J();
}

// Token ids of `e` when it is a non-empty array of integers in [0, 2^32).
bool ReadTokenIds(simdjson::dom::element e, std::vector<uint32_t>* ids) {
  simdjson::dom::array array;
  if (e.get_array().get(array) != simdjson::SUCCESS || array.size() == 0) return false;
  ids->clear();
  ids->reserve(array.size());
  for (simdjson::dom::element item : array) {
    int64_t v;
    if (item.type() != simdjson::dom::element_type::INT64 || item.get_int64().get(v) != simdjson::SUCCESS || v < 0 ||
        v > int64_t{0xffffffff}) {
      ids->clear();
      return false;
    }
    ids->push_back(static_cast<uint32_t>(v));
  }
  return true;
}

// The last field named `key` of the root object, if any.
std::optional<simdjson::dom::element> LastField(simdjson::dom::object object, std::string_view key) {
  std::optional<simdjson::dom::element> last;  // the last of repeated keys is the one nlohmann keeps
  for (simdjson::dom::key_value_pair field : object) {
    if (field.key == key) last = field.value;
  }
  return last;
}

// FromDom of the root, with `member` taken out when it is a token-id array, or `ordered`
// taken out in order (see the header).
json RootFromDom(simdjson::dom::element root, const TokenIdMember* member, const OrderedMember* ordered) {
  simdjson::dom::object object;
  if ((member == nullptr && ordered == nullptr) || root.get_object().get(object) != simdjson::SUCCESS) {
    return FromDom<json>(root);
  }
  if (ordered != nullptr) {
    std::optional<simdjson::dom::element> value = LastField(object, ordered->key);
    if (!value) return FromDom<json>(root);
    *ordered->value = FromDom<nlohmann::ordered_json>(*value);
    *ordered->taken = true;
    return ObjectFromDom<json>(object, ordered->key);
  }
  std::optional<simdjson::dom::element> value = LastField(object, member->key);
  if (!value || !ReadTokenIds(*value, member->ids)) return FromDom<json>(root);
  *member->taken = true;
  return ObjectFromDom<json>(object, member->key);
}

Result<json> ParseWithNlohmann(std::string_view body, const OrderedMember* ordered) {
  if (!JsonDepthWithin(body, config::kMaxJsonBodyDepth)) return InvalidArgument(std::string(kJsonTooDeep));
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string(kJsonInvalid));
  if (ordered != nullptr && j.is_object() && j.contains(ordered->key)) {
    // The rare bodies simdjson does not read as nlohmann does: parse once more, in order.
    nlohmann::ordered_json o = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    *ordered->value = std::move(o[std::string(ordered->key)]);
    *ordered->taken = true;
    j.erase(std::string(ordered->key));
  }
  return j;
}

Result<json> ParseWithSimdjson(simdjson::dom::parser& parser, std::string_view body, const TokenIdMember* member,
                               const OrderedMember* ordered) {
  // realloc_if_needed: simdjson reads up to SIMDJSON_PADDING bytes past the end, so it parses
  // a padded copy in its own buffer, never the caller's bytes.
  if (parser.max_depth() != static_cast<size_t>(config::kMaxJsonBodyDepth)) return ParseWithNlohmann(body, ordered);
  simdjson::dom::element root;
  simdjson::error_code error = parser.parse(body.data(), body.size(), /*realloc_if_needed=*/true).get(root);
  if (error == simdjson::SUCCESS) return RootFromDom(root, member, ordered);
  if (!RefusedByBoth(error)) return ParseWithNlohmann(body, ordered);
  // Deep garbage is "too deep" whichever error simdjson met first, as the depth check ran first.
  return InvalidArgument(std::string(JsonDepthWithin(body, config::kMaxJsonBodyDepth) ? kJsonInvalid : kJsonTooDeep));
}

simdjson::dom::parser NewParser(size_t capacity) {
  simdjson::dom::parser parser;
  // Growing later keeps this depth (parser::ensure_capacity passes max_depth() on). Out of
  // memory, the parser has another depth, and ParseWithSimdjson hands every body to nlohmann.
  if (parser.allocate(capacity, config::kMaxJsonBodyDepth) != simdjson::SUCCESS) return simdjson::dom::parser();
  return parser;
}

}  // namespace

bool JsonDepthWithin(std::string_view s, int limit) {
  int depth = 0;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i++];
    if (c == '"') {
      // Skip the string: to the next quote not escaped by an odd run of backslashes.
      for (;;) {
        const void* q = std::memchr(s.data() + i, '"', s.size() - i);
        if (q == nullptr) return true;
        size_t quote = static_cast<const char*>(q) - s.data();
        size_t backslashes = 0;
        while (quote - backslashes > i && s[quote - backslashes - 1] == '\\') ++backslashes;
        i = quote + 1;
        if (backslashes % 2 == 0) break;
      }
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

namespace {

Result<json> Parse(std::string_view body, const TokenIdMember* member, const OrderedMember* ordered) {
  if (!SimdjsonReadsAsNlohmann(body)) return ParseWithNlohmann(body, ordered);
  if (body.size() > config::kMaxPooledBodyBytes) {
    simdjson::dom::parser parser = NewParser(body.size());
    return ParseWithSimdjson(parser, body, member, ordered);
  }
  thread_local simdjson::dom::parser parser = NewParser(config::kMaxPooledBodyBytes / 16);
  return ParseWithSimdjson(parser, body, member, ordered);
}

}  // namespace

Result<json> ParseJsonBody(std::string_view body) { return Parse(body, nullptr, nullptr); }

Result<json> ParseJsonBody(std::string_view body, TokenIdMember member) {
  *member.taken = false;
  return Parse(body, &member, nullptr);
}

Result<json> ParseJsonBody(std::string_view body, OrderedMember member) {
  *member.taken = false;
  return Parse(body, nullptr, &member);
}

namespace {

// The bytes a JSON string must escape: control characters, '"' and '\\'.
constexpr std::array<bool, 256> kMustEscape = [] {
  std::array<bool, 256> table{};
  for (int c = 0; c < 0x20; ++c) table[c] = true;
  table['"'] = table['\\'] = true;
  return table;
}();

void DumpString(std::string_view s, std::string* out) {
  out->push_back('"');
  size_t run = 0;  // start of the bytes not yet written
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (!kMustEscape[c]) continue;
    out->append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default: {
        static constexpr char kHex[] = "0123456789abcdef";  // nlohmann writes lower-case hex
        const char escape[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
        out->append(escape, sizeof(escape));
      }
    }
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
}

void Dump(const json& j, std::string* out) {
  switch (j.type()) {
    case json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, value] : j.get_ref<const json::object_t&>()) {
        if (!first) out->push_back(',');
        first = false;
        DumpString(key, out);
        out->push_back(':');
        Dump(value, out);
      }
      out->push_back('}');
      return;
    }
    case json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const json& item : j.get_ref<const json::array_t&>()) {
        if (!first) out->push_back(',');
        first = false;
        Dump(item, out);
      }
      out->push_back(']');
      return;
    }
    case json::value_t::string:
      DumpString(j.get_ref<const json::string_t&>(), out);
      return;
    default:
      out->append(j.dump());  // numbers, booleans, null: nlohmann's own formats
  }
}

}  // namespace

std::string DumpJson(const json& j) {
  std::string out;
  Dump(j, &out);
  return out;
}

}  // namespace kvfleet::router
