// Paged-attention decode and prefill kernels against the double-precision CPU reference, over
// head sizes, block sizes (2..256), GQA/MQA groups, split-K partitions and every mask.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "kernels/fp8.h"
#include "kernels/paged_attention_ref.h"
#include "kernels/small_kernels_ref.h"
#include "kernels/paged_decode.h"
#include "kernels/paged_prefill.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

// bf16 inputs and output, fp32 accumulation: the error METHOD.md expects of bf16 operands.
constexpr double kTolerance = 1e-2;

struct Case {
  int head_dim = 128;
  int block_size = 16;
  int num_kv_heads = 2;
  int num_q_heads = 8;
  std::vector<int> seq_lens;  // cached tokens per sequence, new ones included
  std::vector<int> q_lens;    // prefill: new tokens per sequence (decode: all 1)
  AttentionMask mask;
  bool shift_rope = false;
  int partition_size = 0;  // decode: 0 = PagedDecodeChoosePartition
  bool force_cuda_cores = false;  // decode: the CUDA-core kernel instead of the tensor-core one
  bool fp8 = false;               // e4m3 pages with per-(layer, head) scales
  float q_range = 2.f;            // queries uniform in [-q_range, q_range]
  int prefill_sms = 0;            // prefill: > 0 gives a workspace and this many SMs (split-KV)
};

// A pool of random K/V with two layers (the test reads layer 1), block tables drawing
// distinct blocks in shuffled order, and random queries.
struct Fixture {
  PagedKvLayout layout;
  int max_blocks = 0;
  int num_tokens = 0;
  std::vector<bf16_bits> pool, q;
  std::vector<int32_t> tables, cu_q;
  std::vector<float> inv_freq;
  // fp8: the pool quantised, and its scales [layer][kv_heads] (K, V).
  PagedKvLayout layout8;
  std::vector<fp8_bits> pool8;
  std::vector<float> k_scales, v_scales;

  Fixture(const Case& c, std::mt19937& rng) {
    layout = PagedKvLayout{2, c.num_kv_heads, c.block_size, c.head_dim};
    const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
    max_blocks = (max_len + c.block_size - 1) / c.block_size;
    const int num_blocks = max_blocks * static_cast<int>(c.seq_lens.size()) + 3;
    pool = gputest::RandomBf16(num_blocks * layout.BlockElems(), rng);
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(c.seq_lens.size() * max_blocks, -1);
    int next = 0;
    for (size_t s = 0; s < c.seq_lens.size(); ++s)
      for (int j = 0; j < (c.seq_lens[s] + c.block_size - 1) / c.block_size; ++j)
        tables[s * max_blocks + j] = ids[next++];
    cu_q.push_back(0);
    for (int ql : c.q_lens) cu_q.push_back(cu_q.back() + ql);
    num_tokens = cu_q.back();
    // Queries in [-2, 2] by default, so that softmax is neither flat nor one-hot.
    q = gputest::RandomBf16(size_t(num_tokens) * c.num_q_heads * c.head_dim, rng, -c.q_range, c.q_range);
    RopeConfig rope;
    rope.head_dim = c.head_dim;
    rope.theta = 10000;
    inv_freq = RopeInvFreq(rope);
    if (c.fp8) {
      // |x| <= 1 over scales in [1, 3] / 448: e4m3 values up to 448, none saturated, and
      // every head of every layer with its own scale.
      std::uniform_real_distribution<float> u(1.f, 3.f);
      for (int i = 0; i < layout.num_layers * layout.num_kv_heads; ++i) {
        k_scales.push_back(u(rng) / kFp8E4m3Max);
        v_scales.push_back(u(rng) / kFp8E4m3Max);
      }
      layout8 = layout;
      layout8.elem_bytes = 1;
      pool8.resize(pool.size());
      QuantizeKvPoolRef(pool.data(), pool8.data(), layout8, num_blocks, k_scales.data(), v_scales.data());
    }
  }

  // The scales of layer 1 (the one the tests read): K then V, [kv_heads] each.
  std::vector<float> Layer1Scales() const {
    if (k_scales.empty()) return {};
    std::vector<float> s(k_scales.begin() + layout.num_kv_heads, k_scales.begin() + 2 * layout.num_kv_heads);
    s.insert(s.end(), v_scales.begin() + layout.num_kv_heads, v_scales.begin() + 2 * layout.num_kv_heads);
    return s;
  }

  std::vector<float> Reference(const Case& c) const {
    std::vector<float> out(q.size());
    PagedAttentionRefArgs a;
    a.q = q.data();
    a.kv_pool = pool.data();
    const std::vector<float> scales = c.fp8 ? Layer1Scales() : std::vector<float>{};
    if (c.fp8) {
      a.kv_pool = nullptr;
      a.kv_fp8 = pool8.data();
      a.k_scale = scales.data();
      a.v_scale = scales.data() + layout.num_kv_heads;
    }
    a.block_tables = tables.data();
    a.cu_q_lens = cu_q.data();
    a.seq_lens = c.seq_lens.data();
    a.rope_inv_freq = c.shift_rope ? inv_freq.data() : nullptr;
    a.out = out.data();
    a.layout = c.fp8 ? layout8 : layout;
    a.layer = 1;
    a.num_seqs = static_cast<int>(c.seq_lens.size());
    a.num_q_heads = c.num_q_heads;
    a.max_blocks_per_seq = max_blocks;
    a.scale = 1.f / std::sqrt(float(c.head_dim));
    a.mask = c.mask;
    PagedAttentionRef(a);
    return out;
  }
};

double RunDecode(Case c, uint32_t seed) {
  std::mt19937 rng(seed);
  c.q_lens.assign(c.seq_lens.size(), 1);
  Fixture f(c, rng);
  DeviceBuffer<bf16_bits> pool(c.fp8 ? std::vector<bf16_bits>{} : f.pool), q(f.q), out(f.q.size());
  DeviceBuffer<fp8_bits> pool8(f.pool8);
  DeviceBuffer<float> scales(f.Layer1Scales());
  DeviceBuffer<int32_t> tables(f.tables), lens(std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end()));
  DeviceBuffer<float> inv_freq(f.inv_freq);
  PagedDecodeParams p;
  p.q = q.as<__nv_bfloat16>();
  if (c.fp8) {
    p.kv_fp8 = pool8.get();
    p.scales = {scales.get(), scales.get() + c.num_kv_heads};
  } else {
    p.kv_pool = pool.as<__nv_bfloat16>();
  }
  p.block_tables = tables.get();
  p.seq_lens = lens.get();
  p.out = out.as<__nv_bfloat16>();
  p.rope_inv_freq = c.shift_rope ? inv_freq.get() : nullptr;
  p.layout = c.fp8 ? f.layout8 : f.layout;
  p.layer = 1;
  p.num_seqs = static_cast<int>(c.seq_lens.size());
  p.num_q_heads = c.num_q_heads;
  p.max_blocks_per_seq = f.max_blocks;
  p.max_seq_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  p.partition_size = c.partition_size > 0 ? c.partition_size
                                          : PagedDecodeChoosePartition(p.num_seqs, p.num_q_heads,
                                                                       f.layout.num_kv_heads, p.max_seq_len, 132);
  p.scale = 1.f / std::sqrt(float(c.head_dim));
  p.mask = c.mask;
  p.force_cuda_cores = c.force_cuda_cores;
  DeviceBuffer<float> ws(std::max<size_t>(PagedDecodeWorkspaceBytes(p) / sizeof(float), 1));
  p.workspace = ws.get();
  out.Poison();
  KVF_CUDA_OK(LaunchPagedDecode(p, nullptr));
  KVF_CUDA_OK(cudaDeviceSynchronize());
  return gputest::RelativeError(out.Download(), f.Reference(c));
}

double RunPrefill(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Fixture f(c, rng);
  DeviceBuffer<bf16_bits> pool(c.fp8 ? std::vector<bf16_bits>{} : f.pool), q(f.q), out(f.q.size());
  DeviceBuffer<fp8_bits> pool8(f.pool8);
  DeviceBuffer<float> scales(f.Layer1Scales());
  DeviceBuffer<int32_t> tables(f.tables), lens(std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end())),
      cu(f.cu_q);
  PagedPrefillParams p;
  p.q = q.as<__nv_bfloat16>();
  if (c.fp8) {
    p.kv_fp8 = pool8.get();
    p.scales = {scales.get(), scales.get() + c.num_kv_heads};
  } else {
    p.kv_pool = pool.as<__nv_bfloat16>();
  }
  p.block_tables = tables.get();
  p.cu_q_lens = cu.get();
  p.seq_lens = lens.get();
  p.out = out.as<__nv_bfloat16>();
  p.layout = c.fp8 ? f.layout8 : f.layout;
  p.layer = 1;
  p.num_seqs = static_cast<int>(c.seq_lens.size());
  p.num_q_heads = c.num_q_heads;
  p.max_blocks_per_seq = f.max_blocks;
  p.max_q_len = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  p.scale = 1.f / std::sqrt(float(c.head_dim));
  p.mask = c.mask;
  DeviceBuffer<float> ws(std::max<size_t>(PagedPrefillWorkspaceBytes(c.head_dim, c.prefill_sms) / sizeof(float), 1));
  if (c.prefill_sms > 0) {
    p.workspace = ws.get();
    p.workspace_bytes = PagedPrefillWorkspaceBytes(c.head_dim, c.prefill_sms);
    p.num_sms = c.prefill_sms;
    p.max_seq_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
    CHECK(PagedPrefillChooseSplits(p) > 1);  // the case is one that splits
  }
  out.Poison();
  KVF_CUDA_OK(LaunchPagedPrefill(p, nullptr));
  KVF_CUDA_OK(cudaDeviceSynchronize());
  return gputest::RelativeError(out.Download(), f.Reference(c));
}

TEST_CASE("decode matches the reference for every head size and block sizes 1..256") {
  uint32_t seed = 1;
  for (bool cuda_cores : {false, true})
    for (int head_dim : {64, 128, 256})
      for (int block_size : {1, 2, 7, 16, 64, 256}) {  // 1: token-level KV, a block table entry per token
        Case c;
        c.head_dim = head_dim;
        c.block_size = block_size;
        c.seq_lens = {1, 37, 300, 1029};
        c.force_cuda_cores = cuda_cores;
        CAPTURE(cuda_cores);
        CAPTURE(head_dim);
        CAPTURE(block_size);
        CHECK(RunDecode(c, seed++) < kTolerance);
      }
}

TEST_CASE("decode shares each KV head across its query group: MHA, GQA, MQA, groups over 8") {
  uint32_t seed = 100;
  for (bool cuda_cores : {false, true})
    for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{4, 4}, {8, 2}, {14, 2}, {9, 3}, {12, 1}, {32, 2}, {40, 1}}) {
      Case c;
      c.num_q_heads = hq;
      c.num_kv_heads = hkv;
      c.seq_lens = {5, 700, 2100};
      c.force_cuda_cores = cuda_cores;
      CAPTURE(cuda_cores);
      CAPTURE(hq);
      CAPTURE(hkv);
      CHECK(RunDecode(c, seed++) < kTolerance);
    }
}

TEST_CASE("decode split-K partitions reduce to the single-partition result") {
  uint32_t seed = 200;
  for (int part : {128, 256, 512, 4096}) {
    Case c;
    c.seq_lens = {3000, 17, 4500};
    c.partition_size = part;
    CAPTURE(part);
    CHECK(RunDecode(c, seed++) < kTolerance);
  }
}

TEST_CASE("decode honours sliding windows, sinks and chunked attention, on bf16 and fp8 pages") {
  uint32_t seed = 300;
  std::vector<AttentionMask> masks = {{64, 0, 0}, {1000, 0, 0}, {100, 4, 0}, {33, 16, 0}, {0, 0, 256}, {0, 0, 100}};
  for (bool fp8 : {false, true})
    for (const AttentionMask& m : masks) {
      Case c;
      c.fp8 = fp8;
      c.seq_lens = {1, 50, 101, 1500, 2049};
      c.mask = m;
      CAPTURE(fp8);
      CAPTURE(m.window);
      CAPTURE(m.sinks);
      CAPTURE(m.chunk);
      CHECK(RunDecode(c, seed++) < kTolerance);
    }
}

TEST_CASE("decode with StreamingLLM sinks rotates q and K by their positions in the kept cache") {
  uint32_t seed = 400;
  for (int head_dim : {64, 128}) {
    Case c;
    c.head_dim = head_dim;
    c.mask = {256, 4, 0};
    c.shift_rope = true;
    c.seq_lens = {3, 300, 2000};
    c.partition_size = 128;
    CAPTURE(head_dim);
    CHECK(RunDecode(c, seed++) < kTolerance);
  }
}

TEST_CASE("prefill of a chunk attends causally to the cached prefix and itself") {
  uint32_t seed = 500;
  for (int head_dim : {64, 128})
    for (int block_size : {1, 2, 16, 256}) {
      Case c;
      c.head_dim = head_dim;
      c.block_size = block_size;
      c.seq_lens = {70, 200, 33};  // cached prefixes 0, 130 and 32
      c.q_lens = {70, 70, 1};
      CAPTURE(head_dim);
      CAPTURE(block_size);
      CHECK(RunPrefill(c, seed++) < kTolerance);
    }
}

TEST_CASE("prefill of short chunks over long cached prefixes splits the K/V range and merges the parts") {
  uint32_t seed = 550;
  for (bool fp8 : {false, true})
    for (int head_dim : {64, 128})
      for (const AttentionMask& m : std::vector<AttentionMask>{{}, {300, 4, 0}, {0, 0, 512}}) {
        Case c;
        c.head_dim = head_dim;
        c.fp8 = fp8;
        c.mask = m;
        c.seq_lens = {2100, 4129, 700};  // prefixes 2068, 4128 and 683
        c.q_lens = {32, 1, 17};
        c.prefill_sms = 132;
        CAPTURE(fp8);
        CAPTURE(head_dim);
        CAPTURE(m.window);
        CAPTURE(m.chunk);
        CHECK(RunPrefill(c, seed++) < kTolerance);
      }
  Case gqa;  // a group of 8 (Llama 3 8B's), 4 KV heads
  gqa.num_q_heads = 32;
  gqa.num_kv_heads = 4;
  gqa.seq_lens = {8192};
  gqa.q_lens = {32};
  gqa.prefill_sms = 132;
  CHECK(RunPrefill(gqa, seed++) < kTolerance);
}

TEST_CASE("prefill handles GQA groups, MQA and every mask") {
  uint32_t seed = 600;
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{2, 2}, {7, 1}, {8, 2}, {9, 3}}) {
    Case c;
    c.num_q_heads = hq;
    c.num_kv_heads = hkv;
    c.seq_lens = {150, 90};
    c.q_lens = {100, 90};
    CAPTURE(hq);
    CHECK(RunPrefill(c, seed++) < kTolerance);
  }
  for (const AttentionMask& m : std::vector<AttentionMask>{{32, 0, 0}, {50, 4, 0}, {0, 0, 64}, {17, 3, 0}}) {
    Case c;
    c.seq_lens = {300, 129};
    c.q_lens = {200, 129};
    c.mask = m;
    CAPTURE(m.window);
    CAPTURE(m.sinks);
    CAPTURE(m.chunk);
    CHECK(RunPrefill(c, seed++) < kTolerance);
  }
}

TEST_CASE("prefill K/V tiles span pages of every block size, power of two or not") {
  // 64-token K/V tiles cover 64 pages of 1 (token-level KV), 4 of 16, 2 of 32, one of 64, and
  // cut pages of 7 and 48.
  uint32_t seed = 650;
  for (int head_dim : {64, 128})
    for (int block_size : {1, 7, 16, 32, 48, 64}) {
      Case c;
      c.head_dim = head_dim;
      c.block_size = block_size;
      c.num_q_heads = 8;
      c.num_kv_heads = 2;
      c.seq_lens = {517, 190};  // prefixes 260 and 0; chunks not multiples of the 32-token row tile
      c.q_lens = {257, 190};
      CAPTURE(head_dim);
      CAPTURE(block_size);
      CHECK(RunPrefill(c, seed++) < kTolerance);
    }
}

TEST_CASE("prefill over a long prefix applies windows, sinks and chunks on every tile") {
  // Windows far shorter than the prefix put the block's range start mid-tile and differ between
  // the warps of a block; sinks sit in a tile far below every row's window; chunk masks start
  // mid-tile; with prefixes not a multiple of 64, some warps meet tiles wholly past their last
  // query (skipped).
  uint32_t seed = 680;
  for (int head_dim : {64, 128})
    for (const AttentionMask& m :
         std::vector<AttentionMask>{{0, 0, 0}, {100, 0, 0}, {100, 4, 0}, {130, 70, 0}, {0, 0, 200}, {64, 3, 0}}) {
      Case c;
      c.head_dim = head_dim;
      c.block_size = 16;
      c.num_q_heads = 4;
      c.num_kv_heads = 1;
      c.seq_lens = {1200, 700};
      c.q_lens = {300, 333};
      c.mask = m;
      CAPTURE(head_dim);
      CAPTURE(m.window);
      CAPTURE(m.sinks);
      CAPTURE(m.chunk);
      CHECK(RunPrefill(c, seed++) < kTolerance);
    }
}

TEST_CASE("prefill of one token per sequence equals decode") {
  Case c;
  c.seq_lens = {513, 64};
  c.q_lens = {1, 1};
  CHECK(RunPrefill(c, 700) < kTolerance);
  CHECK(RunDecode(c, 700) < kTolerance);
}

TEST_CASE("fp8 decode reads e4m3 pages with per-head scales, on both kernels, every head size and block size") {
  uint32_t seed = 800;
  for (bool cuda_cores : {false, true})
    for (int head_dim : {64, 128, 256})
      for (int block_size : {1, 16, 64}) {
        Case c;
        c.fp8 = true;
        c.head_dim = head_dim;
        c.block_size = block_size;
        c.seq_lens = {1, 37, 300, 2100};
        c.force_cuda_cores = cuda_cores;
        CAPTURE(cuda_cores);
        CAPTURE(head_dim);
        CAPTURE(block_size);
        CHECK(RunDecode(c, seed++) < kTolerance);
      }
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{8, 8}, {32, 8}, {12, 1}, {40, 2}}) {
    Case c;
    c.fp8 = true;
    c.num_q_heads = hq;
    c.num_kv_heads = hkv;
    c.seq_lens = {700, 4500};
    c.partition_size = 256;  // several partitions: the V scale must survive the combine
    CAPTURE(hq);
    CAPTURE(hkv);
    CHECK(RunDecode(c, seed++) < kTolerance);
  }
  Case shift;  // StreamingLLM: K rotated after dequantisation
  shift.fp8 = true;
  shift.mask = {256, 4, 0};
  shift.shift_rope = true;
  shift.seq_lens = {3, 2000};
  shift.partition_size = 128;
  CHECK(RunDecode(shift, seed++) < kTolerance);
}

TEST_CASE("fp8 decode keeps small and large queries exact (f16 operands scaled per head)") {
  uint32_t seed = 850;
  for (bool fp8 : {false, true})
    for (float range : {1e-4f, 3e-2f, 40.f, 3000.f}) {
      Case c;
      c.fp8 = fp8;
      c.q_range = range;
      c.num_q_heads = 16;
      c.num_kv_heads = 2;
      c.seq_lens = {300, 1100};
      CAPTURE(fp8);
      CAPTURE(range);
      CHECK(RunDecode(c, seed++) < kTolerance);
    }
}

TEST_CASE("fp8 prefill reads e4m3 pages across pages, groups and masks") {
  uint32_t seed = 900;
  for (int head_dim : {64, 128})
    for (int block_size : {1, 7, 16, 64}) {
      Case c;
      c.fp8 = true;
      c.head_dim = head_dim;
      c.block_size = block_size;
      c.seq_lens = {517, 190, 33};
      c.q_lens = {257, 190, 1};
      CAPTURE(head_dim);
      CAPTURE(block_size);
      CHECK(RunPrefill(c, seed++) < kTolerance);
    }
  for (const AttentionMask& m : std::vector<AttentionMask>{{100, 4, 0}, {0, 0, 200}}) {
    Case c;
    c.fp8 = true;
    c.num_q_heads = 12;
    c.num_kv_heads = 3;
    c.seq_lens = {1200, 700};
    c.q_lens = {300, 333};
    c.mask = m;
    CAPTURE(m.window);
    CHECK(RunPrefill(c, seed++) < kTolerance);
  }
}

TEST_CASE("the kernels refuse an fp8 pool without scales or with a bf16 layout") {
  std::mt19937 rng(950);
  Case c;
  c.fp8 = true;
  c.seq_lens = {64};
  c.q_lens = {1};
  Fixture f(c, rng);
  DeviceBuffer<fp8_bits> pool8(f.pool8);
  PagedDecodeParams p;
  p.kv_fp8 = pool8.get();
  p.layout = f.layout8;
  p.num_seqs = 1;
  p.num_q_heads = c.num_q_heads;
  p.max_seq_len = 64;
  p.partition_size = 128;
  CHECK(LaunchPagedDecode(p, nullptr) == cudaErrorInvalidValue);  // no scales
  DeviceBuffer<float> scales(f.Layer1Scales());
  p.scales = {scales.get(), scales.get() + c.num_kv_heads};
  p.layout = f.layout;  // elem_bytes 2
  CHECK(LaunchPagedDecode(p, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvfleet::kernels
