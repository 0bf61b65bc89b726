// token_kv_bench: what the KV block size B costs in memory and in the KV manager's CPU time,
// at B = 1 (token-level KV, LightLLM's TokenAttention), 16, 32 and 64.
//
//   taskset -c 0 build/bench/token_kv_bench [--trace FILE.jsonl] [--requests N] [--running N]
//
// Replays the input and output lengths of a trace (Mooncake's JSONL: input_length,
// output_length; default /work/shared/workloads/mooncake_synthetic_trace.jsonl, else a
// seeded log-normal generator) through a KvCacheManager as an engine would: up to --running
// sequences at once (default 32); each new one is allocated its whole prompt, then every
// step appends one token to each running sequence, which is released after its output.
// Prints, per B:
//   waste: allocated minus used tokens (the unfilled tail of each sequence's last block),
//          the mean over steps, and at the step of peak allocation (tokens and share);
//   ns/token: thread CPU time of AddSequence + Allocate + Commit + Append + Release per
//          token, reuse off (allocation and free only) and on (hashing and the reuse tree,
//          events taken each step); every trace request is distinct, so reuse finds nothing.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::kv {
namespace {

constexpr uint32_t kVocab = 128'256;  // Llama 3's
constexpr uint32_t kMaxPrompt = 16'384;  // longer trace prompts are cut: the cache holds --running of them

struct Request {
  uint32_t input = 0;
  uint32_t output = 0;
};

std::vector<Request> LoadTrace(const std::string& path, size_t n) {
  std::vector<Request> out;
  std::ifstream in(path);
  std::string line;
  while (out.size() < n && std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("input_length") || !j.contains("output_length")) continue;
    Request r{std::min<uint32_t>(j["input_length"].get<uint32_t>(), kMaxPrompt),
              std::max<uint32_t>(1, j["output_length"].get<uint32_t>())};
    if (r.input > 0) out.push_back(r);
  }
  return out;
}

std::vector<Request> Generate(size_t n) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> in(std::log(2000.0), 1.0), outd(std::log(200.0), 1.0);
  std::vector<Request> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back({static_cast<uint32_t>(std::clamp(in(rng), 1.0, double{kMaxPrompt})),
                   static_cast<uint32_t>(std::clamp(outd(rng), 1.0, 4096.0))});
  }
  return out;
}

class NullCopier final : public BlockCopier {
 public:
  void Copy(std::span<const BlockCopy>) override {}
};

int64_t ThreadNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Result {
  double mean_waste = 0;       // tokens
  double peak_alloc = 0;       // tokens allocated at the peak step
  double waste_at_peak = 0;    // tokens
  double ns_per_token = 0;
};

Result Replay(const std::vector<Request>& trace, uint32_t B, uint32_t running, bool reuse) {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = {1};
  c.head_dim = 1;
  c.dtype_bytes = 1;
  c.max_seq_len = 1u << 20;
  c.block_size = B;
  c.vocab_size = kVocab;
  c.enable_block_reuse = reuse;
  c.event_buffer_max_size = reuse ? 100'000 : 0;
  // Room for `running` of the longest sequences, so nothing waits for memory.
  uint32_t longest = 0;
  for (const Request& r : trace) longest = std::max(longest, r.input + r.output);
  c.device_bytes = (uint64_t{running} * (longest + B) / B + 64) * 2 * B;
  NullCopier copier;
  auto made = KvCacheManager::Make(c, &copier, SystemClock::Default());
  KVF_CHECK(made.ok()) << made.status().ToString();
  KvCacheManager& m = **made;

  struct Live {
    SequenceId id;
    uint32_t left;  // output tokens still to append
  };
  std::vector<Live> live;
  size_t next = 0;
  uint64_t tokens_done = 0, steps = 0;
  double waste_sum = 0;
  Result res;
  int64_t ns = 0;
  TokenId fresh = 1;  // distinct tokens: no request shares a prefix
  std::vector<TokenId> prompt;
  while (next < trace.size() || !live.empty()) {
    // Admit up to `running`.
    while (live.size() < running && next < trace.size()) {
      const Request& r = trace[next++];
      prompt.resize(r.input);
      for (TokenId& t : prompt) t = (fresh++) % kVocab;
      SequenceSpec spec;
      spec.prompt = prompt;
      spec.model = "m";
      const int64_t t0 = ThreadNs();
      auto id = m.AddSequence(std::move(spec));
      KVF_CHECK(id.ok() && m.CanAllocate(*id));
      KVF_CHECK(m.Allocate(*id).ok());
      m.Commit(*id, r.input);
      ns += ThreadNs() - t0;
      tokens_done += r.input;
      live.push_back({*id, r.output});
    }
    // One decode step: a token each; the finished leave.
    const int64_t t0 = ThreadNs();
    for (Live& s : live) {
      const TokenId t = (fresh++) % kVocab;
      KVF_CHECK(m.Append(s.id, std::span<const TokenId>(&t, 1)).ok());
      m.Commit(s.id, m.NumTokens(s.id));
      --s.left;
    }
    ns += ThreadNs() - t0;
    tokens_done += live.size();
    // Waste now: blocks held x B minus tokens, over the running sequences.
    uint64_t used = 0, allocated = 0;
    for (const Live& s : live) {
      used += m.NumTokens(s.id);
      allocated += (uint64_t{m.NumTokens(s.id)} + B - 1) / B * B;
    }
    waste_sum += static_cast<double>(allocated - used);
    if (static_cast<double>(allocated) > res.peak_alloc) {
      res.peak_alloc = static_cast<double>(allocated);
      res.waste_at_peak = static_cast<double>(allocated - used);
    }
    ++steps;
    const int64_t t1 = ThreadNs();
    for (Live& s : live) {
      if (s.left == 0) m.Release(s.id);
    }
    std::erase_if(live, [](const Live& s) { return s.left == 0; });
    if (reuse) m.TakeEvents();
    ns += ThreadNs() - t1;
  }
  res.mean_waste = waste_sum / static_cast<double>(steps);
  res.ns_per_token = static_cast<double>(ns) / static_cast<double>(tokens_done);
  return res;
}

}  // namespace
}  // namespace kvfleet::kv

int main(int argc, char** argv) {
  using namespace kvfleet::kv;
  kvfleet::LogOptions log;
  log.level = "warn";
  (void)kvfleet::InitLogging(log);
  std::string trace_path = "/work/shared/workloads/mooncake_synthetic_trace.jsonl";
  size_t requests = 2000;
  uint32_t running = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--trace") == 0) trace_path = argv[i + 1];
    else if (std::strcmp(argv[i], "--requests") == 0) requests = std::stoul(argv[i + 1]);
    else if (std::strcmp(argv[i], "--running") == 0) running = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    else {
      std::fprintf(stderr, "token_kv_bench: unknown flag %s (--trace, --requests, --running)\n", argv[i]);
      return 2;
    }
  }
  std::vector<Request> trace = LoadTrace(trace_path, requests);
  const char* source = trace_path.c_str();
  if (trace.empty()) {
    trace = Generate(requests);
    source = "seeded log-normal lengths (no trace file)";
  }
  double in = 0, out = 0;
  for (const Request& r : trace) in += r.input, out += r.output;
  std::printf("trace: %s: %zu requests, mean input %.0f, mean output %.1f tokens (prompts cut at %u); %u running\n",
              source, trace.size(), in / trace.size(), out / trace.size(), kMaxPrompt, running);
  std::printf("%4s %14s %16s %10s %18s %18s\n", "B", "waste mean", "waste at peak", "share", "ns/token reuse off",
              "ns/token reuse on");
  for (uint32_t B : {1u, 16u, 32u, 64u}) {
    const Result off = Replay(trace, B, running, false);
    const Result on = Replay(trace, B, running, true);
    std::printf("%4u %14.1f %16.1f %9.3f%% %18.1f %18.1f\n", B, off.mean_waste, off.waste_at_peak,
                100.0 * off.waste_at_peak / off.peak_alloc, off.ns_per_token, on.ns_per_token);
  }
  return 0;
}
