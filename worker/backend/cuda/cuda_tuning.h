// CudaTuning: the cuda backend's switches from BackendOptions::extra, for benches and tests
// that compare a path with its alternative (a deployment leaves them at their defaults). A
// value outside a switch's set is refused, naming the switch.
//
//   cuda_graphs    0 | 1   decode steps as CUDA graphs (cuda_backend.h invariant 4)
//   gemv_max_rows  0..kGemvMaxRows   steps of at most this many rows take the gemv kernels (5)
//   gemv_fusion    0..4    how much of a layer the gemv path fuses (5)
//   moe_gemv       0 | 1   MoE decode steps through the expert gemv (kernels/moe.h) (9)
//   moe_blas       0 | 1   MoE steps with prompt tokens through cuBLAS's grouped GEMM (moe_blas.h) (9)
//   lora_tile_rows 1..kLoraMaxTileRows   the LoRA kernels' tile height (7; unset: by the step's rows)
//   pdl            0 | 1   programmatic dependent launch, process-wide (kernels/launch.h)
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"

namespace kvfleet::backend::cuda {

struct CudaTuning {
  bool use_graphs = true;
  // Token rows up to which the matrix products run on the skinny GEMM kernel instead of
  // cuBLASLt. Measured on an H200 over the llama-3.1-8b shapes (kvfleet_gemv_bench,
  // tests/bench/results/README.md): all matmuls of a step at 1 row take 3.83 ms against
  // cuBLASLt's 3.99; at 2 rows they tie, from 3 rows on cuBLASLt is faster.
  int32_t gemv_max_rows = 1;
  int32_t gemv_fusion = 3;
  bool moe_gemv = true;
  bool moe_blas = true;
  int32_t lora_tile_rows = 0;  // 0: kernels::LoraTileRowsFor
  std::optional<bool> pdl;  // unset: the process's setting stays
};

Result<CudaTuning> ParseCudaTuning(const std::map<std::string, std::string>& extra);

}  // namespace kvfleet::backend::cuda
