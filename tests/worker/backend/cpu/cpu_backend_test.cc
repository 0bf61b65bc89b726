// The cpu backend beyond parity: selection by name, its KV pools, batch validation,
// chunked attention, StreamingLLM sinks and dynamic NTK RoPE (checked against equivalent
// plain runs), and results that do not depend on the thread count or the batch.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/worker/backend/cpu/streaming_reference.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"

namespace kvfleet::backend {
namespace {

namespace fs = std::filesystem;
using kvfleet::testing::RandomModelDir;
using kvfleet::testing::StreamingReference;

// A copy of a model directory whose config.json `edit` changes (weights linked, not copied).
struct VariantModel {
  fs::path dir;
  VariantModel(const std::string& base, const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
    dir = fs::temp_directory_path() / ("kvfleet-variant-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::create_symlink(fs::path(base) / "model.safetensors", dir / "model.safetensors");
    std::ifstream in(fs::path(base) / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir / "config.json") << j.dump(2);
  }
  ~VariantModel() { fs::remove_all(dir); }
};

std::unique_ptr<ModelBackend> Make(const std::string& dir, int32_t block_size = 8, int threads = 2,
                                   std::function<void(BackendOptions&)> tweak = nullptr) {
  BackendOptions o;
  o.model_dir = dir;
  o.block_size = block_size;
  o.num_blocks = 128;
  o.max_context = 1024;
  o.threads = threads;
  if (tweak) tweak(o);
  auto b = CreateBackend("cpu", o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

std::vector<TokenId> Tokens(int n, int salt = 0) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 7919 + salt * 104729 + 17) % 32000));
  return t;
}

std::vector<BlockId> Table(BlockId first, int n) {
  std::vector<BlockId> t;
  for (int i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}

// Logits of every token of one prefill from position 0.
std::vector<float> PrefillLogits(ModelBackend& b, std::span<const TokenId> tokens, BlockId first_block) {
  std::vector<BlockId> table = Table(first_block, static_cast<int>(tokens.size()) / b.block_size() + 1);
  StepBatch batch;
  SequenceStep s;
  s.tokens = tokens;
  s.block_tables = {table};
  s.logits = LogitsRequest::kAll;
  batch.seqs.push_back(s);
  StepOutput out;
  Status st = b.Execute(batch, &out);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return out.logits;
}

float MaxDiff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_CASE("backends are chosen by name; an unknown name lists the known ones") {
  auto names = BackendNames();
  CHECK(std::find(names.begin(), names.end(), "cpu") != names.end());
  auto b = CreateBackend("tpu", BackendOptions{});
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == StatusCode::kNotFound);
  CHECK(b.status().message().find("cpu") != std::string::npos);
}

TEST_CASE("bad options and bad model directories fail at construction") {
  BackendOptions o;
  o.model_dir = RandomModelDir("tiny", 1);
  o.block_size = 12;
  CHECK(CreateBackend("cpu", o).status().message().find("block_size") != std::string::npos);
  o.block_size = 8;
  o.attention.sink_tokens = 4;  // sinks need a window
  CHECK(CreateBackend("cpu", o).status().message().find("--sink-tokens needs a sliding window") != std::string::npos);
  o.attention.max_attention_window = {2};
  CHECK(CreateBackend("cpu", o).status().message().find("shorter than --sink-tokens") != std::string::npos);
  o.attention = {};
  o.attention.attention_chunk_size = 12;
  CHECK(CreateBackend("cpu", o).status().message().find("not a multiple of --block-size") != std::string::npos);
  o.attention = {};
  o.kv_cache_dtype = KvCacheDtype::kFp8E4m3;  // the cpu backend keeps fp32 KV: fp8 and bf16 refused, named
  CHECK(CreateBackend("cpu", o).status().message().find("--kv-cache-dtype fp8_e4m3") != std::string::npos);
  o.kv_cache_dtype = KvCacheDtype::kBf16;
  CHECK(CreateBackend("cpu", o).status().message().find("--kv-cache-dtype bf16") != std::string::npos);
  o.kv_cache_dtype = KvCacheDtype::kAuto;
  o.model_dir = "/nonexistent/model";
  CHECK(CreateBackend("cpu", o).status().message().find("/nonexistent/model") != std::string::npos);
}

TEST_CASE("a model it cannot run is refused at start-up, naming the config.json field") {
  const std::string base = RandomModelDir("tiny", 1);
  struct Case {
    const char* tag;
    std::function<void(nlohmann::json&)> edit;
    const char* field;
  };
  for (const Case& k :
       {Case{"arch", [](nlohmann::json& j) { j["architectures"] = {"Gemma2ForCausalLM"}; }, "architectures"},
        Case{"act", [](nlohmann::json& j) { j["hidden_act"] = "gelu_pytorch_tanh"; }, "hidden_act"},
        Case{"rope", [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}}; },
             "rope_scaling.rope_type"},
        Case{"partial", [](nlohmann::json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor"}}) {
    VariantModel m(base, std::string("refused-") + k.tag, k.edit);
    BackendOptions o;
    o.model_dir = m.dir.string();
    o.num_blocks = 64;
    auto b = CreateBackend("cpu", o);
    REQUIRE_FALSE(b.ok());
    CHECK_MESSAGE(b.status().message().find(std::string("config.json: ") + k.field + ":") != std::string::npos,
                  b.status().message());
  }
}

TEST_CASE("KV pools: block-major fp32 blocks, one pool per window") {
  auto b = Make(RandomModelDir("tiny", 1), 16);
  REQUIRE(b->pools().size() == 1);
  const KvPoolInfo& p = b->pools()[0];
  CHECK(p.window == 0);
  CHECK(p.layers == std::vector<int32_t>{0, 1});
  CHECK(p.num_kv_heads == 2);
  CHECK(p.head_dim == 16);
  CHECK(p.bytes_per_block == 2u * 2 * 2 * 16 * 16 * sizeof(float));
  CHECK(p.device_blocks == 128);
  CHECK(p.max_blocks_per_seq == 1024 / 16);

  auto m = Make(RandomModelDir("tiny-mistral", 2), 16);
  REQUIRE(m->pools().size() == 1);
  CHECK(m->pools()[0].window == 20);
  CHECK(m->pools()[0].num_kv_heads == 1);

  auto s = Make(RandomModelDir("tiny", 1), 16, 2, [](BackendOptions& o) {
    o.attention.sink_tokens = 4;
    o.attention.max_attention_window = {64};
    o.attention.streaming_llm = true;
  });
  CHECK(s->pools()[0].window == 64);
  CHECK(s->pools()[0].sink_tokens == 4);
  CHECK(s->pools()[0].position_shift);
  CHECK(s->pools()[0].dense_context);

  // --max-attention-window's list repeats to the layers; a window >= the context is full attention.
  auto mixed = Make(RandomModelDir("tiny", 1), 16, 2,
                    [](BackendOptions& o) { o.attention.max_attention_window = {32, 4096}; });
  REQUIRE(mixed->pools().size() == 2);
  CHECK(mixed->pools()[0].window == 0);
  CHECK(mixed->pools()[0].layers == std::vector<int32_t>{1});
  CHECK(mixed->pools()[1].window == 32);
  CHECK(mixed->pools()[1].layers == std::vector<int32_t>{0});
  CHECK_FALSE(mixed->pools()[1].position_shift);
}

TEST_CASE("a malformed batch is refused with the reason, before anything runs") {
  auto b = Make(RandomModelDir("tiny", 1), 8);
  const std::vector<TokenId> toks = Tokens(10);
  const std::vector<BlockId> table = Table(0, 2), other = Table(2, 2), short_table = Table(0, 1);
  std::vector<BlockId> hole = table;
  hole[1] = kNoBlock;
  const std::vector<BlockId> out_of_range = {0, 500};
  const std::vector<TokenId> bad_token = {5, 200000};
  auto expect = [&](std::function<void(StepBatch&)> edit, const std::string& words) {
    StepBatch batch;
    SequenceStep s;
    s.tokens = toks;
    s.block_tables = {table};
    s.sample = true;
    batch.seqs.push_back(s);
    edit(batch);
    StepOutput out;
    Status st = b->Execute(batch, &out);
    INFO(words);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(st.message().find(words) != std::string::npos, st.message());
  };
  expect([&](StepBatch& x) { x.seqs[0].tokens = {}; }, "no tokens");
  expect([&](StepBatch& x) { x.seqs[0].tokens = bad_token; }, "outside the vocabulary");
  expect([&](StepBatch& x) { x.seqs[0].block_tables = {short_table}; }, "does not reach position 9");
  expect([&](StepBatch& x) { x.seqs[0].block_tables = {hole}; }, "no block for visible position 8");
  expect([&](StepBatch& x) { x.seqs[0].block_tables = {out_of_range}; }, "block id 500 out of range");
  expect([&](StepBatch& x) { x.seqs[0].block_tables = {}; }, "block tables");
  const SamplingParams no_top_p{.top_p = 0};
  expect([&](StepBatch& x) { x.seqs[0].sampling = &no_top_p; }, "'top_p' must be greater than 0");
  expect([&](StepBatch& x) { x.seqs[0].sampling = nullptr; }, "no sampling parameters");
  const SamplingParams no_logprobs;
  expect(
      [&](StepBatch& x) {
        x.seqs[0].sampling = &no_logprobs;
        x.seqs[0].prompt_logprobs = true;
      },
      "prompt logprobs need");
  expect([&](StepBatch& x) { x.seqs[0].start_position = 1020; }, "outside the context");
  expect([&](StepBatch& x) { x.seqs.push_back(x.seqs[0]); }, "written by two sequences");
  expect(
      [&](StepBatch& x) {
        for (int i = 0; i < 900; ++i) {
          x.seqs.push_back(x.seqs[0]);
          x.seqs.back().block_tables = {other};
        }
      },
      "sequences; the limit is 256");
}

TEST_CASE("results do not depend on the thread count, and sampling not on the batch") {
  const std::string dir = RandomModelDir("tiny", 1);
  auto one = Make(dir, 8, 1), two = Make(dir, 8, 2);
  const std::vector<TokenId> toks = Tokens(37, 1);
  CHECK(PrefillLogits(*one, toks, 0) == PrefillLogits(*two, toks, 0));  // bit for bit

  // A seeded, tempered request samples the same tokens alone and beside another.
  const SamplingParams tempered{.temperature = 0.9f, .top_p = 0.95f, .top_k = 40}, plain;
  auto run = [&](bool crowded) {
    std::vector<TokenId> generated;
    std::vector<BlockId> t0 = Table(10, 8), t1 = Table(20, 8);
    std::vector<TokenId> noise = Tokens(9, 5);
    TokenId last = 0;
    for (int step = 0; step < 12; ++step) {
      StepBatch batch;
      SequenceStep s;
      s.tokens = step == 0 ? std::span<const TokenId>(toks) : std::span<const TokenId>(&last, 1);
      s.start_position = step == 0 ? 0 : 37 + step - 1;
      s.block_tables = {t0};
      s.sample = true;
      s.sampling = &tempered;
      s.seed = 1234;
      s.rng_counter = static_cast<uint64_t>(step);
      batch.seqs.push_back(s);
      if (crowded && step < 2) {
        SequenceStep n;
        n.tokens = std::span<const TokenId>(noise).subspan(step * 5, step == 0 ? 5 : 4);
        n.start_position = step * 5;
        n.block_tables = {t1};
        n.sample = true;
        n.sampling = &plain;
        n.seed = 99;
        batch.seqs.insert(batch.seqs.begin(), n);
      }
      StepOutput out;
      REQUIRE(two->Execute(batch, &out).ok());
      last = out.tokens[batch.seqs.size() - 1];
      generated.push_back(last);
    }
    return generated;
  };
  const auto alone = run(false);
  CHECK(alone == run(true));
  CHECK(std::count(alone.begin(), alone.end(), alone[0]) < 12);  // tempered: not one repeated token
}

TEST_CASE("chunked attention: each chunk computes as if it were a fresh sequence") {
  // RoPE scores depend only on position differences, and a chunk sees nothing before it,
  // so the logits of chunk k equal the plain model's on chunk k's tokens alone.
  const std::string base = RandomModelDir("tiny", 1);
  VariantModel chunked(base, "chunk", [](nlohmann::json& j) { j["attention_chunk_size"] = 16; });
  auto b = Make(chunked.dir.string(), 8);
  auto plain = Make(base, 8);
  CHECK(b->pools()[0].attention_chunk == 16);
  const int64_t V = b->config().vocab_size;
  const std::vector<TokenId> toks = Tokens(40, 2);
  const std::vector<float> all = PrefillLogits(*b, toks, 0);
  for (int64_t c0 : {0, 16, 32}) {
    const int64_t n = std::min<int64_t>(16, 40 - c0);
    const std::vector<float> fresh = PrefillLogits(*plain, std::span<const TokenId>(toks).subspan(c0, n), 0);
    INFO("chunk at " << c0);
    CHECK(MaxDiff(std::span<const float>(all).subspan(c0 * V, n * V), fresh) < 1e-4f);
  }
  // And the first chunk's logits are the plain model's (nothing is cut off yet).
  const std::vector<float> plain_all = PrefillLogits(*plain, toks, 0);
  CHECK(MaxDiff(std::span<const float>(all).first(16 * V), std::span<const float>(plain_all).first(16 * V)) < 1e-4f);
  CHECK(MaxDiff(std::span<const float>(all).subspan(20 * V, V), std::span<const float>(plain_all).subspan(20 * V, V)) >
        1e-2f);
}

TEST_CASE("StreamingLLM sinks with position shift: the cache reads as sinks + window from 0") {
  // One layer, so keys depend only on their token: a query at q must then score exactly
  // like the last token of the fresh sequence sinks ‖ window (positions 0..S+W-1).
  const std::string base = RandomModelDir("tiny", 1);
  VariantModel one_layer(base, "onelayer", [](nlohmann::json& j) { j["num_hidden_layers"] = 1; });
  constexpr int S = 4, W = 8;
  for (const int B : {1, 4}) {  // 1: token-level KV
    CAPTURE(B);
    auto stream = Make(one_layer.dir.string(), B, 2, [](BackendOptions& o) {
      o.attention.sink_tokens = S;
      o.attention.max_attention_window = {W};
      o.attention.streaming_llm = true;
    });
    auto plain = Make(one_layer.dir.string(), B);
    const int64_t V = plain->config().vocab_size;
    const std::vector<TokenId> toks = Tokens(30, 3);

    // Prefill 20 tokens, then decode 10 with the blocks behind the window freed.
    std::vector<BlockId> table = Table(0, 30 / B + 1);
    std::vector<float> rows;
    StepBatch batch;
    SequenceStep s;
    s.tokens = std::span<const TokenId>(toks).first(20);
    s.block_tables = {table};
    s.logits = LogitsRequest::kAll;
    batch.seqs.push_back(s);
    StepOutput out;
    REQUIRE(stream->Execute(batch, &out).ok());
    rows = out.logits;
    for (int q = 20; q < 30; ++q) {
      for (int blk = S / B; (blk + 1) * B <= q - W + 1; ++blk) table[blk] = kNoBlock;  // sinks stay
      batch.seqs[0].tokens = std::span<const TokenId>(toks).subspan(q, 1);
      batch.seqs[0].start_position = q;
      batch.seqs[0].block_tables = {table};
      REQUIRE(stream->Execute(batch, &out).ok());
      rows.insert(rows.end(), out.logits.begin(), out.logits.end());
    }
    for (int q = 0; q < 30; ++q) {
      std::vector<TokenId> fresh;
      if (q < S + W) {
        fresh.assign(toks.begin(), toks.begin() + q + 1);  // everything still visible
      } else {
        fresh.assign(toks.begin(), toks.begin() + S);
        fresh.insert(fresh.end(), toks.begin() + q - W + 1, toks.begin() + q + 1);
      }
      const std::vector<float> want = PrefillLogits(*plain, fresh, 64);
      INFO("query at " << q);
      CHECK(MaxDiff(std::span<const float>(rows).subspan(q * V, V), std::span<const float>(want).last(V)) < 1e-4f);
    }
  }
}

// Dynamic NTK (HF's "dynamic" rope_type): a sequence no longer than max_position_embeddings
// rotates with the plain frequencies; a longer one with theta grown to
// theta · (factor · L / max − (factor − 1))^(d / (d − 2)) for its length L after the step, so
// its prefill equals a plain model with that theta. Each sequence of a batch by its own length.
TEST_CASE("dynamic NTK RoPE: plain up to max_position_embeddings, grown theta past it, per sequence") {
  const std::string base = RandomModelDir("tiny", 1);
  VariantModel dynamic(base, "dynamic", [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    j["max_position_embeddings"] = 16;
  });
  VariantModel plain_model(base, "plain", [](nlohmann::json& j) { j["rope_scaling"] = nullptr; });
  const double theta = 500000.0, d = 16;  // the tiny model's
  const double grown_theta = theta * std::pow(2.0 * 24 / 16 - 1, d / (d - 2));
  VariantModel grown_model(base, "grown", [&](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["rope_theta"] = grown_theta;
  });
  auto dyn = Make(dynamic.dir.string());
  auto plain = Make(plain_model.dir.string());
  auto grown = Make(grown_model.dir.string());
  const int64_t V = dyn->config().vocab_size;
  const std::vector<TokenId> toks = Tokens(24, 5);
  const std::span<const TokenId> first16 = std::span<const TokenId>(toks).first(16);

  CHECK(MaxDiff(PrefillLogits(*dyn, first16, 0), PrefillLogits(*plain, first16, 0)) < 1e-6f);
  const std::vector<float> long_dyn = PrefillLogits(*dyn, toks, 0);
  CHECK(MaxDiff(long_dyn, PrefillLogits(*grown, toks, 0)) < 1e-4f);
  const std::vector<float> long_plain = PrefillLogits(*plain, toks, 0);
  CHECK(MaxDiff(std::span<const float>(long_dyn).last(V), std::span<const float>(long_plain).last(V)) > 1e-2f);

  // One step, two sequences: 16 tokens (plain) and 24 (grown), each with its own frequencies.
  std::vector<BlockId> ta = Table(0, 3), tb = Table(8, 4);
  StepBatch batch;
  for (auto [span, table] : {std::pair{first16, &ta}, std::pair{std::span<const TokenId>(toks), &tb}}) {
    SequenceStep s;
    s.tokens = span;
    s.block_tables = {*table};
    s.logits = LogitsRequest::kAll;
    batch.seqs.push_back(s);
  }
  StepOutput out;
  REQUIRE(dyn->Execute(batch, &out).ok());
  const std::span<const float> both(out.logits);
  CHECK(MaxDiff(both.subspan(out.logits_offset[0] * V, 16 * V), PrefillLogits(*plain, first16, 0)) < 1e-6f);
  CHECK(MaxDiff(both.subspan(out.logits_offset[1] * V, 24 * V), long_dyn) < 1e-6f);

  // StreamingLLM re-rotates cached keys at one set of frequencies: refused with dynamic.
  BackendOptions o;
  o.model_dir = dynamic.dir.string();
  o.num_blocks = 64;
  o.attention.max_attention_window = {8};
  o.attention.sink_tokens = 4;
  o.attention.streaming_llm = true;
  auto refused = CreateBackend("cpu", o);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("rope_type dynamic") != std::string::npos);
}

// Runs `toks` through a StreamingLLM backend as the engine would: the prompt (its first
// prompt_len tokens) in chunks of `chunk` with context_end = prompt_len and every block kept,
// then one token per step with the blocks behind the window dropped (the sinks stay), as the
// KV manager drops them. Returns the logits of every position.
std::vector<float> StreamRun(ModelBackend& b, std::span<const TokenId> toks, int64_t prompt_len, int64_t chunk,
                             int64_t context_end) {
  const int64_t B = b.block_size();
  const KvPoolInfo& pool = b.pools()[0];
  std::vector<BlockId> table = Table(0, static_cast<int>(toks.size() / B) + 1);
  std::vector<float> rows;
  for (int64_t pos = 0; pos < static_cast<int64_t>(toks.size());) {
    const int64_t n = pos < prompt_len ? std::min(chunk, prompt_len - pos) : 1;
    if (pos >= prompt_len) {  // blocks wholly before the query's window, sink blocks excepted
      for (int64_t blk = (pool.sink_tokens + B - 1) / B; (blk + 1) * B <= pos - pool.window + 1; ++blk) {
        table[blk] = kNoBlock;
      }
    }
    StepBatch batch;
    SequenceStep s;
    s.tokens = toks.subspan(pos, n);
    s.start_position = pos;
    s.context_end = context_end;
    s.block_tables = {table};
    s.logits = LogitsRequest::kAll;
    batch.seqs.push_back(s);
    StepOutput out;
    const Status st = b.Execute(batch, &out);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    rows.insert(rows.end(), out.logits.begin(), out.logits.end());
    pos += n;
  }
  return rows;
}

TEST_CASE("StreamingLLM's dense context phase: the prompt attends densely, then only sinks + window are kept") {
  // Two layers, so the second layer's KV of a prompt token depends on how the first attended:
  // the reference attends densely over the prompt, then keeps S + W (StreamingLLM).
  constexpr int S = 4, W = 8, B = 4, kPrompt = 30, kTotal = 50;
  const std::string dir = RandomModelDir("tiny", 1);
  auto stream = Make(dir, B, 2, [](BackendOptions& o) {
    o.attention.sink_tokens = S;
    o.attention.max_attention_window = {W};
    o.attention.streaming_llm = true;
  });
  const int64_t V = stream->config().vocab_size;
  const std::vector<TokenId> toks = Tokens(kTotal, 4);
  StreamingReference ref(dir, {.sinks = S, .window = W, .prompt_len = kPrompt});
  std::vector<float> want;
  for (TokenId t : toks) {
    const std::vector<float> row = ref.Next(t);
    want.insert(want.end(), row.begin(), row.end());
  }
  for (int64_t chunk : {kPrompt, 7}) {
    const std::vector<float> got = StreamRun(*stream, toks, kPrompt, chunk, kPrompt);
    float most = 0;
    for (int q = 0; q < kTotal; ++q) {
      INFO("chunk " << chunk << ", position " << q);
      const float d = MaxDiff(std::span<const float>(got).subspan(q * V, V), std::span<const float>(want).subspan(q * V, V));
      CHECK(d < 1e-4f);
      most = std::max(most, d);
    }
    MESSAGE("chunk " << chunk << ": max |logit - reference| " << most);
  }
  // Without the dense phase the prompt sees only sinks + window: its rows past S + W differ.
  const std::vector<float> windowed = StreamRun(*stream, toks, kPrompt, kPrompt, /*context_end=*/0);
  CHECK(MaxDiff(std::span<const float>(windowed).subspan(20 * V, V), std::span<const float>(want).subspan(20 * V, V)) >
        1e-2f);
  // And the dense phase's later rows differ from a plain dense model's: the window applies.
  StreamingReference dense(dir, {.window = 0});
  std::vector<float> last;
  for (TokenId t : toks) last = dense.Next(t);
  CHECK(MaxDiff(last, std::vector<float>(want.end() - V, want.end())) > 1e-2f);
}

TEST_CASE("a step reading a dropped block of a dense prompt query is refused") {
  auto stream = Make(RandomModelDir("tiny", 1), 4, 2, [](BackendOptions& o) {
    o.attention.sink_tokens = 4;
    o.attention.max_attention_window = {8};
    o.attention.streaming_llm = true;
  });
  const std::vector<TokenId> toks = Tokens(24, 5);
  std::vector<BlockId> table = Table(0, 7);
  table[2] = kNoBlock;  // fine for a windowed query at 23, not for the dense phase
  StepBatch batch;
  SequenceStep s;
  s.tokens = std::span<const TokenId>(toks).subspan(20, 4);
  s.start_position = 20;
  s.block_tables = {table};
  batch.seqs.push_back(s);
  StepOutput out;
  CHECK(stream->Execute(batch, &out).ok());
  batch.seqs[0].context_end = 24;
  const Status st = stream->Execute(batch, &out);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("no block for visible position 8") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::backend
