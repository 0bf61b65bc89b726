#include "router/http/codec.h"

#include <nlohmann/json.hpp>


namespace kvfleet::router {

namespace {

class ByteDecoder final : public StreamDecoder {
 public:
  std::string Push(TokenId id) override {
    if (id < 256) return std::string(1, static_cast<char>(id));
    return std::string(1, static_cast<char>('a' + id % 26));
  }
  std::string Finish() override { return {}; }
};

class ByteCodec final : public TextCodec {
 public:
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override {
    return std::vector<TokenId>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  // A plain-text template: "<|tools|>\n[tools as JSON]\n" first when the request has tools,
  // then "<|role|>\ncontent\n" per message (an assistant's calls after its content as
  // "<tool_call>{"name", "arguments"}</tool_call>"), then "<|assistant|>\n". It reads no
  // other variable, so chat_template_kwargs change nothing here (as in a Jinja template that
  // reads none of them).
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json& messages,
                                          const ChatTemplateOptions& options) const override {
    if (!messages.is_array()) return InvalidArgument("messages must be an array");
    std::string text;
    if (options.tools) text += "<|tools|>\n" + options.tools->dump() + "\n";
    for (const auto& m : messages) {
      text += "<|" + m.value("role", std::string("user")) + "|>\n";
      const auto& content = m.contains("content") ? m["content"] : nlohmann::ordered_json();
      if (content.is_string()) {
        text += content.get<std::string>();
      } else if (content.is_array()) {
        for (const auto& part : content) text += part.value("text", std::string());
      }
      if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
        for (const auto& call : *calls) {
          const auto& fn = call.contains("function") ? call["function"] : nlohmann::ordered_json::object();
          nlohmann::ordered_json shown = {{"name", fn.value("name", std::string())},
                                          {"arguments", fn.contains("arguments") ? fn["arguments"] : nlohmann::ordered_json()}};
          text += "<tool_call>" + shown.dump() + "</tool_call>";
        }
      }
      text += "\n";
    }
    if (options.continue_final_message) {
      text.pop_back();  // the last message stays open
    } else if (options.add_generation_prompt) {
      text += "<|assistant|>\n";
    }
    return EncodePrompt(text);
  }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return std::make_unique<ByteDecoder>(); }
  std::vector<TokenId> eos_token_ids() const override { return {}; }
  std::string name() const override { return "bytes"; }
  bool is_byte_codec() const override { return true; }
};


}  // namespace

std::string TextCodec::Decode(std::span<const TokenId> ids) const {
  auto decoder = NewDecoder();
  std::string text;
  for (TokenId id : ids) text += decoder->Push(id);
  return text + decoder->Finish();
}

std::unique_ptr<TextCodec> MakeByteCodec() { return std::make_unique<ByteCodec>(); }


}  // namespace kvfleet::router
