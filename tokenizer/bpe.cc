#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstring>
#include <queue>

#include <xxhash.h>

#include "tokenizer/unicode.h"

namespace kvfleet::tok {

// ---- StringIdMap ----

void StringIdMap::Reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  for (const Slot& s : old) {
    if (!s.used) continue;
    size_t mask = slots_.size() - 1;
    for (size_t i = s.hash & mask;; i = (i + 1) & mask) {
      if (!slots_[i].used) {
        slots_[i] = s;
        break;
      }
    }
  }
}

void StringIdMap::Grow() { Reserve(std::max<size_t>(16, size_ * 2 + 2)); }

bool StringIdMap::Insert(std::string_view key, TokenId id) {
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  uint64_t h = XXH3_64bits(key.data(), key.size());
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (!s.used) {
      s.used = true;
      s.hash = h;
      s.offset = static_cast<uint32_t>(arena_.size());
      s.length = static_cast<uint32_t>(key.size());
      s.id = id;
      arena_.append(key);
      ++size_;
      return true;
    }
    if (s.hash == h && std::string_view(arena_).substr(s.offset, s.length) == key) return false;
  }
}

std::optional<TokenId> StringIdMap::Find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  uint64_t h = XXH3_64bits(key.data(), key.size());
  size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (!s.used) return std::nullopt;
    if (s.hash == h && s.length == key.size() &&
        std::string_view(arena_).substr(s.offset, s.length) == key) {
      return s.id;
    }
  }
}

// ---- MergeMap: (left, right) -> Merge, open addressing ----

class BpeModel::MergeMap {
 public:
  explicit MergeMap(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.resize(cap);
    mask_ = cap - 1;
  }
  // Keeps the first (lowest-rank) entry for a pair.
  void Insert(uint32_t left, uint32_t right, Merge m) {
    uint64_t key = Key(left, right);
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = m;
        return;
      }
      if (keys_[i] == key) return;
    }
  }
  const Merge* Find(uint32_t left, uint32_t right) const {
    uint64_t key = Key(left, right);
    if (key == kEmpty) return nullptr;  // two unknown symbols: never a merge
    for (size_t i = Hash(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t Key(uint32_t l, uint32_t r) { return (static_cast<uint64_t>(l) << 32) | r; }
  size_t Hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Merge> values_;
  size_t mask_;
};

namespace {

namespace config {
// The word cache: direct-mapped, per thread. Words repeat (Zipf), and a hit avoids both
// the vocabulary probe (two cache misses in a multi-megabyte table) and BPE merging.
// 8192 entries of 64 bytes = 512 KiB, about an L2 cache.
constexpr size_t kWordCacheEntries = 8192;
constexpr size_t kWordCacheMaxBytes = 20;  // longer words bypass the cache
constexpr size_t kWordCacheMaxIds = 8;     // and so do words of more ids
}  // namespace config

struct WordCacheEntry {
  uint32_t model = 0;  // BpeModel::cache_id_; 0 = empty
  uint8_t length = 0;
  uint8_t n_ids = 0;
  char word[config::kWordCacheMaxBytes];
  TokenId ids[config::kWordCacheMaxIds];
};
static_assert(sizeof(WordCacheEntry) <= 64);

std::atomic<uint32_t> next_cache_id{1};

WordCacheEntry& CacheSlot(uint32_t model, std::string_view word) {
  thread_local std::vector<WordCacheEntry> cache(config::kWordCacheEntries);
  uint64_t h = XXH3_64bits_withSeed(word.data(), word.size(), model);
  return cache[h & (config::kWordCacheEntries - 1)];
}

}  // namespace

BpeModel::BpeModel() : cache_id_(next_cache_id.fetch_add(1)) {}
BpeModel::~BpeModel() = default;

Result<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& model, bool byte_level) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  auto flag = [&](const char* key) { return model.contains(key) && model[key].is_boolean() && model[key].get<bool>(); };
  auto nonempty_string = [&](const char* key) {
    return model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty();
  };
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    return Unimplemented("tokenizer.json: BPE dropout is not supported");
  }
  if (nonempty_string("continuing_subword_prefix")) {
    return Unimplemented("tokenizer.json: BPE continuing_subword_prefix is not supported");
  }
  if (nonempty_string("end_of_word_suffix")) {
    return Unimplemented("tokenizer.json: BPE end_of_word_suffix is not supported");
  }
  m->ignore_merges_ = flag("ignore_merges");
  m->byte_fallback_ = flag("byte_fallback");
  m->fuse_unk_ = flag("fuse_unk");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return InvalidArgument("tokenizer.json: BPE model has no vocab");
  if (!model.contains("merges") || !model["merges"].is_array()) return InvalidArgument("tokenizer.json: BPE model has no merges");

  const auto& vocab = model["vocab"];
  m->vocab_.Reserve(vocab.size());
  TokenId max_id = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_unsigned()) return InvalidArgument("tokenizer.json: vocab id of '" + it.key() + "' is not an unsigned number");
    max_id = std::max(max_id, it.value().get<TokenId>());
  }
  if (max_id >= kExtraBase) return InvalidArgument("tokenizer.json: vocab id too large");
  m->id_to_token_.assign(vocab.empty() ? 0 : max_id + 1, std::string());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    TokenId id = it.value().get<TokenId>();
    m->vocab_.Insert(it.key(), id);
    m->id_to_token_[id] = it.key();
  }

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    m->unk_token_ = model["unk_token"].get<std::string>();
    m->unk_id_ = m->vocab_.Find(m->unk_token_);
  }

  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  if (byte_level) {
    m->byte_symbol_.assign(256, kUnknownSymbol);
    for (int b = 0; b < 256; ++b) {
      if (auto id = m->vocab_.Find(alphabet.byte_to_text[b])) m->byte_symbol_[b] = *id;
    }
    // The raw bytes each token stands for, so words are looked up without re-spelling.
    m->raw_vocab_.Reserve(vocab.size());
    std::string raw;
    for (TokenId id = 0; id < m->id_to_token_.size(); ++id) {
      const std::string& t = m->id_to_token_[id];
      if (t.empty() || !IsValidUtf8(t)) continue;
      raw.clear();
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        int b = alphabet.ByteOf(NextCodePoint(t, &i));
        if (b < 0) ok = false;
        else raw.push_back(static_cast<char>(b));
      }
      if (ok) m->raw_vocab_.Insert(raw, id);
    }
  } else {
    for (TokenId id = 0; id < m->id_to_token_.size(); ++id) {
      const std::string& t = m->id_to_token_[id];
      if (!t.empty() && IsValidUtf8(t) && Utf8Length(static_cast<unsigned char>(t[0])) == t.size()) {
        m->char_symbol_.Insert(t, id);
      }
    }
  }
  m->byte_fallback_ids_.assign(256, kUnknownSymbol);
  if (m->byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto id = m->vocab_.Find(name)) m->byte_fallback_ids_[b] = *id;
    }
  }

  // Merges: "a b" strings (old format) or ["a", "b"] pairs.
  const auto& merges = model["merges"];
  m->merges_ = std::make_unique<MergeMap>(merges.size());
  StringIdMap extra_index;
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& entry = merges[rank];
    std::string left, right;
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos) return InvalidArgument("tokenizer.json: merge '" + s + "' has no space");
      left = s.substr(0, space);
      size_t end = s.find(' ', space + 1);
      right = s.substr(space + 1, end == std::string::npos ? std::string::npos : end - space - 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      return InvalidArgument("tokenizer.json: merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    auto l = m->vocab_.Find(left);
    auto r = m->vocab_.Find(right);
    if (!l || !r) continue;  // a merge of symbols that can never occur
    merged = left + right;
    uint32_t result;
    if (auto id = m->vocab_.Find(merged)) {
      result = *id;
    } else if (auto e = extra_index.Find(merged)) {
      result = kExtraBase + *e;
    } else {
      extra_index.Insert(merged, static_cast<TokenId>(m->extra_tokens_.size()));
      result = kExtraBase + static_cast<uint32_t>(m->extra_tokens_.size());
      m->extra_tokens_.push_back(merged);
    }
    m->merges_->Insert(*l, *r, Merge{static_cast<uint32_t>(rank), result});
  }
  return m;
}

const std::string& BpeModel::IdToToken(TokenId id) const {
  static const std::string kEmpty;
  return id < id_to_token_.size() ? id_to_token_[id] : kEmpty;
}

void BpeModel::EmitUnknown(std::string_view text, std::vector<TokenId>* out) const {
  if (byte_fallback_) {
    bool all = true;
    for (unsigned char c : text) all = all && byte_fallback_ids_[c] != kUnknownSymbol;
    if (all) {
      for (unsigned char c : text) out->push_back(byte_fallback_ids_[c]);
      return;
    }
  }
  if (unk_id_) out->push_back(*unk_id_);
}

void BpeModel::Encode(std::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  if (word.size() > config::kWordCacheMaxBytes) {
    EncodeUncached(word, out);
    return;
  }
  WordCacheEntry& slot = CacheSlot(cache_id_, word);
  if (slot.model == cache_id_ && slot.length == word.size() && std::memcmp(slot.word, word.data(), word.size()) == 0) {
    out->insert(out->end(), slot.ids, slot.ids + slot.n_ids);
    return;
  }
  size_t first = out->size();
  EncodeUncached(word, out);
  size_t n = out->size() - first;
  if (n <= config::kWordCacheMaxIds) {
    slot.model = cache_id_;
    slot.length = static_cast<uint8_t>(word.size());
    slot.n_ids = static_cast<uint8_t>(n);
    std::memcpy(slot.word, word.data(), word.size());
    std::copy(out->begin() + static_cast<std::ptrdiff_t>(first), out->end(), slot.ids);
  }
}

void BpeModel::EncodeUncached(std::string_view word, std::vector<TokenId>* out) const {
  if (ignore_merges_) {
    auto id = byte_level_ ? raw_vocab_.Find(word) : vocab_.Find(word);
    if (id) {
      out->push_back(*id);
      return;
    }
  }
  // Symbols as a doubly linked list over a vector; a merge keeps the left one.
  struct Symbol {
    uint32_t id;
    uint32_t begin, end;  // bytes of `word` it covers
    int32_t prev, next;
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  if (byte_level_) {
    for (size_t i = 0; i < word.size(); ++i) {
      int32_t n = static_cast<int32_t>(symbols.size());
      symbols.push_back({byte_symbol_[static_cast<unsigned char>(word[i])], static_cast<uint32_t>(i),
                         static_cast<uint32_t>(i + 1), n - 1, n + 1});
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      size_t len = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
      auto id = char_symbol_.Find(word.substr(i, len));
      int32_t n = static_cast<int32_t>(symbols.size());
      symbols.push_back({id ? *id : kUnknownSymbol, static_cast<uint32_t>(i), static_cast<uint32_t>(i + len), n - 1, n + 1});
      i += len;
    }
  }
  symbols.back().next = -1;

  if (symbols.size() > 1) {
    struct Candidate {
      uint32_t rank;
      int32_t pos;     // left symbol
      uint32_t left, right;  // the ids the pair had when queued
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    thread_local std::vector<Candidate> heap;
    heap.clear();
    auto push = [&](int32_t pos) {
      int32_t next = symbols[pos].next;
      if (next < 0) return;
      const Merge* m = merges_->Find(symbols[pos].id, symbols[next].id);
      if (m == nullptr) return;
      heap.push_back({m->rank, pos, symbols[pos].id, symbols[next].id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      Candidate c = heap.back();
      heap.pop_back();
      Symbol& left = symbols[c.pos];
      if (left.id != c.left || left.next < 0) continue;  // stale
      Symbol& right = symbols[left.next];
      if (right.id != c.right) continue;
      const Merge* m = merges_->Find(left.id, right.id);
      left.id = m->result;
      left.end = right.end;
      right.id = kUnknownSymbol - 1;  // dead
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.pos;
      if (left.prev >= 0) push(left.prev);
      push(c.pos);
    }
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id < kExtraBase) {
      out->push_back(s.id);
    } else if (byte_level_) {
      // Spelled in the byte-level alphabet, as the reference's fallback sees it.
      if (s.id != kUnknownSymbol) {
        EmitUnknown(extra_tokens_[s.id - kExtraBase], out);
      } else {
        std::string spelled = ByteLevelAlphabet::Get().byte_to_text[static_cast<unsigned char>(word[s.begin])];
        EmitUnknown(spelled, out);
      }
    } else {
      EmitUnknown(word.substr(s.begin, s.end - s.begin), out);
    }
  }
}

}  // namespace kvfleet::tok
