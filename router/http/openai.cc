#include "router/http/openai.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "router/http/chat_messages.h"
#include "router/http/json_body.h"
#include "router/http/request_fields.h"
#include "router/http/structured_output.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

// Reads an optional number field into *out; null counts as absent.
template <typename T>
Status ReadNumber(const json& j, const char* name, T* out, double lo, double hi, bool integer) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() || (integer && !it->is_number_integer())) {
    return FieldError(std::string("'") + name + "' must be " + (integer ? "an integer" : "a number"), name);
  }
  double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return FieldError(std::string("'") + name + "' must be between " + NumberText(lo) + " and " + NumberText(hi), name);
  }
  *out = static_cast<T>(integer ? static_cast<double>(it->get<int64_t>()) : v);
  if constexpr (std::is_integral_v<T>) {
    if (it->is_number_unsigned()) *out = static_cast<T>(it->get<uint64_t>());
    else *out = static_cast<T>(it->get<int64_t>());
  }
  return Status::Ok();
}

// A JSON number as a float; beyond float's range, an infinity (which no bound admits).
float ToFloat(const json& v) {
  const double d = v.get<double>();
  if (std::fabs(d) > std::numeric_limits<float>::max()) return std::copysign(std::numeric_limits<float>::infinity(), d);
  return static_cast<float>(d);
}

// Reads an optional number into *out with no bound of its own (ValidateSampling's apply).
Status ReadFloat(const json& j, const char* name, float* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return FieldError(std::string("'") + name + "' must be a number", name);
  *out = ToFloat(*it);
  return Status::Ok();
}

Status ReadBool(const json& j, const char* name, bool* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return FieldError(std::string("'") + name + "' must be a boolean", name);
  *out = it->get<bool>();
  return Status::Ok();
}

Status ReadString(const json& j, const char* name, std::string* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return FieldError(std::string("'") + name + "' must be a string", name);
  *out = it->get<std::string>();
  return Status::Ok();
}

Status ParseRetention(const json& j, Retention* out) {
  if (j.is_null()) return Status::Ok();
  if (!j.is_object()) return FieldError("'kv_retention' must be an object", "kv_retention");
  if (auto it = j.find("token_ranges"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError("'kv_retention.token_ranges' must be an array", "kv_retention");
    if (it->size() > 64) return FieldError("'kv_retention.token_ranges' has more than 64 ranges", "kv_retention");
    for (const json& r : *it) {
      if (!r.is_object()) return FieldError("each token range must be an object", "kv_retention");
      RetentionRange range;
      uint32_t start = 0;
      KVF_RETURN_IF_ERROR(ReadNumber(r, "start", &start, 0, 4294967295.0, true));
      range.start = start;
      if (r.contains("end") && !r["end"].is_null()) {
        uint32_t end = 0;
        KVF_RETURN_IF_ERROR(ReadNumber(r, "end", &end, 0, 4294967295.0, true));
        if (end <= start) return FieldError("a token range's end must be after its start", "kv_retention");
        range.end = end;
      }
      int priority = kv::kDefaultPriority;
      KVF_RETURN_IF_ERROR(ReadNumber(r, "priority", &priority, 0, 100, true));
      range.priority = static_cast<uint8_t>(priority);
      if (r.contains("duration_ms") && !r["duration_ms"].is_null()) {
        uint64_t d = 0;
        KVF_RETURN_IF_ERROR(ReadNumber(r, "duration_ms", &d, 0, 1e15, true));
        range.duration_ms = d;
      }
      out->ranges.push_back(range);
    }
  }
  if (j.contains("decode_priority") && !j["decode_priority"].is_null()) {
    int p = kv::kDefaultPriority;
    KVF_RETURN_IF_ERROR(ReadNumber(j, "decode_priority", &p, 0, 100, true));
    out->decode_priority = static_cast<uint8_t>(p);
  }
  if (j.contains("decode_duration_ms") && !j["decode_duration_ms"].is_null()) {
    uint64_t d = 0;
    KVF_RETURN_IF_ERROR(ReadNumber(j, "decode_duration_ms", &d, 0, 1e15, true));
    out->decode_duration_ms = d;
  }
  return Status::Ok();
}

json UsageJson(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

void AddExtension(json& j, const UsageCounts& u) {
  if (u.worker.empty()) return;
  j["kvfleet"] = {{"worker", u.worker}, {"worker_ttft_ms", u.worker_ttft_ms}};
  if (const auto& t = u.timings) {
    j["kvfleet"]["router_timings_ns"] = {{"read", t->read},
                                         {"routed", t->routed},
                                         {"sent", t->sent},
                                         {"first_delta", t->first_delta},
                                         {"first_chunk", t->first_chunk}};
  }
}

json FinishJson(std::string_view finish) { return finish.empty() ? json(nullptr) : json(std::string(finish)); }

// Penalties, min_p, logit_bias and logprobs (the completions and chat shapes of the last).
// Their bounds are ValidateSampling's, but for the shapes of logprobs in the body.
Status ParseLogitControls(const json& j, CompletionRequest* r) {
  SamplingParams& s = r->sampling;
  KVF_RETURN_IF_ERROR(ReadFloat(j, "presence_penalty", &s.presence_penalty));
  KVF_RETURN_IF_ERROR(ReadFloat(j, "frequency_penalty", &s.frequency_penalty));
  KVF_RETURN_IF_ERROR(ReadFloat(j, "repetition_penalty", &s.repetition_penalty));
  KVF_RETURN_IF_ERROR(ReadFloat(j, "min_p", &s.min_p));
  if (auto bias = j.find("logit_bias"); bias != j.end() && !bias->is_null()) {
    if (!bias->is_object()) return FieldError("'logit_bias' must be an object of token id -> bias", "logit_bias");
    for (const auto& [key, value] : bias->items()) {
      char* end = nullptr;
      const unsigned long long id = std::strtoull(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || key[0] == '-' || key[0] == '+' || id > 0xffffffffull) {
        return FieldError("'logit_bias' keys must be token ids, got '" + key + "'", "logit_bias");
      }
      if (!value.is_number()) {
        const std::string bound = NumberText(sampling::config::kMaxLogitBiasValue);
        return FieldError("'logit_bias' values must be numbers between -" + bound + " and " + bound + " (token " + key + ")",
                   "logit_bias");
      }
      s.logit_bias.emplace_back(static_cast<TokenId>(id), ToFloat(value));
    }
  }
  const int32_t max_lp = sampling::config::kMaxTopLogprobs;
  if (r->chat) {
    bool want = false;
    KVF_RETURN_IF_ERROR(ReadBool(j, "logprobs", &want));
    int32_t top = -1;
    KVF_RETURN_IF_ERROR(ReadNumber(j, "top_logprobs", &top, 0, max_lp, true));
    if (top >= 0 && !want) return FieldError("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    if (want) s.logprobs = std::max(top, 0);
  } else {
    if (auto lp = j.find("logprobs"); lp != j.end() && lp->is_boolean()) {
      return FieldError("'logprobs' must be an integer 0.." + std::to_string(max_lp) + " on /v1/completions", "logprobs");
    }
    KVF_RETURN_IF_ERROR(ReadNumber(j, "logprobs", &s.logprobs, 0, max_lp, true));
    if (auto top = j.find("top_logprobs"); top != j.end() && !top->is_null()) {
      return FieldError("'top_logprobs' is a chat field; /v1/completions takes 'logprobs' 0.." + std::to_string(max_lp),
                 "top_logprobs");
    }
  }
  return Status::Ok();
}

// A completions prompt given as JSON values (a token-id prompt the body's parser did not take).
Status ParsePrompt(json& j, CompletionRequest* r) {
  auto prompt = j.find("prompt");
  if (prompt == j.end() || prompt->is_null()) return FieldError("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    r->prompt_text = std::move(prompt->get_ref<std::string&>());  // 8K-token prompts: no copy
    return Status::Ok();
  }
  if (!prompt->is_array()) return FieldError("'prompt' must be a string or an array of token ids", "prompt");
  // A list of token ids; a list of one string or one id-list is that prompt (n=1).
  json* p = &*prompt;
  if (p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    return Status::Ok();
  }
  if (p->empty()) return FieldError("'prompt' must not be empty", "prompt");
  // Out of the json first: a plain vector frees 8K numbers far faster than
  // nlohmann's array destructor, which moves each one onto a stack.
  json::array_t ids = std::move(p->get_ref<json::array_t&>());
  r->prompt_tokens.reserve(ids.size());
  for (const json& t : ids) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() > 0xffffffffull) {
      return FieldError("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt");
    }
    r->prompt_tokens.push_back(static_cast<TokenId>(t.get<uint64_t>()));
  }
  return Status::Ok();
}

// Stop strings: the router's (it matches them in the text), so its limits.
Status ParseStop(const json& j, const RequestLimits& limits, std::vector<std::string>* out) {
  auto stop = j.find("stop");
  if (stop == j.end() || stop->is_null()) return Status::Ok();
  if (stop->is_string()) {
    out->push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (const json& s : *stop) {
      if (!s.is_string()) return FieldError("'stop' must be a string or an array of strings", "stop");
      out->push_back(s.get<std::string>());
    }
  } else {
    return FieldError("'stop' must be a string or an array of strings", "stop");
  }
  if (out->size() > limits.max_stop_strings) {
    return FieldError("'stop' may hold at most " + std::to_string(limits.max_stop_strings) + " strings", "stop");
  }
  for (const auto& s : *out) {
    if (s.empty() || s.size() > limits.max_stop_bytes) return FieldError("each stop string must be 1 to 256 bytes", "stop");
  }
  return Status::Ok();
}

// The generation and sampling fields into r->sampling (r->max_tokens, the body's, apart),
// then ValidateSampling. The body's max_tokens is named `max_name`.
Status ParseSampling(const json& j, const char* max_name, const RequestLimits& limits, CompletionRequest* r) {
  SamplingParams& sampling = r->sampling;
  if (j.contains(max_name) && !j[max_name].is_null()) {
    // 0: only with echo (checked by the caller), to score a prompt as lm-evaluation-harness does.
    uint32_t max_tokens = 0;
    KVF_RETURN_IF_ERROR(ReadNumber(j, max_name, &max_tokens, 0, limits.max_tokens_cap, true));
    r->max_tokens = max_tokens;
  }
  KVF_RETURN_IF_ERROR(ReadFloat(j, "temperature", &sampling.temperature));
  KVF_RETURN_IF_ERROR(ReadFloat(j, "top_p", &sampling.top_p));
  int64_t top_k = 0;
  KVF_RETURN_IF_ERROR(ReadNumber(j, "top_k", &top_k, -1, sampling::config::kMaxTopK, true));
  sampling.top_k = static_cast<int32_t>(std::max<int64_t>(top_k, 0));  // -1 (vLLM): off
  if (auto seed = j.find("seed"); seed != j.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return FieldError("'seed' must be an integer", "seed");
    sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  KVF_RETURN_IF_ERROR(ParseStop(j, limits, &r->stop));
  if (auto ids = j.find("stop_token_ids"); ids != j.end() && !ids->is_null()) {
    if (!ids->is_array()) return FieldError("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const json& t : *ids) {
      if (!t.is_number_unsigned() || t.get<uint64_t>() > 0xffffffffull) {
        return FieldError("'stop_token_ids' must be an array of non-negative integer token ids", "stop_token_ids");
      }
      sampling.stop_token_ids.push_back(static_cast<TokenId>(t.get<uint64_t>()));
    }
  }
  KVF_RETURN_IF_ERROR(ParseLogitControls(j, r));
  KVF_RETURN_IF_ERROR(ReadNumber(j, "n", &sampling.n, 1, limits.max_n, true));
  if (auto best_of = j.find("best_of"); best_of != j.end() && !best_of->is_null()) {
    // best_of > n ranks candidates by their log probability and returns the n best; kvfleet
    // returns every sequence it samples, so it honours best_of only where that is all of them.
    if (!best_of->is_number_integer() || best_of->get<int64_t>() != static_cast<int64_t>(sampling.n)) {
      return FieldError("'best_of' must equal 'n' (" + std::to_string(sampling.n) +
                     "): kvfleet returns every sequence it samples and does not rank them",
                 "best_of");
    }
  }
  KVF_RETURN_IF_ERROR(ReadBool(j, "ignore_eos", &sampling.ignore_eos));
  std::string field;
  const Status bounds = ValidateSampling(sampling, &field);
  return bounds.ok() ? bounds : FieldError(bounds.message(), field);
}

// A choice's "logprobs": completions' four parallel arrays, or chat's content list.
json LogprobsJson(const CompletionRequest& req, const ChoiceLogprobs& lp) {
  if (req.chat) {
    auto bytes = [](const std::string& s) {
      json b = json::array();
      for (unsigned char c : s) b.push_back(c);
      return b;
    };
    json content = json::array();
    for (const LogprobEntry& e : lp.entries) {
      json top = json::array();
      for (const auto& [t, v] : e.top) top.push_back({{"token", t}, {"logprob", v}, {"bytes", bytes(t)}});
      content.push_back({{"token", e.token}, {"logprob", e.logprob.value_or(0.0f)}, {"bytes", bytes(e.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  size_t offset = lp.text_offset;
  for (const LogprobEntry& e : lp.entries) {
    tokens.push_back(e.token);
    offsets.push_back(offset);
    offset += e.token.size();
    if (!e.logprob) {  // the prompt's first token: nothing conditions it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(*e.logprob);
    // OpenAI: the sampled token's logprob is always in the map (so up to logprobs + 1 keys).
    json top = json::object();
    for (const auto& [t, v] : e.top) {
      if (!top.contains(t)) top[t] = v;
    }
    if (!top.contains(e.token)) top[e.token] = *e.logprob;
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

// The fields read with their keys in the client's order: tools (chat_tools.h; a template's
// tojson writes them as given) and the structured-output fields (structured_output.h; a
// grammar engine generates a schema's properties in its order). A body that has them is read
// once more, in order.
Status ParseOrderedFields(const json& j, std::string_view body, const RequestLimits& limits, CompletionRequest* r) {
  const bool tools = r->chat && j.contains("tools") && !j["tools"].is_null();
  const bool structured = HasStructuredOutputField(j);
  nlohmann::ordered_json ordered;
  if (tools || structured) {
    auto all = ParseOrderedJson(body);
    if (!all.ok() || !all->is_object()) return FieldError(std::string(kJsonInvalid), "");
    ordered = std::move(all).value();
  }
  if (r->chat) {
    KVF_RETURN_IF_ERROR(ParseChatTools(j, tools ? &ordered["tools"] : nullptr, &r->tools));
    r->chat_template.tools = r->tools.tools;
  }
  std::string field;
  if (structured) KVF_RETURN_IF_ERROR(ParseStructuredOutput(ordered, &r->sampling.structured, &field));
  if (r->tools.forced()) {
    if (r->sampling.structured.kind != StructuredOutput::Kind::kNone) {
      return FieldError("'" + field + "' and a forced tool call ('tool_choice') cannot both constrain the answer", field);
    }
    field = "tool_choice";
    r->sampling.structured = {StructuredOutput::Kind::kJsonSchema, ForcedCallSchema(r->tools)};
  }
  // Checked here, routed only to workers that enforce it (Router::Route): never served
  // unconstrained.
  if (r->sampling.structured.kind != StructuredOutput::Kind::kNone) {
    r->structured_field = field;
    KVF_RETURN_IF_ERROR(ValidateStructuredOutput(r->sampling.structured, field));
  }
  return Status::Ok();
}

}  // namespace

std::string ApiError::ToJson() const {
  json j = {{"error",
             {{"message", message},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError ErrorFromStatus(const Status& status) {
  const std::string& m = status.message();
  size_t sep = m.find('\x1f');
  if (sep == std::string::npos) return BadRequest(m);
  return BadRequest(m.substr(sep + 1), m.substr(0, sep));
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body, bool chat, const RequestLimits& limits) {
  CompletionRequest r;
  r.chat = chat;
  // A token-id prompt comes straight out of the parser, not through 8K json values.
  bool prompt_taken = false;
  bool messages_taken = false;
  Result<json> parsed =
      chat ? ParseJsonBody(body, OrderedMember{"messages", &r.messages, &messages_taken})
           : ParseJsonBody(body, TokenIdMember{"prompt", &r.prompt_tokens, &prompt_taken});
  if (!parsed.ok()) return FieldError(parsed.status().message(), "");
  json& j = *parsed;
  if (!j.is_object()) return FieldError("the body must be a JSON object", "");
  KVF_RETURN_IF_ERROR(ApplyFieldRule(j, chat, limits.fields, &r.chat_template));
  auto model = j.find("model");
  if (model == j.end() || !model->is_string() || model->get_ref<const std::string&>().empty()) {
    return FieldError("'model' is required and must be a non-empty string", "model");
  }
  r.model = model->get<std::string>();
  if (chat) {
    // Parsed once, in order (OrderedMember): the codec renders this value.
    if (!messages_taken) return FieldError("'messages' is required", "messages");
    KVF_RETURN_IF_ERROR(NormalizeChatMessages(&r.messages));
  } else if (!prompt_taken) {
    KVF_RETURN_IF_ERROR(ParsePrompt(j, &r));
  }
  const char* max_name = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  KVF_RETURN_IF_ERROR(ParseSampling(j, max_name, limits, &r));
  KVF_RETURN_IF_ERROR(ParseOrderedFields(j, body, limits, &r));
  // tools and functions are refused by the field rule above; suffix is a parsed field.
  if (auto it = j.find("suffix"); it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
                                  !(it->is_array() && it->empty()) && !(it->is_object() && it->empty())) {
    return FieldError("'suffix' is not supported", "suffix");
  }
  KVF_RETURN_IF_ERROR(ReadBool(j, "stream", &r.stream));
  KVF_RETURN_IF_ERROR(ReadBool(j, "echo", &r.echo));  // completions only (the field rule)
  r.sampling.prompt_logprobs = r.echo && r.sampling.logprobs >= 0;
  if (r.max_tokens == 0u && !r.echo) return FieldError("'" + std::string(max_name) + "' must be >= 1 (0 only with echo)", max_name);
  if (auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return FieldError("'stream_options' must be an object", "stream_options");
    if (!r.stream) return FieldError("'stream_options' is only allowed when 'stream' is true", "stream_options");
    KVF_RETURN_IF_ERROR(ReadBool(*so, "include_usage", &r.include_usage));
  }
  KVF_RETURN_IF_ERROR(ReadString(j, "user", &r.user));
  KVF_RETURN_IF_ERROR(ReadString(j, "cache_salt", &r.cache_salt));
  if (auto kr = j.find("kv_retention"); kr != j.end()) KVF_RETURN_IF_ERROR(ParseRetention(*kr, &r.retention));
  if (auto routing = j.find("routing"); routing != j.end() && !routing->is_null()) {
    if (!routing->is_string()) return FieldError("'routing' must be a string", "routing");
    auto p = ParsePolicy(routing->get<std::string>());
    if (!p.ok()) return FieldError(p.status().message(), "routing");
    r.routing = *p;
  }
  return r;
}

std::string_view FinishReasonText(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: return "";
  }
  return "";
}

std::string FormatCompletion(const CompletionRequest& req, std::string_view id, int64_t created,
                             std::string_view text, std::string_view finish_reason, const UsageCounts& usage,
                             const ChoiceLogprobs* logprobs) {
  return FormatCompletion(req, id, created, {ChoiceText{std::string(text), std::string(finish_reason), logprobs}},
                          usage);
}

std::string FormatCompletion(const CompletionRequest& req, std::string_view id, int64_t created,
                             const std::vector<ChoiceText>& choices, const UsageCounts& usage) {
  json array = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json choice = {{"index", i},
                   {"logprobs", choices[i].logprobs ? LogprobsJson(req, *choices[i].logprobs) : json(nullptr)},
                   {"finish_reason", FinishJson(choices[i].finish_reason)}};
    if (req.chat && choices[i].output != nullptr) {
      const ChatOutput& o = *choices[i].output;
      const bool reasoned = o.reasoning && !o.reasoning->empty();
      json message = {{"role", "assistant"},
                      {"content", o.content.empty() && (reasoned || !o.calls.empty()) ? json(nullptr) : json(o.content)}};
      if (o.reasoning) message["reasoning_content"] = reasoned ? json(*o.reasoning) : json(nullptr);
      if (!o.calls.empty()) message["tool_calls"] = ToolCallsJson(o.calls);
      choice["message"] = std::move(message);
    } else if (req.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    } else {
      choice["text"] = choices[i].text;
    }
    array.push_back(std::move(choice));
  }
  json j = {{"id", std::string(id)},
            {"object", req.chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", std::move(array)},
            {"usage", UsageJson(usage)}};
  AddExtension(j, usage);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ToolCallsJson(const std::vector<ParsedToolCall>& calls) {
  json out = json::array();
  for (const ParsedToolCall& c : calls) {
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

std::string FormatChunk(const CompletionRequest& req, std::string_view id, int64_t created, std::string_view text,
                        std::string_view finish_reason, bool first, uint32_t index, const ChoiceLogprobs* logprobs,
                        const ChatOutputDelta* parsed) {
  json choice = {{"index", index},
                 {"logprobs", logprobs ? LogprobsJson(req, *logprobs) : json(nullptr)},
                 {"finish_reason", FinishJson(finish_reason)}};
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (parsed != nullptr) text = parsed->content;
    if (!text.empty() || first) delta["content"] = std::string(text);
    if (parsed != nullptr && !parsed->reasoning.empty()) delta["reasoning_content"] = parsed->reasoning;
    if (parsed != nullptr && !parsed->calls.empty()) {
      json calls = json::array();
      for (const ToolCallDelta& d : parsed->calls) {
        json call = {{"index", d.index}};
        if (d.first) {
          call["id"] = d.id;
          call["type"] = "function";
          call["function"] = {{"name", d.name}, {"arguments", d.arguments}};
        } else {
          call["function"] = {{"arguments", d.arguments}};
        }
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
  }
  json j = {{"id", std::string(id)},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", json::array({std::move(choice)})}};
  if (req.include_usage) j["usage"] = nullptr;
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string FormatUsageChunk(const CompletionRequest& req, std::string_view id, int64_t created,
                             const UsageCounts& usage) {
  json j = {{"id", std::string(id)},
            {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", req.model},
            {"choices", json::array()},
            {"usage", UsageJson(usage)}};
  AddExtension(j, usage);
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string FormatStreamError(const ApiError& error) { return "data: " + error.ToJson() + "\n\n"; }

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::Push(std::string_view text, bool* stopped) {
  *stopped = stopped_;
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  pending_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

}  // namespace kvfleet::router
