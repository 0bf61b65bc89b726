#include "grammar/ebnf_parser.h"

#include <cctype>
#include <limits>
#include <unordered_map>

namespace kvfleet::grammar {

namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

// A recursive-descent parser; every error is positioned and the recursion is bounded.
class Parser {
 public:
  Parser(std::string_view text, int max_depth) : text_(text), max_depth_(max_depth) {}

  Result<Grammar> Run() {
    SkipSpace();
    while (pos_ < text_.size()) {
      size_t start = pos_;
      std::string name = ReadName();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (!Consume("::=")) return Error("expected '::=' after rule name '" + name + "'");
      int32_t rule = RuleIndex(name);
      if (g_.rule(rule).body >= 0 || defined_.count(name)) {
        pos_ = start;
        return Error("rule '" + name + "' is defined twice");
      }
      defined_.insert({name, true});
      auto body = ParseAlternatives(0);
      if (!body.ok()) return body.status();
      g_.SetBody(rule, *body);
      SkipSpace();
    }
    int32_t root = g_.FindRule("root");
    if (root < 0 || g_.rule(root).body < 0) return InvalidArgument("ebnf: the grammar has no rule named 'root'");
    g_.set_root(root);
    for (size_t r = 0; r < g_.num_rules(); ++r) {
      if (g_.rule(r).body < 0) {
        return InvalidArgument("ebnf: rule '" + g_.rule(r).name + "' is used at " + Where(used_at_[r]) + " but never defined");
      }
    }
    return std::move(g_);
  }

 private:
  Status Error(const std::string& what) const { return InvalidArgument("ebnf: " + what + " at " + Where(pos_)); }
  // "line L, column C" of a byte offset; computed only for an error.
  std::string Where(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  bool Consume(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  std::string ReadName() {
    if (pos_ >= text_.size() || !IsNameStart(text_[pos_])) return {};
    size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // True when a rule definition `name ::=` starts at pos_ (the current sequence ends there).
  bool AtRuleStart() {
    size_t save = pos_;
    bool yes = !ReadName().empty();
    if (yes) {
      SkipSpace();
      yes = Consume("::=");
    }
    pos_ = save;
    return yes;
  }
  int32_t RuleIndex(const std::string& name) {
    int32_t r = g_.FindRule(name);
    if (r < 0) {
      r = g_.AddRule(name);
      used_at_.push_back(pos_);
    }
    return r;
  }

  Result<int32_t> ParseAlternatives(int depth) {
    if (depth > max_depth_) return Error("groups nested deeper than " + std::to_string(max_depth_));
    std::vector<int32_t> alts;
    while (true) {
      auto seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      alts.push_back(*seq);
      SkipSpace();
      if (!Consume("|")) break;
    }
    return g_.Alt(std::move(alts));
  }

  Result<int32_t> ParseSequence(int depth) {
    std::vector<int32_t> items;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size()) break;
      char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (IsNameStart(c) && AtRuleStart()) break;
      auto item = ParsePrimary(depth);
      if (!item.ok()) return item.status();
      auto post = ParsePostfix(*item);
      if (!post.ok()) return post.status();
      items.push_back(*post);
    }
    return g_.Seq(std::move(items));
  }

  Result<int32_t> ParsePostfix(int32_t item) {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '*') { ++pos_; item = g_.Star(item); }
      else if (c == '+') { ++pos_; item = g_.Plus(item); }
      else if (c == '?') { ++pos_; item = g_.Optional(item); }
      else if (c == '{') {
        ++pos_;
        auto lo = ReadCount();
        if (!lo.ok()) return lo.status();
        int32_t hi = *lo;
        if (Consume(",")) {
          if (pos_ < text_.size() && text_[pos_] == '}') {
            hi = Expr::kUnbounded;
          } else {
            auto h = ReadCount();
            if (!h.ok()) return h.status();
            hi = *h;
          }
        }
        if (!Consume("}")) return Error("expected '}' to close a repetition");
        if (hi != Expr::kUnbounded && hi < *lo) return Error("repetition {m,n} with n < m");
        item = g_.Repeat(item, *lo, hi);
      } else {
        break;
      }
    }
    return item;
  }

  Result<int32_t> ReadCount() {
    int64_t v = 0;
    size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      v = v * 10 + (text_[pos_] - '0');
      if (v > std::numeric_limits<int32_t>::max()) return Error("repetition count too large");
      ++pos_;
    }
    if (pos_ == start) return Error("expected a number in a repetition");
    return static_cast<int32_t>(v);
  }

  Result<int32_t> ParsePrimary(int depth) {
    char c = text_[pos_];
    if (c == '"' || c == '\'') return ParseLiteral(c);
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return g_.Class({}, /*negated=*/true);
    }
    if (c == '(') {
      ++pos_;
      auto inner = ParseAlternatives(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipSpace();
      if (!Consume(")")) return Error("expected ')'");
      return *inner;
    }
    if (IsNameStart(c)) return g_.Ref(RuleIndex(ReadName()));
    return Error(std::string("unexpected character '") + c + "'");
  }

  // One escape after '\' at pos_; in a literal, \xHH is a raw byte (*raw_byte = true).
  Result<uint32_t> ParseEscape(bool in_literal, bool* raw_byte) {
    *raw_byte = false;
    if (pos_ >= text_.size()) return Error("unterminated escape");
    char c = text_[pos_++];
    auto hex = [&](int n) -> Result<uint32_t> {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_]))) {
          return Error("expected " + std::to_string(n) + " hex digits");
        }
        char h = text_[pos_++];
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      if (v > 0x10FFFF) return Error("codepoint beyond U+10FFFF");
      return v;
    };
    switch (c) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case 'x': *raw_byte = in_literal; return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return static_cast<uint32_t>(c);
      default: --pos_; return Error(std::string("unknown escape '\\") + c + "'");
    }
  }

  // The UTF-8 codepoint at pos_ (source text is taken as UTF-8; invalid bytes pass as-is).
  uint32_t ReadCodepoint() {
    auto b = static_cast<uint8_t>(text_[pos_]);
    int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (pos_ + n > text_.size()) n = 1;
    uint32_t v = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < n; ++k) v = (v << 6) | (static_cast<uint8_t>(text_[pos_ + k]) & 0x3F);
    pos_ += n;
    return v;
  }

  Result<int32_t> ParseLiteral(char quote) {
    ++pos_;
    std::string bytes;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') return Error("unterminated string literal");
      char c = text_[pos_];
      if (c == quote) { ++pos_; break; }
      if (c == '\\') {
        ++pos_;
        bool raw = false;
        auto cp = ParseEscape(/*in_literal=*/true, &raw);
        if (!cp.ok()) return cp.status();
        if (raw) bytes += static_cast<char>(*cp); else AppendUtf8(*cp, &bytes);
      } else {
        bytes += c;
        ++pos_;
      }
    }
    return g_.Bytes(std::move(bytes));
  }

  Result<int32_t> ParseClass() {
    ++pos_;
    bool negated = Consume("^");
    std::vector<CodepointRange> ranges;
    auto one = [&]() -> Result<uint32_t> {
      if (pos_ >= text_.size()) return Error("unterminated character class");
      if (text_[pos_] == '\\') {
        ++pos_;
        bool raw;
        return ParseEscape(/*in_literal=*/false, &raw);
      }
      return ReadCodepoint();
    };
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') return Error("unterminated character class");
      if (text_[pos_] == ']') { ++pos_; break; }
      auto lo = one();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        auto h = one();
        if (!h.ok()) return h.status();
        hi = *h;
        if (hi < *lo) return Error("character range out of order");
      }
      ranges.push_back({*lo, hi});
    }
    return g_.Class(std::move(ranges), negated);
  }

  std::string_view text_;
  int max_depth_;
  size_t pos_ = 0;
  Grammar g_;
  std::unordered_map<std::string, bool> defined_;
  std::vector<size_t> used_at_;  // where each rule was first named
};

}  // namespace

Result<Grammar> ParseEbnf(std::string_view text, int max_depth) { return Parser(text, max_depth).Run(); }

}  // namespace kvfleet::grammar
