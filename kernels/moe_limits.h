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

// The tiles LaunchMoeGroupedGemm launches for S routes over E experts: an upper bound of
// Σ_e ceil(count_e / kMoeTileRows) whatever the routing (tiles past the last group exit).
inline int32_t MoeMaxTiles(int32_t S, int32_t E) { return (S + kMoeTileRows - 1) / kMoeTileRows + E; }

}  // namespace kvfleet::kernels
