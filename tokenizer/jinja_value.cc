#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>

#include <utf8proc.h>

#include "tokenizer/unicode.h"

namespace kvfleet::tok::jinja {

ValuePtr Undefined() {
  static const ValuePtr v = std::make_shared<Value>();
  return v;
}

ValuePtr Null() {
  static const ValuePtr v = [] {
    auto n = std::make_shared<Value>();
    n->kind = Kind::kNull;
    return n;
  }();
  return v;
}

ValuePtr Bool(bool b) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kBool;
  v->boolean = b;
  return v;
}

int64_t IntFromFloat(double d) {
  // 2^63 is exact in a double; every finite double below it and >= -2^63 fits.
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) throw RenderError("number does not fit a 64-bit integer");
  return static_cast<int64_t>(d);
}

int64_t CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}

int64_t CheckedSub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}

int64_t CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}

ValuePtr Int(int64_t i) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kInt;
  v->integer = i;
  return v;
}

ValuePtr Float(double d) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kFloat;
  v->number = d;
  return v;
}

ValuePtr Str(std::string s) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kString;
  v->str = std::move(s);
  return v;
}

ValuePtr Array(std::vector<ValuePtr> items, Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  v->items = std::move(items);
  return v;
}

ValuePtr MakeObject(std::shared_ptr<Object> o, Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  v->object = o ? std::move(o) : std::make_shared<Object>();
  return v;
}

ValuePtr Fn(Function f) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::kFunction;
  v->fn = std::move(f);
  return v;
}

bool IsArray(const Value& v) { return v.kind == Kind::kArray || v.kind == Kind::kTuple; }

bool IsObject(const Value& v) { return v.kind == Kind::kObject || v.kind == Kind::kKwargs; }

bool IsNumber(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kFloat; }

double NumberOf(const Value& v) {
  return v.kind == Kind::kInt ? static_cast<double>(v.integer) : v.kind == Kind::kFloat ? v.number : (v.boolean ? 1 : 0);
}

const char* TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "UndefinedValue";
    case Kind::kNull: return "NullValue";
    case Kind::kBool: return "BooleanValue";
    case Kind::kInt: return "IntegerValue";
    case Kind::kFloat: return "FloatValue";
    case Kind::kString: return "StringValue";
    case Kind::kArray: return "ArrayValue";
    case Kind::kTuple: return "TupleValue";
    case Kind::kObject: return "ObjectValue";
    case Kind::kKwargs: return "KeywordArgumentsValue";
    case Kind::kNamespace: return "NamespaceValue";
    case Kind::kFunction: return "FunctionValue";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: case Kind::kNull: return false;
    case Kind::kBool: return v.boolean;
    case Kind::kInt: return v.integer != 0;
    case Kind::kFloat: return v.number != 0 && !std::isnan(v.number);
    case Kind::kString: return !v.str.empty();
    case Kind::kArray: case Kind::kTuple: return !v.items.empty();
    case Kind::kObject: case Kind::kKwargs: return !v.object->entries.empty();
    case Kind::kNamespace: case Kind::kFunction: return true;
  }
  return false;
}

std::string JsNumber(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";
  if (d == std::trunc(d) && std::fabs(d) < 9e18) {  // within long long
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof(buf), static_cast<long long>(d));
    return std::string(buf, r.ptr);
  }
  if (d == std::trunc(d) && std::fabs(d) < 1e21) {
    // JS writes the shortest round-trip digits, then zeros up to the units: 2.222222222222222e19
    // is "22222222222222220000".
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    std::string sci(buf, r.ptr);
    const size_t e = sci.find('e');
    std::string digits;
    for (size_t i = 0; i < e; ++i) {
      if (sci[i] != '.' && sci[i] != '-') digits += sci[i];
    }
    const int exponent = std::stoi(sci.substr(e + 1));
    digits.resize(static_cast<size_t>(exponent) + 1, '0');
    return (d < 0 ? "-" : "") + digits;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  // to_chars writes 1e-07; JS writes 1e-7.
  size_t e = s.find('e');
  if (e != std::string::npos) {
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    char sign = '+';
    if (exp[0] == '-' || exp[0] == '+') {
      sign = exp[0];
      exp = exp.substr(1);
    }
    while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
    s = mant + "e" + sign + exp;
  }
  return s;
}

std::string JsonString(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[16];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else if (c == 0x7F && ensure_ascii) {
            out += "\\u007f";
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      continue;
    }
    size_t start = i;
    char32_t cp = NextCodePoint(s, &i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
      continue;
    }
    auto unit = [&](unsigned u) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    };
    if (cp >= 0x10000) {
      // The reference escapes each UTF-16 unit.
      cp -= 0x10000;
      unit(0xD800 + (cp >> 10));
      unit(0xDC00 + (cp & 0x3FF));
    } else {
      unit(cp);
    }
  }
  return out + "\"";
}

std::string ToJson(const Value& v, const JsonOptions& o, int depth, bool undefined_to_null) {
  std::string item_sep, key_sep;
  if (o.separators) {
    item_sep = o.separators->first;
    key_sep = o.separators->second;
  } else if (o.indent && *o.indent) {
    item_sep = ",";
    key_sep = ": ";
  } else {
    item_sep = ", ";
    key_sep = ": ";
  }
  switch (v.kind) {
    case Kind::kNull: return "null";
    case Kind::kUndefined: return undefined_to_null ? "null" : "undefined";
    case Kind::kInt: return std::to_string(v.integer);
    case Kind::kFloat: return std::isfinite(v.number) ? JsNumber(v.number) : "null";
    case Kind::kBool: return v.boolean ? "true" : "false";
    case Kind::kString: return JsonString(v.str, o.ensure_ascii);
    case Kind::kArray: case Kind::kTuple: case Kind::kObject: case Kind::kKwargs: case Kind::kNamespace: {
      bool indented = o.indent && *o.indent;
      std::string indent_unit = indented ? std::string(static_cast<size_t>(std::max<int64_t>(0, *o.indent)), ' ') : "";
      std::string base = "\n";
      for (int i = 0; i < depth; ++i) base += indent_unit;
      std::string child = base + indent_unit;
      std::vector<std::string> core;
      if (IsArray(v)) {
        for (const auto& x : v.items) core.push_back(ToJson(*x, o, depth + 1, undefined_to_null));
        std::string out = "[";
        if (indented && !core.empty()) {
          out += child;
          for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep + child : "") + core[i];
          return out + base + "]";
        }
        for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
        return out + "]";
      }
      auto entries = v.object->entries;
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      for (const auto& [k, x] : entries) {
        std::string e = JsonString(k, o.ensure_ascii) + key_sep + ToJson(*x, o, depth + 1, undefined_to_null);
        core.push_back(indented ? child + e : e);
      }
      std::string out = "{";
      for (size_t i = 0; i < core.size(); ++i) out += (i ? item_sep : "") + core[i];
      return out + (indented && !core.empty() ? base : "") + "}";
    }
    case Kind::kFunction:
      throw RenderError("cannot convert a function to JSON");
  }
  return "";
}

std::string Display(const Value& v) {
  switch (v.kind) {
    case Kind::kBool: return v.boolean ? "true" : "false";
    case Kind::kInt: return std::to_string(v.integer);
    case Kind::kFloat:
      if (v.number == 0 && std::signbit(v.number)) return "-0.0";
      if (std::isfinite(v.number) && v.number == std::trunc(v.number)) return JsNumber(v.number) + ".0";
      return JsNumber(v.number);
    case Kind::kString: return v.str;
    case Kind::kArray: case Kind::kTuple: case Kind::kObject: case Kind::kKwargs: case Kind::kNamespace:
      return ToJson(v, {}, 0, false);
    default:
      throw RenderError(std::string("cannot output a ") + TypeName(v));
  }
}

std::string RawString(const Value& v) {
  switch (v.kind) {
    case Kind::kString: return v.str;
    case Kind::kInt: return std::to_string(v.integer);
    case Kind::kFloat: return JsNumber(v.number);
    case Kind::kBool: return v.boolean ? "true" : "false";
    default: throw RenderError(std::string("cannot concatenate a ") + TypeName(v));
  }
}

bool LooseEquals(const Value& a, const Value& b) {
  bool a_nullish = a.kind == Kind::kUndefined || a.kind == Kind::kNull;
  bool b_nullish = b.kind == Kind::kUndefined || b.kind == Kind::kNull;
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.str == b.str;
  auto scalar = [](const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kFloat || v.kind == Kind::kBool || v.kind == Kind::kString; };
  if (scalar(a) && scalar(b)) {
    auto num = [](const Value& v) {
      if (v.kind != Kind::kString) return NumberOf(v);
      std::string_view s = TrimEndJs(TrimStartJs(v.str));
      if (s.empty()) return 0.0;
      double d = 0;
      auto r = std::from_chars(s.data(), s.data() + s.size(), d);
      return r.ec == std::errc() && r.ptr == s.data() + s.size() ? d : std::nan("");
    };
    return num(a) == num(b);
  }
  if (a.kind == Kind::kFunction || b.kind == Kind::kFunction) return &a == &b;
  return &a == &b || (IsArray(a) && IsArray(b) && a.items.empty() && b.items.empty() && &a == &b) ||
         (a.object && a.object == b.object);
}

bool StrictEquals(const Value& a, const Value& b) {
  if (a.kind == Kind::kString || b.kind == Kind::kString) return a.kind == b.kind && a.str == b.str;
  if (IsNumber(a) && IsNumber(b)) return NumberOf(a) == NumberOf(b);
  if (a.kind == Kind::kBool && b.kind == Kind::kBool) return a.boolean == b.boolean;
  if (a.kind != b.kind) return false;
  if (a.kind == Kind::kNull || a.kind == Kind::kUndefined) return true;
  return &a == &b || (a.object && a.object == b.object);
}

ValuePtr FromJson(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return Null();
    case json::value_t::boolean: return Bool(j.get<bool>());
    case json::value_t::number_integer: return Int(j.get<int64_t>());
    case json::value_t::number_unsigned: return Int(static_cast<int64_t>(j.get<uint64_t>()));
    case json::value_t::number_float: {
      double d = j.get<double>();
      // JSON.parse gives integral numbers; the reference treats them as integers.
      if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9e15) return Int(static_cast<int64_t>(d));
      return Float(d);
    }
    case json::value_t::string: return Str(j.get<std::string>());
    case json::value_t::array: {
      std::vector<ValuePtr> items;
      for (const auto& x : j) items.push_back(FromJson(x));
      return Array(std::move(items));
    }
    case json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->entries.emplace_back(it.key(), FromJson(it.value()));
      return MakeObject(std::move(o));
    }
    default:
      return Undefined();
  }
}

size_t Utf16Length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) n += NextCodePoint(s, &i) >= 0x10000 ? 2 : 1;
  return n;
}

std::vector<std::string> CodePoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    NextCodePoint(s, &i);
    out.emplace_back(s.substr(b, i - b));
  }
  return out;
}

std::string MapCase(std::string_view s, bool upper) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    char32_t cp = NextCodePoint(s, &i);
    auto m = upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(cp));
    AppendUtf8(static_cast<char32_t>(m), &out);
  }
  return out;
}

std::string TitleCase(std::string_view s) {
  std::string out(s);
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < out.size(); ++i) {
    if (word(out[i]) && (i == 0 || !word(out[i - 1]))) out[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[i])));
  }
  return out;
}

std::vector<std::string> SplitString(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t last = 0;
  for (size_t pos = s.find(sep); pos != std::string::npos; pos = s.find(sep, last)) {
    out.push_back(s.substr(last, pos - last));
    last = pos + sep.size();
  }
  out.push_back(s.substr(last));
  return out;
}

std::vector<ValuePtr> Slice(const std::vector<ValuePtr>& a, std::optional<int64_t> start, std::optional<int64_t> stop,
                            int64_t step) {
  int64_t n = static_cast<int64_t>(a.size());
  std::vector<ValuePtr> out;
  if (step == 0) throw RenderError("slice step cannot be zero");
  int64_t b, e;
  if (step > 0) {
    b = start ? (*start < 0 ? std::max<int64_t>(n + *start, 0) : std::min(*start, n)) : 0;
    e = stop ? (*stop < 0 ? std::max<int64_t>(n + *stop, 0) : std::min(*stop, n)) : n;
    for (int64_t i = b; i < e; i = e - i > step ? i + step : e) out.push_back(a[i]);  // no overflow past e
  } else {
    b = start ? (*start < 0 ? std::max<int64_t>(n + *start, -1) : std::min(*start, n - 1)) : n - 1;
    e = stop ? (*stop < -1 ? std::max<int64_t>(n + *stop, -1) : std::min(*stop, n - 1)) : -1;
    for (int64_t i = b; i > e; i += step) out.push_back(a[i]);  // i >= 0: cannot overflow
  }
  return out;
}

std::string StrftimeNow(const std::string& format) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  static const char* kShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static const char* kLong[] = {"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"};
  auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    char c = format[++i];
    switch (c) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += pad2(tm.tm_mon + 1); break;
      case 'd': out += pad2(tm.tm_mday); break;
      case 'b': out += kShort[tm.tm_mon]; break;
      case 'B': out += kLong[tm.tm_mon]; break;
      case 'H': out += pad2(tm.tm_hour); break;
      case 'M': out += pad2(tm.tm_min); break;
      case '%': out += '%'; break;
      default: out += '%'; out += c;
    }
  }
  return out;
}

}  // namespace kvfleet::tok::jinja
