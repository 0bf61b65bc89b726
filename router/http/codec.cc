#include "router/http/codec.h"

#include <nlohmann/json.hpp>

#ifdef KVFLEET_HAVE_TOKENIZER
#include "common/tokenizer/tokenizer.h"
#endif

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
  Result<std::vector<TokenId>> EncodeChat(std::string_view messages_json) const override {
    auto messages = nlohmann::json::parse(messages_json, nullptr, false);
    if (messages.is_discarded() || !messages.is_array()) return InvalidArgument("messages must be an array");
    std::string text;
    for (const auto& m : messages) {
      text += "<|" + m.value("role", std::string("user")) + "|>\n";
      const auto& content = m.contains("content") ? m["content"] : nlohmann::json();
      if (content.is_string()) {
        text += content.get<std::string>();
      } else if (content.is_array()) {
        for (const auto& part : content) text += part.value("text", std::string());
      }
      text += "\n";
    }
    text += "<|assistant|>\n";
    return EncodePrompt(text);
  }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return std::make_unique<ByteDecoder>(); }
  std::vector<TokenId> eos_token_ids() const override { return {}; }
  std::string name() const override { return "bytes"; }
};

#ifdef KVFLEET_HAVE_TOKENIZER
class TokenizerDecoder final : public StreamDecoder {
 public:
  explicit TokenizerDecoder(std::shared_ptr<const tok::Tokenizer> t) : tok_(std::move(t)), dec_(*tok_, true) {}
  std::string Push(TokenId id) override { return dec_.Push(id); }
  std::string Finish() override { return dec_.Finish(); }

 private:
  std::shared_ptr<const tok::Tokenizer> tok_;
  tok::IncrementalDecoder dec_;
};

class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(std::shared_ptr<const tok::Tokenizer> t, std::string dir) : tok_(std::move(t)), dir_(std::move(dir)) {}
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override {
    return tok_->Encode(text, tok::EncodeOptions{});
  }
  Result<std::vector<TokenId>> EncodeChat(std::string_view messages_json) const override {
    auto messages = nlohmann::json::parse(messages_json, nullptr, false);
    if (messages.is_discarded()) return InvalidArgument("messages must be JSON");
    KVF_ASSIGN_OR_RETURN(std::string prompt, tok_->ApplyChatTemplate(messages, /*add_generation_prompt=*/true));
    // The template already wrote BOS where the model wants it.
    tok::EncodeOptions options;
    options.add_special_tokens = false;
    return tok_->Encode(prompt, options);
  }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return std::make_unique<TokenizerDecoder>(tok_); }
  std::vector<TokenId> eos_token_ids() const override {
    auto ids = tok_->eos_token_ids();
    return std::vector<TokenId>(ids.begin(), ids.end());
  }
  std::string name() const override { return "tokenizer:" + dir_; }

 private:
  std::shared_ptr<const tok::Tokenizer> tok_;
  std::string dir_;
};
#endif

}  // namespace

std::unique_ptr<TextCodec> MakeByteCodec() { return std::make_unique<ByteCodec>(); }

Result<std::shared_ptr<const TextCodec>> LoadTokenizerCodec(const std::string& model_dir) {
#ifdef KVFLEET_HAVE_TOKENIZER
  KVF_ASSIGN_OR_RETURN(auto t, tok::Tokenizer::Load(model_dir));
  return std::shared_ptr<const TextCodec>(std::make_shared<TokenizerCodec>(std::move(t), model_dir));
#else
  return Unimplemented("this build has no tokenizer library (common/tokenizer); cannot load " + model_dir);
#endif
}

}  // namespace kvfleet::router
