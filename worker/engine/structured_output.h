// StructuredOutputs: the worker's constrained decoding (structured outputs) before a request
// reaches the engine. It holds the model's grammar vocabulary (token id -> bytes, built once
// at start-up) and one worker-wide GrammarCache, and compiles a request's
// SamplingParams::structured into the CompiledGrammar its sequences follow (one
// grammar::Matcher each, in the engine). Compile time and memory are bounded by
// grammar::Limits, and a spec seen before is a cache hit.
//
// The request server calls Prepare on its I/O thread, as a request is decoded, so the
// engine thread never compiles. A background thread then fills each prepared grammar's token
// cache (grammar::WarmTokenCache), so that the engine thread's mask for a state it has not
// seen costs a walk of the vocabulary (up to ~8 ms on 128K tokens) only while that thread
// has not reached the state yet.
//
// Thread safety: thread-safe (the vocabulary is immutable, the cache is thread-safe, the
// warming queue is under a mutex).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "worker/engine/request.h"

namespace kvfleet::engine {

class StructuredOutputs {
 public:
  // `warm`: start the background thread that fills prepared grammars' token caches.
  explicit StructuredOutputs(grammar::Vocabulary vocabulary, size_t cache_capacity = 256, bool warm = true);
  ~StructuredOutputs();  // stops the warming thread between two states and joins it
  StructuredOutputs(const StructuredOutputs&) = delete;
  StructuredOutputs& operator=(const StructuredOutputs&) = delete;

  // Sets request->grammar when request->sampling.structured asks for one (otherwise does
  // nothing). InvalidArgument naming the field and the schema keyword when the spec is
  // invalid or unsupported.
  Status Prepare(GenerateRequest* request);

  const grammar::Vocabulary& vocabulary() const { return vocabulary_; }
  const grammar::GrammarCache& cache() const { return cache_; }
  // Grammars whose token cache the warming thread has filled (a grammar prepared again is
  // counted again: its second pass finds every entry filled).
  size_t grammars_warmed() const { return warmed_.load(std::memory_order_acquire); }

 private:
  // Grammars waiting to be warmed; a full queue drops the newest (generation fills them lazily).
  static constexpr size_t kMaxWarmQueue = 64;
  void WarmLoop();

  const grammar::Vocabulary vocabulary_;
  grammar::GrammarCache cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const grammar::CompiledGrammar>> to_warm_;  // GUARDED_BY(mu_)
  std::atomic<bool> stop_{false};
  std::atomic<size_t> warmed_{0};
  std::thread warmer_;  // last: started once the members above exist
};

// The grammar spec of a request's constraint (schema/sampling.h's kinds map one to one).
// REQUIRES: s.kind != kNone.
grammar::Spec SpecOf(const StructuredOutput& s);

// The byte vocabulary of a model directory without a tokenizer (a mock fleet, whose router
// uses the byte codec: an id below 256 is that byte). Ids 0..255 are their byte; every other
// id of `vocab_size` is never allowed, and there are no stop ids: the byte codec would show
// an end-of-sequence id as a letter, so the engine ends a finished document itself.
grammar::Vocabulary ByteVocabulary(size_t vocab_size);

}  // namespace kvfleet::engine
