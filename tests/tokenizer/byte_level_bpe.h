// Test support: the "model" object of a tiny byte-level BPE tokenizer.json, for tests that
// build tokenizers by hand: the 256 byte symbols (ids 0..255 in byte order), then one token
// per merge (ids from 256, in order).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok::testing {

inline nlohmann::json ByteLevelBpeModel(const std::vector<std::pair<std::string, std::string>>& merges) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::Get();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[a.byte_to_text[b]] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  TokenId next = 256;
  for (const auto& [l, r] : merges) {
    vocab[l + r] = next++;
    merge_list.push_back(l + " " + r);
  }
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}};
}

}  // namespace kvfleet::tok::testing
