// SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators",
// OOPSLA 2014): an integer-only 64-bit mixer, identical on every machine and on the GPU.
// make-model's weights and the sampler's random draws are counter-based on it.
#pragma once

#include <cstdint>

namespace kvfleet::model {

constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace kvfleet::model
