#include "worker/engine/structured_output.h"

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

StructuredOutputs::StructuredOutputs(grammar::Vocabulary vocabulary, size_t cache_capacity)
    : vocabulary_(std::move(vocabulary)), cache_(cache_capacity) {}

Status StructuredOutputs::Prepare(GenerateRequest* request) {
  const StructuredOutput& s = request->sampling.structured;
  if (s.kind == StructuredOutput::Kind::kNone) return Status::Ok();
  auto compiled = cache_.GetOrCompile(SpecOf(s), vocabulary_);
  if (!compiled.ok()) {
    return InvalidArgument("response_format (structured output): " + std::string(compiled.status().message()));
  }
  request->grammar = *std::move(compiled);
  return Status::Ok();
}

grammar::Vocabulary ByteVocabulary(size_t vocab_size) {
  std::vector<std::string> bytes(vocab_size);
  for (size_t b = 0; b < 256 && b < vocab_size; ++b) bytes[b] = std::string(1, static_cast<char>(b));
  return grammar::Vocabulary::FromTokenBytes(std::move(bytes), {});
}

}  // namespace kvfleet::engine
