// SectionCache: an LRU map from one encoded section of a prompt to the ids it produced,
// bounded by bytes. Tokenizer::Encode cuts its input at added tokens into sections and
// encodes each text section independently of the others, so a section's ids depend only
// on (tokenizer, parse_special, whether it is the first section, its text): that is the
// key. Chat prompts repeat long sections (the system prompt, few-shot examples, earlier
// turns), and a hit replaces normalizing, pre-tokenizing and BPE with a hash, one compare
// of the text and a copy of the ids.
//
// Thread safety: thread-compatible. Encode uses one per thread (ThisThreadSectionCache),
// so the hot path takes no lock; entries are never shared between threads.
//
// Invariants (CheckInvariants asserts them):
//   1. bytes() == the sum of Charge(text, ids) over the entries, and bytes() <= max_bytes().
//   2. the index and the recency list hold the same entries: each entry's hash maps to it.
//   3. no two entries share a hash (an insert whose hash collides replaces the old entry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/block_hash.h"

namespace kvfleet::tok {

namespace config {
// Sections shorter than this are encoded, not cached: encoding ~100 tokens costs a few
// microseconds, about what hashing, the map probe and an entry's allocation cost, and the
// short pieces of a chat render (role headers, a short user turn) rarely repeat exactly.
constexpr size_t kSectionCacheMinBytes = 512;
// Per-thread bound. 8 MiB holds ~1 MB of distinct long sections with their ids (4 bytes
// per ~4 bytes of text) many times over a 32 KB system prompt, while a router's few HTTP
// threads together stay within tens of MiB.
constexpr size_t kSectionCacheMaxBytes = size_t{8} << 20;
// What an entry costs besides its text and ids: the list node, the index node, the
// string and vector headers. Counted so that many small entries cannot exceed the bound.
constexpr size_t kSectionCacheEntryOverheadBytes = 128;
}  // namespace config

// What a section's ids depend on. `tokenizer_id` is TokenizerImpl's instance id, never
// reused (an address could be reused by a later tokenizer and hit a dead one's entries).
struct SectionKey {
  uint64_t tokenizer_id = 0;
  bool parse_special = true;
  bool first_section = false;  // Metaspace prepend_scheme "first" prepends only there
  std::string_view text;       // the section's text as cut (UTF-8 repaired, l/rstripped)
};

class SectionCache {
 public:
  explicit SectionCache(size_t max_bytes = config::kSectionCacheMaxBytes) : max_bytes_(max_bytes) {}
  SectionCache(const SectionCache&) = delete;
  SectionCache& operator=(const SectionCache&) = delete;

  // On a hit appends the key's ids to *out, makes the entry most recently used and
  // returns true; on a miss leaves *out alone and returns false.
  bool Lookup(const SectionKey& key, std::vector<TokenId>* out);
  // Stores `ids` for `key`, evicting least recently used entries to stay within
  // max_bytes(). An entry whose charge alone exceeds max_bytes() is not stored.
  void Insert(const SectionKey& key, std::span<const TokenId> ids);
  void Clear();
  // Evicts down to the new bound at once.
  void set_max_bytes(size_t max_bytes);

  // What an entry of this much text and this many ids counts against max_bytes().
  static size_t Charge(size_t text_bytes, size_t n_ids) {
    return text_bytes + n_ids * sizeof(TokenId) + config::kSectionCacheEntryOverheadBytes;
  }
  size_t bytes() const { return bytes_; }
  size_t max_bytes() const { return max_bytes_; }
  size_t entries() const { return lru_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  void CheckInvariants() const;

 private:
  struct Entry {
    uint64_t hash;
    uint64_t tokenizer_id;
    bool parse_special;
    bool first_section;
    std::string text;
    std::vector<TokenId> ids;
  };
  using List = std::list<Entry>;
  struct IdentityHash {
    size_t operator()(uint64_t h) const { return static_cast<size_t>(h); }
  };

  static uint64_t Hash(const SectionKey& key);
  void Erase(List::iterator it);
  void EvictTo(size_t limit);

  size_t max_bytes_;
  size_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  List lru_;  // front: most recently used
  std::unordered_map<uint64_t, List::iterator, IdentityHash> index_;
};

// The calling thread's cache, created on first use and freed when the thread exits.
SectionCache& ThisThreadSectionCache();

}  // namespace kvfleet::tok
