// UTF-8 helpers for the tokenizer: WHATWG-style repair of invalid input, code point
// iteration, JavaScript whitespace trimming, Unicode normalization (utf8proc) and the
// GPT-2 byte-level alphabet.
//
// The reference tokenizer is JavaScript, so "whitespace" for trimming means what
// String.prototype.trim removes, and invalid UTF-8 becomes what TextDecoder makes of it.
//
// Thread safety: stateless functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvfleet::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// `s` with every maximal ill-formed subsequence replaced by U+FFFD, exactly as the
// WHATWG "utf-8 decode without BOM" (TextDecoder with fatal=false) does.
std::string RepairUtf8(std::string_view s);

// Decodes the code point at s[*i] and advances *i. REQUIRES: s is valid UTF-8, *i < size.
inline char32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *i;
  if (p[0] < 0x80) {
    *i += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *i += 2;
    return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    *i += 3;
    return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *i += 4;
  return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// Length in bytes of the UTF-8 sequence that starts with `lead`.
inline size_t Utf8Length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

void AppendUtf8(char32_t cp, std::string* out);

// ECMAScript WhiteSpace or LineTerminator: what \s matches in a JS regex and what
// trim() removes.
bool IsJsWhitespace(char32_t cp);
std::string_view TrimStartJs(std::string_view s);
std::string_view TrimEndJs(std::string_view s);

// Letters and digits (Unicode categories L* and N*), for single_word added tokens.
bool IsAlphanumeric(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// REQUIRES: s is valid UTF-8.
Result<std::string> Normalize(std::string_view s, NormalForm form);

// GPT-2's byte-level alphabet: each byte is shown as a printable code point.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_text;  // UTF-8 of the code point standing for the byte
  std::array<int16_t, 324> cp_to_byte;        // the byte a code point < 324 stands for, or -1
  // The byte a code point stands for, or -1.
  int ByteOf(char32_t cp) const { return cp < cp_to_byte.size() ? cp_to_byte[cp] : -1; }
  static const ByteLevelAlphabet& Get();
};

}  // namespace kvfleet::tok
