// StructuredOutputs: the worker's constrained decoding (structured outputs) before a request
// reaches the engine. It holds the model's grammar vocabulary (token id -> bytes, built once
// at start-up) and one worker-wide GrammarCache, and compiles a request's
// SamplingParams::structured into the CompiledGrammar its sequences follow (one
// grammar::Matcher each, in the engine). Compile time and memory are bounded by
// grammar::Limits, and a spec seen before is a cache hit.
//
// The request server calls Prepare on its I/O thread, as a request is decoded, so the
// engine thread never compiles.
//
// Thread safety: thread-safe (the vocabulary is immutable, the cache is thread-safe).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "worker/engine/request.h"

namespace kvfleet::engine {

class StructuredOutputs {
 public:
  explicit StructuredOutputs(grammar::Vocabulary vocabulary, size_t cache_capacity = 256);

  // Sets request->grammar when request->sampling.structured asks for one (otherwise does
  // nothing). InvalidArgument naming the field and the schema keyword when the spec is
  // invalid or unsupported.
  Status Prepare(GenerateRequest* request);

  const grammar::Vocabulary& vocabulary() const { return vocabulary_; }
  const grammar::GrammarCache& cache() const { return cache_; }

 private:
  const grammar::Vocabulary vocabulary_;
  grammar::GrammarCache cache_;
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
