#include "worker/server/grammar_vocabulary.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "worker/engine/structured_output.h"

namespace kvfleet::server {

Result<grammar::Vocabulary> LoadGrammarVocabulary(const std::string& model_dir, size_t vocab_size,
                                                  const std::vector<TokenId>& eos_token_ids) {
  std::error_code ec;
  if (model_dir.empty() || !std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json", ec)) {
    return engine::ByteVocabulary(vocab_size);
  }
  KVF_ASSIGN_OR_RETURN(auto tok, tok::Tokenizer::Load(model_dir));
  std::vector<std::string> bytes(vocab_size);
  std::vector<int32_t> special;
  const size_t n = std::min(vocab_size, tok->vocab_size());
  for (size_t id = 0; id < n; ++id) {
    const auto t = static_cast<TokenId>(id);
    if (tok->IsSpecial(t)) {
      special.push_back(static_cast<int32_t>(id));
    } else {
      bytes[id] = tok->TokenBytes(t);
    }
  }
  std::vector<int32_t> stops;
  for (TokenId e : eos_token_ids) {
    if (e < vocab_size) stops.push_back(static_cast<int32_t>(e));
  }
  std::erase_if(special, [&](int32_t id) { return std::find(stops.begin(), stops.end(), id) != stops.end(); });
  return grammar::Vocabulary::FromTokenBytes(std::move(bytes), std::move(stops), std::move(special));
}

}  // namespace kvfleet::server
