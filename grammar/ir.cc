#include "grammar/ir.h"

#include <algorithm>
#include <cstdio>

namespace kvfleet::grammar {

namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// The length of the UTF-8 sequence starting at s[i], or 0 when it is not valid UTF-8.
size_t Utf8Length(std::string_view s, size_t i, uint32_t* cp) {
  auto b = static_cast<uint8_t>(s[i]);
  size_t n;
  uint32_t v;
  if (b < 0x80) { *cp = b; return 1; }
  if (b >= 0xC2 && b <= 0xDF) { n = 2; v = b & 0x1F; }
  else if (b >= 0xE0 && b <= 0xEF) { n = 3; v = b & 0x0F; }
  else if (b >= 0xF0 && b <= 0xF4) { n = 4; v = b & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    auto c = static_cast<uint8_t>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > kMaxCodepoint)) || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// A codepoint as EBNF writes it inside a literal (quote = '"') or a class (quote = ']').
void AppendEscaped(uint32_t cp, char quote, std::string* out) {
  char buf[16];
  switch (cp) {
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    case '\\': *out += "\\\\"; return;
    default: break;
  }
  if (cp == static_cast<uint32_t>(quote) || (quote == ']' && (cp == '^' || cp == '-' || cp == '['))) {
    *out += '\\';
    *out += static_cast<char>(cp);
    return;
  }
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) {
    std::snprintf(buf, sizeof(buf), "\\u%04X", static_cast<unsigned>(cp));
    *out += buf;
    return;
  }
  AppendUtf8(cp, out);
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges, bool negated) {
  std::vector<CodepointRange> merged;
  for (auto& r : ranges) r.hi = std::min(r.hi, kMaxCodepoint);
  std::erase_if(ranges, [](const CodepointRange& r) { return r.lo > r.hi; });
  std::sort(ranges.begin(), ranges.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
  for (const auto& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (!negated) return merged;
  std::vector<CodepointRange> out;
  uint32_t next = 0;
  for (const auto& r : merged) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

int32_t Grammar::AddRule(std::string name) {
  rules_.push_back({std::move(name), -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

int32_t Grammar::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  }
  return -1;
}

std::string Grammar::FreshName(std::string_view base) const {
  std::string name(base);
  for (int k = 1; FindRule(name) >= 0; ++k) name = std::string(base) + "-" + std::to_string(k);
  return name;
}

int32_t Grammar::Bytes(std::string bytes) {
  Expr e;
  e.type = Expr::Type::kBytes;
  e.bytes = std::move(bytes);
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::Class(std::vector<CodepointRange> ranges, bool negated) {
  Expr e;
  e.type = Expr::Type::kClass;
  e.ranges = NormalizeRanges(std::move(ranges), negated);
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::Seq(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  Expr e;
  e.type = Expr::Type::kSeq;
  e.children = std::move(children);
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::Alt(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  Expr e;
  e.type = Expr::Type::kAlt;
  e.children = std::move(children);
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::Ref(int32_t rule) {
  Expr e;
  e.type = Expr::Type::kRef;
  e.rule = rule;
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::Repeat(int32_t child, int32_t min, int32_t max) {
  Expr e;
  e.type = Expr::Type::kRepeat;
  e.children = {child};
  e.min = min;
  e.max = max;
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

Status Grammar::CheckComplete() const {
  if (root_ < 0) return InvalidArgument("grammar has no root rule");
  for (const auto& r : rules_) {
    if (r.body < 0) return InvalidArgument("rule '" + r.name + "' is referenced but never defined");
  }
  return Status::Ok();
}

std::string Grammar::ExprToEbnf(int32_t i, int parent_precedence) const {
  const Expr& e = exprs_[i];
  std::string out;
  switch (e.type) {
    case Expr::Type::kBytes: {
      out += '"';
      for (size_t k = 0; k < e.bytes.size();) {
        uint32_t cp;
        size_t n = Utf8Length(e.bytes, k, &cp);
        if (n == 0) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(static_cast<uint8_t>(e.bytes[k])));
          out += buf;
          ++k;
        } else {
          AppendEscaped(cp, '"', &out);
          k += n;
        }
      }
      out += '"';
      return out;
    }
    case Expr::Type::kClass:
      out += '[';
      for (const auto& r : e.ranges) {
        AppendEscaped(r.lo, ']', &out);
        if (r.hi != r.lo) {
          out += '-';
          AppendEscaped(r.hi, ']', &out);
        }
      }
      if (e.ranges.empty()) return "[^\\u0000-\\U0010FFFF]";
      out += ']';
      return out;
    case Expr::Type::kRef:
      return rules_[e.rule].name;
    case Expr::Type::kSeq: {
      if (e.children.empty()) return "\"\"";
      for (size_t k = 0; k < e.children.size(); ++k) {
        if (k) out += ' ';
        out += ExprToEbnf(e.children[k], 1);
      }
      return parent_precedence > 1 ? "(" + out + ")" : out;
    }
    case Expr::Type::kAlt: {
      for (size_t k = 0; k < e.children.size(); ++k) {
        if (k) out += " | ";
        out += ExprToEbnf(e.children[k], 0);
      }
      return parent_precedence > 0 ? "(" + out + ")" : out;
    }
    case Expr::Type::kRepeat: {
      out = ExprToEbnf(e.children[0], 2);
      if (e.min == 0 && e.max == 1) return out + "?";
      if (e.min == 0 && e.max == Expr::kUnbounded) return out + "*";
      if (e.min == 1 && e.max == Expr::kUnbounded) return out + "+";
      out += "{" + std::to_string(e.min);
      if (e.max != e.min) out += "," + (e.max == Expr::kUnbounded ? std::string() : std::to_string(e.max));
      return out + "}";
    }
  }
  return out;
}

std::string Grammar::ToEbnf() const {
  std::string out;
  auto emit = [&](size_t r) {
    out += rules_[r].name + " ::= " + (rules_[r].body >= 0 ? ExprToEbnf(rules_[r].body, 0) : "\"\"") + "\n";
  };
  if (root_ >= 0) emit(root_);
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (static_cast<int32_t>(r) != root_) emit(r);
  }
  return out;
}

}  // namespace kvfleet::grammar
