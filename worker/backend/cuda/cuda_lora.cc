// CudaBackend, LoRA (cuda_backend.h invariant 7): the device slots, LoadLora, the step's row
// groups and the shrink + expand launches after each targeted product. Thread-compatible, as
// CudaBackend: the engine thread calls it.
#include <algorithm>
#include <cstring>
#include <string>

#include "common/check.h"
#include "kernels/lora.h"
#include "kernels/lora_ref.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"
#include "worker/model/safetensors.h"

namespace kvfleet::backend::cuda {
namespace {

using bf16 = __nv_bfloat16;
using model::LoraTarget;

// The targets of each group, in the order of the fused product's output columns.
constexpr int kGroupTargets[4][3] = {{static_cast<int>(LoraTarget::kQ), static_cast<int>(LoraTarget::kK),
                                      static_cast<int>(LoraTarget::kV)},
                                     {static_cast<int>(LoraTarget::kO), -1, -1},
                                     {static_cast<int>(LoraTarget::kGate), static_cast<int>(LoraTarget::kUp), -1},
                                     {static_cast<int>(LoraTarget::kDown), -1, -1}};

model::LoraDims DimsOf(const model::ModelConfig& c, int target) {
  return model::LoraTargetDims(c, static_cast<LoraTarget>(target));
}
const char* TargetName(int target) { return model::LoraTargetName(static_cast<LoraTarget>(target)); }

}  // namespace

Status CudaBackend::AllocateLora() {
  const int32_t slots = options_.max_loras;
  if (slots <= 0) return Status::Ok();
  if (options_.max_lora_rank < 1 || options_.max_lora_rank > kernels::kLoraMaxRank) {
    return InvalidArgument("cuda backend: max_lora_rank " + std::to_string(options_.max_lora_rank) +
                           " is outside [1, " + std::to_string(kernels::kLoraMaxRank) + "]");
  }
  const model::ModelConfig& c = config_;
  lora_rank_ = (options_.max_lora_rank + 7) / 8 * 8;
  const size_t R = static_cast<size_t>(lora_rank_);
  lora_.resize(static_cast<size_t>(c.num_layers));
  for (auto& layer : lora_) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      LoraGroupSlots& s = layer[g];
      s.segments = 0;
      s.out = 0;
      for (int target : kGroupTargets[g]) {
        if (target < 0) continue;
        const model::LoraDims d = DimsOf(c, target);
        s.in = d.in;
        s.out += d.out;
        s.seg_end[s.segments++] = s.out;
        if (d.out % 8 != 0) {
          return InvalidArgument(std::string("cuda backend: LoRA needs the ") + TargetName(target) +
                                 " projection's output (" + std::to_string(d.out) +
                                 " columns) to be a multiple of 8; --max-loras 0 serves this model without adapters");
        }
      }
      const size_t a_elems = static_cast<size_t>(slots) * s.segments * R * s.in;
      const size_t b_elems = static_cast<size_t>(slots) * s.out * R;
      KVF_ASSIGN_OR_RETURN(s.a, DeviceAlloc<bf16>(a_elems));
      KVF_ASSIGN_OR_RETURN(s.b, DeviceAlloc<bf16>(b_elems));
      // Zero: an empty slot's rows are never read, but a stale NaN must not be either.
      KVF_CUDA_RETURN(cudaMemsetAsync(s.a, 0, a_elems * sizeof(bf16), stream_));
      KVF_CUDA_RETURN(cudaMemsetAsync(s.b, 0, b_elems * sizeof(bf16), stream_));
      lora_pinned_elems_ = std::max(lora_pinned_elems_, (a_elems + b_elems) / static_cast<size_t>(slots));
    }
  }
  lora_slot_rank_.assign(static_cast<size_t>(slots), 0);
  lora_slot_scaling_.assign(static_cast<size_t>(slots), 0.0f);
  lora_slot_groups_.assign(static_cast<size_t>(slots), {});
  KVF_ASSIGN_OR_RETURN(lora_slot_rank_dev_, DeviceAlloc<int32_t>(static_cast<size_t>(slots)));
  KVF_ASSIGN_OR_RETURN(lora_slot_scaling_dev_, DeviceAlloc<float>(static_cast<size_t>(slots)));
  KVF_ASSIGN_OR_RETURN(lora_t_, DeviceAlloc<float>(static_cast<size_t>(kernels::LoraShrinkScratchFloats(
                                   options_.max_num_tokens, kernels::kLoraMaxSegments * lora_rank_))));
  KVF_ASSIGN_OR_RETURN(lora_counters_, DeviceAlloc<int32_t>(static_cast<size_t>(kernels::kLoraShrinkTargetBlocks)));
  KVF_CUDA_RETURN(cudaMemsetAsync(lora_counters_, 0, kernels::kLoraShrinkTargetBlocks * sizeof(int32_t), stream_));
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&lora_stream_, cudaStreamNonBlocking));
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&lora_side_, cudaStreamNonBlocking));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&lora_fork_, cudaEventDisableTiming));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&lora_join_, cudaEventDisableTiming));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&lora_ready_, cudaEventDisableTiming));
  for (int i = 0; i < 2; ++i) {
    void* h = nullptr;
    KVF_CUDA_RETURN(cudaHostAlloc(&h, lora_pinned_elems_ * sizeof(uint16_t), cudaHostAllocDefault));
    host_allocations_.push_back(h);
    lora_pinned_[i] = static_cast<uint16_t*>(h);
    KVF_CUDA_RETURN(cudaEventCreateWithFlags(&lora_pinned_free_[i], cudaEventDisableTiming));
  }
  return Status::Ok();
}

Status CudaBackend::LoadLora(int32_t slot, const model::LoraAdapter& adapter) {
  const model::ModelConfig& c = config_;
  const std::string what = "cuda backend: adapter '" + adapter.name + "'";
  if (slot < 0 || slot >= options_.max_loras) {
    return InvalidArgument(what + ": slot " + std::to_string(slot) + " is outside the backend's " +
                           std::to_string(options_.max_loras) + " LoRA slots (--max-loras)");
  }
  if (adapter.rank < 1 || adapter.rank > options_.max_lora_rank) {
    return InvalidArgument(what + ": rank " + std::to_string(adapter.rank) + " is outside [1, " +
                           std::to_string(options_.max_lora_rank) + "] (--max-lora-rank)");
  }
  if (static_cast<int64_t>(adapter.layers.size()) != c.num_layers) {
    return InvalidArgument(what + ": " + std::to_string(adapter.layers.size()) + " layers, the model has " +
                           std::to_string(c.num_layers));
  }
  const size_t rank = static_cast<size_t>(adapter.rank), R = static_cast<size_t>(lora_rank_);
  std::array<bool, kNumLoraGroups> groups = {};
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    for (int t = 0; t < model::kNumLoraTargets; ++t) {
      const model::LoraMatrices& mat = adapter.layers[l][t];
      if (mat.empty()) continue;
      const model::LoraDims d = DimsOf(c, t);
      if (mat.a.size() != rank * d.in || mat.b.size() != static_cast<size_t>(d.out) * rank) {
        return InvalidArgument(what + ": layer " + std::to_string(l) + " " +
                               TargetName(t) + ": A of " +
                               std::to_string(mat.a.size()) + " and B of " + std::to_string(mat.b.size()) +
                               " values, expected " + std::to_string(rank * d.in) + " and " +
                               std::to_string(d.out * rank));
      }
      for (int g = 0; g < kNumLoraGroups; ++g) {
        for (int gt : kGroupTargets[g]) groups[g] = groups[g] || gt == t;
      }
    }
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  lora_slot_rank_[slot] = 0;  // unusable until the copy below completes in full
  // Each (layer, group): converted to bf16 and zero-padded to R in a pinned buffer (two in
  // turn, so one converts while the other copies), then copied on the LoRA stream.
  int turn = 0;
  for (size_t l = 0; l < lora_.size(); ++l) {
    for (int g = 0; g < kNumLoraGroups; ++g) {
      const LoraGroupSlots& s = lora_[l][g];
      uint16_t* buf = lora_pinned_[turn];
      KVF_CUDA_RETURN(cudaEventSynchronize(lora_pinned_free_[turn]));
      const size_t a_elems = static_cast<size_t>(s.segments) * R * s.in, b_elems = static_cast<size_t>(s.out) * R;
      std::memset(buf, 0, (a_elems + b_elems) * sizeof(uint16_t));
      uint16_t* a = buf;
      uint16_t* b = buf + a_elems;
      int32_t col = 0;
      for (int seg = 0; seg < s.segments; ++seg) {
        const int t = kGroupTargets[g][seg];
        const model::LoraMatrices& mat = adapter.layers[l][t];
        const int32_t out = DimsOf(c, t).out;
        if (!mat.empty()) {
          for (size_t r = 0; r < rank; ++r) {
            for (int32_t i = 0; i < s.in; ++i) a[(seg * R + r) * s.in + i] = model::F32ToBF16(mat.a[r * s.in + i]);
          }
          for (int32_t j = 0; j < out; ++j) {
            for (size_t r = 0; r < rank; ++r) b[(col + j) * R + r] = model::F32ToBF16(mat.b[j * rank + r]);
          }
        }
        col += out;
      }
      KVF_CUDA_RETURN(cudaMemcpyAsync(s.a + slot * a_elems, a, a_elems * sizeof(bf16), cudaMemcpyHostToDevice,
                                      lora_stream_));
      KVF_CUDA_RETURN(cudaMemcpyAsync(s.b + slot * b_elems, b, b_elems * sizeof(bf16), cudaMemcpyHostToDevice,
                                      lora_stream_));
      KVF_CUDA_RETURN(cudaEventRecord(lora_pinned_free_[turn], lora_stream_));
      turn ^= 1;
    }
  }
  lora_slot_rank_[slot] = adapter.rank;
  lora_slot_scaling_[slot] = adapter.scaling;
  lora_slot_groups_[slot] = groups;
  // Pageable sources: copied out before these calls return.
  KVF_CUDA_RETURN(cudaMemcpyAsync(lora_slot_rank_dev_, lora_slot_rank_.data(), lora_slot_rank_.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, lora_stream_));
  KVF_CUDA_RETURN(cudaMemcpyAsync(lora_slot_scaling_dev_, lora_slot_scaling_.data(),
                                  lora_slot_scaling_.size() * sizeof(float), cudaMemcpyHostToDevice, lora_stream_));
  KVF_CUDA_RETURN(cudaEventRecord(lora_ready_, lora_stream_));
  lora_pending_ = true;
  return Status::Ok();
}

void CudaBackend::PackLora(const StepBatch& batch, StepMeta* m, std::byte* host, std::byte* dev, size_t* used) {
  std::vector<int32_t> row_slot(static_cast<size_t>(m->num_tokens), -1);
  bool any = false;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const int32_t slot = batch.seqs[s].lora_slot;
    if (slot < 0) continue;
    any = true;
    std::fill(row_slot.begin() + m->row0[s], row_slot.begin() + m->row0[s + 1], slot);
    for (int g = 0; g < kNumLoraGroups; ++g) m->lora_groups[g] = m->lora_groups[g] || lora_slot_groups_[slot][g];
  }
  if (!any) return;
  const int64_t grouped = std::count_if(row_slot.begin(), row_slot.end(), [](int32_t s) { return s >= 0; });
  // A graphed step (4) replays fixed launches and staging offsets: its tile height follows
  // the padded batch, and the rows and tiles are padded to bounds of the batch alone (empty
  // tiles launch blocks that do nothing).
  const int64_t tile_basis = m->graph ? m->num_tokens : grouped;
  const int32_t tile_rows =
      tuning_.lora_tile_rows > 0 ? tuning_.lora_tile_rows : kernels::LoraTileRowsFor(tile_basis);
  kernels::LoraGroupsHost g = kernels::GroupLoraRows(row_slot, tile_rows);
  if (m->graph) {
    // Σ over slots of ceil(n_slot / tile_rows) <= T / tile_rows + (slots in the step), and a
    // tile holds at least one row.
    const int32_t T = m->num_tokens;
    const int32_t bound = std::min(T, (T + tile_rows - 1) / tile_rows + std::min(T, options_.max_loras));
    KVF_CHECK(g.num_tiles() <= bound) << "cuda backend: LoRA tiles exceed their graph bound";
    g.rows.resize(static_cast<size_t>(T), 0);
    g.tile_begin.resize(static_cast<size_t>(bound) + 1, g.tile_begin.back());
    g.tile_slot.resize(static_cast<size_t>(bound), 0);
  }
  auto take = [&](const std::vector<int32_t>& v) {
    *used = (*used + config::kStagingAlign - 1) / config::kStagingAlign * config::kStagingAlign;
    KVF_CHECK(*used + v.size() * sizeof(int32_t) <= staging_bytes_) << "cuda backend: LoRA rows exceed the staging buffer";
    std::memcpy(host + *used, v.data(), v.size() * sizeof(int32_t));
    const int32_t* d = reinterpret_cast<const int32_t*>(dev + *used);
    *used += v.size() * sizeof(int32_t);
    return d;
  };
  m->lora.rows = take(g.rows);
  m->lora.tile_begin = take(g.tile_begin);
  m->lora.tile_slot = take(g.tile_slot);
  m->lora.num_tiles = g.num_tiles();
}

kernels::LoraShrinkParams CudaBackend::LoraShrinkFor(const StepMeta& m, int64_t layer, LoraGroup group,
                                                     const bf16* x) const {
  const LoraGroupSlots& s = lora_[static_cast<size_t>(layer)][group];
  kernels::LoraShrinkParams sp;
  sp.x = x;
  sp.a = s.a;
  sp.slot_rank = lora_slot_rank_dev_;
  sp.t = lora_t_;
  sp.counters = lora_counters_;
  sp.in = s.in;
  sp.max_rank = lora_rank_;
  sp.segments = s.segments;
  sp.splits = kernels::LoraShrinkSplits(m.lora.num_tiles, s.in, s.segments * lora_rank_);
  sp.groups = m.lora;
  return sp;
}

kernels::LoraExpandParams CudaBackend::LoraExpandFor(const StepMeta& m, int64_t layer, LoraGroup group,
                                                     bf16* y) const {
  const LoraGroupSlots& s = lora_[static_cast<size_t>(layer)][group];
  kernels::LoraExpandParams ep;
  ep.t = lora_t_;
  ep.b = s.b;
  ep.slot_rank = lora_slot_rank_dev_;
  ep.slot_scaling = lora_slot_scaling_dev_;
  ep.y = y;
  ep.y_stride = s.out;
  ep.out = s.out;
  ep.max_rank = lora_rank_;
  ep.segments = s.segments;
  ep.splits = kernels::LoraShrinkSplits(m.lora.num_tiles, s.in, s.segments * lora_rank_);
  std::copy(std::begin(s.seg_end), std::end(s.seg_end), ep.seg_end);
  ep.groups = m.lora;
  return ep;
}

bool CudaBackend::LoraRuns(const StepMeta& m, LoraGroup group) const {
  return m.lora.num_tiles > 0 && m.lora_groups[group] && lora_debug_.launch_kernels;
}

Status CudaBackend::LoraShrinkAhead(const StepMeta& m, int64_t layer, LoraGroup group, const bf16* x) {
  if (!LoraRuns(m, group) || lora_debug_.time_kernels) return Status::Ok();
  // x is ready once the stream reaches here; the shrink needs nothing the product writes.
  KVF_CUDA_RETURN(cudaEventRecord(lora_fork_, stream_));
  KVF_CUDA_RETURN(cudaStreamWaitEvent(lora_side_, lora_fork_, 0));
  if (lora_debug_.launch_shrink) {
    KVF_CUDA_RETURN(kernels::LaunchLoraShrink(LoraShrinkFor(m, layer, group, x), lora_side_));
  }
  KVF_CUDA_RETURN(cudaEventRecord(lora_join_, lora_side_));
  return Status::Ok();
}

Status CudaBackend::LoraAddToProduct(const StepMeta& m, int64_t layer, LoraGroup group, const bf16* x, bf16* y) {
  if (!LoraRuns(m, group)) return Status::Ok();
  if (!lora_debug_.time_kernels) {
    KVF_CUDA_RETURN(cudaStreamWaitEvent(stream_, lora_join_, 0));
    if (lora_debug_.launch_expand) {
      KVF_CUDA_RETURN(kernels::LaunchLoraExpand(LoraExpandFor(m, layer, group, y), stream_));
    }
    return Status::Ok();
  }
  // Timed (the bench's ablation): both launches on the step's stream, between events.
  const size_t first = lora_timed_.size() * 3;
  while (lora_events_.size() < first + 3) {
    cudaEvent_t e = nullptr;
    KVF_CUDA_RETURN(cudaEventCreate(&e));
    lora_events_.push_back(e);
  }
  lora_timed_.emplace_back(static_cast<int>(group), first);
  cudaEvent_t* ev = &lora_events_[first];
  KVF_CUDA_RETURN(cudaEventRecord(ev[0], stream_));
  KVF_CUDA_RETURN(kernels::LaunchLoraShrink(LoraShrinkFor(m, layer, group, x), stream_));
  KVF_CUDA_RETURN(cudaEventRecord(ev[1], stream_));
  KVF_CUDA_RETURN(kernels::LaunchLoraExpand(LoraExpandFor(m, layer, group, y), stream_));
  KVF_CUDA_RETURN(cudaEventRecord(ev[2], stream_));
  return Status::Ok();
}

Result<CudaBackend::LoraKernelTimes> CudaBackend::TakeLoraKernelTimes() {
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
  LoraKernelTimes t;
  for (const auto& [group, first] : lora_timed_) {
    float shrink = 0, expand = 0;
    KVF_CUDA_RETURN(cudaEventElapsedTime(&shrink, lora_events_[first], lora_events_[first + 1]));
    KVF_CUDA_RETURN(cudaEventElapsedTime(&expand, lora_events_[first + 1], lora_events_[first + 2]));
    t.shrink_ms[static_cast<size_t>(group)] += shrink;
    t.expand_ms[static_cast<size_t>(group)] += expand;
    ++t.launches;
  }
  lora_timed_.clear();
  return t;
}

}  // namespace kvfleet::backend::cuda
