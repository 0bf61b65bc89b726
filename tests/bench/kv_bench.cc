// kv_bench: the KV cache manager's bookkeeping cost, in nanoseconds per block.
//
//   taskset -c 0 build/bench/kv_bench [--quick]
//
// Times are thread CPU time (CLOCK_THREAD_CPUTIME_ID), so other load on the core does not count.
//
// Prints, for trees of 10k, 100k and 1M cached blocks (B = 32, events on, taken and dropped
// after each request, copies counted but not performed):
//   request: AddSequence + Match + Allocate + Commit (stores) + Release of 2,048-token
//            requests sharing a 1,024-token prefix, with the cache full, so each request also
//            evicts the 32 blocks it adds. ns per block = time / 64 blocks per request.
//   evict:   Evict() of every cached block, dropping them (no host tier).
//   offload: Evict() of every cached block into an equally large host tier.
//   onboard: Match + Allocate + Release of requests whose 64 blocks all sit on the host.
// and the host memory the manager's bookkeeping costs per block, and the time Snapshot() of
// the full tree takes (milliseconds, all blocks).
#include <time.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::kv {
namespace {

constexpr uint32_t kB = 32;
constexpr uint32_t kRequestTokens = 2048;
constexpr uint32_t kSharedTokens = 1024;
constexpr uint32_t kBlocksPerRequest = kRequestTokens / kB;
constexpr uint32_t kVocab = 128'256;  // Llama 3's vocabulary: tokens are stored in 17 bits

class CountingCopier final : public BlockCopier {
 public:
  void Copy(std::span<const BlockCopy> copies) override { n += copies.size(); }
  uint64_t n = 0;
};

KvCacheConfig Config(uint32_t device_blocks, uint32_t host_blocks, uint32_t block_size = kB) {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = {1};
  c.head_dim = 1;
  c.dtype_bytes = 1;
  c.max_seq_len = 1u << 20;
  c.block_size = block_size;
  c.vocab_size = kVocab;
  c.device_bytes = uint64_t{device_blocks} * 2 * block_size;
  c.host_bytes = uint64_t{host_blocks} * 2 * block_size;
  return c;
}

struct Bench {
  Bench(uint32_t device_blocks, uint32_t host_blocks) {
    auto m = KvCacheManager::Make(Config(device_blocks, host_blocks), &copier, SystemClock::Default());
    KVF_CHECK(m.ok()) << m.status().ToString();
    mgr = std::move(m).value();
  }
  // One whole request; returns the blocks it reused.
  void Request(const std::vector<TokenId>& tokens) {
    SequenceSpec spec;
    spec.prompt = tokens;
    spec.model.assign(1, 'm');
    auto id = mgr->AddSequence(std::move(spec));
    KVF_CHECK(id.ok());
    mgr->Match(*id);
    KVF_CHECK(mgr->Allocate(*id).ok());
    mgr->Commit(*id, static_cast<uint32_t>(tokens.size()));
    mgr->Release(*id);
    (void)mgr->TakeEvents();
  }
  CountingCopier copier;
  std::unique_ptr<KvCacheManager> mgr;
};

// A token of the vocabulary, a pseudo-random function of (stream, i).
TokenId TokenAt(uint64_t stream, uint64_t i) {
  uint64_t z = stream * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
  z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
  return static_cast<TokenId>((z ^ (z >> 29)) % kVocab);
}

std::vector<TokenId> RequestTokens(uint32_t prefix_id, uint64_t unique_id) {
  std::vector<TokenId> t(kRequestTokens);
  for (uint32_t i = 0; i < kSharedTokens; ++i) t[i] = TokenAt(prefix_id, i);
  for (uint32_t i = kSharedTokens; i < kRequestTokens; ++i) t[i] = TokenAt(uint64_t{1} << 40 | unique_id, i);
  return t;
}

// Thread CPU time: the build machine is shared, and wall time would count other processes.
double CpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}
double NsSince(double t0) { return CpuNs() - t0; }

// Fills a cache of `blocks` device blocks with distinct requests until it holds `blocks` cached.
void Fill(Bench& b, uint32_t blocks, uint64_t* next_id) {
  for (uint32_t i = 0; i < blocks / kBlocksPerRequest; ++i) b.Request(RequestTokens(1'000'000 + i, (*next_id)++));
}

struct Row {
  double request = 0, evict = 0, offload = 0, onboard = 0, bytes_per_block = 0, snapshot_ms = 0;
};

Row Measure(uint32_t tree_blocks, uint32_t requests) {
  Row row;
  uint64_t next_id = 1;
  {
    // request: the tree stays full, so every request also evicts as many blocks as it stores.
    Bench b(tree_blocks, 0);
    Fill(b, tree_blocks, &next_id);
    for (uint32_t i = 0; i < 100; ++i) b.Request(RequestTokens(i % 8, next_id++));  // warm the 8 prefixes
    std::vector<std::vector<TokenId>> reqs;  // made outside the timed loop: only the manager is timed
    for (uint32_t i = 0; i < requests; ++i) reqs.push_back(RequestTokens(i % 8, next_id++));
    const double t0 = CpuNs();
    for (const auto& r : reqs) b.Request(r);
    row.request = NsSince(t0) / (static_cast<double>(requests) * kBlocksPerRequest);
    row.bytes_per_block = static_cast<double>(b.mgr->MemoryBytes()) / tree_blocks;
    // snapshot: Snapshot() of the whole (full) tree, as the event publisher takes it.
    const double t1 = CpuNs();
    const std::vector<KvEvent> snap = b.mgr->Snapshot();
    row.snapshot_ms = NsSince(t1) / 1e6;
    size_t listed = 0;
    for (const KvEvent& e : snap) listed += std::get<StoredEvent>(e.data).blocks.size();
    KVF_CHECK_EQ(listed, b.mgr->Stats().pools[0].tiers[0].cached);
  }
  {
    Bench b(tree_blocks, 0);
    Fill(b, tree_blocks, &next_id);
    const auto cached = b.mgr->Stats().pools[0].tiers[0].cached;
    const double t0 = CpuNs();
    uint64_t n = 0;
    while (true) {
      const auto out = b.mgr->Evict(0, 256);
      if (out.empty()) break;
      n += out.size();
      (void)b.mgr->TakeEvents();
    }
    KVF_CHECK_EQ(n, cached);
    row.evict = NsSince(t0) / static_cast<double>(n);
  }
  {
    Bench b(tree_blocks, tree_blocks);
    Fill(b, tree_blocks, &next_id);
    const double t0 = CpuNs();
    uint64_t n = 0;
    while (true) {
      const auto out = b.mgr->Evict(0, 256);
      if (out.empty()) break;
      n += out.size();
      (void)b.mgr->TakeEvents();
    }
    row.offload = NsSince(t0) / static_cast<double>(n);
    // onboard: requests whose blocks are all on the host (the last block is recomputed).
    const uint32_t n_req = std::min<uint32_t>(requests, tree_blocks / kBlocksPerRequest);
    std::vector<std::vector<TokenId>> reqs;
    for (uint32_t i = 0; i < n_req; ++i) reqs.push_back(RequestTokens(1'000'000 + i, 1 + i));
    const double t1 = CpuNs();
    uint64_t onboarded = 0;
    for (const auto& r : reqs) {
      SequenceSpec spec;
      spec.prompt = r;
      spec.model.assign(1, 'm');
      auto id = b.mgr->AddSequence(std::move(spec));
      const MatchInfo info = b.mgr->Match(*id);
      KVF_CHECK(b.mgr->Allocate(*id).ok());
      onboarded += info.host_tokens / kB;
      b.mgr->Release(*id);
      (void)b.mgr->TakeEvents();
    }
    KVF_CHECK(onboarded > 0);
    row.onboard = NsSince(t1) / static_cast<double>(n_req * kBlocksPerRequest);
  }
  return row;
}

}  // namespace
}  // namespace kvfleet::kv

int main(int argc, char** argv) {
  using namespace kvfleet::kv;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  kvfleet::LogOptions log;
  log.level = "warn";
  (void)kvfleet::InitLogging(log);
  std::printf("kv_bench: B=%u, %u-token requests sharing a %u-token prefix; ns per block (lower is better)\n", kB,
              kRequestTokens, kSharedTokens);
  std::printf("%12s %12s %12s %12s %12s %16s %12s\n", "tree_blocks", "request", "evict", "offload", "onboard",
              "bytes_per_block", "snapshot_ms");
  std::vector<uint32_t> sizes = {10'000, 100'000, 1'000'000};
  if (quick) sizes = {10'000, 100'000};
  std::vector<Row> rows;
  for (uint32_t n : sizes) {
    rows.push_back(Measure(n, quick ? 500 : 2000));
    const Row& r = rows.back();
    std::printf("%12u %12.1f %12.1f %12.1f %12.1f %16.1f %12.1f\n", n, r.request, r.evict, r.offload, r.onboard,
                r.bytes_per_block, r.snapshot_ms);
    std::fflush(stdout);
  }
  const Row& small = rows.front();
  const Row& large = rows.back();
  std::printf("largest/smallest tree: request %.2fx, evict %.2fx, offload %.2fx, onboard %.2fx (target <= 2x)\n",
              large.request / small.request, large.evict / small.evict, large.offload / small.offload,
              large.onboard / small.onboard);
  std::printf("bytes_per_block: host memory of the bookkeeping per block (every array at its capacity), %u of "
              "them tokens (B x 17 bits for a %u-token vocabulary)\n",
              (kB * 17 + 7) / 8, kVocab);
  // Bookkeeping per block as B varies (100k device blocks, no host tier).
  for (uint32_t b : {2u, 16u, 32u, 64u}) {
    CountingCopier copier;
    auto m = KvCacheManager::Make(Config(100'000, 0, b), &copier, kvfleet::SystemClock::Default());
    KVF_CHECK(m.ok());
    const double per_block = static_cast<double>((*m)->MemoryBytes()) / 100'000;
    const double token_bytes = (b * 17 + 7) / 8;
    std::printf("B=%-3u %7.1f bytes per block (%5.1f without tokens), %6.2f bytes per token\n", b, per_block,
                per_block - token_bytes, per_block / b);
  }
  return 0;
}
