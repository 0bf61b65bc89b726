#include "tokenizer/unicode.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include <utf8proc.h>

namespace kvfleet::tok {

namespace {

// The WHATWG UTF-8 decoder: the bounds of the byte after a lead byte, and how many
// continuation bytes follow. need = 0 marks an invalid lead byte.
struct LeadInfo {
  int need;
  unsigned char lower;
  unsigned char upper;
};

inline LeadInfo InfoOf(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b >= 0xE0 && b <= 0xEF) return {2, static_cast<unsigned char>(b == 0xE0 ? 0xA0 : 0x80),
                                      static_cast<unsigned char>(b == 0xED ? 0x9F : 0xBF)};
  if (b >= 0xF0 && b <= 0xF4) return {3, static_cast<unsigned char>(b == 0xF0 ? 0x90 : 0x80),
                                      static_cast<unsigned char>(b == 0xF4 ? 0x8F : 0xBF)};
  return {0, 0, 0};
}

// Length of the well-formed sequence at p[i], or 0 with *bad set to the bytes that one
// U+FFFD replaces.
inline size_t SequenceAt(const unsigned char* p, size_t n, size_t i, size_t* bad) {
  LeadInfo info = InfoOf(p[i]);
  if (info.need == 0) {
    *bad = 1;
    return 0;
  }
  size_t j = i + 1;
  unsigned char lower = info.lower, upper = info.upper;
  for (int k = 0; k < info.need; ++k, ++j) {
    if (j >= n || p[j] < lower || p[j] > upper) {
      *bad = j - i;  // the offending byte starts the next attempt
      return 0;
    }
    lower = 0x80;
    upper = 0xBF;
  }
  return j - i;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // ASCII runs eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    size_t len = SequenceAt(p, n, i, &bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string RepairUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  std::string out;
  out.reserve(n + 8);
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(static_cast<char>(p[i++]));
      continue;
    }
    size_t bad = 0;
    size_t len = SequenceAt(p, n, i, &bad);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsJsWhitespace(char32_t cp) {
  // ECMA-262 WhiteSpace (TAB, VT, FF, ZWNBSP, any Zs) and LineTerminator (LF, CR, LS, PS).
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20:
    case 0xFEFF: case 0x2028: case 0x2029:
      return true;
    default:
      return cp >= 0x80 && utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ZS;
  }
}

std::string_view TrimStartJs(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!IsJsWhitespace(NextCodePoint(s, &j))) break;
    i = j;
  }
  return s.substr(i);
}

std::string_view TrimEndJs(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t j = start;
    if (!IsJsWhitespace(NextCodePoint(s, &j))) break;
    end = start;
  }
  return s.substr(0, end);
}

bool IsAlphanumeric(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

Result<std::string> Normalize(std::string_view s, NormalForm form) {
  // ASCII is invariant under every normal form.
  bool ascii = true;
  for (unsigned char c : s) {
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) return InvalidArgument(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  // Printable Latin-1 bytes stand for themselves; the rest map to U+0100.. in byte order.
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    auto printable = [](unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    a.cp_to_byte.fill(-1);
    unsigned n = 0;
    for (unsigned b = 0; b < 256; ++b) {
      char32_t cp = printable(b) ? b : 256 + n++;
      AppendUtf8(cp, &a.byte_to_text[b]);
      a.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace kvfleet::tok
