// Regex (the ECMAScript subset JSON Schema patterns use) -> grammar IR.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "grammar/front_ends.h"

namespace kvfleet::grammar {

namespace {

using Ranges = std::vector<CodepointRange>;

Ranges Digit() { return {{'0', '9'}}; }
Ranges Word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
// ECMAScript \s: WhiteSpace and LineTerminator.
Ranges Space() {
  return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
// ECMAScript '.': anything but a line terminator.
Ranges Dot() { return NormalizeRanges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true); }

class RegexParser {
 public:
  RegexParser(Grammar* g, std::string_view pattern, RegexText text, bool search, const Limits& limits)
      : g_(g), text_(text), search_(search), limits_(limits) {
    // Decoded up front; invalid UTF-8 bytes stand for themselves (U+0080..U+00FF).
    for (size_t i = 0; i < pattern.size();) {
      auto b = static_cast<uint8_t>(pattern[i]);
      int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
      if (i + n > pattern.size()) n = 1;
      uint32_t v = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
      for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<uint8_t>(pattern[i + k]) & 0x3F);
      cps_.push_back(v);
      i += n;
    }
  }

  Result<int32_t> Run() {
    end_ = cps_.size();
    auto e = ParseAlt(0);
    if (!e.ok()) return e.status();
    if (pos_ != end_) return Error("unbalanced ')'");
    return e;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("regex: " + what + " at offset " + std::to_string(pos_));
  }
  Status Unsupported(const std::string& feature) const {
    return InvalidArgument("regex: " + feature + " is not supported (at offset " + std::to_string(pos_) + ")");
  }
  bool More() const { return pos_ < end_; }
  uint32_t Peek() const { return cps_[pos_]; }

  // One character of `ranges`, written as the pattern's text mode asks.
  int32_t Char(Ranges ranges, bool negated = false) {
    if (text_ == RegexText::kJsonString) return JsonStringChar(g_, NormalizeRanges(std::move(ranges), negated));
    return g_->Class(std::move(ranges), negated);
  }

  // Any text, as a search's open end admits.
  int32_t AnyText() {
    Ranges all{{0, 0x10FFFF}};
    return g_->Star(text_ == RegexText::kJsonString ? JsonStringChar(g_, all) : g_->Class(all));
  }

  Result<int32_t> ParseAlt(int depth) {
    if (depth > limits_.max_nesting_depth) return Error("groups nested deeper than " + std::to_string(limits_.max_nesting_depth));
    std::vector<int32_t> alts;
    while (true) {
      // ^ and $ anchor a top-level alternative at its ends (^a$|^b$); elsewhere they are refused.
      bool anchored_start = depth == 0 && More() && Peek() == '^';
      if (anchored_start) ++pos_;
      bool anchored_end = false;
      KVF_ASSIGN_OR_RETURN(int32_t seq, ParseSeq(depth, &anchored_end));
      if (depth == 0 && search_) {
        std::vector<int32_t> parts;
        if (!anchored_start) parts.push_back(AnyText());
        parts.push_back(seq);
        if (!anchored_end) parts.push_back(AnyText());
        seq = g_->Seq(std::move(parts));
      }
      alts.push_back(seq);
      if (More() && Peek() == '|') { ++pos_; continue; }
      break;
    }
    return g_->Alt(std::move(alts));
  }

  Result<int32_t> ParseSeq(int depth, bool* anchored_end) {
    std::vector<int32_t> items;
    while (More() && Peek() != '|' && Peek() != ')') {
      if (depth == 0 && Peek() == '$' && (pos_ + 1 == end_ || cps_[pos_ + 1] == '|')) {
        ++pos_;
        *anchored_end = true;
        break;
      }
      KVF_ASSIGN_OR_RETURN(int32_t atom, ParseAtom(depth));
      KVF_ASSIGN_OR_RETURN(atom, ParseQuantifiers(atom));
      items.push_back(atom);
    }
    return g_->Seq(std::move(items));
  }

  Result<int32_t> ParseQuantifiers(int32_t atom) {
    bool quantified = false;
    while (More()) {
      uint32_t c = Peek();
      int32_t lo, hi;
      if (c == '*') { lo = 0; hi = Expr::kUnbounded; ++pos_; }
      else if (c == '+') { lo = 1; hi = Expr::kUnbounded; ++pos_; }
      else if (c == '?') { lo = 0; hi = 1; ++pos_; }
      else if (c == '{' && IsCountedQuantifier()) {
        ++pos_;
        KVF_ASSIGN_OR_RETURN(lo, ReadInt());
        hi = lo;
        if (Peek() == ',') {
          ++pos_;
          if (Peek() == '}') hi = Expr::kUnbounded;
          else { KVF_ASSIGN_OR_RETURN(hi, ReadInt()); }
        }
        ++pos_;  // '}' (IsCountedQuantifier checked the shape)
        if (hi != Expr::kUnbounded && hi < lo) return Error("quantifier {m,n} with n < m");
      } else {
        break;
      }
      if (quantified) return Error("nothing to repeat");
      quantified = true;
      atom = g_->Repeat(atom, lo, hi);
      if (More() && Peek() == '?') ++pos_;  // lazy: the same strings
    }
    return atom;
  }

  // ECMAScript reads '{' as a literal unless it starts {n}, {n,} or {n,m}.
  bool IsCountedQuantifier() const {
    size_t i = pos_ + 1, digits = 0;
    while (i < end_ && cps_[i] >= '0' && cps_[i] <= '9') { ++i; ++digits; }
    if (digits == 0 || i >= end_) return false;
    if (cps_[i] == '}') return true;
    if (cps_[i] != ',') return false;
    ++i;
    while (i < end_ && cps_[i] >= '0' && cps_[i] <= '9') ++i;
    return i < end_ && cps_[i] == '}';
  }

  Result<int32_t> ReadInt() {
    int64_t v = 0;
    while (More() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > std::numeric_limits<int32_t>::max()) return Error("grammar too large: repetition count");
      ++pos_;
    }
    return static_cast<int32_t>(v);
  }

  Result<int32_t> ParseAtom(int depth) {
    uint32_t c = Peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (More() && Peek() == '?') {
          ++pos_;
          if (!More()) return Error("unterminated group");
          uint32_t k = Peek();
          if (k == ':') {
            ++pos_;
          } else if (k == '=' || k == '!') {
            return Unsupported("lookahead");
          } else if (k == '<' && pos_ + 1 < end_ && (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!')) {
            return Unsupported("lookbehind");
          } else if (k == '<') {  // a named group: the name does not change the strings
            while (More() && Peek() != '>') ++pos_;
            if (!More()) return Error("unterminated group name");
            ++pos_;
          } else {
            return Unsupported("group flag '(?" + std::string(1, static_cast<char>(k)) + "'");
          }
        }
        KVF_ASSIGN_OR_RETURN(int32_t inner, ParseAlt(depth + 1));  // anchors inside are refused
        if (!More() || Peek() != ')') return Error("missing ')'");
        ++pos_;
        return inner;
      }
      case ')': return Error("unbalanced ')'");
      case '*': case '+': case '?': return Error("nothing to repeat");
      case '{':
        if (IsCountedQuantifier()) return Error("nothing to repeat");
        ++pos_;
        return Char({{c, c}});
      case '^': return Unsupported("anchor '^' inside the pattern");
      case '$': return Unsupported("anchor '$' inside the pattern");
      case '.': ++pos_; return Char(Dot());
      case '[': return ParseClass();
      case '\\': {
        ++pos_;
        KVF_ASSIGN_OR_RETURN(Ranges r, ParseEscape(/*in_class=*/false));
        return Char(std::move(r));
      }
      default: ++pos_; return Char({{c, c}});
    }
  }

  // The ranges of the escape after '\' (pos_ at the letter).
  Result<Ranges> ParseEscape(bool in_class) {
    if (!More()) return Error("pattern ends with '\\'");
    uint32_t c = Peek();
    ++pos_;
    auto hex = [&](int n) -> Result<uint32_t> {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (!More() || !std::isxdigit(static_cast<int>(Peek() < 128 ? Peek() : 0))) return Error("bad hex escape");
        uint32_t h = Peek();
        ++pos_;
        v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return v;
    };
    switch (c) {
      case 'd': return Digit();
      case 'D': return NormalizeRanges(Digit(), true);
      case 'w': return Word();
      case 'W': return NormalizeRanges(Word(), true);
      case 's': return Space();
      case 'S': return NormalizeRanges(Space(), true);
      case 'n': return Ranges{{'\n', '\n'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0':
        if (More() && Peek() >= '0' && Peek() <= '9') return Unsupported("octal escape");
        return Ranges{{0, 0}};
      case 'x': { KVF_ASSIGN_OR_RETURN(uint32_t v, hex(2)); return Ranges{{v, v}}; }
      case 'u': {
        KVF_ASSIGN_OR_RETURN(uint32_t v, hex(4));
        if (v >= 0xD800 && v <= 0xDFFF) return Unsupported("surrogate escape \\u" + std::to_string(v));
        return Ranges{{v, v}};
      }
      case 'b':
        if (in_class) return Ranges{{8, 8}};
        return Unsupported("word boundary assertion '\\b'");
      case 'B': return Unsupported("word boundary assertion '\\B'");
      case 'k': return Unsupported("named backreference '\\k'");
      case 'p': case 'P': return Unsupported("Unicode property escape '\\" + std::string(1, static_cast<char>(c)) + "'");
      case 'c': return Unsupported("control escape '\\c'");
      default:
        if (c >= '1' && c <= '9') return Unsupported("backreference '\\" + std::string(1, static_cast<char>(c)) + "'");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Unsupported("escape '\\" + std::string(1, static_cast<char>(c)) + "'");
        }
        return Ranges{{c, c}};  // an escaped punctuation character stands for itself
    }
  }

  Result<int32_t> ParseClass() {
    ++pos_;  // '['
    bool negated = false;
    if (More() && Peek() == '^') { negated = true; ++pos_; }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (!More()) return Error("unterminated character class");
      uint32_t c = Peek();
      if (c == ']' && !first) { ++pos_; break; }
      if (c == ']') { ++pos_; break; }  // ECMAScript: [] matches nothing, [^] anything
      first = false;
      KVF_ASSIGN_OR_RETURN(Ranges lo, ClassAtom());
      if (More() && Peek() == '-' && pos_ + 1 < end_ && cps_[pos_ + 1] != ']') {
        ++pos_;
        KVF_ASSIGN_OR_RETURN(Ranges hi, ClassAtom());
        if (lo.size() != 1 || hi.size() != 1 || lo[0].lo != lo[0].hi || hi[0].lo != hi[0].hi) {
          return Error("a class escape cannot bound a range");
        }
        if (hi[0].lo < lo[0].lo) return Error("character range out of order");
        ranges.push_back({lo[0].lo, hi[0].lo});
      } else {
        ranges.insert(ranges.end(), lo.begin(), lo.end());
      }
    }
    return Char(std::move(ranges), negated);
  }

  Result<Ranges> ClassAtom() {
    uint32_t c = Peek();
    ++pos_;
    if (c == '\\') return ParseEscape(/*in_class=*/true);
    if (c == '[' && More() && (Peek() == ':' || Peek() == '=' || Peek() == '.')) {
      return Unsupported("POSIX class '[" + std::string(1, static_cast<char>(Peek())) + "'");
    }
    return Ranges{{c, c}};
  }

  Grammar* g_;
  RegexText text_;
  bool search_;
  const Limits& limits_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

}  // namespace

Result<int32_t> RegexToExpr(Grammar* g, std::string_view pattern, RegexText text, bool search, const Limits& limits) {
  return RegexParser(g, pattern, text, search, limits).Run();
}

int32_t JsonStringChar(Grammar* g, const std::vector<CodepointRange>& ranges) {
  // Written as JSON serializers write them: raw, except '"' and '\' and the controls; at most
  // four alternatives (raw, a short escape, \u000x, \u001x) keep the automaton small.
  auto contains = [&](uint32_t cp) {
    for (const auto& r : ranges) {
      if (cp >= r.lo && cp <= r.hi) return true;
    }
    return false;
  };
  std::vector<CodepointRange> raw;
  for (const auto& r : ranges) {
    for (uint32_t lo = std::max<uint32_t>(r.lo, 0x20); lo <= r.hi;) {
      if (lo == '"' || lo == '\\') {
        ++lo;
        continue;
      }
      uint32_t hi = r.hi;
      if (lo < '"' && hi >= '"') hi = '"' - 1;
      else if (lo < '\\' && hi >= '\\') hi = '\\' - 1;
      raw.push_back({lo, hi});
      if (hi >= r.hi) break;
      lo = hi + 1;
    }
  }
  std::vector<int32_t> alts;
  if (!raw.empty()) alts.push_back(g->Class(std::move(raw)));
  const std::pair<uint32_t, char> kShort[] = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                              {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
  std::vector<CodepointRange> shorts;
  for (const auto& [cp, letter] : kShort) {
    if (contains(cp)) shorts.push_back({static_cast<uint32_t>(letter), static_cast<uint32_t>(letter)});
  }
  if (!shorts.empty()) alts.push_back(g->Seq({g->Bytes("\\"), g->Class(std::move(shorts))}));
  for (uint32_t high = 0; high < 2; ++high) {  // \u000x and \u001x, lowercase hex
    std::vector<CodepointRange> digits;
    for (uint32_t low = 0; low < 16; ++low) {
      uint32_t cp = high * 16 + low;
      if (cp == '\b' || cp == '\f' || cp == '\n' || cp == '\r' || cp == '\t' || !contains(cp)) continue;
      uint32_t d = low < 10 ? '0' + low : 'a' + low - 10;
      digits.push_back({d, d});
    }
    if (!digits.empty()) alts.push_back(g->Seq({g->Bytes(high ? "\\u001" : "\\u000"), g->Class(std::move(digits))}));
  }
  if (alts.empty()) return g->Class({});
  return g->Alt(std::move(alts));
}

}  // namespace kvfleet::grammar
