// Block hashing speed on one core, next to raw XXH3 over the same bytes (the ceiling).
//
//   build/bench/block_hash_bench [--tokens N] [--block-size B]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "common/block_hash.h"

using namespace kvfleet;

namespace {
double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}
}  // namespace

int main(int argc, char** argv) {
  size_t n_tokens = 8192;
  std::vector<uint32_t> block_sizes = {16, 32, 64, 128};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) n_tokens = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--block-size")) block_sizes = {static_cast<uint32_t>(std::atoi(argv[i + 1]))};
  }
  std::vector<TokenId> tokens(n_tokens);
  uint64_t x = 88172645463325252ull;
  for (auto& t : tokens) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    t = static_cast<TokenId>(x % 128256);
  }
  std::printf("block hashing, %zu-token prompt, one core\n", n_tokens);
  std::printf("%6s %14s %14s %12s %10s\n", "B", "Mtokens/s", "raw XXH3 Mt/s", "of ceiling", "ns/block");
  for (uint32_t b : block_sizes) {
    BlockHasher h(b, {"meta-llama/Llama-3.1-8B-Instruct", "", ""});
    std::vector<BlockHash> out;
    out.reserve(n_tokens / b);
    volatile uint64_t sink = 0;
    int iters = 0;
    auto t0 = std::chrono::steady_clock::now();
    double el = 0;
    do {
      out.clear();
      h.Extend(tokens, &out);
      sink = sink + out.back();
      ++iters;
    } while ((el = Seconds(t0)) < 0.5);
    double tok_per_s = static_cast<double>(n_tokens) * iters / el;

    // Ceiling: XXH3 over each block's bytes, with no chaining.
    int raw_iters = 0;
    t0 = std::chrono::steady_clock::now();
    double raw_el = 0;
    do {
      for (size_t i = 0; i + b <= n_tokens; i += b) sink = sink + XXH3_64bits_withSeed(&tokens[i], 4 * b, 1);
      ++raw_iters;
    } while ((raw_el = Seconds(t0)) < 0.5);
    double raw_tok_per_s = static_cast<double>(n_tokens) * raw_iters / raw_el;
    double ns_per_block = 1e9 * el / (static_cast<double>(iters) * (n_tokens / b));
    std::printf("%6u %14.1f %14.1f %11.0f%% %10.1f\n", b, tok_per_s / 1e6, raw_tok_per_s / 1e6,
                100.0 * tok_per_s / raw_tok_per_s, ns_per_block);
  }
  return 0;
}
