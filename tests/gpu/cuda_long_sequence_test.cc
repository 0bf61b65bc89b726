// The cuda backend's long-sequence features against the cpu backend (tests/gpu/cuda_parity.h):
// sliding windows with blocks no query can see absent from the table, StreamingLLM sinks with
// position shift, StreamingLLM's dense context phase against a naive fp32 reference that
// attends densely over the prompt and then keeps the sinks and the window
// (streaming_reference.h), chunked attention, and a million-token streamed generation through
// the engine within its block bound. Needs a GPU (label gpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "tests/gpu/cuda_parity.h"
#include "tests/worker/backend/cpu/streaming_reference.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::testing {
namespace {

TEST_CASE("sliding window: blocks no query can see may be absent from the table") {
  Reference ref = Reference::Load(DataDir() + "/model", "tiny-mistral");
  auto b = Make("cuda", Options(ref.shape, ref.seed, 8));
  REQUIRE(b->pools()[0].window == 20);
  BlockIds ids;
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    ForcedSeq s{.ref = &ref, .prompt = p, .chunk = 6, .drop_behind_window = true};
    s.table = ids.Take(BlocksFor(ref, p, 8));
    ForcedReplay(*b, {&s});
    ExpectMatches(s);
  }
}

TEST_CASE("StreamingLLM sinks with position shift agree with the cpu backend") {
  for (const char* name : {"tiny", "tiny-mistral"}) {
    Reference ref = Reference::Load(DataDir() + "/model", name);
    backend::BackendOptions o = Options(ref.shape, ref.seed, 8);
    o.attention.sink_tokens = 4;
    if (ref.shape == "tiny") o.attention.max_attention_window = {12};  // tiny-mistral: its own window of 20
    o.attention.streaming_llm = true;
    auto gpu = Make("cuda", o);
    auto cpu = Make("cpu", o);
    REQUIRE(gpu->pools().size() == cpu->pools().size());
    REQUIRE(gpu->pools()[0].position_shift);
    INFO(std::string(name));
    for (int64_t chunk : {5, 64}) CompareWithCpu(*gpu, *cpu, ref.prompts[2], chunk, 24);
  }
}

// Runs `toks` as the engine runs a StreamingLLM sequence: the prompt (prompt_len tokens) in
// chunks with context_end = prompt_len and every block kept, then one token per step with the
// blocks behind the window dropped (sink blocks stay). Returns the logits of every position.
std::vector<float> StreamRun(backend::ModelBackend& b, std::span<const TokenId> toks, int64_t prompt_len,
                             int64_t chunk) {
  const int64_t B = b.block_size();
  const backend::KvPoolInfo& pool = b.pools()[0];
  std::vector<backend::BlockId> table;
  for (int64_t i = 0; i <= static_cast<int64_t>(toks.size()) / B; ++i) table.push_back(static_cast<backend::BlockId>(i));
  std::vector<float> rows;
  for (int64_t pos = 0; pos < static_cast<int64_t>(toks.size());) {
    const int64_t n = pos < prompt_len ? std::min(chunk, prompt_len - pos) : 1;
    if (pos >= prompt_len) {
      for (int64_t blk = (pool.sink_tokens + B - 1) / B; (blk + 1) * B <= pos - pool.window + 1; ++blk) {
        table[blk] = backend::kNoBlock;
      }
    }
    backend::SequenceStep st;
    st.tokens = toks.subspan(pos, n);
    st.start_position = pos;
    st.context_end = prompt_len;
    st.block_tables = {table};
    st.logits = backend::LogitsRequest::kAll;
    st.sample = pos + n >= prompt_len;
    backend::StepBatch batch;
    batch.seqs = {st};
    backend::StepOutput out;
    const Status status = b.Execute(batch, &out);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    rows.insert(rows.end(), out.logits.begin(), out.logits.end());
    pos += n;
  }
  return rows;
}

// StreamingLLM's dense context phase (--streaming-llm): the prompt attends densely, then only
// the sinks and the window are kept. Against the naive fp32 reference (streaming_reference.h:
// dense prompt, then K rotated at its cache position) and the cpu backend, on head_dim 16
// (the generic kernel) and 64 (the decode kernel with shifted RoPE; batch-1 decode and the
// dense prompt rows as decode queries of their own).
TEST_CASE("StreamingLLM's dense context phase agrees with a dense-then-windowed reference and the cpu backend") {
  struct Shape {
    const char* name;
    int32_t window;
    float tolerance;
  };
  for (Shape shape : {Shape{"tiny", 12, kBf16Tolerance}, Shape{"smollm2-135m", 40, 0.3f}}) {
    INFO(std::string(shape.name));
    backend::BackendOptions o = Options(shape.name, 5, 8);
    o.threads = 0;
    o.attention.sink_tokens = 4;
    o.attention.max_attention_window = {shape.window};
    o.attention.streaming_llm = true;
    auto gpu = Make("cuda", o);
    auto cpu = Make("cpu", o);
    REQUIRE(gpu->pools()[0].dense_context);
    const int64_t V = gpu->config().vocab_size;
    const int64_t prompt_len = 2 * shape.window + 20, total = prompt_len + 24;
    std::vector<TokenId> toks;
    for (int64_t i = 0; i < total; ++i) toks.push_back(static_cast<TokenId>((i * 7919) % 20000 + 50));
    StreamingReference ref(o.model_dir, {.sinks = 4, .window = shape.window, .prompt_len = prompt_len});
    std::vector<float> want;
    for (TokenId t : toks) {
      const std::vector<float> row = ref.Next(t);
      want.insert(want.end(), row.begin(), row.end());
    }
    for (int64_t chunk : {prompt_len, int64_t{13}}) {
      const std::vector<float> got = StreamRun(*gpu, toks, prompt_len, chunk);
      float most = 0;
      for (int64_t q = 0; q < total; ++q) {
        most = std::max(most, MaxAbsDiff(std::vector<float>(got.begin() + q * V, got.begin() + (q + 1) * V),
                                         std::vector<float>(want.begin() + q * V, want.begin() + (q + 1) * V)));
      }
      MESSAGE("chunk " << chunk << ": max |logit - reference| " << most);
      CHECK(most <= shape.tolerance);
    }
    CompareWithCpu(*gpu, *cpu, std::span<const TokenId>(toks).first(prompt_len), 13, 24, shape.tolerance, false,
                   /*dense_prompt=*/true);
  }
}

// --attention-chunk-size (Llama 4's chunked attention) on the generic (head_dim 16) and
// tensor-core (64) kernels: the same logits as the cpu backend.
TEST_CASE("chunked attention agrees with the cpu backend") {
  std::vector<TokenId> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(static_cast<TokenId>((i * 7919) % 20000 + 50));
  for (const char* shape : {"tiny", "smollm2-135m"}) {
    INFO(std::string(shape));
    backend::BackendOptions o = Options(shape, 5, 8);
    o.threads = 0;
    o.attention.attention_chunk_size = 32;
    auto gpu = Make("cuda", o);
    auto cpu = Make("cpu", o);
    REQUIRE(gpu->pools()[0].attention_chunk == 32);
    for (int64_t chunk : {70, 13}) CompareWithCpu(*gpu, *cpu, prompt, chunk, 24, 0.3f);
  }
}

// The engine on the cuda backend streams a million tokens with sinks 4 and a window of 256
// (B = 64) in a KV cache of exactly its per-sequence bound: MaxSequenceBlocks = 1 sink block
// + ceil(255 / 64) + 1 + 4 first-window blocks held until the window passes them = 10.
// A full device run (KVFLEET_GPU_FULL=1) streams 1,048,576 tokens (about 460 s on an H200);
// otherwise 65,536 (the window passes over 256 times, about 30 s). KVFLEET_STREAMING_TOKENS
// sets the count outright.
TEST_CASE("a 1M-token StreamingLLM generation on the cuda backend stays within its block bound") {
  uint32_t tokens = GpuFullRun() ? 1u << 20 : 1u << 16;
  if (const char* e = std::getenv("KVFLEET_STREAMING_TOKENS"); e != nullptr && *e != 0) tokens = std::stoul(e);
  constexpr uint32_t kPrompt = 300;
  backend::BackendOptions o;
  o.model_dir = SmallVocabModelDir("tiny", 1, 512);
  o.block_size = 64;
  o.max_context = tokens + kPrompt + 1;
  o.max_num_tokens = 512;
  o.max_batch_size = 2;
  o.num_blocks = 10;
  o.attention.sink_tokens = 4;
  o.attention.max_attention_window = {256};
  o.attention.streaming_llm = true;
  auto gpu = Make("cuda", o);
  auto kv = kv::KvCacheManager::Make(backend::KvCacheConfigFor(gpu->config(), backend::KvMemoryOf(*gpu), o.attention),
                                     &gpu->block_copier(), SystemClock::Default());
  REQUIRE_MESSAGE(kv.ok(), kv.status().ToString());
  REQUIRE(backend::CheckPoolsAgree((*kv)->pools(), gpu->pools()).ok());
  REQUIRE((*kv)->MaxSequenceBlocks(0) == 10);
  engine::EngineOptions eo;
  eo.model_name = "tiny";
  eo.scheduler.max_num_tokens = 512;
  eo.scheduler.max_batch_size = 2;
  eo.limits.max_context = tokens + kPrompt + 1;
  eo.limits.vocab_size = static_cast<uint32_t>(gpu->config().vocab_size);
  engine::Engine engine(eo, gpu.get(), kv->get(), SystemClock::Default());
  engine::GenerateRequest r;
  for (uint32_t i = 0; i < kPrompt; ++i) r.prompt.push_back(3 + (i * 7) % 500);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = tokens;
  r.sampling.ignore_eos = true;
  REQUIRE(engine.Add(std::move(r), 0).ok());
  uint64_t generated = 0;
  uint32_t most = 0;
  engine::FinishReason finish = engine::FinishReason::kNone;
  while (engine.HasWork()) {
    for (const engine::RequestOutput& out : engine.Step()) {
      generated += out.new_tokens.size();
      if (out.finish != engine::FinishReason::kNone) finish = out.finish;
    }
    most = std::max(most, (*kv)->Stats().pools[0].tiers[0].in_use);
  }
  CHECK(finish == engine::FinishReason::kLength);
  CHECK(generated == tokens);
  CHECK(most <= 10);
  MESSAGE(tokens << " tokens streamed; at most " << most << " blocks in use");
}

}  // namespace
}  // namespace kvfleet::testing
