// The shape limits of the MoE kernels (moe.h), plain C++ so that host code, the CPU
// references and CI read them without CUDA headers.
#pragma once

#include <cstdint>

namespace kvfleet::kernels {

// Largest expert count LaunchMoeRoute takes (one warp holds a token's router row, 16 per lane).
constexpr int32_t kMoeMaxExperts = 512;
// Largest top-k LaunchMoeRoute takes.
constexpr int32_t kMoeMaxTopK = 16;
// Rows of one tile of LaunchMoeGroupedGemm: an expert's group takes ceil(count / 64) tiles.
constexpr int32_t kMoeTileRows = 64;

// Rows of an expert's group one pass of LaunchMoeGroupedGemv takes (fp32 sums a lane keeps
// per weight row); a larger group takes several passes over its expert's weights.
constexpr int32_t kMoeGemvChunk = 8;

// Whether a step of T tokens takes the decode gemv (LaunchMoeGroupedGemv) rather than the
// grouped GEMM: while the S = T·k routes average at most kMoeGemvRowsPerExpert rows an expert.
// Both read each chosen expert's weights once; the GEMM's 64-row tiles stay mostly empty below
// that (tests/bench/results/2026-11-30-h200-moe-gemv.txt).
constexpr int32_t kMoeGemvRowsPerExpert = 2;
inline bool MoeUseGemv(int32_t T, int32_t k, int32_t E) {
  return int64_t{T} * k <= int64_t{kMoeGemvRowsPerExpert} * E;
}

// The tiles LaunchMoeGroupedGemm launches for S routes over E experts: an upper bound of
// Σ_e ceil(count_e / kMoeTileRows) whatever the routing (tiles past the last group exit).
inline int32_t MoeMaxTiles(int32_t S, int32_t E) { return (S + kMoeTileRows - 1) / kMoeTileRows + E; }

}  // namespace kvfleet::kernels
