// The cuda backend's tensor parallelism (cuda_backend.h invariant 8) on one GPU: N ranks on
// GPU 0 (extra tp_devices "0,0"), joined by the same-device communicator, against one rank
// and against the fp32 cpu backend, on the tiny, tiny-qwen2, tiny-mistral and tiny-qwen3
// shapes: chunked prefill beside another prompt, 32 greedy decode steps, decode from copied
// blocks, CUDA-graphed decode at batch 1 (the gemv fusions) and 3; N = 4 with fewer KV heads
// than ranks (replicated). Over NCCL with two GPUs the same parity runs, and it is skipped
// loudly on a machine with one, where asking for it is a clear start-up error.
//
// Tolerances. Every step is teacher-forced with the cpu backend's greedy token, so each
// backend computes the same rows. The bf16 backend at N = 1 stays within kBf16Tolerance of
// the fp32 forward on these models (cuda_backend_test.cc); N ranks add one bf16 rounding of
// each rank's partial o and down products before the sum (NCCL rounds too), far below that
// bound, so N ranks must meet the same kBf16Tolerance against fp32, and so differ from one
// rank by at most 2 · kBf16Tolerance (the triangle inequality; the largest difference seen is
// printed). A greedy choice may differ from the reference only where the reference's top two
// logits are within kBf16Tolerance (a near-tie bf16 rounding can flip).
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/gpu/graphed_decode.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "kernels/bf16.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_comm.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::testing {
namespace {

// As cuda_backend_test.cc's: the bf16 backend against fp32 on the tiny models.
constexpr float kTpBf16Tolerance = 0.2f;
constexpr int32_t kTpBlock = 16;
constexpr int kDecodeSteps = 32;

backend::BackendOptions TpOptions(const std::string& dir, int32_t tp, const std::string& devices) {
  backend::BackendOptions o;
  o.model_dir = dir;
  o.block_size = kTpBlock;
  o.num_blocks = 256;
  o.max_context = 1024;
  o.max_num_tokens = 256;
  o.max_batch_size = 8;
  o.threads = 2;
  o.tensor_parallel = tp;
  if (!devices.empty()) o.extra["tp_devices"] = devices;
  return o;
}

std::unique_ptr<backend::ModelBackend> MakeTp(const char* name, const backend::BackendOptions& o) {
  auto b = backend::CreateBackend(name, o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

// "0,0,...": every one of tp ranks on GPU 0.
std::string OnGpu0(int32_t tp) {
  std::string s = "0";
  for (int32_t r = 1; r < tp; ++r) s += ",0";
  return s;
}

// compute-sanitizer (tests/gpu/run.sh sets this) serialises kernels, so the same-device
// communicator's graphed barrier, two kernels that must run at once, cannot pass there.
bool SkipUnderSanitizer(const char* what) {
  const char* san = std::getenv("KVFLEET_UNDER_SANITIZER");
  if (san == nullptr || *san == 0) return false;
  MESSAGE("SKIPPED under compute-sanitizer " << san << ": " << what
                                             << " replays the device-side rank barrier (two kernels at once)");
  return true;
}

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<TokenId> Prompt(int n, int salt) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 7919 + salt * 104729 + 17) % 128000));
  return t;
}

// What one scenario gives: every logits row, in order, and the greedy token of each.
struct Run {
  std::vector<std::vector<float>> rows;
  std::vector<TokenId> greedy;
};

// Sequence A prefills 40 tokens in chunks of 16, 16 and 8, B its 7 beside A's second chunk;
// then both decode kDecodeSteps tokens (past tiny-mistral's 20-token window), fed `forced`
// (the reference's greedy tokens; empty: their own); then C, a copy of A's first blocks
// (block_copier), decodes one token. Every step asks for the last row's logits.
Run Scenario(backend::ModelBackend& b, const std::vector<TokenId>* forced) {
  Run run;
  const int64_t V = b.config().vocab_size;
  std::vector<TokenId> a = Prompt(40, 1), bb = Prompt(7, 2);
  std::vector<backend::BlockId> ta, tb, tc;
  for (backend::BlockId i = 0; i < 8; ++i) {
    ta.push_back(i);
    tb.push_back(16 + i);
    tc.push_back(100 + i);
  }
  size_t next_forced = 0;
  auto step = [&](std::vector<std::pair<std::vector<TokenId>*, std::pair<int64_t, int64_t>>> parts,
                  std::vector<const std::vector<backend::BlockId>*> tables) {
    backend::StepBatch batch;
    for (size_t i = 0; i < parts.size(); ++i) {
      backend::SequenceStep st;
      const auto [begin, count] = parts[i].second;
      st.tokens = std::span<const TokenId>(*parts[i].first).subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
      st.start_position = begin;
      st.block_tables = {*tables[i]};
      st.sample = true;
      st.logits = backend::LogitsRequest::kLast;
      batch.seqs.push_back(st);
    }
    backend::StepOutput out;
    const Status s = b.Execute(batch, &out);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    std::vector<TokenId> next;
    for (size_t i = 0; i < parts.size(); ++i) {
      const float* row = &out.logits[static_cast<size_t>(out.logits_offset[i] * V)];
      run.rows.emplace_back(row, row + V);
      run.greedy.push_back(out.tokens[i]);
      next.push_back(forced != nullptr ? (*forced)[next_forced++] : out.tokens[i]);
    }
    return next;
  };
  step({{&a, {0, 16}}}, {&ta});
  std::vector<TokenId> n = step({{&a, {16, 16}}, {&bb, {0, 7}}}, {&ta, &tb});
  bb.push_back(n[1]);
  n = step({{&a, {32, 8}}}, {&ta});
  a.push_back(n[0]);
  for (int i = 0; i < kDecodeSteps; ++i) {
    n = step({{&a, {static_cast<int64_t>(a.size()) - 1, 1}}, {&bb, {static_cast<int64_t>(bb.size()) - 1, 1}}},
             {&ta, &tb});
    a.push_back(n[0]);
    bb.push_back(n[1]);
  }
  // C: A's first 32 tokens, copied block by block, then its 33rd token decoded.
  std::vector<kv::BlockCopy> copies;
  for (backend::BlockId i = 0; i < 2; ++i) copies.push_back({0, kv::Tier::kDevice, i, kv::Tier::kDevice, 100 + i});
  b.block_copier().Copy(copies);
  std::vector<TokenId> c(a.begin(), a.begin() + 33);
  step({{&c, {32, 1}}}, {&tc});
  return run;
}

float MaxDiff(const Run& x, const Run& y) {
  REQUIRE(x.rows.size() == y.rows.size());
  float d = 0;
  for (size_t r = 0; r < x.rows.size(); ++r) {
    for (size_t i = 0; i < x.rows[r].size(); ++i) d = std::max(d, std::fabs(x.rows[r][i] - y.rows[r][i]));
  }
  return d;
}

// Greedy choices of `got` that differ from `ref`'s; each must be a near-tie of ref's logits.
int Flips(const Run& ref, const Run& got) {
  int flips = 0;
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    if (got.greedy[r] == ref.greedy[r]) continue;
    ++flips;
    const std::vector<float>& row = ref.rows[r];
    CHECK_MESSAGE(row[got.greedy[r]] >= row[ref.greedy[r]] - kTpBf16Tolerance,
                  "row " << r << ": token " << got.greedy[r] << " against " << ref.greedy[r]);
  }
  return flips;
}

// N ranks on `devices` against one rank and the fp32 cpu backend, on every tiny shape.
void ExpectParity(int32_t tp, const std::string& devices) {
  struct Case {
    const char* shape;
    uint64_t seed;
  };
  for (const Case& k : {Case{"tiny", 1}, Case{"tiny-qwen2", 3}, Case{"tiny-mistral", 2}, Case{"tiny-qwen3", 189}}) {
    const std::string dir = RandomModelDir(k.shape, k.seed);
    const std::string shape_name = k.shape;
    CAPTURE(shape_name);
    CAPTURE(tp);
    const Run ref = Scenario(*MakeTp("cpu", TpOptions(dir, 1, "")), nullptr);
    const Run one = Scenario(*MakeTp("cuda", TpOptions(dir, 1, "")), &ref.greedy);
    auto many_backend = MakeTp("cuda", TpOptions(dir, tp, devices));
    const auto* cuda = dynamic_cast<const backend::cuda::CudaBackend*>(many_backend.get());
    REQUIRE(cuda != nullptr);
    CHECK(cuda->tensor_parallel() == tp);
    const Run many = Scenario(*many_backend, &ref.greedy);
    const float d_ref = MaxDiff(ref, many), d_one = MaxDiff(one, many), d_ref_one = MaxDiff(ref, one);
    const int flips = Flips(ref, many);
    MESSAGE(shape_name << " tp " << tp << " (" << std::string(cuda->comm_kind()) << "): max |logit - fp32| " << d_ref
                    << " (tp 1: " << d_ref_one << "), max |logit - tp 1| " << d_one << ", " << flips
                    << " near-tie flips of " << ref.greedy.size());
    // Each rank rounds its partial o and down outputs to bf16 before the sum: at most about
    // as much error again as one rank's bf16 products, so within twice TP=1's own distance
    // from fp32 (or the bf16 backend's tolerance, whichever is larger).
    CHECK(d_ref <= std::max(kTpBf16Tolerance, 2 * d_ref_one));
    CHECK(d_one <= 2 * kTpBf16Tolerance);
  }
}

TEST_CASE("two ranks on one GPU follow one rank and the fp32 forward on every tiny shape") {
  ExpectParity(2, OnGpu0(2));
}

TEST_CASE("four ranks on one GPU, KV heads replicated (2 and 1 KV heads), follow the fp32 forward") {
  ExpectParity(4, OnGpu0(4));
}

TEST_CASE("tensor-parallel steps are deterministic: the same-device all-reduce sums in rank order") {
  const std::string dir = RandomModelDir("tiny", 1);
  const Run a = Scenario(*MakeTp("cuda", TpOptions(dir, 2, OnGpu0(2))), nullptr);
  const Run b = Scenario(*MakeTp("cuda", TpOptions(dir, 2, OnGpu0(2))), nullptr);
  CHECK(MaxDiff(a, b) == 0.0f);
  CHECK(a.greedy == b.greedy);
}

TEST_CASE("CUDA-graphed decode on two ranks gives the tokens of eager steps, at batch 1 (gemv fusions) and 3") {
  if (SkipUnderSanitizer("graphed decode on ranks sharing a GPU")) return;
  for (const std::string shape : {"tiny", "tiny-qwen3"}) {
    CAPTURE(shape);
    const std::string dir = RandomModelDir(shape, 5);
    backend::BackendOptions o = TpOptions(dir, 2, OnGpu0(2));
    auto graphs = MakeTp("cuda", o);
    o.extra.emplace("cuda_graphs", "0");
    auto eager = MakeTp("cuda", o);
    constexpr int kSeqs = 3;
    std::vector<std::vector<TokenId>> toks(kSeqs);
    std::vector<std::vector<backend::BlockId>> tables(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      toks[s] = Prompt(9 + 5 * s, 10 + s);
      for (int j = 0; j < 8; ++j) tables[s].push_back(static_cast<backend::BlockId>(s * 8 + j));
    }
    // Batch 1 runs on the gemv with its fusions.
    GraphedDecode d{toks, tables, {}, 24, [](int step) { return step < 12 ? 1 : kSeqs; }};
    const auto [equal, near] = CompareGraphedDecode(*eager, *graphs, d);
    const auto* cuda = dynamic_cast<const backend::cuda::CudaBackend*>(graphs.get());
    REQUIRE(cuda != nullptr);
    MESSAGE(shape << ": " << equal << " graphed tokens equal to eager, " << near << " near-ties, "
                  << cuda->graphs_captured() << " graphs");
    CHECK(cuda->graphs_captured() >= 2);  // batch 1 and the padded batch 4, at least
    CHECK(equal > 0);
  }
}

TEST_CASE("two ranks over NCCL on two GPUs follow one rank (skipped loudly with fewer GPUs)") {
  const int gpus = GpuCount();
  if (gpus < 2) {
    MESSAGE("SKIPPED: tensor parallelism over NCCL needs 2 GPUs, this machine has " << gpus);
    return;
  }
  ExpectParity(2, "");
}

// Rank r's buffer for call `round`: element i is (r + 1) * (i % 7) + round, small integers
// that bf16 and the sum hold exactly.
std::vector<uint16_t> RankValues(int r, int round, int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = kernels::FloatToBf16(static_cast<float>((r + 1) * (i % 7) + round));
  return v;
}

TEST_CASE("the same-device communicator sums and gathers across rank threads, eagerly and replayed from CUDA graphs") {
  using backend::cuda::CudaStatus;
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    const int64_t n = 5000;
    const std::vector<int> devices(static_cast<size_t>(ranks), 0);
    auto comm = backend::cuda::CudaComm::Make(devices, n, n);
    REQUIRE_MESSAGE(comm.ok(), comm.status().ToString());
    CHECK(std::string((*comm)->kind()) == "same-device");
    backend::cuda::RankThreads threads(ranks);
    std::vector<cudaStream_t> streams(static_cast<size_t>(ranks));
    std::vector<__nv_bfloat16*> bufs(static_cast<size_t>(ranks));
    std::vector<float*> send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks));
    std::vector<cudaGraphExec_t> graphs(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      REQUIRE(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&bufs[r]), n * sizeof(uint16_t)) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send[r]), n * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv[r]), ranks * n * sizeof(float)) == cudaSuccess);
    }
    // One call of every rank: upload its values, all-reduce, gather; or capture that call.
    auto call = [&](int r, int round, bool capture) -> Status {
      KVF_CUDA_RETURN(cudaSetDevice(0));
      const std::vector<uint16_t> v = RankValues(r, round, n);
      std::vector<float> f(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(r * 1000 + i);
      KVF_CUDA_RETURN(cudaMemcpy(bufs[r], v.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
      KVF_CUDA_RETURN(cudaMemcpy(send[r], f.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      if (capture) KVF_CUDA_RETURN(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal));
      KVF_RETURN_IF_ERROR((*comm)->AllReduceSum(r, bufs[r], n, streams[r]));
      KVF_RETURN_IF_ERROR((*comm)->AllGather(r, send[r], recv[r], n, streams[r]));
      if (capture) {
        cudaGraph_t g = nullptr;
        KVF_CUDA_RETURN(cudaStreamEndCapture(streams[r], &g));
        KVF_CUDA_RETURN(cudaGraphInstantiate(&graphs[r], g, 0));
        cudaGraphDestroy(g);
      }
      return CudaStatus(cudaStreamSynchronize(streams[r]), "sync");
    };
    auto check = [&](int round) {
      for (int r = 0; r < ranks; ++r) {
        std::vector<uint16_t> got(static_cast<size_t>(n));
        std::vector<float> gathered(static_cast<size_t>(ranks * n));
        REQUIRE(cudaMemcpy(got.data(), bufs[r], n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
        REQUIRE(cudaMemcpy(gathered.data(), recv[r], ranks * n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int k = 0; k < ranks; ++k) want += static_cast<float>((k + 1) * (i % 7) + round);
          wrong += kernels::Bf16ToFloat(got[i]) != want;
          for (int k = 0; k < ranks; ++k) wrong += gathered[k * n + i] != static_cast<float>(k * 1000 + i);
        }
        CHECK_MESSAGE(wrong == 0, "rank " << r << " round " << round);
      }
    };
    for (int round = 0; round < 3; ++round) {  // eager
      REQUIRE(threads.Run([&](int r) { return call(r, round, false); }).ok());
      check(round);
    }
    if (!SkipUnderSanitizer("the graph replays")) {
      REQUIRE(threads.Run([&](int r) { return call(r, 0, true); }).ok());  // captured, nothing runs
      for (int round = 10; round < 13; ++round) {  // replays over new inputs
        REQUIRE(threads.Run([&](int r) -> Status {
                  const std::vector<uint16_t> v = RankValues(r, round, n);
                  KVF_CUDA_RETURN(cudaSetDevice(0));
                  KVF_CUDA_RETURN(cudaMemcpy(bufs[r], v.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
                  KVF_CUDA_RETURN(cudaGraphLaunch(graphs[r], streams[r]));
                  return CudaStatus(cudaStreamSynchronize(streams[r]), "sync");
                }).ok());
        check(round);
      }
    }
    for (int r = 0; r < ranks; ++r) {
      if (graphs[r] != nullptr) cudaGraphExecDestroy(graphs[r]);
      cudaFree(bufs[r]);
      cudaFree(send[r]);
      cudaFree(recv[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
}

TEST_CASE("bad tensor-parallel settings are refused at start-up, naming the flag") {
  const std::string dir = RandomModelDir("tiny", 1);  // 4 heads, 2 KV heads
  auto error = [&](backend::BackendOptions o) {
    auto b = backend::CreateBackend("cuda", o);
    REQUIRE_FALSE(b.ok());
    return b.status().message();
  };
  // Default devices 0..N-1: more ranks than GPUs is an error, not a crash.
  const int gpus = GpuCount();
  if (gpus < 2) {
    const std::string m = error(TpOptions(dir, 2, ""));
    CHECK(m.find("--tensor-parallel 2") != std::string::npos);
    CHECK(m.find("this machine has") != std::string::npos);
  } else {
    MESSAGE("SKIPPED the one-GPU error: this machine has " << gpus << " GPUs");
  }
  CHECK(error(TpOptions(dir, 8, OnGpu0(8))).find("num_attention_heads") != std::string::npos);
  CHECK(error(TpOptions(dir, 2, "0,0,0")).find("tp_devices") != std::string::npos);
  CHECK(error(TpOptions(dir, 2, "0,x")).find("tp_devices") != std::string::npos);
  CHECK(error(TpOptions(dir, 1, "0")).find("tp_devices") != std::string::npos);
  if (gpus >= 3) CHECK(error(TpOptions(dir, 4, "0,0,1,2")).find("tp_devices") != std::string::npos);
  backend::BackendOptions lora = TpOptions(dir, 2, OnGpu0(2));
  lora.max_loras = 1;
  CHECK(error(lora).find("--max-loras") != std::string::npos);
  backend::BackendOptions fp8 = TpOptions(dir, 2, OnGpu0(2));
  fp8.kv_cache_dtype = backend::KvCacheDtype::kFp8E4m3;
  CHECK(error(fp8).find("--kv-cache-dtype") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::testing
