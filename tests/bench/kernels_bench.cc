// Kernel benchmarks: each kernel's achieved GB/s or TFLOP/s next to the device limits measured
// in the same run (device-to-device copy bandwidth, cuBLASLt bf16 GEMM rate, pinned host<->device
// copy bandwidth). Timing: CUDA events, warm-up first, median of repeated single launches; the
// data of memory-bound cases is several times the L2 so no case measures the cache (except the
// decode section's batch-1 cases, whose KV is tens of MiB). The decode rows time launches back
// to back, as a decode step's CUDA graph runs them, so the host's launch latency stays out.
//
//   kvfleet_kernels_bench [--quick] [--only decode|prefill|small|kvcopy] [--block-size B] [--kv-dtype bf16|fp8]
//                         [--decode-cases B:CTX[,B:CTX...]] [--partition-sweep]
//   (--block-size: the decode section's tokens per KV block, default 16; 1 is token-level KV;
//   --kv-dtype fp8: decode and prefill read e4m3 pages; GB/s counts the bytes read, 1 per
//   element, and the decode rows add the KV tokens read per second, comparable across dtypes;
//   --decode-cases: only these (batch, context) decode cases, e.g. for a profiler;
//   --partition-sweep: every decode case at every partition size, not only the chooser's)
//                                       prints one line per case and a summary table
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/kv_block_copy.h"
#include "kernels/paged_decode.h"
#include "kernels/paged_prefill.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/small_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

// Median milliseconds of one call of fn over reps, after warm-up calls (gpu_test_util.h).
double TimeMs(const std::function<void()>& fn, int reps = 20, int warmup = 3) {
  return gputest::MedianCallMs(fn, reps, warmup);
}

// Median milliseconds per call of fn over rounds of `per_round` calls issued back to back
// between two events (the queue stays ahead of the device: no host launch gap in the figure).
double TimeMsBackToBack(const std::function<void()>& fn, int per_round = 10, int rounds = 7) {
  return TimeMs(
             [&] {
               for (int i = 0; i < per_round; ++i) fn();
             },
             rounds, 1) /
         per_round;
}

// Fills a device buffer with random bits interpreted as bf16 in [-1, 1] (no zeros: METHOD.md).
void FillRandom(DeviceBuffer<uint16_t>& buf, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t chunk = 1 << 24;
  std::vector<uint16_t> host(std::min(chunk, buf.size()));
  for (auto& x : host) x = FloatToBf16(std::uniform_real_distribution<float>(-1, 1)(rng));
  for (size_t off = 0; off < buf.size(); off += chunk) {
    const size_t n = std::min(chunk, buf.size() - off);
    KVF_CUDA_OK(cudaMemcpy(buf.get() + off, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
}

// e4m3 codes of values uniform in [-448, 448] (scale 1/448: [-1, 1]), a 16 MiB pattern repeated.
void FillRandomFp8(DeviceBuffer<uint8_t>& buf, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t chunk = 1 << 24;
  std::vector<uint8_t> host(std::min(chunk, buf.size()));
  for (auto& x : host) x = FloatToFp8E4m3(std::uniform_real_distribution<float>(-448, 448)(rng));
  for (size_t off = 0; off < buf.size(); off += chunk) {
    const size_t n = std::min(chunk, buf.size() - off);
    KVF_CUDA_OK(cudaMemcpy(buf.get() + off, host.data(), n, cudaMemcpyHostToDevice));
  }
}

struct Limits {
  double copy_gbs = 0;   // device-to-device, bytes read + written
  double gemm_tflops = 0;
  double h2d_gbs = 0, d2h_gbs = 0;  // pinned, one large contiguous copy
};

Limits MeasureLimits(bool quick) {
  Limits lim;
  const size_t bytes = size_t(quick ? 1 : 2) << 30;
  void *a, *b;
  KVF_CUDA_OK(cudaMalloc(&a, bytes));
  KVF_CUDA_OK(cudaMalloc(&b, bytes));
  KVF_CUDA_OK(cudaMemset(a, 1, bytes));
  double ms = TimeMs([&] { KVF_CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  lim.copy_gbs = 2.0 * bytes / ms / 1e6;
  std::printf("limit  device copy            %8.1f GB/s  (cudaMemcpy D2D %zu MiB, read+write)\n", lim.copy_gbs, bytes >> 20);
  const size_t host_bytes = size_t(512) << 20;
  void* h;
  KVF_CUDA_OK(cudaMallocHost(&h, host_bytes));
  std::memset(h, 1, host_bytes);
  ms = TimeMs([&] { KVF_CUDA_OK(cudaMemcpyAsync(a, h, host_bytes, cudaMemcpyHostToDevice)); }, 10, 2);
  lim.h2d_gbs = host_bytes / ms / 1e6;
  ms = TimeMs([&] { KVF_CUDA_OK(cudaMemcpyAsync(h, a, host_bytes, cudaMemcpyDeviceToHost)); }, 10, 2);
  lim.d2h_gbs = host_bytes / ms / 1e6;
  std::printf("limit  pinned host->device    %8.1f GB/s  (one 512 MiB cudaMemcpyAsync)\n", lim.h2d_gbs);
  std::printf("limit  pinned device->host    %8.1f GB/s\n", lim.d2h_gbs);
  KVF_CUDA_OK(cudaFreeHost(h));
  KVF_CUDA_OK(cudaFree(a));
  KVF_CUDA_OK(cudaFree(b));

  // cuBLASLt bf16 GEMM, fp32 accumulation, random data: D[m][n] = A^T B (column-major).
  const int n = 8192;
  DeviceBuffer<uint16_t> A(size_t(n) * n), B(size_t(n) * n), D(size_t(n) * n);
  FillRandom(A, 1);
  FillRandom(B, 2);
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n);
  size_t ws_bytes = size_t(64) << 20;
  DeviceBuffer<uint8_t> ws(ws_bytes);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
  if (found > 0) {
    const float alpha = 1, beta = 0;
    ms = TimeMs([&] {
      cublasLtMatmul(lt, desc, &alpha, A.get(), la, B.get(), lb, &beta, D.get(), ld, D.get(), ld, &heur.algo,
                     ws.get(), ws_bytes, nullptr);
    });
    lim.gemm_tflops = 2.0 * n * n * double(n) / ms / 1e9;
    std::printf("limit  cuBLASLt bf16 GEMM     %8.1f TFLOP/s (%d^3, fp32 accumulate, random data)\n", lim.gemm_tflops, n);
  } else {
    std::printf("limit  cuBLASLt bf16 GEMM     no algorithm found\n");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  return lim;
}

struct Row {
  std::string name;
  double value;
  const char* unit;
  double fraction;
};
std::vector<Row> g_rows;

void Report(const std::string& name, double value, const char* unit, double limit, double ms) {
  const double frac = limit > 0 ? value / limit : 0;
  std::printf("bench  %-46s %9.3f ms  %8.1f %s  %5.1f%% of limit\n", name.c_str(), ms, value, unit, 100 * frac);
  g_rows.push_back({name, value, unit, frac});
}

// Llama-3.1-8B attention shape: 32 query heads, 8 KV heads, head_dim 128, block size bs (16).
// Blocks are shuffled over the pool; below 16 tokens per block every case also runs with the
// blocks in pool order, as token-level KV allocates a sequence's slots (one contiguous run).
void BenchDecode(const Limits& lim, bool quick, int bs, bool fp8, const std::vector<std::pair<int, int>>& only_cases,
                 bool sweep_all) {
  const int hq = 32, hkv = 8, d = 128;
  char bs_tag[24] = "";
  std::snprintf(bs_tag, sizeof(bs_tag), "%s", fp8 ? " fp8" : "");
  if (bs != 16) std::snprintf(bs_tag + std::strlen(bs_tag), sizeof(bs_tag) - std::strlen(bs_tag), " B=%d", bs);
  // fp8: every head's scales 1/448, pages random like bf16's (the softmax rescales O only when a
  // running max moves, so timing depends on the values).
  DeviceBuffer<float> scales(std::vector<float>(2 * hkv, 1.f / 448));
  std::vector<std::pair<int, int>> cases;  // (batch, context)
  for (int ctx : {1024, 4096, 8192, 16384, 32768}) {
    cases.push_back({1, ctx});
    // A batch whose KV is 1 GiB per layer: far past the L2, as a full batch is.
    cases.push_back({std::max(1, (1 << 30) / (ctx * hkv * d * 4)), ctx});
  }
  cases.push_back({32, 2048});
  cases.push_back({64, 2048});
  cases.push_back({128, 2048});
  if (quick) cases = {{8, 4096}, {1, 32768}};
  if (!only_cases.empty()) cases = only_cases;
  int num_sms = 0;
  KVF_CUDA_OK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  for (auto [batch, ctx] : cases) {
    PagedKvLayout layout{1, hkv, bs, d, fp8 ? 1 : 2};
    const int blocks_per_seq = ctx / bs;
    const int num_blocks = batch * blocks_per_seq;
    DeviceBuffer<uint16_t> pool(fp8 ? 1 : size_t(num_blocks) * layout.BlockElems());
    DeviceBuffer<uint8_t> pool8(fp8 ? size_t(num_blocks) * layout.BlockBytes() : 1);
    if (fp8) {
      FillRandomFp8(pool8, 3);
    } else {
      FillRandom(pool, 3);
    }
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(4));
    DeviceBuffer<int32_t> tables(ids), lens(std::vector<int32_t>(batch, ctx));
    DeviceBuffer<uint16_t> q(size_t(batch) * hq * d), out(size_t(batch) * hq * d);
    FillRandom(q, 5);
    PagedDecodeParams p;
    p.q = q.as<__nv_bfloat16>();
    if (fp8) {
      p.kv_fp8 = pool8.get();
      p.scales = {scales.get(), scales.get() + hkv};
    } else {
      p.kv_pool = pool.as<__nv_bfloat16>();
    }
    p.block_tables = tables.get();
    p.seq_lens = lens.get();
    p.out = out.as<__nv_bfloat16>();
    p.layout = layout;
    p.num_seqs = batch;
    p.num_q_heads = hq;
    p.max_blocks_per_seq = blocks_per_seq;
    p.max_seq_len = ctx;
    p.partition_size = PagedDecodeChoosePartition(batch, hq, hkv, ctx, num_sms);
    p.scale = 0.088f;
    DeviceBuffer<float> ws(std::max<size_t>(PagedDecodeWorkspaceBytes(p) / 4, 1));
    p.workspace = ws.get();
    const double bytes = double(num_blocks) * layout.BlockBytes() + 2.0 * batch * hq * d * 2;
    for (bool cuda_cores : {false, true}) {
      if (cuda_cores && batch == 1) continue;
      p.force_cuda_cores = cuda_cores;
      const double ms = TimeMsBackToBack([&] { KVF_CUDA_OK(LaunchPagedDecode(p, nullptr)); });
      char name[96];
      std::snprintf(name, sizeof(name), "paged decode%s%s b=%d ctx=%d (P=%d)", bs_tag, cuda_cores ? " cuda-cores" : "",
                    batch, ctx, p.partition_size);
      Report(name, bytes / ms / 1e6, "GB/s", lim.copy_gbs, ms);
      std::snprintf(name, sizeof(name), "  KV tokens read%s%s b=%d ctx=%d", bs_tag, cuda_cores ? " cuda-cores" : "",
                    batch, ctx);
      Report(name, double(batch) * ctx / ms / 1e3, "Mtok/s", 0, ms);
    }
    if ((batch == 64 && ctx == 4096) || bs < 16) {
      // The same with blocks in pool order (a contiguous table), against the shuffled order
      // above: shows what scattered blocks cost (TLB reach, DRAM pages).
      std::vector<int32_t> seq_ids(num_blocks);
      std::iota(seq_ids.begin(), seq_ids.end(), 0);
      tables.Upload(seq_ids);
      p.force_cuda_cores = false;
      const double ms = TimeMsBackToBack([&] { KVF_CUDA_OK(LaunchPagedDecode(p, nullptr)); });
      char name[96];
      std::snprintf(name, sizeof(name), "paged decode%s b=%d ctx=%d (P=%d, contiguous blocks)", bs_tag, batch, ctx,
                    p.partition_size);
      Report(name, bytes / ms / 1e6, "GB/s", lim.copy_gbs, ms);
      tables.Upload(ids);
    }
    // Partition-size sweeps (the chooser's evidence): a full batch at 4K, one sequence at 16K and 32K.
    if (sweep_all || (bs == 16 && ((batch == 64 && ctx == 4096) || (batch == 1 && ctx >= 16384)))) {
      const int chosen = p.partition_size;
      for (int part : {128, 256, 512, 1024, 2048}) {
        if (part == chosen || part > ctx) continue;
        p.force_cuda_cores = false;
        p.partition_size = part;
        DeviceBuffer<float> ws2(std::max<size_t>(PagedDecodeWorkspaceBytes(p) / 4, 1));
        p.workspace = ws2.get();
        const double ms = TimeMsBackToBack([&] { KVF_CUDA_OK(LaunchPagedDecode(p, nullptr)); });
        char name[96];
        std::snprintf(name, sizeof(name), "paged decode%s b=%d ctx=%d (P=%d, sweep)", bs_tag, batch, ctx, part);
        Report(name, bytes / ms / 1e6, "GB/s", lim.copy_gbs, ms);
      }
    }
  }
}

// 8K prompt in chunks of 2K (chunk i attends to the 2K*i cached tokens plus itself, causally).
void BenchPrefill(const Limits& lim, bool quick, bool fp8) {
  const int hq = 32, hkv = 8, d = 128, bs = 16, prompt = quick ? 4096 : 8192, chunk = 2048;
  PagedKvLayout layout{1, hkv, bs, d};
  const int blocks = prompt / bs;
  DeviceBuffer<uint16_t> pool(size_t(blocks) * layout.BlockElems()), q(size_t(chunk) * hq * d), out(q.size());
  FillRandom(pool, 6);
  FillRandom(q, 7);
  PagedKvLayout layout8 = layout;
  layout8.elem_bytes = 1;
  DeviceBuffer<float> scales(std::vector<float>(2 * hkv, 1.f / 448));
  // fp8: the bf16 pool's bytes read as e4m3 (finite but for the rare NaN code: timing only).
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  DeviceBuffer<int32_t> tables(ids), cu(std::vector<int32_t>{0, chunk});
  double total_ms = 0, total_flops = 0;
  for (int start = 0; start < prompt; start += chunk) {
    DeviceBuffer<int32_t> lens(std::vector<int32_t>{start + chunk});
    PagedPrefillParams p;
    p.q = q.as<__nv_bfloat16>();
    if (fp8) {
      p.kv_fp8 = reinterpret_cast<const uint8_t*>(pool.get());
      p.scales = {scales.get(), scales.get() + hkv};
    } else {
      p.kv_pool = pool.as<__nv_bfloat16>();
    }
    p.block_tables = tables.get();
    p.cu_q_lens = cu.get();
    p.seq_lens = lens.get();
    p.out = out.as<__nv_bfloat16>();
    p.layout = fp8 ? layout8 : layout;
    p.num_seqs = 1;
    p.num_q_heads = hq;
    p.max_blocks_per_seq = blocks;
    p.max_q_len = chunk;
    p.scale = 0.088f;
    const double ms = TimeMs([&] { KVF_CUDA_OK(LaunchPagedPrefill(p, nullptr)); });
    // Useful FLOPs: QK^T and PV over the visible (causal) pairs.
    double pairs = double(chunk) * start + double(chunk) * (chunk + 1) / 2;
    const double flops = 4.0 * hq * d * pairs;
    total_ms += ms;
    total_flops += flops;
    char name[96];
    std::snprintf(name, sizeof(name), "paged prefill%s chunk %d-%d of %d", fp8 ? " fp8" : "", start, start + chunk,
                  prompt);
    Report(name, flops / ms / 1e9, "TFLOP/s", lim.gemm_tflops, ms);
  }
  char name[96];
  std::snprintf(name, sizeof(name), "paged prefill%s %d in chunks of %d (attention)", fp8 ? " fp8" : "", prompt, chunk);
  Report(name, total_flops / total_ms / 1e9, "TFLOP/s", lim.gemm_tflops, total_ms);
}

void BenchSmall(const Limits& lim) {
  const int rows = 8192, hidden = 4096, inter = 14336;
  {
    DeviceBuffer<uint16_t> x(size_t(rows) * hidden), res(x.size()), w(hidden), out(x.size());
    FillRandom(x, 8);
    FillRandom(res, 9);
    FillRandom(w, 10);
    const double ms = TimeMs([&] {
      KVF_CUDA_OK(LaunchRmsNorm(x.as<__nv_bfloat16>(), res.as<__nv_bfloat16>(), w.as<__nv_bfloat16>(),
                                out.as<__nv_bfloat16>(), rows, hidden, 1e-5f, nullptr));
    });
    Report("rmsnorm+residual 8192x4096", 4.0 * x.size() * 2 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
  }
  {
    DeviceBuffer<uint16_t> gu(size_t(rows) * 2 * inter), out(size_t(rows) * inter);
    FillRandom(gu, 11);
    const double ms = TimeMs(
        [&] { KVF_CUDA_OK(LaunchSiluMul(gu.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), rows, inter, nullptr)); });
    Report("silu_mul 8192x14336", 3.0 * out.size() * 2 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
  }
  {
    const int tokens = 8192, hq = 32, hkv = 8, d = 128;
    PagedKvLayout layout{1, hkv, 16, d};
    DeviceBuffer<uint16_t> qkv(size_t(tokens) * (hq + 2 * hkv) * d), qout(size_t(tokens) * hq * d),
        pool(size_t(tokens / 16) * layout.BlockElems());
    FillRandom(qkv, 12);
    std::vector<int32_t> pos(tokens), slots(tokens);
    std::iota(pos.begin(), pos.end(), 0);
    std::iota(slots.begin(), slots.end(), 0);
    RopeConfig rc;
    rc.scaling.type = RopeScaling::Type::kLlama3;
    rc.scaling.factor = 8;
    DeviceBuffer<int32_t> dpos(pos), dslots(slots);
    DeviceBuffer<float> inv(RopeInvFreq(rc));
    const double ms = TimeMs([&] {
      KVF_CUDA_OK(LaunchRopeKvStore(qkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), inv.get(),
                                    qout.as<__nv_bfloat16>(), pool.as<__nv_bfloat16>(), layout, 0, tokens, hq, true,
                                    nullptr));
    });
    Report("rope+kv store 8192 tokens (llama-8b)", 2.0 * qkv.size() * 2 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
  }
  {
    // Llama 4 Scout's heads (40 q, 8 KV, head_dim 128): a RoPE layer's interleaved rotation and
    // L2 q/k norm, and a NoPE layer's attention temperature (a warp per head); Qwen3's q/k
    // RMSNorm before the rotation on the same heads.
    const int tokens = 8192, hq = 40, hkv = 8, d = 128;
    PagedKvLayout layout{1, hkv, 16, d};
    DeviceBuffer<uint16_t> qkv(size_t(tokens) * (hq + 2 * hkv) * d), qout(size_t(tokens) * hq * d),
        pool(size_t(tokens / 16) * layout.BlockElems()), qn(d), kn(d);
    FillRandom(qkv, 16);
    FillRandom(qn, 17);
    FillRandom(kn, 18);
    std::vector<int32_t> pos(tokens), slots(tokens);
    std::iota(pos.begin(), pos.end(), 0);
    std::iota(slots.begin(), slots.end(), 0);
    DeviceBuffer<int32_t> dpos(pos), dslots(slots);
    DeviceBuffer<float> inv(RopeInvFreq(RopeConfig{}));
    RopeKvExtras rope_layer, nope_layer, qwen3;
    rope_layer.interleaved = true;
    rope_layer.l2_norm = true;
    rope_layer.norm_eps = 1e-5f;
    nope_layer.temperature_scale = 0.1f;
    nope_layer.temperature_floor = 8192.f;
    qwen3.q_norm = qn.as<__nv_bfloat16>();
    qwen3.k_norm = kn.as<__nv_bfloat16>();
    qwen3.norm_eps = 1e-6f;
    const struct {
      const char* name;
      const RopeKvExtras* extras;
      bool rotate;
    } cases[] = {{"llama-4 rope layer (interleaved, L2 norm)", &rope_layer, true},
                 {"llama-4 nope layer (temperature)", &nope_layer, false},
                 {"qwen3 q/k norm", &qwen3, true}};
    for (const auto& c : cases) {
      const double ms = TimeMs([&] {
        KVF_CUDA_OK(LaunchRopeKvStore(qkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), inv.get(),
                                      qout.as<__nv_bfloat16>(), pool.as<__nv_bfloat16>(), layout, 0, tokens, hq,
                                      c.rotate, *c.extras, nullptr));
      });
      char name[96];
      std::snprintf(name, sizeof(name), "rope+kv store 8192 tokens, %s", c.name);
      Report(name, 2.0 * qkv.size() * 2 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
    }
  }
  {
    const int vocab = 128256, tokens = 8192;
    DeviceBuffer<uint16_t> table(size_t(vocab) * hidden), out(size_t(tokens) * hidden);
    FillRandom(table, 13);
    std::vector<int32_t> ids(tokens);
    std::mt19937 rng(14);
    for (auto& i : ids) i = rng() % vocab;
    DeviceBuffer<int32_t> dids(ids);
    const double ms = TimeMs([&] {
      KVF_CUDA_OK(LaunchEmbedding(dids.get(), table.as<__nv_bfloat16>(), out.as<__nv_bfloat16>(), tokens, vocab,
                                  hidden, nullptr));
    });
    Report("embedding 8192 tokens x 4096", 2.0 * out.size() * 2 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
  }
  for (int batch : {1, 64}) {
    const int vocab = 128256;
    std::vector<float> logits(size_t(batch) * vocab);
    std::mt19937 rng(15);
    std::normal_distribution<float> nd(0, 3);
    for (auto& l : logits) l = nd(rng);
    DeviceBuffer<float> dl(logits), temp(std::vector<float>(batch, 0.8f)), top_p(std::vector<float>(batch, 0.9f));
    DeviceBuffer<int32_t> top_k(std::vector<int32_t>(batch, 50)), out(batch);
    DeviceBuffer<uint64_t> seed(std::vector<uint64_t>(batch, 1)), step(std::vector<uint64_t>(batch, 0));
    SamplingParams p{dl.get(), temp.get(), top_k.get(), top_p.get(), seed.get(), step.get(), out.get(), batch, vocab};
    const double ms = TimeMs([&] { KVF_CUDA_OK(LaunchSampling(p, nullptr)); });
    char name[96];
    std::snprintf(name, sizeof(name), "sampling top-k 50 top-p 0.9 b=%d vocab 128256", batch);
    Report(name, double(batch) * vocab * 4 / ms / 1e6, "GB/s", lim.copy_gbs, ms);
  }
  // The same launch with every row asking for 20 top logprobs and 300 adjustments (penalties,
  // logit_bias; applied in place, so repeats drift the values, not the work), and the prompt-row
  // logprobs kernel.
  {
    const int batch = 64, vocab = 128256, per_row = 300;
    std::vector<float> logits(size_t(batch) * vocab);
    std::mt19937 rng(16);
    std::normal_distribution<float> nd(0, 3);
    for (auto& l : logits) l = nd(rng);
    std::vector<LogitAdjust> adjust;
    std::vector<int32_t> begin = {0};
    for (int b = 0; b < batch; ++b) {
      for (int k = 0; k < per_row; ++k) adjust.push_back({k * 401 % vocab, 0.5f, 1.2f, 0.3f});
      begin.push_back(static_cast<int32_t>(adjust.size()));
    }
    DeviceBuffer<float> dl(logits), temp(std::vector<float>(batch, 0.8f)), top_p(std::vector<float>(batch, 0.9f));
    DeviceBuffer<float> min_p(std::vector<float>(batch, 0.05f)), raw(adjust.size()), lp(batch),
        top_lp(size_t(batch) * kMaxTopLogprobs);
    DeviceBuffer<int32_t> top_k(std::vector<int32_t>(batch, 50)), out(batch), dbegin(begin),
        nlp(std::vector<int32_t>(batch, 20)), top_tok(size_t(batch) * kMaxTopLogprobs);
    DeviceBuffer<uint64_t> seed(std::vector<uint64_t>(batch, 1)), step(std::vector<uint64_t>(batch, 0));
    DeviceBuffer<LogitAdjust> dadj(adjust.size());
    dadj.Upload(adjust);
    SamplingParams p{dl.get(), temp.get(), top_k.get(), top_p.get(), seed.get(), step.get(), out.get(), batch, vocab};
    p.min_p = min_p.get();
    p.adjust_begin = dbegin.get();
    p.adjust = dadj.get();
    p.adjust_raw = raw.get();
    p.logprobs = nlp.get();
    p.token_logprob = lp.get();
    p.top_tokens = top_tok.get();
    p.top_logprobs = top_lp.get();
    double ms = TimeMs([&] { KVF_CUDA_OK(LaunchSampling(p, nullptr)); });
    Report("sampling + 20 logprobs + 300 adjustments b=64 vocab 128256", double(batch) * vocab * 4 / ms / 1e6, "GB/s",
           lim.copy_gbs, ms);
    DeviceBuffer<int32_t> target(std::vector<int32_t>(batch, 7));
    LogprobsParams q{dl.get(), target.get(), 20, lp.get(), top_tok.get(), top_lp.get(), batch, vocab};
    ms = TimeMs([&] { KVF_CUDA_OK(LaunchLogprobs(q, nullptr)); });
    Report("prompt-row logprobs top 20, 64 rows vocab 128256", double(batch) * vocab * 4 / ms / 1e6, "GB/s",
           lim.copy_gbs, ms);
  }
}

// Offload / onboard of 256 random blocks of a llama-8b pool (32 layers, 8 KV heads, B=16:
// 2 MiB per block) in one launch, against one contiguous cudaMemcpyAsync.
void BenchKvCopy(const Limits& lim, bool quick) {
  PagedKvLayout layout{32, 8, 16, 128};
  const int blocks = quick ? 64 : 256, pool_blocks = blocks * 2;
  DeviceBuffer<uint8_t> dev(size_t(pool_blocks) * layout.BlockBytes());
  KVF_CUDA_OK(cudaMemset(dev.get(), 3, dev.size()));
  uint8_t* host;
  KVF_CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), size_t(pool_blocks) * layout.BlockBytes()));
  std::memset(host, 5, size_t(pool_blocks) * layout.BlockBytes());
  std::vector<int32_t> src(pool_blocks), dst(pool_blocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::mt19937 rng(16);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<int32_t> pairs;
  for (int i = 0; i < blocks; ++i) {
    pairs.push_back(src[i]);
    pairs.push_back(dst[i]);
  }
  DeviceBuffer<int32_t> dpairs(pairs);
  const double bytes = double(blocks) * layout.BlockBytes();
  double ms = TimeMs([&] { KVF_CUDA_OK(LaunchKvBlockCopy(dev.get(), host, dpairs.get(), blocks, layout.BlockBytes(), nullptr)); }, 10, 2);
  Report("kv offload 256 x 2MiB blocks (device->host)", bytes / ms / 1e6, "GB/s", lim.d2h_gbs, ms);
  ms = TimeMs([&] { KVF_CUDA_OK(LaunchKvBlockCopy(host, dev.get(), dpairs.get(), blocks, layout.BlockBytes(), nullptr)); }, 10, 2);
  Report("kv onboard 256 x 2MiB blocks (host->device)", bytes / ms / 1e6, "GB/s", lim.h2d_gbs, ms);
  KVF_CUDA_OK(cudaFreeHost(host));
}

}  // namespace
}  // namespace kvfleet::kernels

int main(int argc, char** argv) {
  using namespace kvfleet::kernels;
  bool quick = false;
  std::string only;  // one section: decode, prefill, small, kvcopy
  int block_size = 16;  // the decode section's
  bool fp8 = false;     // --kv-dtype fp8: decode and prefill over e4m3 pages
  std::vector<std::pair<int, int>> decode_cases;  // --decode-cases: (batch, context)
  bool partition_sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--block-size") == 0 && i + 1 < argc) {
      block_size = std::atoi(argv[++i]);
      if (block_size < 1 || block_size > 256 || (block_size & (block_size - 1)) != 0) {
        std::fprintf(stderr, "kvfleet_kernels_bench: --block-size %s is not a power of two in [1, 256]\n", argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
      const std::string d = argv[++i];
      if (d != "bf16" && d != "fp8" && d != "fp8_e4m3") {
        std::fprintf(stderr, "kvfleet_kernels_bench: --kv-dtype must be bf16 or fp8, got '%s'\n", d.c_str());
        return 2;
      }
      fp8 = d != "bf16";
    } else if (std::strcmp(argv[i], "--partition-sweep") == 0) {
      partition_sweep = true;
    } else if (std::strcmp(argv[i], "--decode-cases") == 0 && i + 1 < argc) {
      const std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, end - at);
        int batch = 0, ctx = 0;
        char tail = 0;
        if (std::sscanf(item.c_str(), "%d:%d%c", &batch, &ctx, &tail) != 2 || batch < 1 || ctx < 1) {
          std::fprintf(stderr, "kvfleet_kernels_bench: --decode-cases takes BATCH:CONTEXT[,...], got '%s'\n",
                       item.c_str());
          return 2;
        }
        decode_cases.push_back({batch, ctx});
        at = end + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: kvfleet_kernels_bench [--quick] [--only decode|prefill|small|kvcopy] [--block-size B] "
                   "[--kv-dtype bf16|fp8] [--decode-cases B:CTX[,B:CTX...]] [--partition-sweep]\n");
      return 2;
    }
  }
  for (auto [batch, ctx] : decode_cases) {
    if (ctx % block_size != 0) {
      std::fprintf(stderr, "kvfleet_kernels_bench: --decode-cases context %d is not a multiple of the block size %d\n",
                   ctx, block_size);
      return 2;
    }
  }
  auto want = [&](const char* section) { return only.empty() || only == section; };
  cudaDeviceProp prop;
  KVF_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, %.0f MiB, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1048576.0, prop.l2CacheSize >> 20);
  Limits lim = MeasureLimits(quick);
  if (want("decode")) BenchDecode(lim, quick, block_size, fp8, decode_cases, partition_sweep);
  if (want("prefill")) BenchPrefill(lim, quick, fp8);
  if (want("small")) BenchSmall(lim);
  if (want("kvcopy")) BenchKvCopy(lim, quick);
  std::printf("\nsummary (%s)\n", prop.name);
  for (const Row& r : g_rows) std::printf("  %-48s %9.1f %-8s %5.1f%%\n", r.name.c_str(), r.value, r.unit, 100 * r.fraction);
  return 0;
}
