// Request bodies as nlohmann::json, parsed by simdjson: the value nlohmann::json::parse would
// give (same values, same number types, the last of duplicated keys), at a tenth of its cost
// for long prompts, whose strings nlohmann's lexer copies a character at a time.
//
// simdjson builds its DOM; a small converter makes the nlohmann value from it (one copy per
// string). Where the two libraries read the same bytes differently, the body goes to
// nlohmann itself, so the result never depends on which parser ran:
//   - integers past 64 bits (nlohmann: a double; simdjson: an error), and every number
//     simdjson refuses (so 1e400 gets nlohmann's verdict too);
//   - "-0" (nlohmann: a signed integer; simdjson: indistinguishable from 0);
//   - a NUL byte (nlohmann ends the input there) and a leading UTF-8 byte order mark
//     (nlohmann skips it).
//
// Thread safety: thread-safe; each thread keeps its own simdjson parser (its buffers grow to
// the largest body that thread parsed, up to config::kMaxPooledBodyBytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvfleet::router {

namespace config {
// Deeper bodies are refused before nlohmann sees them, so no body can exhaust the stack of
// its recursive parser, destructor or dump. OpenAI bodies nest at most about 6 deep.
inline constexpr int kMaxJsonBodyDepth = 64;
// Bodies up to this size reuse their thread's simdjson parser (about 15x the body in
// buffers); a larger one gets a parser of its own, so a rare huge body pins no memory.
inline constexpr size_t kMaxPooledBodyBytes = size_t{1} << 20;
}  // namespace config

// The messages of a refused body, as ParseCompletionRequest reports them.
inline constexpr std::string_view kJsonTooDeep = "the JSON body is nested too deeply";
inline constexpr std::string_view kJsonInvalid = "the body is not valid JSON";

// True when no bracket outside strings opens deeper than `limit`. Counts raw bytes, valid
// JSON or not, so deep garbage is "too deep" rather than "invalid".
bool JsonDepthWithin(std::string_view body, int limit);

// Parses `body` as JsonDepthWithin(body, kMaxJsonBodyDepth) then nlohmann::json::parse(body)
// would: InvalidArgument(kJsonTooDeep) or InvalidArgument(kJsonInvalid), or the value.
Result<nlohmann::json> ParseJsonBody(std::string_view body);

// A top-level member to take out as token ids. An 8K-token prompt as 8K nlohmann values
// costs ~200 µs to build, check and free; read straight from simdjson's DOM it costs ~10.
struct TokenIdMember {
  std::string_view key;             // e.g. "prompt"
  std::vector<uint32_t>* ids;       // filled when taken
  bool* taken;                      // whether it was
};

// ParseJsonBody, except that when the body is an object whose `member.key` (the last one,
// if repeated) is a non-empty array of integers in [0, 2^32), its values go to *member.ids,
// *member.taken is set and the key is left out of the returned object. Otherwise (any
// other value, or a body nlohmann parses itself) the result is ParseJsonBody's and
// *member.taken is false.
Result<nlohmann::json> ParseJsonBody(std::string_view body, TokenIdMember member);

// A top-level member to take out with its objects' keys in the body's order (a chat's
// messages: a template that iterates a message, or writes one as JSON, sees the client's
// order, as with Python's json). nlohmann::json sorts keys.
struct OrderedMember {
  std::string_view key;            // e.g. "messages"
  nlohmann::ordered_json* value;   // filled when taken
  bool* taken;                     // whether it was
};
// ParseJsonBody, except that when the body is an object with `member.key` (the last one,
// if repeated), its value goes to *member.value in order, *member.taken is set and the key
// is left out of the returned object.
Result<nlohmann::json> ParseJsonBody(std::string_view body, OrderedMember member);

// The text j.dump() gives (compact, object keys in order, nlohmann's escapes and number
// formats), writing strings a run of plain bytes at a time instead of through nlohmann's
// per-byte UTF-8 decoder. REQUIRES: every string in `j` is valid UTF-8 (true of whatever
// ParseJsonBody returns); nlohmann would throw where this copies the bytes through.
std::string DumpJson(const nlohmann::json& j);

}  // namespace kvfleet::router
