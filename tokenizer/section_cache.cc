#include "tokenizer/section_cache.h"

#include <iterator>

#include <xxhash.h>

#include "common/check.h"

namespace kvfleet::tok {

uint64_t SectionCache::Hash(const SectionKey& key) {
  // The flags go into the seed's low bits; instance ids stay far below 2^62.
  uint64_t seed = (key.tokenizer_id << 2) | (key.parse_special ? 2u : 0u) | (key.first_section ? 1u : 0u);
  return XXH3_64bits_withSeed(key.text.data(), key.text.size(), seed);
}

bool SectionCache::Lookup(const SectionKey& key, std::vector<TokenId>* out) {
  auto found = index_.find(Hash(key));
  if (found == index_.end()) {
    ++misses_;
    return false;
  }
  const Entry& e = *found->second;
  if (e.tokenizer_id != key.tokenizer_id || e.parse_special != key.parse_special ||
      e.first_section != key.first_section || e.text != key.text) {
    ++misses_;  // a 64-bit hash collision: the entry belongs to another key
    return false;
  }
  lru_.splice(lru_.begin(), lru_, found->second);
  out->insert(out->end(), e.ids.begin(), e.ids.end());
  ++hits_;
  return true;
}

void SectionCache::Insert(const SectionKey& key, std::span<const TokenId> ids) {
  size_t charge = Charge(key.text.size(), ids.size());
  if (charge > max_bytes_) return;
  uint64_t hash = Hash(key);
  if (auto found = index_.find(hash); found != index_.end()) Erase(found->second);
  EvictTo(max_bytes_ - charge);
  lru_.push_front(Entry{hash, key.tokenizer_id, key.parse_special, key.first_section, std::string(key.text),
                        std::vector<TokenId>(ids.begin(), ids.end())});
  index_.emplace(hash, lru_.begin());
  bytes_ += charge;
}

void SectionCache::Clear() {
  index_.clear();
  lru_.clear();
  bytes_ = 0;
}

void SectionCache::set_max_bytes(size_t max_bytes) {
  max_bytes_ = max_bytes;
  EvictTo(max_bytes_);
}

void SectionCache::Erase(List::iterator it) {
  bytes_ -= Charge(it->text.size(), it->ids.size());
  index_.erase(it->hash);
  lru_.erase(it);
}

void SectionCache::EvictTo(size_t limit) {
  while (bytes_ > limit && !lru_.empty()) Erase(std::prev(lru_.end()));
}

void SectionCache::CheckInvariants() const {
  size_t sum = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    sum += Charge(it->text.size(), it->ids.size());
    auto found = index_.find(it->hash);
    KVF_CHECK(found != index_.end() && found->second == it) << "an entry is missing from the index";  // 2, 3
  }
  KVF_CHECK_EQ(index_.size(), lru_.size());  // 2
  KVF_CHECK_EQ(sum, bytes_);                 // 1
  KVF_CHECK_LE(bytes_, max_bytes_);          // 1
}

SectionCache& ThisThreadSectionCache() {
  thread_local SectionCache cache;
  return cache;
}

}  // namespace kvfleet::tok
