#include "router/http/tool_parsers.h"

#include <mutex>
#include <random>

#include "router/http/chat_messages.h"
#include "router/http/chat_tools.h"

namespace kvfleet::router {

namespace {

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";       // v11+: name[ARGS]{...}
constexpr std::string_view kMistralCallId = "[CALL_ID]";  // v11+: name[CALL_ID]id[ARGS]{...}
constexpr std::string_view kPythonTag = "<|python_tag|>";
// The most a v11 call's text before its arguments may hold: a name and an id of at most 64
// bytes, [CALL_ID], [ARGS] and whitespace.
constexpr size_t kMaxMistralHeader = 256;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool AllSpace(std::string_view s) {
  for (char c : s) {
    if (!IsSpace(c)) return false;
  }
  return true;
}

// A function name's bytes, as OpenAI allows them (chat_tools.h).
bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// True when `s` is a proper prefix of `marker` (more text may complete it).
bool MayBecome(std::string_view s, std::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

size_t SkipSpace(std::string_view s, size_t at) {
  while (at < s.size() && IsSpace(s[at])) ++at;
  return at;
}

// The length of the longest tail of `s` that is a proper prefix of `marker`.
size_t PartialMarker(std::string_view s, std::string_view marker) {
  for (size_t len = std::min(s.size(), marker.size() - 1); len > 0; --len) {
    if (s.substr(s.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

std::string_view StartMarker(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::kHermes: return kHermesStart;
    case ToolParserKind::kMistral: return kMistralStart;
    default: return {};
  }
}

}  // namespace

Result<ToolParserKind> ToolParserFromName(std::string_view name) {
  for (ToolParserKind k : {ToolParserKind::kNone, ToolParserKind::kLlama3Json, ToolParserKind::kHermes,
                           ToolParserKind::kMistral}) {
    if (ToolParserName(k) == name) return k;
  }
  return InvalidArgument("unknown tool call parser '" + std::string(name) +
                         "' (none, llama3_json, hermes or mistral)");
}

std::string_view ToolParserName(ToolParserKind kind) {
  switch (kind) {
    case ToolParserKind::kNone: return "none";
    case ToolParserKind::kLlama3Json: return "llama3_json";
    case ToolParserKind::kHermes: return "hermes";
    case ToolParserKind::kMistral: return "mistral";
  }
  return "none";
}

ToolParserKind DetectToolParser(std::string_view t) {
  if (t.find(kHermesStart) != std::string_view::npos) return ToolParserKind::kHermes;
  if (t.find(kMistralStart) != std::string_view::npos) return ToolParserKind::kMistral;
  // Llama 3.1's template: calls as {"name": ..., "parameters": ...}, results as ipython.
  if (t.find(kPythonTag) != std::string_view::npos ||
      (t.find("\"parameters\": ") != std::string_view::npos && t.find("ipython") != std::string_view::npos)) {
    return ToolParserKind::kLlama3Json;
  }
  return ToolParserKind::kNone;
}

std::vector<std::string_view> ToolParserSpecialTokens(ToolParserKind kind) {
  if (kind != ToolParserKind::kMistral) return {};
  return {kMistralStart, kMistralArgs, kMistralCallId};
}

namespace {

std::string RandomId(std::string id, int letters) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < letters; ++i) id += kAlphabet[rng() % kAlphabet.size()];
  return id;
}

}  // namespace

std::string NewToolCallId() { return RandomId("call_", 24); }
std::string NewMistralToolCallId() { return RandomId("", 9); }

ToolCallStream::ToolCallStream(ToolParserKind kind, uint32_t max_calls, std::function<std::string()> new_id)
    : kind_(kind), max_calls_(max_calls), new_id_(std::move(new_id)) {}

ToolCallStream ToolCallStream::ForcedArray(uint32_t max_calls, std::function<std::string()> new_id) {
  ToolCallStream s(ToolParserKind::kMistral, max_calls, std::move(new_id));
  s.forced_array_ = true;
  s.state_ = State::kAfterCall;  // reads the '[' that opens the calls
  s.mistral_open_ = true;
  return s;
}

ToolStreamOut ToolCallStream::Push(std::string_view text) {
  ToolStreamOut out;
  if (kind_ == ToolParserKind::kNone || state_ == State::kDone) {
    out.content.assign(text);
    return out;
  }
  buf_.append(text);
  Run(&out, false);
  return out;
}

ToolStreamOut ToolCallStream::Finish() {
  ToolStreamOut out;
  if (kind_ == ToolParserKind::kNone || state_ == State::kDone) return out;
  Run(&out, true);
  if (state_ == State::kCall) {
    if (scan_.header_sent || scan_.dropped) {
      // Cut off inside a call (max_tokens): what went out of it stands.
      if (!scan_.dropped && !scan_.args_start && !scan_.args_done) {
        out.calls.push_back(ToolCallDelta{calls_ - 1, "", "", "{}", false});
      }
    } else {
      out.content += call_marker_ + buf_;  // never became a call
    }
  } else if (state_ == State::kName) {
    out.content += call_marker_ + buf_;  // a v11 call cut before its arguments
  }
  // kRawArgs: a v11 call cut off inside its arguments; what went out stands.
  unfinished_ = state_ == State::kCall || state_ == State::kName || state_ == State::kRawArgs;
  buf_.clear();
  state_ = State::kDone;
  return out;
}

void ToolCallStream::Run(ToolStreamOut* out, bool final) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kText: progressed = RunText(out, final); break;
      case State::kCall: progressed = RunCall(out); break;
      case State::kName: progressed = RunName(out, final); break;
      case State::kRawArgs: progressed = RunRawArgs(out); break;
      case State::kAfterCall: progressed = RunAfterCall(out, final); break;
      case State::kDone:
        out->content += buf_;
        buf_.clear();
        return;
    }
    if (!progressed) return;
  }
}

void ToolCallStream::EmitContent(ToolStreamOut* out, std::string_view text, bool final) {
  if (text.empty()) return;
  if (calls_ > 0) {
    // Whitespace between and after calls is no content.
    held_ws_.append(text);
    if (AllSpace(held_ws_)) {
      if (final) held_ws_.clear();
      return;
    }
    out->content += held_ws_;
    held_ws_.clear();
    return;
  }
  out->content.append(text);
}

bool ToolCallStream::RunText(ToolStreamOut* out, bool final) {
  if (buf_.empty()) return false;
  if (forced_array_) {  // after the array: no marker starts another
    EmitContent(out, buf_, final);
    buf_.clear();
    return false;
  }
  if (kind_ == ToolParserKind::kLlama3Json) {
    // A call is the whole answer: it starts it, after optional whitespace and <|python_tag|>.
    if (!at_start_ && calls_ == 0) {
      out->content += buf_;
      buf_.clear();
      return false;
    }
    size_t at = SkipSpace(buf_, 0);
    if (at == buf_.size() && !final) return false;  // only whitespace yet
    std::string_view rest = std::string_view(buf_).substr(at);
    if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
      at = SkipSpace(buf_, at + kPythonTag.size());
      rest = std::string_view(buf_).substr(at);
      if (rest.empty() && !final) return false;
    } else if (!final && rest.size() < kPythonTag.size() && kPythonTag.substr(0, rest.size()) == rest) {
      return false;
    }
    if (!rest.empty() && rest[0] == '{' && calls_ == 0) {
      call_marker_ = buf_.substr(0, at);
      buf_.erase(0, at);
      StartCall();
      return true;
    }
    at_start_ = false;
    std::string text = std::move(buf_);
    buf_.clear();
    if (calls_ > 0) {
      state_ = State::kDone;  // text after the calls: content from here on
      EmitContent(out, text, final);
      return false;
    }
    out->content += text;
    return false;
  }
  const std::string_view marker = StartMarker(kind_);
  const size_t found = buf_.find(marker);
  if (found == std::string::npos) {
    const size_t hold = final ? 0 : PartialMarker(buf_, marker);
    EmitContent(out, std::string_view(buf_).substr(0, buf_.size() - hold), final);
    buf_.erase(0, buf_.size() - hold);
    return false;
  }
  if (calls_ > 0) {
    held_ws_.clear();
    if (!AllSpace(std::string_view(buf_).substr(0, found))) EmitContent(out, std::string_view(buf_).substr(0, found), final);
    held_ws_.clear();
  } else {
    out->content.append(buf_, 0, found);
  }
  call_marker_.assign(marker);
  buf_.erase(0, found + marker.size());
  if (kind_ == ToolParserKind::kMistral) {
    in_array_ = false;
    state_ = State::kAfterCall;  // reads the '[' that opens the calls
    mistral_open_ = true;
    return true;
  }
  StartCall();
  return true;
}

void ToolCallStream::StartCall() {
  scan_ = Scan{};
  state_ = State::kCall;
}

void ToolCallStream::EmitArguments(ToolStreamOut* out) {
  if (!scan_.header_sent || scan_.dropped || !scan_.args_start) return;
  if (scan_.args_string) {
    if (!scan_.args_done || scan_.args_sent > 0) return;
    // "arguments": "{...}": the string's JSON text, decoded.
    auto decoded = ParseOrderedJson(std::string_view(buf_).substr(*scan_.args_start, scan_.last_nonspace - *scan_.args_start));
    std::string args = decoded.ok() && decoded->is_string() ? decoded->get<std::string>() : std::string("{}");
    scan_.args_sent = 1;
    out->calls.push_back(ToolCallDelta{calls_ - 1, "", "", std::move(args), false});
    return;
  }
  const size_t from = *scan_.args_start + scan_.args_sent;
  if (scan_.last_nonspace <= from) return;
  out->calls.push_back(ToolCallDelta{calls_ - 1, "", "", buf_.substr(from, scan_.last_nonspace - from), false});
  scan_.args_sent = scan_.last_nonspace - *scan_.args_start;
}

bool ToolCallStream::RunCall(ToolStreamOut* out) {
  Scan& s = scan_;
  while (s.pos < buf_.size()) {
    const char c = buf_[s.pos];
    const bool in_args = s.args_start && !s.args_done;
    if (s.depth == 0) {
      if (IsSpace(c)) {
        ++s.pos;
        continue;
      }
      if (c != '{') return GiveUp(out);
      s.depth = 1;
      ++s.pos;
      continue;
    }
    if (in_args && !IsSpace(c) && !(s.depth == 1 && !s.in_string && (c == ',' || c == '}'))) s.last_nonspace = s.pos + 1;
    if (s.in_string) {
      if (s.escape) {
        s.escape = false;
      } else if (c == '\\') {
        s.escape = true;
      } else if (c == '"') {
        s.in_string = false;
        if (s.in_key) {
          s.in_key = false;
          s.key = buf_.substr(s.key_start, s.pos - s.key_start);
        } else if (s.in_name) {
          s.in_name = false;
          auto name = ParseOrderedJson(std::string_view(buf_).substr(s.value_start, s.pos + 1 - s.value_start));
          if (!name.ok() || !name->is_string() || name->get_ref<const std::string&>().empty()) return GiveUp(out);
          s.name = name->get<std::string>();
          s.name_done = true;
          s.dropped = calls_ >= max_calls_;
          s.header_sent = !s.dropped;
          BeginCall(out, s.name);
        }
      }
      ++s.pos;
      continue;
    }
    if (s.depth == 1 && s.value_pending && !IsSpace(c)) {
      s.value_pending = false;
      s.value_start = s.pos;
      if (s.key == "name") {
        if (c != '"' || s.name_done) return GiveUp(out);
        s.in_name = true;
      } else if (((s.key == "arguments" && !forced_array_) || s.key == "parameters") && !s.args_start) {
        s.args_start = s.pos;
        s.args_string = c == '"';
        s.last_nonspace = s.pos + 1;
      }
    }
    switch (c) {
      case '"':
        s.in_string = true;
        if (s.depth == 1 && s.expect_key) {
          s.in_key = true;
          s.key_start = s.pos + 1;
        }
        break;
      case ':':
        if (s.depth == 1 && !s.expect_key) return GiveUp(out);
        if (s.depth == 1) {
          s.expect_key = false;
          s.value_pending = true;
        }
        break;
      case '{':
      case '[':
        ++s.depth;
        break;
      case ',':
      case '}':
        if (s.depth == 1) {
          if (s.args_start && !s.args_done) s.args_done = true;
          s.expect_key = true;
        }
        if (c == '}' && --s.depth == 0) {
          ++s.pos;
          if (!s.name_done) return GiveUp(out);
          EmitArguments(out);
          if (!s.args_start && !s.dropped) out->calls.push_back(ToolCallDelta{calls_ - 1, "", "", "{}", false});
          buf_.erase(0, s.pos);
          state_ = State::kAfterCall;
          return true;
        }
        break;
      case ']':
        --s.depth;
        break;
      default:
        break;
    }
    ++s.pos;
  }
  EmitArguments(out);
  return false;
}

void ToolCallStream::BeginCall(ToolStreamOut* out, std::string name) {
  const bool dropped = calls_ >= max_calls_;
  ++calls_;
  if (!dropped) out->calls.push_back(ToolCallDelta{calls_ - 1, new_id_(), std::move(name), "", true});
}

bool ToolCallStream::RunName(ToolStreamOut* out, bool final) {
  // name[ARGS]{, name[CALL_ID]id[ARGS]{, or name{ (a decoder that hid [ARGS]). The model's call
  // id is read past: the call gets kvfleet's, as vLLM gives its own.
  size_t at = 0;
  while (at < buf_.size() && IsNameChar(buf_[at])) ++at;
  const size_t name_end = at;
  if (name_end > config::kMaxToolNameBytes) return GiveUp(out);
  auto wait = [&] { return final ? GiveUp(out) : false; };
  if (at == buf_.size()) return wait();
  std::string_view rest = std::string_view(buf_).substr(at);
  if (MayBecome(rest, kMistralCallId) || MayBecome(rest, kMistralArgs)) return wait();
  if (rest.substr(0, kMistralCallId.size()) == kMistralCallId) {
    at += kMistralCallId.size();
    const size_t id_start = at;
    while (at < buf_.size() && IsNameChar(buf_[at])) ++at;
    if (at - id_start > config::kMaxToolNameBytes) return GiveUp(out);
    rest = std::string_view(buf_).substr(at);
    if (rest.empty() || MayBecome(rest, kMistralArgs)) return wait();
    if (rest.substr(0, kMistralArgs.size()) != kMistralArgs) return GiveUp(out);
  }
  if (rest.substr(0, kMistralArgs.size()) == kMistralArgs) at += kMistralArgs.size();
  at = SkipSpace(buf_, at);
  // What is held here is bounded: a name, an id, two markers and a little whitespace.
  if (at == buf_.size()) return at > kMaxMistralHeader ? GiveUp(out) : wait();
  if (buf_[at] != '{' || name_end == 0) return GiveUp(out);
  raw_dropped_ = calls_ >= max_calls_;
  BeginCall(out, buf_.substr(0, name_end));
  buf_.erase(0, at);
  raw_ = JsonEndScanner{};
  state_ = State::kRawArgs;
  return true;
}

bool ToolCallStream::RunRawArgs(ToolStreamOut* out) {
  // The arguments object as the model writes it, up to the '}' that closes it.
  size_t end = 0;
  bool closed = false;
  while (end < buf_.size() && !closed) closed = raw_.Push(buf_[end++]);
  if (end > 0 && !raw_dropped_) out->calls.push_back(ToolCallDelta{calls_ - 1, "", "", buf_.substr(0, end), false});
  buf_.erase(0, end);
  if (!closed) return false;
  state_ = State::kAfterCall;
  return true;
}

bool ToolCallStream::GiveUp(ToolStreamOut* out) {
  // Not a call after all: what was held goes out as text. A call whose header went out
  // cannot be taken back; it ends where it is.
  if (!scan_.header_sent && !scan_.dropped) out->content += call_marker_;
  out->content += buf_;
  buf_.clear();
  state_ = State::kDone;
  broken_ = true;
  return false;
}

bool ToolCallStream::RunAfterCall(ToolStreamOut* out, bool final) {
  const size_t at = SkipSpace(buf_, 0);
  if (at == buf_.size()) {
    if (final) buf_.clear();
    return false;
  }
  const char c = buf_[at];
  switch (kind_) {
    case ToolParserKind::kHermes: {
      std::string_view rest = std::string_view(buf_).substr(at);
      if (rest.substr(0, kHermesEnd.size()) == kHermesEnd) {
        buf_.erase(0, at + kHermesEnd.size());
        state_ = State::kText;
        return true;
      }
      if (!final && rest.size() < kHermesEnd.size() && kHermesEnd.substr(0, rest.size()) == rest) return false;
      buf_.erase(0, at);  // no closing tag: the text after the call is text
      state_ = State::kText;
      return true;
    }
    case ToolParserKind::kMistral:
      if (mistral_open_) {
        mistral_open_ = false;
        if (!forced_array_ && IsNameChar(c)) {  // v11+: [TOOL_CALLS]name[ARGS]{...}
          buf_.erase(0, at);
          scan_ = Scan{};  // no JSON call of this one to take back
          state_ = State::kName;
          return true;
        }
        if (c == '[') {
          in_array_ = true;
          buf_.erase(0, at + 1);
          StartCall();
          return true;
        }
        if (c == '{' && !forced_array_) {
          buf_.erase(0, at);
          StartCall();
          return true;
        }
        return GiveUp(out);
      }
      if (in_array_ && c == ',') {
        buf_.erase(0, at + 1);
        StartCall();
        return true;
      }
      if (in_array_ && c == ']') in_array_ = false, buf_.erase(0, at + 1);
      else buf_.erase(0, at);
      state_ = State::kText;
      return true;
    case ToolParserKind::kLlama3Json:
      if (c == ';') {
        buf_.erase(0, at + 1);
        const size_t next = SkipSpace(buf_, 0);
        if (next == buf_.size()) {
          // "; " then nothing yet: wait for the next call's '{'.
          buf_.insert(0, ";");
          if (final) buf_.clear();
          return false;
        }
        buf_.erase(0, next);
        call_marker_.clear();
        StartCall();
        return true;
      }
      buf_.erase(0, at);
      state_ = State::kText;
      return true;
    case ToolParserKind::kNone:
      break;
  }
  return false;
}

ParsedToolCalls ParseToolCalls(ToolParserKind kind, std::string_view text, uint32_t max_calls,
                               std::function<std::string()> new_id) {
  ToolCallStream stream(kind, max_calls, std::move(new_id));
  ToolStreamOut a = stream.Push(text);
  ToolStreamOut b = stream.Finish();
  ParsedToolCalls out;
  out.content = a.content + b.content;
  for (ToolStreamOut* part : {&a, &b}) {
    for (ToolCallDelta& d : part->calls) {
      if (d.first) out.calls.push_back(ParsedToolCall{std::move(d.id), std::move(d.name), ""});
      else if (!out.calls.empty()) out.calls.back().arguments += d.arguments;
    }
  }
  // vLLM's rule: a call that is not valid JSON (cut off, malformed) makes it all text.
  bool valid = !stream.broken();
  for (const ParsedToolCall& c : out.calls) {
    auto args = ParseOrderedJson(c.arguments);
    if (!args.ok() || !args->is_object()) valid = false;
  }
  if (!valid || stream.unfinished()) return ParsedToolCalls{std::string(text), {}};
  return out;
}

}  // namespace kvfleet::router
