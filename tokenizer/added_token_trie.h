// AddedTokenTrie: the tokenizer's index of added-token contents (special tokens, chat
// markers), used to split text into the sections between them before BPE. Internal to
// tokenizer/ (tokenizer.cc).
//
// Thread safety: built once, then read concurrently (const methods only).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kvfleet::tok {

// A byte trie over added-token contents: at a position, the longest content that
// starts there (the reference's DictionarySplitter).
class AddedTokenTrie {
 public:
  AddedTokenTrie() : nodes_(1) { first_byte_.fill(false); }
  void Insert(std::string_view s, int token) {
    if (s.empty()) return;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t child = Child(node, c);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.push_back({c, child});
        nodes_.emplace_back();
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token;
  }
  bool empty() const { return nodes_.size() == 1; }
  bool MayStart(unsigned char c) const { return first_byte_[c]; }
  // Length of the longest accepted content at text[pos]; 0 if none. *token is set.
  template <typename Accept>
  size_t Match(std::string_view text, size_t pos, Accept&& accept, int* token) const {
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      int t = nodes_[node].token;
      if (t >= 0 && accept(t, pos, i + 1)) {
        best = i + 1 - pos;
        *token = t;
      }
    }
    return best;
  }

 private:
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int token = -1;
  };
  int32_t Child(int32_t node, unsigned char c) const {
    for (const auto& [b, child] : nodes_[node].children) {
      if (b == c) return child;
    }
    return -1;
  }
  std::vector<TrieNode> nodes_;
  std::array<bool, 256> first_byte_;
};

}  // namespace kvfleet::tok
