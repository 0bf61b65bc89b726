// CudaBackend, the fp8 KV cache's scales (--kv-cache-dtype fp8): one fp32 scale per (layer,
// KV head) for K and one for V; a stored element is e4m3(x / scale) (kernels/paged_kv.h).
// They are fixed at start-up, before any block exists, and never change: cached blocks are
// reused by later requests, so a block must read back with the scales it was written with.
//
// Where they come from, first match:
//   1. The checkpoint, as vLLM and llm-compressor store them, per layer N:
//      model.layers.N.self_attn.{k,v}_scale, model.layers.N.self_attn.{k,v}_proj.output_scale,
//      or model.layers.N.self_attn.{k,v}_proj.{k,v}_scale (ModelOpt); model.layers.N.self_attn.kv_scale
//      for both. One value (per tensor) or num_kv_heads values (per head); every layer or none.
//   2. Calibration: one prefill of kCalibrationTokens fixed pseudo-random tokens with the pools
//      read as bf16, then scale = amax * kCalibrationMargin / 448 per (layer, KV head, K/V).
// Thread-compatible, as CudaBackend.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/log.h"
#include "kernels/bf16.h"
#include "kernels/fp8.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {
namespace {

// Tokens of the calibration prefill: enough that every head sees a spread of positions and
// inputs; a fraction of a second on any model the backend runs.
constexpr int64_t kCalibrationTokens = 512;
// Headroom over the calibration's amax: real prompts reach past random tokens' values. One
// e4m3 exponent step: costs precision only for values that fall below 2^-6 * scale (subnormals).
constexpr float kCalibrationMargin = 2.f;

// Per-tensor or per-head values of one scale tensor, or an error naming it.
Result<std::vector<float>> ReadScale(const model::TensorView& t, const std::string& name, int64_t heads) {
  const int64_t n = t.numel();
  if (n != 1 && n != heads) {
    return InvalidArgument("fp8 KV scale " + name + " has " + std::to_string(n) + " values; expected 1 or " +
                           std::to_string(heads) + " (num_key_value_heads)");
  }
  std::vector<float> v(static_cast<size_t>(n));
  model::ConvertToF32(t.dtype, t.bytes.data(), v.size(), v.data());
  for (float x : v) {
    if (!std::isfinite(x) || x <= 0) {
      return InvalidArgument("fp8 KV scale " + name + " holds " + std::to_string(x) + "; scales must be finite and > 0");
    }
  }
  if (n == 1) v.assign(static_cast<size_t>(heads), v[0]);
  return v;
}

// The first of `names` the checkpoint has, or null.
const model::TensorView* FindFirst(const model::Checkpoint& ck, std::initializer_list<std::string> names,
                                   std::string* found) {
  for (const std::string& n : names) {
    if (const model::TensorView* t = ck.Find(n)) {
      *found = n;
      return t;
    }
  }
  return nullptr;
}

}  // namespace

kernels::KvScales CudaBackend::LayerKvScales(int64_t layer) const {
  if (!KvFp8Now()) return {};
  const int64_t hk = config_.num_kv_heads;
  return {kv_scales_ + layer * 2 * hk, kv_scales_ + layer * 2 * hk + hk};
}

Status CudaBackend::SetUpKvScales(const model::Checkpoint& checkpoint) {
  const int64_t L = config_.num_layers, hk = config_.num_kv_heads;
  kv_scales_host_.assign(static_cast<size_t>(L * 2 * hk), 1.f);
  int64_t layers_found = 0;
  for (int64_t l = 0; l < L; ++l) {
    const std::string attn = "model.layers." + std::to_string(l) + ".self_attn.";
    for (int kv = 0; kv < 2; ++kv) {
      const std::string x = kv == 0 ? "k" : "v";
      std::string name;
      const model::TensorView* t = FindFirst(
          checkpoint, {attn + x + "_scale", attn + x + "_proj.output_scale", attn + x + "_proj." + x + "_scale",
                       attn + "kv_scale"},
          &name);
      if (t == nullptr) continue;
      KVF_ASSIGN_OR_RETURN(std::vector<float> v, ReadScale(*t, name, hk));
      std::copy(v.begin(), v.end(), kv_scales_host_.begin() + (l * 2 + kv) * hk);
      if (kv == 1) ++layers_found;
    }
  }
  if (layers_found != 0 && layers_found != L) {
    return InvalidArgument("the checkpoint has fp8 KV scales (k_scale and v_scale) for " + std::to_string(layers_found) +
                           " of its " + std::to_string(L) + " layers; --kv-cache-dtype fp8 needs all or none");
  }
  KVF_ASSIGN_OR_RETURN(kv_scales_, DeviceAlloc<float>(kv_scales_host_.size()));
  if (layers_found == L) {
    kv_scales_source_ = "checkpoint";
  } else {
    KVF_RETURN_IF_ERROR(CalibrateKvScales());
    kv_scales_source_ = "calibrated";
  }
  KVF_CUDA_RETURN(cudaMemcpy(kv_scales_, kv_scales_host_.data(), kv_scales_host_.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaBackend::CalibrateKvScales() {
  const int64_t B = options_.block_size, hk = config_.num_kv_heads, D = config_.head_dim;
  // Read as bf16, a pool holds half its fp8 block count.
  int64_t blocks = INT64_MAX;
  for (const KvPoolInfo& p : pools_) blocks = std::min<int64_t>(blocks, p.device_blocks / 2);
  const int64_t n = std::min({kCalibrationTokens, static_cast<int64_t>(options_.max_num_tokens), max_context_, blocks * B});
  if (n < 1) return ResourceExhausted("fp8 KV scale calibration: the KV pools have no room for one block");
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  uint64_t state = 0x9e3779b97f4a7c15ull;  // fixed: the same scales on every start of a model
  for (TokenId& t : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<TokenId>((state >> 33) % static_cast<uint64_t>(config_.vocab_size));
  }
  const int64_t nb = (n + B - 1) / B;
  std::vector<BlockId> table(static_cast<size_t>(nb));
  std::iota(table.begin(), table.end(), BlockId{0});
  StepBatch batch;
  SequenceStep& st = batch.seqs.emplace_back();
  st.tokens = tokens;
  st.history = tokens;
  st.prompt_len = n;
  st.start_position = 0;
  st.sample = false;
  st.block_tables.assign(pools_.size(), std::span<const BlockId>(table));
  kv_calibrating_ = true;
  StepOutput out;
  const Status s = Execute(batch, &out);
  kv_calibrating_ = false;
  KVF_RETURN_IF_ERROR(s.WithContext("fp8 KV scale calibration"));

  // amax per (layer, K/V, head) over the calibration tokens each pool kept.
  std::vector<float> amax(kv_scales_host_.size(), 0.f);
  std::vector<kernels::bf16_bits> host;
  for (size_t pi = 0; pi < pools_.size(); ++pi) {
    kernels::PagedKvLayout layout = PoolLayout(pi);
    layout.elem_bytes = 2;
    host.resize(static_cast<size_t>(nb * layout.BlockElems()));
    KVF_CUDA_RETURN(cudaMemcpy(host.data(), device_kv_[pi], host.size() * sizeof(kernels::bf16_bits),
                               cudaMemcpyDeviceToHost));
    for (size_t li = 0; li < pools_[pi].layers.size(); ++li) {
      const int64_t l = pools_[pi].layers[li];
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t h = 0; h < hk; ++h) {
          float& a = amax[static_cast<size_t>((l * 2 + kv) * hk + h)];
          for (int64_t t = 0; t < n; ++t) {
            const kernels::bf16_bits* x =
                host.data() + layout.Offset(t / B, static_cast<int32_t>(li), kv, static_cast<int32_t>(h), t % B);
            for (int64_t d = 0; d < D; ++d) a = std::max(a, std::fabs(kernels::Bf16ToFloat(x[d])));
          }
        }
    }
    // The calibration's bf16 K/V must not read as e4m3 later: pools start zeroed.
    KVF_CUDA_RETURN(cudaMemset(device_kv_[pi], 0, host.size() * sizeof(kernels::bf16_bits)));
  }
  for (size_t i = 0; i < amax.size(); ++i) {
    kv_scales_host_[i] = std::isfinite(amax[i]) && amax[i] > 0 ? amax[i] * kCalibrationMargin / kernels::kFp8E4m3Max : 1.f;
  }
  const auto [lo, hi] = std::minmax_element(kv_scales_host_.begin(), kv_scales_host_.end());
  Logger("model")->info("cuda backend: fp8 KV scales calibrated on {} tokens: {:.3g} .. {:.3g}", n, *lo, *hi);
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
