// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT) used by pre-tokenizers, normalizers
// and decoders, matching the way the JavaScript reference runs the same tokenizer.json.
//
// tokenizer.json patterns are Oniguruma syntax (the Rust library's engine). The JS
// reference rewrites them; FromTokenizerJson applies the same rewrites so both agree:
//   - \s and \S mean Unicode White_Space (not Perl's space class);
//   - (?i:...) folds ASCII letters only.
// Matching iterates like JS's matchAll with the "gu" flags: after an empty match the
// search resumes one code point further.
//
// Thread safety: immutable after construction; Find* may run on many threads at once
// (each call uses thread-local match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvfleet::tok {

class Regex {
 public:
  // `pattern` is PCRE2 syntax.
  static Result<std::shared_ptr<const Regex>> Compile(std::string_view pattern);
  // `pattern` is a tokenizer.json (Oniguruma) pattern; see the rewrites above.
  static Result<std::shared_ptr<const Regex>> FromTokenizerJson(std::string_view pattern);
  // The PCRE2 pattern FromTokenizerJson compiles for `pattern`.
  static Result<std::string> RewriteOniguruma(std::string_view pattern);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end) for every match in `text`, left to right, as JS matchAll does.
  // Fails only when PCRE2 runs out of its match limits on hostile input.
  // REQUIRES: text is valid UTF-8.
  template <typename Fn>
  Status ForEachMatch(std::string_view text, Fn&& fn) const {
    size_t pos = 0;
    std::pair<size_t, size_t> m;
    while (pos <= text.size()) {
      int rc = NextMatch(text, pos, &m);
      if (rc < 0) return MatchError(rc);
      if (rc == 0) break;
      fn(m.first, m.second);
      if (m.second > m.first) {
        pos = m.second;
      } else {
        // An empty match: move one code point on (JS "u" flag semantics).
        pos = m.second;
        if (pos >= text.size()) break;
        ++pos;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
    return Status::Ok();
  }

  // text with every match replaced by `replacement` (taken literally).
  Result<std::string> ReplaceAll(std::string_view text, std::string_view replacement) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  // 1 and the first match at or after `start`; 0 when there is none; a PCRE2 error (< 0).
  int NextMatch(std::string_view text, size_t start, std::pair<size_t, size_t>* match) const;
  Status MatchError(int rc) const;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace kvfleet::tok
