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
  // A plain-text template: "<|role|>\ncontent\n" per message, then "<|assistant|>\n". It has
  // no variables, so chat_template_kwargs change nothing here (as in a Jinja template that
  // reads none of them).
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json& messages,
                                          const ChatTemplateOptions& options) const override {
    if (!messages.is_array()) return InvalidArgument("messages must be an array");
    std::string text;
    for (const auto& m : messages) {
      text += "<|" + m.value("role", std::string("user")) + "|>\n";
      const auto& content = m.contains("content") ? m["content"] : nlohmann::ordered_json();
      if (content.is_string()) {
        text += content.get<std::string>();
      } else if (content.is_array()) {
        for (const auto& part : content) text += part.value("text", std::string());
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
