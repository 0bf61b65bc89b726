#include "worker/engine/structured_output.h"

#include <algorithm>

namespace kvfleet::engine {

grammar::Spec SpecOf(const StructuredOutput& s) {
  grammar::Spec spec;
  spec.text = s.spec;
  switch (s.kind) {
    case StructuredOutput::Kind::kJsonSchema: spec.kind = grammar::Kind::kJsonSchema; break;
    case StructuredOutput::Kind::kJsonObject: spec.kind = grammar::Kind::kJsonObject; break;
    case StructuredOutput::Kind::kRegex: spec.kind = grammar::Kind::kRegex; break;
    case StructuredOutput::Kind::kChoice: spec.kind = grammar::Kind::kChoice; break;
    case StructuredOutput::Kind::kEbnf: spec.kind = grammar::Kind::kEbnf; break;
    case StructuredOutput::Kind::kNone: break;
  }
  return spec;
}

StructuredOutputs::StructuredOutputs(grammar::Vocabulary vocabulary, size_t cache_capacity, bool warm)
    : vocabulary_(std::move(vocabulary)), cache_(cache_capacity) {
  if (warm) warmer_ = std::thread([this] { WarmLoop(); });
}

StructuredOutputs::~StructuredOutputs() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_relaxed);
  }
  cv_.notify_all();
  if (warmer_.joinable()) warmer_.join();
}

void StructuredOutputs::WarmLoop() {
  for (;;) {
    std::shared_ptr<const grammar::CompiledGrammar> g;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_.load(std::memory_order_relaxed) || !to_warm_.empty(); });
      if (stop_.load(std::memory_order_relaxed)) return;
      g = std::move(to_warm_.front());
      to_warm_.pop_front();
    }
    grammar::WarmTokenCache(*g, &stop_);
    if (!stop_.load(std::memory_order_relaxed)) warmed_.fetch_add(1, std::memory_order_release);
  }
}

Status StructuredOutputs::Prepare(GenerateRequest* request) {
  const StructuredOutput& s = request->sampling.structured;
  if (s.kind == StructuredOutput::Kind::kNone) return Status::Ok();
  auto compiled = cache_.GetOrCompile(SpecOf(s), vocabulary_);
  if (!compiled.ok()) {
    return InvalidArgument("response_format (structured output): " + std::string(compiled.status().message()));
  }
  request->grammar = *std::move(compiled);
  if (warmer_.joinable()) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool queued = std::find(to_warm_.begin(), to_warm_.end(), request->grammar) != to_warm_.end();
    if (!queued && to_warm_.size() < kMaxWarmQueue) {
      to_warm_.push_back(request->grammar);
      cv_.notify_one();
    }
  }
  return Status::Ok();
}

grammar::Vocabulary ByteVocabulary(size_t vocab_size) {
  std::vector<std::string> bytes(vocab_size);
  for (size_t b = 0; b < 256 && b < vocab_size; ++b) bytes[b] = std::string(1, static_cast<char>(b));
  return grammar::Vocabulary::FromTokenBytes(std::move(bytes), {});
}

}  // namespace kvfleet::engine
