#include "router/http/request_fields.h"

#include <array>
#include <string>

#include <nlohmann/json.hpp>

namespace kvfleet::router {

using nlohmann::json;

namespace {

constexpr auto kParsed = FieldSupport::kParsed;
constexpr auto kHonoured = FieldSupport::kHonoured;
constexpr auto kRefused = FieldSupport::kRefused;
constexpr auto kOpenAi = FieldOrigin::kOpenAi;
constexpr auto kVllm = FieldOrigin::kVllm;
constexpr auto kKvfleet = FieldOrigin::kKvfleet;

// OpenAI's API reference (Create chat completion, Create completion), then kvfleet's
// extensions, then vLLM's extras. A row flips from kRefused to kParsed when it is built.
constexpr std::array kFields = {
    // OpenAI, both endpoints.
    RequestField{"model", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"stream", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"stream_options", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"max_tokens", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"temperature", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"top_p", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"seed", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"stop", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"user", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"n", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"frequency_penalty", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"presence_penalty", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"logit_bias", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"logprobs", kBothFields, kOpenAi, kParsed, ""},
    // OpenAI, /v1/completions.
    RequestField{"prompt", kCompletionsField, kOpenAi, kParsed, ""},
    RequestField{"best_of", kCompletionsField, kOpenAi, kParsed, ""},
    RequestField{"echo", kCompletionsField, kOpenAi, kParsed, ""},
    RequestField{"suffix", kCompletionsField, kOpenAi, kParsed, ""},
    // OpenAI, /v1/chat/completions.
    RequestField{"messages", kChatField, kOpenAi, kParsed, ""},
    RequestField{"max_completion_tokens", kChatField, kOpenAi, kParsed, ""},
    RequestField{"top_logprobs", kChatField, kOpenAi, kParsed, ""},
    // Function tools (chat_tools.h): rendered by the template, calls parsed from the text.
    RequestField{"tools", kChatField, kOpenAi, kParsed, ""},
    RequestField{"tool_choice", kChatField, kOpenAi, kParsed, ""},
    RequestField{"parallel_tool_calls", kChatField, kOpenAi, kParsed, ""},
    RequestField{"response_format", kChatField, kOpenAi, kParsed, ""},
    // Hints about caching and abuse monitoring: nothing in the answer depends on them.
    RequestField{"prompt_cache_key", kChatField, kOpenAi, kHonoured, ""},
    RequestField{"safety_identifier", kChatField, kOpenAi, kHonoured, ""},
    // Not built: the values that ask for nothing pass. functions / function_call are the
    // deprecated shape of tools.
    RequestField{"functions", kChatField, kOpenAi, kRefused, "[[]]"},
    RequestField{"function_call", kChatField, kOpenAi, kRefused, R"(["none","auto"])"},
    RequestField{"audio", kChatField, kOpenAi, kRefused, "[]"},
    RequestField{"modalities", kChatField, kOpenAi, kRefused, R"([["text"]])"},
    RequestField{"prediction", kChatField, kOpenAi, kRefused, "[]"},
    RequestField{"reasoning_effort", kChatField, kOpenAi, kRefused, "[]"},
    RequestField{"verbosity", kChatField, kOpenAi, kRefused, "[]"},
    RequestField{"web_search_options", kChatField, kOpenAi, kRefused, "[]"},
    RequestField{"store", kChatField, kOpenAi, kRefused, "[false]"},
    RequestField{"metadata", kChatField, kOpenAi, kRefused, "[{}]"},
    RequestField{"service_tier", kChatField, kOpenAi, kRefused, R"(["auto","default"])"},
    RequestField{"prompt_cache_retention", kChatField, kOpenAi, kRefused, R"(["in-memory"])"},
    // kvfleet's extensions (openai.h).
    RequestField{"kv_retention", kBothFields, kKvfleet, kParsed, ""},
    RequestField{"cache_salt", kBothFields, kKvfleet, kParsed, ""},
    RequestField{"routing", kBothFields, kKvfleet, kParsed, ""},
    RequestField{"ignore_eos", kBothFields, kVllm, kParsed, ""},
    // vLLM's extras.
    RequestField{"top_k", kBothFields, kVllm, kParsed, ""},
    RequestField{"stop_token_ids", kBothFields, kVllm, kParsed, ""},
    RequestField{"chat_template_kwargs", kChatField, kVllm, kHonoured, ""},
    RequestField{"add_generation_prompt", kChatField, kVllm, kHonoured, ""},
    RequestField{"continue_final_message", kChatField, kVllm, kHonoured, ""},
    RequestField{"min_p", kBothFields, kVllm, kParsed, ""},
    RequestField{"repetition_penalty", kBothFields, kVllm, kParsed, ""},
    RequestField{"min_tokens", kBothFields, kVllm, kRefused, "[0]"},
    // kvfleet's streams never show special tokens.
    RequestField{"skip_special_tokens", kBothFields, kVllm, kRefused, "[true]"},
    RequestField{"include_stop_str_in_output", kBothFields, kVllm, kRefused, "[false]"},
    RequestField{"use_beam_search", kBothFields, kVllm, kRefused, "[false]"},
    // Constraints (structured_output.h): parsed, validated, and routed to workers that
    // decode under constraints (their Hello's structuredOutputs).
    RequestField{"guided_json", kBothFields, kVllm, kParsed, ""},
    RequestField{"guided_regex", kBothFields, kVllm, kParsed, ""},
    RequestField{"guided_choice", kBothFields, kVllm, kParsed, ""},
    RequestField{"guided_grammar", kBothFields, kVllm, kParsed, ""},
    RequestField{"structured_outputs", kBothFields, kVllm, kParsed, ""},
    // A template from the request would run a client's Jinja in the router.
    RequestField{"chat_template", kChatField, kVllm, kRefused, "[]"},
    RequestField{"documents", kChatField, kVllm, kRefused, "[]"},
};

// stream_options' fields: include_usage is read by ParseCompletionRequest.
constexpr std::array kStreamOptions = {
    RequestField{"include_usage", kBothFields, kOpenAi, kParsed, ""},
    RequestField{"include_obfuscation", kBothFields, kOpenAi, kRefused, "[false]"},
};


// Variables the chat template gets from their own fields; kwargs may not replace them.
constexpr std::array<std::string_view, 3> kReservedTemplateVariables = {"messages", "add_generation_prompt", "tools"};

bool Admitted(const RequestField& f, const json& value) {
  if (value.is_null()) return true;
  json admitted = json::parse(f.admitted.empty() ? std::string_view("[]") : f.admitted);
  for (const json& a : admitted) {
    if (a == value) return true;
  }
  return false;
}

const RequestField* Find(std::span<const RequestField> rows, std::string_view name, bool chat) {
  const uint8_t endpoint = chat ? kChatField : kCompletionsField;
  for (const RequestField& f : rows) {
    if (f.name == name && (f.endpoints & endpoint)) return &f;
  }
  return nullptr;
}

Status CheckObject(const json& object, std::span<const RequestField> rows, bool chat, const FieldRule& rule,
                   std::string_view prefix) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string name = std::string(prefix) + it.key();
    const RequestField* f = Find(rows, it.key(), chat);
    if (f == nullptr) {
      if (Find(rows, it.key(), !chat) != nullptr) {
        return FieldError("'" + name + "' is not a field of " + (chat ? "/v1/chat/completions" : "/v1/completions"), name);
      }
      if (!rule.allow_unknown) {
        return FieldError("Unrecognized request argument supplied: " + name +
                       " (the router admits unknown fields with --allow-unknown-fields)",
                   name);
      }
      if (rule.on_unknown) rule.on_unknown(name);
      continue;
    }
    if (f->support == kRefused && !Admitted(*f, it.value())) {
      std::string accepted;
      for (const json& a : json::parse(f->admitted.empty() ? std::string_view("[]") : f->admitted)) {
        accepted += (accepted.empty() ? "" : " or ") + a.dump();
      }
      return FieldError("'" + name + "' is not supported" + (accepted.empty() ? "" : " (accepted: " + accepted + ")"), name);
    }
  }
  return Status::Ok();
}

Status ReadTemplateBool(const json& body, const char* name, bool* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return FieldError(std::string("'") + name + "' must be a boolean", name);
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

Status FieldError(std::string message, std::string_view param) {
  return InvalidArgument(std::string(param) + "\x1f" + message);
}

std::span<const RequestField> RequestFields() { return kFields; }

const RequestField* FindRequestField(std::string_view name, bool chat) { return Find(kFields, name, chat); }

Status ApplyFieldRule(const json& body, bool chat, const FieldRule& rule, ChatTemplateOptions* chat_template) {
  KVF_RETURN_IF_ERROR(CheckObject(body, kFields, chat, rule, ""));
  if (auto so = body.find("stream_options"); so != body.end() && so->is_object()) {
    KVF_RETURN_IF_ERROR(CheckObject(*so, kStreamOptions, chat, rule, "stream_options."));
  }
  if (!chat) return Status::Ok();
  KVF_RETURN_IF_ERROR(ReadTemplateBool(body, "add_generation_prompt", &chat_template->add_generation_prompt));
  KVF_RETURN_IF_ERROR(ReadTemplateBool(body, "continue_final_message", &chat_template->continue_final_message));
  if (chat_template->continue_final_message && chat_template->add_generation_prompt &&
      body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_null()) {
    return FieldError("'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message");
  }
  if (chat_template->continue_final_message) chat_template->add_generation_prompt = false;
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) return FieldError("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (std::string_view reserved : kReservedTemplateVariables) {
      if (kw->contains(reserved)) {
        return FieldError("'chat_template_kwargs' may not set '" + std::string(reserved) + "' (it has its own field)",
                   "chat_template_kwargs");
      }
    }
    if (!kw->empty()) chat_template->kwargs_json = kw->dump();
  }
  return Status::Ok();
}

}  // namespace kvfleet::router
