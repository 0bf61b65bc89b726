// The cuda backend's fp8 KV cache (tests/gpu/cuda_parity.h): twice the blocks of the bf16
// cache, the bf16 cache's greedy tokens with calibrated scales, and scales loaded from the
// checkpoint, per head or per tensor. Needs a GPU (label gpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/gpu/cuda_parity.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_backend.h"

namespace kvfleet::testing {
namespace {

TEST_CASE("an fp8 KV cache holds twice the blocks and follows the bf16 cache's greedy tokens (calibrated scales)") {
  // tiny and tiny-qwen3 (head_dim 16: the generic kernel), smollm2-135m (head_dim 64: the
  // tensor-core decode and prefill kernels, and the gemv's RoPE + K/V store epilogue at batch 1).
  for (const char* shape : {"tiny", "tiny-qwen3", "smollm2-135m"}) {
    INFO(shape);
    backend::BackendOptions o = Options(shape, 7, 16);
    o.num_blocks = 0;
    o.kv_cache_bytes = 64ull << 20;
    auto bf = Make("cuda", o);
    o.kv_cache_dtype = backend::KvCacheDtype::kFp8E4m3;
    auto f8 = Make("cuda", o);
    const int64_t a = bf->pools()[0].device_blocks, b = f8->pools()[0].device_blocks;
    CHECK(b >= 2 * a);
    CHECK(b <= 2 * a + 1);
    CHECK(f8->pools()[0].bytes_per_block * 2 == bf->pools()[0].bytes_per_block);
    auto* cuda8 = dynamic_cast<backend::cuda::CudaBackend*>(f8.get());
    REQUIRE(cuda8 != nullptr);
    CHECK(cuda8->kv_fp8());
    CHECK(cuda8->kv_scales_source() == "calibrated");
    const auto scales = cuda8->kv_scales();
    CHECK(scales.size() == size_t(2 * f8->config().num_layers * f8->config().num_kv_heads));
    CHECK(std::all_of(scales.begin(), scales.end(), [](float x) { return std::isfinite(x) && x > 0; }));
    CHECK(std::any_of(scales.begin(), scales.end(), [](float x) { return x != 1.f; }));

    std::vector<TokenId> toks;
    for (int i = 0; i < 60; ++i) toks.push_back(static_cast<TokenId>((i * 7919 + 11) % (f8->config().vocab_size - 1) + 1));
    std::vector<backend::BlockId> table;
    for (int j = 0; j < 8; ++j) table.push_back(static_cast<backend::BlockId>(j + 3));
    constexpr int kSteps = 40;
    // Prompt in two chunks, then kSteps decode steps fed bf16's greedy tokens; each decode
    // step's logits.
    auto run = [&](backend::ModelBackend& m, const std::vector<TokenId>* forced, std::vector<TokenId>* chosen,
                   std::vector<std::vector<float>>* rows) {
      std::vector<TokenId> t = toks;
      for (int step = -1; step <= kSteps; ++step) {
        backend::SequenceStep st;
        if (step < 1) {
          const size_t begin = step < 0 ? 0 : 40;
          st.tokens = std::span<const TokenId>(t).subspan(begin, step < 0 ? 40 : 20);
          st.start_position = static_cast<int64_t>(begin);
        } else {
          st.tokens = std::span<const TokenId>(&t.back(), 1);
          st.start_position = static_cast<int64_t>(t.size()) - 1;
        }
        st.logits = backend::LogitsRequest::kLast;
        st.block_tables = {table};
        st.sample = step >= 0;
        backend::StepBatch batch;
        batch.seqs = {st};
        backend::StepOutput out;
        REQUIRE(m.Execute(batch, &out).ok());
        if (step < 0) continue;
        chosen->push_back(out.tokens[0]);
        rows->push_back(out.logits);
        t.push_back(forced != nullptr ? (*forced)[step] : out.tokens[0]);
      }
    };
    std::vector<TokenId> ref, got;
    std::vector<std::vector<float>> ref_rows, got_rows;
    run(*bf, nullptr, &ref, &ref_rows);
    run(*f8, &ref, &got, &got_rows);
    int differ = 0;
    double sum_d = 0, sum_abs = 0;
    for (size_t s = 0; s < ref.size(); ++s) {
      for (size_t i = 0; i < ref_rows[s].size(); ++i) {
        sum_d += std::fabs(ref_rows[s][i] - got_rows[s][i]);
        sum_abs += std::fabs(ref_rows[s][i]);
      }
      if (got[s] == ref[s]) continue;
      ++differ;
      CHECK(ref_rows[s][got[s]] >= ref_rows[s][ref[s]] - 0.5f);  // a near-tie of the bf16 run
    }
    INFO("mean |dlogit| / mean |logit| = " << sum_d / sum_abs);
    CHECK(differ <= kSteps / 4);
    CHECK(sum_d < 0.1 * sum_abs);
    CHECK(sum_d > 0);  // the cache really is another one
  }
}

// A copy of model directory `src` at `dst` whose model.safetensors also holds `extra` (F32
// tensors): how vLLM / llm-compressor checkpoints carry their fp8 KV scales.
std::string WithExtraTensors(const std::string& src, const std::string& dst,
                             const std::vector<std::pair<std::string, std::vector<float>>>& extra) {
  namespace fs = std::filesystem;
  fs::remove_all(dst);
  fs::copy(src, dst, fs::copy_options::recursive);
  const std::string file = dst + "/model.safetensors";
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  for (const auto& [name, values] : extra) {
    header[name] = {{"dtype", "F32"},
                    {"shape", {static_cast<int64_t>(values.size())}},
                    {"data_offsets", {data.size(), data.size() + 4 * values.size()}}};
    data.append(reinterpret_cast<const char*>(values.data()), 4 * values.size());
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  const uint64_t hn = h.size();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&hn), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return dst;
}

TEST_CASE("fp8 KV scales come from the checkpoint when it has them: per head or per tensor, all layers or none") {
  backend::BackendOptions o = Options("tiny", 7, 16);
  const model::ModelConfig c = Make("cuda", o)->config();
  const int64_t L = c.num_layers, hk = c.num_kv_heads;
  std::vector<std::pair<std::string, std::vector<float>>> scales;
  std::vector<float> expect;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> k(static_cast<size_t>(hk));
    for (int64_t h = 0; h < hk; ++h) k[h] = 0.01f * static_cast<float>(l + 1) + 0.001f * static_cast<float>(h);
    const std::string attn = "model.layers." + std::to_string(l) + ".self_attn.";
    scales.push_back({attn + "k_scale", k});
    scales.push_back({attn + "v_proj.output_scale", {0.5f}});  // per tensor, the other spelling
    expect.insert(expect.end(), k.begin(), k.end());
    expect.insert(expect.end(), static_cast<size_t>(hk), 0.5f);
  }
  const std::string base = o.model_dir;
  o.kv_cache_dtype = backend::KvCacheDtype::kFp8E4m3;
  o.model_dir = WithExtraTensors(base, base + "-kv-scales", scales);
  {
    auto b = Make("cuda", o);
    auto* cb = dynamic_cast<backend::cuda::CudaBackend*>(b.get());
    REQUIRE(cb != nullptr);
    CHECK(cb->kv_scales_source() == "checkpoint");
    CHECK(std::vector<float>(cb->kv_scales().begin(), cb->kv_scales().end()) == expect);
  }
  // One layer's scales missing, or a scale of the wrong size: refused at start-up, named.
  auto partial = scales;
  partial.erase(partial.begin(), partial.begin() + 2);
  o.model_dir = WithExtraTensors(base, base + "-kv-scales-partial", partial);
  auto made = backend::CreateBackend("cuda", o);
  REQUIRE_FALSE(made.ok());
  CHECK(made.status().message().find("for " + std::to_string(L - 1) + " of its " + std::to_string(L) + " layers") !=
        std::string::npos);
  auto wrong = scales;
  wrong[0].second.push_back(1.f);
  o.model_dir = WithExtraTensors(base, base + "-kv-scales-wrong", wrong);
  made = backend::CreateBackend("cuda", o);
  REQUIRE_FALSE(made.ok());
  CHECK(made.status().message().find("model.layers.0.self_attn.k_scale has " + std::to_string(hk + 1) + " values") !=
        std::string::npos);
}

}  // namespace
}  // namespace kvfleet::testing
