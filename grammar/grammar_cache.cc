#include <list>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <xxhash.h>

#include "grammar/compiled.h"

namespace kvfleet::grammar {

namespace {

struct Key {
  Kind kind;
  bool strict;
  bool any_whitespace;
  std::string text;
  uint64_t vocab;
  std::tuple<size_t, int, size_t, size_t, size_t, bool> limits;
  bool operator==(const Key&) const = default;
};

uint64_t HashKey(const Key& k) {
  uint64_t h = XXH3_64bits_withSeed(k.text.data(), k.text.size(), k.vocab);
  auto [a, b, c, d, e, f] = k.limits;
  uint64_t parts[] = {static_cast<uint64_t>(k.kind), k.strict, k.any_whitespace, a, static_cast<uint64_t>(b), c, d, e, f, h};
  return XXH3_64bits(parts, sizeof(parts));
}

}  // namespace

struct GrammarCache::Impl {
  struct Entry {
    Key key;
    std::shared_ptr<const CompiledGrammar> grammar;
  };
  size_t capacity;
  mutable std::mutex mu;
  std::list<Entry> lru;  // front: most recently used
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index;
  uint64_t hits = 0, misses = 0;
};

GrammarCache::GrammarCache(size_t capacity) : impl_(std::make_unique<Impl>()) {
  impl_->capacity = capacity == 0 ? 1 : capacity;
}
GrammarCache::~GrammarCache() = default;

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::GetOrCompile(const Spec& spec, const Vocabulary& vocab,
                                                                          const Limits& limits) {
  Key key{spec.kind,
          spec.strict,
          spec.any_whitespace,
          spec.text,
          vocab.fingerprint(),
          {limits.max_spec_bytes, limits.max_nesting_depth, limits.max_rules, limits.max_states, limits.max_stacks,
           limits.token_cache}};
  uint64_t h = HashKey(key);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->index.find(h);
    if (it != impl_->index.end() && it->second->key == key) {
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
      ++impl_->hits;
      return it->second->grammar;
    }
    ++impl_->misses;
  }
  // Compiled outside the lock: a large schema takes milliseconds, others must not wait.
  auto compiled = Compile(spec, vocab, limits);
  if (!compiled.ok()) return compiled.status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->index.find(h);
  if (it != impl_->index.end()) {
    impl_->lru.erase(it->second);
    impl_->index.erase(it);
  }
  impl_->lru.push_front({std::move(key), *compiled});
  impl_->index[h] = impl_->lru.begin();
  while (impl_->lru.size() > impl_->capacity) {
    impl_->index.erase(HashKey(impl_->lru.back().key));
    impl_->lru.pop_back();
  }
  return *compiled;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->lru.size();
}
uint64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->hits;
}
uint64_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->misses;
}

}  // namespace kvfleet::grammar
