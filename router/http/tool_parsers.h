// Tool calls out of a model's text, in the formats the model families write them:
//   - llama3_json (Llama 3.1/3.2/3.3): the answer is a JSON object {"name", "parameters"},
//     optionally after <|python_tag|>; several are separated by ";".
//   - hermes (Qwen2.5, Qwen3, Hermes): <tool_call>{"name", "arguments"}</tool_call>, any
//     number, text before them is content.
//   - mistral: [TOOL_CALLS][{"name", "arguments"}, ...] (tokenizers before v11: Mistral 7B
//     v0.3), or [TOOL_CALLS]name[ARGS]{...} per call, optionally name[CALL_ID]id[ARGS]{...}
//     (v11+: Mistral Small 3.1+, Devstral, Magistral). The form is what follows [TOOL_CALLS]:
//     '[' or '{' the JSON one, a name the other.
// vLLM's parsers of the same names (vllm/entrypoints/openai/tool_parsers/) are the
// reference for what counts as a call; this is kvfleet's own streaming implementation.
//
// ToolCallStream takes the text as it is decoded and returns what can go out now: content
// (text that is not part of a call; a tail that may still become a call marker is held
// back) and call deltas in OpenAI's streaming shape (the first delta of a call carries its
// index, id and name with empty arguments, later ones argument fragments). Arguments stream
// as the model wrote them (the JSON text of the value), so the fragments of a call join to
// valid JSON once it ends; a string value ("arguments": "{...}") is decoded first. The whole
// answer (ParseToolCalls) is the same machine fed at once, so streamed and whole answers agree.
//
// Bounded: every byte is scanned once; the held-back text is at most a marker's length,
// except inside a call whose name has not ended (its text up to the name; a v11 name is at
// most 64 bytes, its call id as long).
//
// Thread safety: a ToolCallStream belongs to one choice of one request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "router/http/json_scan.h"

namespace kvfleet::router {

enum class ToolParserKind : uint8_t { kNone, kLlama3Json, kHermes, kMistral };

// "none", "llama3_json", "hermes", "mistral" (vLLM's names); InvalidArgument otherwise.
Result<ToolParserKind> ToolParserFromName(std::string_view name);
std::string_view ToolParserName(ToolParserKind kind);
// The parser a chat template's calls are written for (the markers it renders), or kNone.
ToolParserKind DetectToolParser(std::string_view chat_template);
// The special tokens the parser's markers are (mistral's [TOOL_CALLS], [ARGS], [CALL_ID]),
// which a decoder that hides special tokens must show; empty: none needed.
std::vector<std::string_view> ToolParserSpecialTokens(ToolParserKind kind);

// "call_" and 24 random letters and digits, as OpenAI's ids look.
std::string NewToolCallId();
// 9 random letters and digits: Mistral's chat templates refuse any other call id when the
// call comes back in the next turn (mistral-common's rule; vLLM's mistral parser gives these).
std::string NewMistralToolCallId();

struct ToolCallDelta {
  uint32_t index = 0;
  std::string id;         // first delta of a call only
  std::string name;       // first delta of a call only
  std::string arguments;  // a fragment ("" on the first delta)
  bool first = false;
};

struct ToolStreamOut {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class ToolCallStream {
 public:
  // max_calls: calls past this many are dropped with their text (parallel_tool_calls false: 1).
  // new_id: each call's id (tests pass a counter).
  ToolCallStream(ToolParserKind kind, uint32_t max_calls = UINT32_MAX,
                 std::function<std::string()> new_id = NewToolCallId);
  // The calls of a forced "required" answer (ForcedCallSchema's array of {"name",
  // "parameters"}, no marker before it); text after the array is content.
  static ToolCallStream ForcedArray(uint32_t max_calls, std::function<std::string()> new_id = NewToolCallId);
  ToolStreamOut Push(std::string_view text);
  // The end of the text: what was held back, as content when it never became a call.
  ToolStreamOut Finish();
  uint32_t calls() const { return calls_; }  // calls begun (their header went out)

 // True when a call's text turned out malformed (its text went out as content).
  bool broken() const { return broken_; }
  // True when the text ended inside a call (Finish closed it as it was).
  bool unfinished() const { return unfinished_; }

 private:
  // kCall scans a JSON call object; kName and kRawArgs are mistral's v11 form (the name and
  // what comes before '{', then the arguments object as written).
  enum class State : uint8_t { kText, kCall, kName, kRawArgs, kAfterCall, kDone };
  // Each step consumes what it can; true: the state changed, run the next.
  void Run(ToolStreamOut* out, bool final);
  bool RunText(ToolStreamOut* out, bool final);
  bool RunCall(ToolStreamOut* out);
  bool RunName(ToolStreamOut* out, bool final);
  bool RunRawArgs(ToolStreamOut* out);
  // A call's name was read: its header goes out (unless past max_calls).
  void BeginCall(ToolStreamOut* out, std::string name);
  bool RunAfterCall(ToolStreamOut* out, bool final);
  bool GiveUp(ToolStreamOut* out);
  void EmitContent(ToolStreamOut* out, std::string_view text, bool final);
  void EmitArguments(ToolStreamOut* out);
  void StartCall();

  ToolParserKind kind_;
  uint32_t max_calls_;
  std::function<std::string()> new_id_;
  State state_ = State::kText;
  std::string buf_;           // text not yet consumed
  std::string call_marker_;   // the marker the current call came after (given back if it is no call)
  std::string held_ws_;       // whitespace after a call: dropped unless text follows
  bool at_start_ = true;      // llama3_json: nothing but whitespace so far
  bool mistral_open_ = false; // mistral: [TOOL_CALLS] read, its '[' not yet
  bool in_array_ = false;     // mistral: inside [TOOL_CALLS][ ... ]
  bool forced_array_ = false; // ForcedArray: the array without a marker, "parameters" only
  JsonEndScanner raw_;        // kRawArgs: where the arguments object ends
  bool raw_dropped_ = false;  // kRawArgs: the call is past max_calls
  bool broken_ = false;
  bool unfinished_ = false;
  uint32_t calls_ = 0;        // calls whose name was read (dropped ones included)

  // The call being scanned: one JSON object in buf_, a byte at a time.
  struct Scan {
    size_t pos = 0;  // next byte of buf_ to scan
    int depth = 0;
    bool in_string = false, escape = false;
    bool expect_key = true, in_key = false, value_pending = false;
    size_t key_start = 0, value_start = 0;
    std::string key;   // the top-level key whose value is being read
    std::string name;  // the function's name, once read
    bool in_name = false, name_done = false;
    std::optional<size_t> args_start;  // where the arguments' value starts in buf_
    size_t args_sent = 0;              // bytes of it sent
    size_t last_nonspace = 0;          // end of its last non-space byte so far
    bool args_string = false, args_done = false;
    bool header_sent = false, dropped = false;
  } scan_;
};

struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: JSON text
};
struct ParsedToolCalls {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
// The whole answer's calls and the content outside them. A call whose JSON is invalid makes
// the whole text content, with no calls (vLLM's rule).
ParsedToolCalls ParseToolCalls(ToolParserKind kind, std::string_view text, uint32_t max_calls = UINT32_MAX,
                               std::function<std::string()> new_id = NewToolCallId);

}  // namespace kvfleet::router
