#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>


namespace kvfleet::tok {

namespace {

namespace config {
// JIT stack for patterns like \s+(?!\S) over long whitespace runs; PCRE2's default is 32 KiB.
constexpr size_t kJitStackMinBytes = 32 * 1024;
constexpr size_t kJitStackMaxBytes = 4 * 1024 * 1024;
}  // namespace config

// Per-thread match state: match data sized for one group, and a JIT stack.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(config::kJitStackMinBytes, config::kJitStackMaxBytes, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string PcreError(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Result<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return InvalidArgument("regex '" + std::string(pattern) + "' does not compile at offset " +
                           std::to_string(offset) + ": " + PcreError(error));
  }
  // Without JIT (an unsupported CPU) matching still works, only slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::shared_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  return std::shared_ptr<const Regex>(std::move(regex));
}

Result<std::string> Regex::RewriteOniguruma(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  std::vector<bool> fold_stack;  // ASCII folding of each open group
  bool fold = false;
  int class_depth = 0;
  for (size_t i = 0; i < p.size();) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char next = p[i + 1];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        if (class_depth > 0) return Unimplemented("regex '" + std::string(p) + "': \\S inside a character class");
        out += "\\P{White_Space}";
      } else {
        out += c;
        out += next;
      }
      i += 2;
      continue;
    }
    if (class_depth > 0) {
      if (c == '[') {
        ++class_depth;
      } else if (c == ']') {
        --class_depth;
      } else if (fold && std::isalpha(static_cast<unsigned char>(c))) {
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        ++i;
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      ++i;
      // A ']' right after '[' or '[^' is a literal.
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];
      continue;
    }
    if (c == '(') {
      fold_stack.push_back(fold);
      if (p.substr(i, 4) == "(?i:") {
        fold = true;
        out += "(?:";
        i += 4;
        continue;
      }
      if (p.substr(i, 2) == "(?" && i + 2 < p.size() && std::isalpha(static_cast<unsigned char>(p[i + 2])) &&
          p[i + 2] != 'P') {
        return Unimplemented("regex '" + std::string(p) + "': inline flags other than (?i:...)");
      }
      out += c;
      ++i;
      continue;
    }
    if (c == ')') {
      if (!fold_stack.empty()) {
        fold = fold_stack.back();
        fold_stack.pop_back();
      }
      out += c;
      ++i;
      continue;
    }
    if (fold && std::isalpha(static_cast<unsigned char>(c))) {
      out += '[';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      out += ']';
      ++i;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

Result<std::shared_ptr<const Regex>> Regex::FromTokenizerJson(std::string_view pattern) {
  KVF_ASSIGN_OR_RETURN(std::string rewritten, RewriteOniguruma(pattern));
  return Compile(rewritten);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

int Regex::NextMatch(std::string_view text, size_t start, std::pair<size_t, size_t>* match) const {
  ThreadMatchState& state = MatchState();
  auto* code = static_cast<pcre2_code*>(code_);
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, PCRE2_NO_UTF_CHECK,
                       state.data, state.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                     PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, state.data, state.context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) return rc;  // match or depth limits on hostile input
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
  match->first = ovector[0];
  match->second = ovector[1];
  return 1;
}

Status Regex::MatchError(int rc) const {
  return ResourceExhausted("regex '" + pattern_ + "' failed on this input: " + PcreError(rc));
}

Result<std::string> Regex::ReplaceAll(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t last = 0;
  KVF_RETURN_IF_ERROR(ForEachMatch(text, [&](size_t b, size_t e) {
    out.append(text.substr(last, b - last));
    out.append(replacement);
    last = e;
  }));
  out.append(text.substr(last));
  return out;
}

}  // namespace kvfleet::tok
