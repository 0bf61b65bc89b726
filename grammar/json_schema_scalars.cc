// JSON Schema scalars: strings (length, pattern, format), integers and numbers with exact
// bounds (digit-range construction), additional-property keys, and the generic JSON rules.
#include <cmath>
#include <map>

#include "grammar/json_schema_internal.h"

namespace kvfleet::grammar {

namespace {

// Bounds beyond this are refused: the digit construction works on int64.
constexpr double kMaxBound = 1e18;

// RFC 3339 and RFC 3986 shapes, as ECMAScript regexes over the string's characters. Day
// numbers are not checked against their month; leap seconds (60) are allowed.
const std::map<std::string, std::string, std::less<>> kFormats = {
    {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"},
    {"time", R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"date-time", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"email", R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+)"},
    {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
    {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
};

std::string Ipv6Pattern() {
  const std::string h = "[0-9a-fA-F]{1,4}";
  const std::string v4 = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})";
  const std::string ls32 = "(" + h + ":" + h + "|" + v4 + ")";
  auto upto = [&](int n) { return "((" + h + ":){0," + std::to_string(n) + "}" + h + ")?"; };
  // RFC 3986 section 3.2.2, IPv6address.
  return "(" + h + ":){6}" + ls32 + "|::(" + h + ":){5}" + ls32 + "|(" + h + ")?::(" + h + ":){4}" + ls32 + "|" +
         upto(1) + "::(" + h + ":){3}" + ls32 + "|" + upto(2) + "::(" + h + ":){2}" + ls32 + "|" + upto(3) + "::" +
         h + ":" + ls32 + "|" + upto(4) + "::" + ls32 + "|" + upto(5) + "::" + h + "|" + upto(6) + "::";
}

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<uint8_t>(s[i]);
    int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (i + n > s.size()) n = 1;
    uint32_t v = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    out.push_back(v);
    i += n;
  }
  return out;
}

}  // namespace

// Strings, numbers and integers are inlined where they are used rather than made rules:
// a token that ends a string and goes on (`",`, `"}`) then stays inside the caller's rule,
// and the token cache can decide it without the stack below (XGrammar inlines likewise).
int32_t SchemaCompiler::AnyString() {
  int32_t escape = g_.Seq({Lit("\\"), g_.Alt({g_.Class({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'},
                                                         {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                               g_.Seq({Lit("u"), g_.Repeat(g_.Class({{'0', '9'}, {'A', 'F'}, {'a', 'f'}}), 4, 4)})})});
  int32_t ch = g_.Alt({g_.Class({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negated=*/true), escape});
  return g_.Seq({Lit("\""), g_.Star(ch), Lit("\"")});
}

int32_t SchemaCompiler::AnyInteger() { return IntegerRange(std::nullopt, std::nullopt, /*negative_zero=*/false); }

int32_t SchemaCompiler::AnyNumber() {
  int32_t digits = g_.Plus(g_.Class({{'0', '9'}}));
  // "-0" only as the integer part of a number ("-0.5"): alone it is an integer no serializer writes.
  return g_.Seq({IntegerRange(std::nullopt, std::nullopt, /*negative_zero=*/true), g_.Optional(g_.Seq({Lit("."), digits})),
                 g_.Optional(g_.Seq({g_.Class({{'e', 'e'}, {'E', 'E'}}), g_.Optional(g_.Class({{'+', '+'}, {'-', '-'}})),
                                     g_.Plus(g_.Class({{'0', '9'}}))}))});
}

int32_t SchemaCompiler::AnyValue() {
  if (any_value_ >= 0) return g_.Ref(any_value_);
  any_value_ = g_.AddRule(g_.FreshName(options_.rule_prefix + "value"));
  int32_t obj = g_.AddRule(g_.FreshName(options_.rule_prefix + "any-object"));
  int32_t arr = g_.AddRule(g_.FreshName(options_.rule_prefix + "any-array"));
  int32_t pair = g_.Seq({AnyString(), Punct(":"), g_.Ref(any_value_)});
  g_.SetBody(obj, g_.Seq({Punct("{"), g_.Optional(g_.Seq({pair, g_.Star(g_.Seq({Punct(","), g_.Seq({AnyString(), Punct(":"), g_.Ref(any_value_)})}))})), Punct("}")}));
  g_.SetBody(arr, g_.Seq({Punct("["), g_.Optional(g_.Seq({g_.Ref(any_value_), g_.Star(g_.Seq({Punct(","), g_.Ref(any_value_)}))})), Punct("]")}));
  g_.SetBody(any_value_, g_.Alt({g_.Ref(obj), g_.Ref(arr), AnyString(), AnyNumber(), Lit("true"), Lit("false"), Lit("null")}));
  return g_.Ref(any_value_);
}

// Equal-length decimal strings lo <= hi: the strings of that length between them.
static int32_t SameLength(Grammar* g, const std::string& lo, const std::string& hi) {
  if (lo == hi) return g->Bytes(lo);
  size_t p = 0;
  while (lo[p] == hi[p]) ++p;
  if (p > 0) return g->Seq({g->Bytes(lo.substr(0, p)), SameLength(g, lo.substr(p), hi.substr(p))});
  size_t rest = lo.size() - 1;
  auto any_digits = [&] { return g->Repeat(g->Class({{'0', '9'}}), static_cast<int32_t>(rest), static_cast<int32_t>(rest)); };
  auto cls = [&](char a, char b) { return g->Class({{static_cast<uint32_t>(a), static_cast<uint32_t>(b)}}); };
  if (rest == 0) return cls(lo[0], hi[0]);
  bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
  bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
  char mid_lo = lo_zeros ? lo[0] : static_cast<char>(lo[0] + 1);
  char mid_hi = hi_nines ? hi[0] : static_cast<char>(hi[0] - 1);
  std::vector<int32_t> alts;
  if (!lo_zeros) alts.push_back(g->Seq({cls(lo[0], lo[0]), SameLength(g, lo.substr(1), std::string(rest, '9'))}));
  if (mid_lo <= mid_hi) alts.push_back(g->Seq({cls(mid_lo, mid_hi), any_digits()}));
  if (!hi_nines) alts.push_back(g->Seq({cls(hi[0], hi[0]), SameLength(g, std::string(rest, '0'), hi.substr(1))}));
  return g->Alt(std::move(alts));
}

// The decimal texts (no sign, no leading zero) of [a, b]; b < 0 means no upper bound.
static int32_t NonNegativeRange(Grammar* g, int64_t a, int64_t b) {
  std::string as = std::to_string(a);
  std::vector<int32_t> alts;
  size_t max_len = b < 0 ? as.size() : std::to_string(b).size();
  int64_t pow10 = 1;
  for (size_t k = 1; k < as.size(); ++k) pow10 *= 10;  // 10^(len(a)-1)
  for (size_t len = as.size(); len <= max_len; ++len) {
    int64_t lo = std::max(a, len == 1 ? int64_t{0} : pow10);
    int64_t top = len >= 19 ? INT64_MAX : pow10 * 10 - 1;
    int64_t hi = b < 0 ? top : std::min(b, top);
    if (lo <= hi) alts.push_back(SameLength(g, std::to_string(lo), std::to_string(hi)));
    if (len < 19) pow10 *= 10;
  }
  if (b < 0) {  // longer than max_len digits: any
    alts.push_back(g->Seq({g->Class({{'1', '9'}}),
                           g->Repeat(g->Class({{'0', '9'}}), static_cast<int32_t>(max_len), Expr::kUnbounded)}));
  }
  return g->Alt(std::move(alts));
}

int32_t SchemaCompiler::IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi, bool negative_zero) {
  std::vector<int32_t> alts;
  if (!hi || *hi >= 0) alts.push_back(NonNegativeRange(&g_, lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1));
  if (!lo || *lo < 0) {
    int64_t a = hi ? std::max<int64_t>(-*hi, 1) : 1;
    alts.push_back(g_.Seq({Lit("-"), NonNegativeRange(&g_, a, lo ? -*lo : -1)}));
  }
  if (negative_zero && (!lo || *lo <= 0) && (!hi || *hi >= 0)) alts.push_back(Lit("-0"));
  return g_.Alt(std::move(alts));
}

Result<int32_t> SchemaCompiler::Integer(const Json& s, const std::string& path) {
  std::optional<int64_t> lo, hi;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!s.contains(key)) continue;
    const Json& v = s[key];
    if (!v.is_number()) return Error(PointerAppend(path, key), std::string(key) + " must be a number");
    double d = v.get<double>();
    if (std::fabs(d) > kMaxBound) return Unsupported(path, key, "integer bounds beyond 10^18");
    std::string k = key;
    if (k == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(d)));
    if (k == "exclusiveMinimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(d)) + 1);
    if (k == "maximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(d)));
    if (k == "exclusiveMaximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(d)) - 1);
  }
  if (!lo && !hi) return AnyInteger();
  if (lo && hi && *lo > *hi) return Error(path, "no integer lies within the bounds");
  return IntegerRange(lo, hi, /*negative_zero=*/false);
}

Result<int32_t> SchemaCompiler::Number(const Json& s, const std::string& path) {
  // With integer bounds L, U, a decimal x (no exponent) satisfies them iff it is an integer
  // in range, or lies strictly between k and k+1 with L <= k and k+1 <= U.
  std::optional<int64_t> lo, hi;       // the bounds, as integers
  bool lo_strict = false, hi_strict = false;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!s.contains(key)) continue;
    const Json& v = s[key];
    if (!v.is_number()) return Error(PointerAppend(path, key), std::string(key) + " must be a number");
    double d = v.get<double>();
    if (std::fabs(d) > kMaxBound) return Unsupported(path, key, "number bounds beyond 10^18");
    if (d != std::floor(d)) return Unsupported(path, key, "a number's bounds must be integers");
    auto b = static_cast<int64_t>(d);
    std::string k = key;
    bool lower = k == "minimum" || k == "exclusiveMinimum", strict = k.starts_with("exclusive");
    if (lower && (!lo || b > *lo || (b == *lo && strict))) { lo = b; lo_strict = strict; }
    if (!lower && (!hi || b < *hi || (b == *hi && strict))) { hi = b; hi_strict = strict; }
  }
  if (!lo && !hi) return AnyNumber();
  std::vector<int32_t> alts;
  // Integers in range, optionally written with a zero fraction ("3.0").
  std::optional<int64_t> ilo = lo ? std::optional<int64_t>(*lo + (lo_strict ? 1 : 0)) : std::nullopt;
  std::optional<int64_t> ihi = hi ? std::optional<int64_t>(*hi - (hi_strict ? 1 : 0)) : std::nullopt;
  if (!ilo || !ihi || *ilo <= *ihi) {
    alts.push_back(g_.Seq({IntegerRange(ilo, ihi, /*negative_zero=*/true), g_.Optional(g_.Seq({Lit("."), g_.Plus(Lit("0"))}))}));
  }
  // Non-integers in (k, k+1) for k in [lo, hi - 1] (an absent bound: no limit).
  int32_t digit = g_.Class({{'0', '9'}});
  auto frac = [&] { return g_.Seq({Lit("."), g_.Star(digit), g_.Class({{'1', '9'}}), g_.Star(g_.Class({{'0', '9'}}))}); };
  const bool has_klo = lo.has_value(), has_khi = hi.has_value();
  const int64_t klo = lo.value_or(0), khi = hi.value_or(0) - 1;
  if (!has_klo || !has_khi || klo <= khi) {
    if (!has_khi || khi >= 0) {  // x = k.f with k >= 0
      alts.push_back(g_.Seq({NonNegativeRange(&g_, has_klo ? std::max<int64_t>(klo, 0) : 0, has_khi ? khi : -1), frac()}));
    }
    if (!has_klo || klo <= -1) {  // x = -(j.f) with j = -k-1 >= 0
      int64_t jlo = has_khi ? std::max<int64_t>(-khi - 1, 0) : 0;
      alts.push_back(g_.Seq({Lit("-"), NonNegativeRange(&g_, jlo, has_klo ? -klo - 1 : -1), frac()}));
    }
  }
  if (alts.empty()) return Error(path, "no number lies within the bounds");
  return g_.Alt(std::move(alts));
}

Result<int32_t> SchemaCompiler::Format(const std::string& format, const std::string& path) {
  std::string pattern;
  if (format == "ipv6") {
    pattern = Ipv6Pattern();
  } else if (auto it = kFormats.find(format); it != kFormats.end()) {
    pattern = it->second;
  } else {
    return Unsupported(path, "format", "format '" + format + "' is not supported");
  }
  auto e = RegexToExpr(&g_, pattern, RegexText::kJsonString, /*search=*/false, limits_);
  if (!e.ok()) return Error(PointerAppend(path, "format"), e.status().message());
  return *e;
}

Result<int32_t> SchemaCompiler::String(const Json& s, const std::string& path) {
  bool has_len = s.contains("minLength") || s.contains("maxLength");
  int32_t body;
  if (s.contains("format")) {
    if (!s["format"].is_string()) return Error(PointerAppend(path, "format"), "format must be a string");
    for (const char* k : {"minLength", "maxLength", "pattern"}) {
      if (s.contains(k)) return Unsupported(path, k, "beside 'format'");
    }
    KVF_ASSIGN_OR_RETURN(body, Format(s["format"].get<std::string>(), path));
  } else if (s.contains("pattern")) {
    if (!s["pattern"].is_string()) return Error(PointerAppend(path, "pattern"), "pattern must be a string");
    if (has_len) return Unsupported(path, s.contains("minLength") ? "minLength" : "maxLength", "beside 'pattern'");
    auto e = RegexToExpr(&g_, s["pattern"].get<std::string>(), RegexText::kJsonString, /*search=*/true, limits_);
    if (!e.ok()) return Error(PointerAppend(path, "pattern"), e.status().message());
    body = *e;
  } else if (has_len) {
    int64_t lo = 0, hi = -1;
    for (const char* k : {"minLength", "maxLength"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) return Error(PointerAppend(path, k), std::string(k) + " must be a non-negative integer");
      if (s[k].get<int64_t>() > static_cast<int64_t>(limits_.max_states)) {
        return Error(PointerAppend(path, k), "grammar too large: a length of " + std::to_string(s[k].get<int64_t>()));
      }
      (std::string(k) == "minLength" ? lo : hi) = s[k].get<int64_t>();
    }
    if (hi >= 0 && lo > hi) return Error(path, "minLength exceeds maxLength");
    body = g_.Repeat(JsonStringChar(&g_, {{0, 0x10FFFF}}), static_cast<int32_t>(lo),
                     hi < 0 ? Expr::kUnbounded : static_cast<int32_t>(hi));
  } else {
    return AnyString();
  }
  return g_.Seq({Lit("\""), body, Lit("\"")});
}

int32_t SchemaCompiler::KeyNotIn(const std::vector<std::string>& names) {
  if (names.empty()) return AnyString();
  // A trie of the names over codepoints; each node is a rule: end the key (unless a name
  // ends here), follow a child, or leave the trie with any other character.
  struct Node {
    std::map<uint32_t, int> kids;
    bool end = false;
  };
  std::vector<Node> nodes(1);
  for (const auto& name : names) {
    int cur = 0;
    for (uint32_t cp : DecodeUtf8(name)) {
      auto it = nodes[cur].kids.find(cp);
      if (it == nodes[cur].kids.end()) {
        nodes.emplace_back();
        it = nodes[cur].kids.emplace(cp, static_cast<int>(nodes.size() - 1)).first;
      }
      cur = it->second;
    }
    nodes[cur].end = true;
  }
  int32_t tail = g_.AddRule(g_.FreshName(options_.rule_prefix + "key-tail"));
  g_.SetBody(tail, g_.Seq({g_.Star(JsonStringChar(&g_, {{0, 0x10FFFF}})), Lit("\"")}));
  std::vector<int32_t> rules(nodes.size());
  for (auto& r : rules) r = g_.AddRule(g_.FreshName(options_.rule_prefix + "key"));
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<int32_t> alts;
    std::vector<CodepointRange> taken;
    if (!nodes[i].end) alts.push_back(Lit("\""));
    for (const auto& [cp, kid] : nodes[i].kids) {
      alts.push_back(g_.Seq({JsonStringChar(&g_, {{cp, cp}}), g_.Ref(rules[kid])}));
      taken.push_back({cp, cp});
    }
    auto others = NormalizeRanges(taken, /*negated=*/true);
    if (!others.empty()) alts.push_back(g_.Seq({JsonStringChar(&g_, others), g_.Ref(tail)}));
    g_.SetBody(rules[i], g_.Alt(std::move(alts)));
  }
  return g_.Seq({Lit("\""), g_.Ref(rules[0])});
}

}  // namespace kvfleet::grammar
