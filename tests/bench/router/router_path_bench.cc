// router_path_bench: the CPU cost of each step the router's HTTP thread runs per request,
// one step at a time, for 1K- and 8K-token prompts (block size 32, the mock workers').
//
//   build/bench/router_path_bench [--iterations 2000]
//
// Steps: the byte codec's tokenization, block hashing (Contract 1), the global index's
// prefix match (an index of 8 workers holding 4096 blocks each), Contract 3's Generate
// encoding, the ZMQ send's copy into a message, and the predicted entries' insertion (after
// the send: it delays the thread's next work, not this request; each request's entries are
// confirmed by a Store before the next, as workers' events do). The end-to-end picture,
// with the hops between threads and processes, is router_loadgen's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "schema/requests.h"
#include "router/http/codec.h"
#include "router/index/global_index.h"

namespace kvfleet::router {
namespace {

using BenchClock = std::chrono::steady_clock;

// Median and mean µs of `fn` over `n` runs; `setup` runs untimed before each.
void Time(const char* name, int n, const std::function<void()>& setup, const std::function<void()>& fn) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    setup();
    auto t0 = BenchClock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(BenchClock::now() - t0).count());
  }
  double mean = 0;
  for (double v : us) mean += v;
  mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  std::printf("  %-44s median %8.2f us   mean %8.2f us\n", name, us[us.size() / 2], mean);
}

void Run(int iterations) {
  constexpr uint32_t kBlockSize = 32;
  SystemClock clock;
  GlobalIndex index(GlobalIndexOptions{}, &clock);
  std::mt19937_64 rng(7);
  BlockHasher hasher(kBlockSize, HashNamespace{"mock", "", ""});
  // Fill: 8 workers, 4096 stored blocks each (random prompts, so requests miss at block 0 or
  // match a stored prefix, as the benchmark's random prompts do).
  for (WorkerId w = 0; w < 8; ++w) {
    std::vector<TokenId> tokens(4096 * kBlockSize);
    for (auto& t : tokens) t = static_cast<TokenId>(rng() % 32000);
    std::vector<BlockOp> ops;
    for (BlockHash h : hasher.HashAll(tokens)) ops.push_back({h, BlockOp::kStore, kv::Tier::kDevice});
    index.Apply(w, ops);
  }
  auto codec = MakeByteCodec();
  zmq::context_t ctx(1);
  for (int prompt_tokens : {1024, 8192}) {
    std::printf("%d-token prompt:\n", prompt_tokens);
    std::string text(static_cast<size_t>(prompt_tokens), 'a');
    auto fresh_text = [&] {
      for (auto& c : text) c = static_cast<char>('a' + rng() % 26);
    };
    std::vector<TokenId> tokens;
    std::vector<BlockHash> hashes;
    std::vector<PrefixMatch> matches;
    matches.reserve(64);
    Time("tokenize (byte codec)", iterations, fresh_text, [&] { tokens = std::move(*codec->EncodePrompt(text)); });
    Time("hash blocks", iterations, [] {}, [&] { hashes = hasher.HashAll(tokens); });
    Time("prefix match (global index)", iterations, [] {}, [&] { index.FindMatches(hashes, &matches); });
    GenerateParams params;
    params.tokens = tokens;
    params.sampling.max_tokens = 4;
    params.model = "mock";
    std::string frame;
    Time("encode Generate (Contract 3)", iterations, [] {}, [&] { frame = EncodeGenerate(1, params); });
    Time("copy into a ZMQ message", iterations, [] {}, [&] { zmq::message_t m(frame.data(), frame.size()); });
    // As in a running router: the worker's stored events confirm each request's predicted
    // entries within milliseconds, so the side table of predictions stays small.
    WorkerId w = 0;
    Time("insert predicted entries", iterations, [&] {
      std::vector<BlockOp> confirm;
      for (BlockHash h : hashes) confirm.push_back({h, BlockOp::kStore, kv::Tier::kDevice});
      index.Apply(w, confirm);
      fresh_text();
      tokens = std::move(*codec->EncodePrompt(text));
      hashes = hasher.HashAll(tokens);
      w = (w + 1) % 8;
    }, [&] { index.InsertPredicted(w, hashes, 2 * kNsPerSec); });
  }
}

}  // namespace
}  // namespace kvfleet::router

int main(int argc, char** argv) {
  int iterations = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iterations") {
      iterations = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (iterations <= 0) {
    std::fprintf(stderr, "--iterations must be positive\n");
    return 2;
  }
  kvfleet::router::Run(iterations);
  return 0;
}
