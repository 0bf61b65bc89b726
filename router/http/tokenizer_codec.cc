// The tokenizer-backed TextCodec, in its own library (kvfleet_router_codec) so the API
// library and its tests do not depend on the tokenizer.
#include <nlohmann/json.hpp>

#include "router/http/codec.h"
#include "router/http/json_body.h"

#ifdef KVFLEET_HAVE_TOKENIZER
#include "tokenizer/tokenizer.h"
#endif

namespace kvfleet::router {

namespace {

#ifdef KVFLEET_HAVE_TOKENIZER
class TokenizerDecoder final : public StreamDecoder {
 public:
  explicit TokenizerDecoder(std::shared_ptr<const tok::Tokenizer> t) : dec_(std::move(t), true) {}
  std::string Push(TokenId id) override { return dec_.Push(id); }
  std::string Finish() override { return dec_.Finish(); }

 private:
  tok::IncrementalDecoder dec_;
};

// Shows special tokens the tokenizer's decoder would hide (a handful: a linear search).
class ShowingDecoder final : public StreamDecoder {
 public:
  ShowingDecoder(std::shared_ptr<const tok::Tokenizer> t, std::vector<std::pair<TokenId, std::string>> shown)
      : dec_(std::move(t), true), shown_(std::move(shown)) {}
  std::string Push(TokenId id) override {
    for (const auto& [shown, text] : shown_) {
      if (id == shown) return dec_.Finish() + text;
    }
    return dec_.Push(id);
  }
  std::string Finish() override { return dec_.Finish(); }

 private:
  tok::IncrementalDecoder dec_;
  std::vector<std::pair<TokenId, std::string>> shown_;
};

class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(std::shared_ptr<const tok::Tokenizer> t, std::string dir) : tok_(std::move(t)), dir_(std::move(dir)) {}
  Result<std::vector<TokenId>> EncodePrompt(std::string_view text) const override {
    return tok_->Encode(text, tok::EncodeOptions{});
  }
  Result<std::vector<TokenId>> EncodeText(std::string_view text) const override {
    tok::EncodeOptions options;
    options.add_special_tokens = false;
    return tok_->Encode(text, options);
  }
  Result<std::vector<TokenId>> EncodeChat(const nlohmann::ordered_json& messages,
                                          const ChatTemplateOptions& options) const override {
    if (!messages.is_array() || messages.empty()) return InvalidArgument("messages must be a non-empty array");
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    if (!options.kwargs_json.empty()) {
      auto k = ParseJsonBody(options.kwargs_json);
      if (!k.ok() || !k->is_object()) return InvalidArgument("chat_template_kwargs must be a JSON object");
      kwargs = std::move(k).value();
    }
    // The tools as the client sent them (transformers' apply_chat_template(tools=...)).
    if (options.tools) kwargs["tools"] = *options.tools;
    const bool generation_prompt = options.add_generation_prompt && !options.continue_final_message;
    KVF_ASSIGN_OR_RETURN(std::string prompt, tok_->ApplyChatTemplate(messages, generation_prompt, kwargs));
    if (options.continue_final_message) {
      // vLLM's rule: cut the rendering right after the last message's text, so the model
      // goes on with it instead of starting a new turn.
      const nlohmann::json& last = messages.back();
      if (!last.contains("content") || !last["content"].is_string()) {
        return InvalidArgument("continue_final_message needs a last message whose content is a string");
      }
      const std::string& text = last["content"].get_ref<const std::string&>();
      size_t at = prompt.rfind(text);
      if (text.empty() || at == std::string::npos) {
        return InvalidArgument("continue_final_message: the chat template does not write the last message's text");
      }
      prompt.resize(at + text.size());
    }
    // The template already wrote BOS where the model wants it.
    tok::EncodeOptions encode;
    encode.add_special_tokens = options.add_special_tokens;
    return tok_->Encode(prompt, encode);
  }
  std::string Decode(std::span<const TokenId> ids) const override { return tok_->Decode(ids, false); }
  std::string TokenString(TokenId id) const override { return tok_->IdToToken(id); }
  size_t vocab_size() const override { return tok_->vocab_size(); }
  std::unique_ptr<StreamDecoder> NewDecoder() const override { return std::make_unique<TokenizerDecoder>(tok_); }
  std::unique_ptr<StreamDecoder> NewDecoderShowing(const std::vector<std::string_view>& shown) const override {
    // Only the special ones: a token that is not special is shown already (or absent: the
    // tokenizer's version has no such marker).
    std::vector<std::pair<TokenId, std::string>> ids;
    for (std::string_view s : shown) {
      std::optional<TokenId> id = tok_->TokenToId(s);
      if (id && tok_->IsSpecial(*id)) ids.emplace_back(*id, std::string(s));
    }
    if (ids.empty()) return NewDecoder();
    return std::make_unique<ShowingDecoder>(tok_, std::move(ids));
  }
  std::string_view chat_template_text() const override { return tok_->chat_template_text(); }
  std::vector<TokenId> eos_token_ids() const override {
    auto ids = tok_->eos_token_ids();
    return std::vector<TokenId>(ids.begin(), ids.end());
  }
  std::string name() const override {
    const std::string& source = tok_->chat_template_source();
    return "tokenizer:" + dir_ + (source.empty() ? " (no chat template)" : " (chat template: " + source + ")");
  }

 private:
  std::shared_ptr<const tok::Tokenizer> tok_;
  std::string dir_;
};
#endif

}  // namespace

Result<std::shared_ptr<const TextCodec>> LoadTokenizerCodec(const std::string& model_dir,
                                                            const std::optional<std::string>& chat_template) {
#ifdef KVFLEET_HAVE_TOKENIZER
  tok::LoadOptions options;
  options.chat_template = chat_template;
  KVF_ASSIGN_OR_RETURN(auto t, tok::Tokenizer::Load(model_dir, options));
  return std::shared_ptr<const TextCodec>(std::make_shared<TokenizerCodec>(std::move(t), model_dir));
#else
  return Unimplemented("this build has no tokenizer library (tokenizer/); cannot load " + model_dir);
#endif
}


}  // namespace kvfleet::router
