// KV transfer between two cuda workers (Contract 4 over the TransferService on 127.0.0.1)
// against recomputing the prefix:
//
//   kv_transfer_bench [--model DIR] [--prompt-tokens N] [--decode-tokens N] [--reps N]
//                     [--kv-cache-gib G] [--ipc] [--nccl] [--devices A,B] [--peak-gbs G] [--log-level L]
//
//   --model DIR        default: a llama-3.1-8b-shaped random model (test_models.h, seed 7)
//   --prompt-tokens N  default 8192; whole blocks of 32 are pulled, the last block computed
//   --decode-tokens N  greedy tokens per request (default 4)
//   --reps N           measured rounds (default 3), each on fresh random prompts
//   --kv-cache-gib G   each worker's device KV bytes (default 12): both share the GPU
//   --ipc              A runs in a child process and B pulls by CUDA IPC (device to device);
//                      default: both in this process, the pull's bytes over TCP
//   --nccl             A runs in a child process and B pulls by NCCL send/recv (--transfer-nccl,
//                      B with --no-transfer-ipc); needs two GPUs. With --ipc too: the IPC rounds,
//                      then the NCCL rounds on a fresh B, from the same A, side by side.
//   --devices A,B      the GPUs of worker A and worker B (--device; default 0,0). On two GPUs
//                      the run ends with the two same-host transports side by side over the
//                      pull's bytes: peer copies (what CUDA IPC does) and NCCL send/recv.
//   --peak-gbs G       the link's peak one way, for the copies' share of it (default 478: an
//                      H200 pair's NV18, 18 NVLinks of 26.562 GB/s; 0: not printed)
//   --log-level L      the workers' log level (default info); debug times each pull's stages
//
// Workers A and B (in-process, cuda backend, one GPU). After a warm-up (a prompt on each, and
// one pull from A to B), each round: A computes prompt P's prefix; B computes P' (P with its first
// token changed: nothing of it cached anywhere) — the recompute TTFT; B gets P with a
// PullHint naming A — the pull TTFT. The reference tokens: A computes P's whole blocks before
// its last token, then P from that cached prefix, the split B's pulled request has (cached
// blocks, the last block computed); B's greedy tokens must equal them. (A whole-prompt prefill
// rounds differently in bf16 — another attention split — and can flip a near-tie, as two of
// three prompts here do.) TTFT is the client's
// wall time from sending the Generate to the first token's Delta (the worker's own
// timeToFirstTokenUs beside it). The pull's bytes and time are B's TransferService stats
// (StartPull to the last verified block: the holder's device reads, checksums, encode, the
// loopback, decode and checks; the receiver's writes into its cache, frame by frame on its
// engine thread, overlap it but are not in it).
//
// Then where a pull's time goes: each stage of the streamed path timed alone over the same
// bytes (blocks of the model's size), summed over its frames (BlocksPerFrame blocks, up to
// 16 MiB): the device-to-host copy through pinned staging into a reused frame buffer
// (ReadKvBlocks), XXH3 checksums and checks, Cap'n Proto encode of each frame, the frames over
// a ZeroMQ DEALER→ROUTER on tcp://127.0.0.1, in-place decode + checks, and the host-to-device
// copy from each received frame through the staging (WriteKvBlocksFrom).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <capnp/message.h>
#include <zmq.hpp>

#include "common/block_hash.h"
#include "common/log.h"
#include "schema/requests.h"
#include "schema/transfer_codec.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "tests/bench/kv_transfer_stages.h"
#include "tests/worker/model/test_models.h"
#include "tests/worker/server/loopback_worker_config.h"
#include "worker/model/model_config.h"
#include "worker/server/worker.h"

namespace kvfleet {
namespace {

using bench::Clk;
using bench::Median;
using bench::MsSince;

struct Answer {
  std::vector<TokenId> tokens;
  double ttft_ms = 0;         // client wall time to the first token
  double worker_ttft_ms = 0;  // the worker's timeToFirstTokenUs
  double total_ms = 0;
  uint32_t cached = 0;
  bool finished = false;
};

Answer Ask(zmq::context_t& context, const std::string& endpoint, const std::vector<TokenId>& prompt, int max_tokens,
           const PullHint& hint = {}) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(1);
  auto t = g.initTokens(static_cast<unsigned>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) t.set(static_cast<unsigned>(i), prompt[i]);
  g.getSampling().setTemperature(0);
  g.getSampling().setMaxTokens(static_cast<uint32_t>(max_tokens));
  g.getSampling().setIgnoreEos(true);
  if (!hint.source.empty()) {
    auto h = g.initPull();
    h.setSource(hint.source);
    h.setBlocks(hint.blocks);
    h.setWorkerId(hint.worker_id);
  }
  const std::string frame = wire::Encode(msg);
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the connection, out of the timing
  Answer a;
  const Clk::time_point t0 = Clk::now();
  s.send(zmq::buffer(frame), zmq::send_flags::none);
  while (!a.finished) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(120'000)) != 1) break;
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
    if (!d.ok() || !(*d)->Root<schema::FromWorker>().isDelta()) {
      std::fprintf(stderr, "the worker answered an error\n");
      std::exit(1);
    }
    auto delta = (*d)->Root<schema::FromWorker>().getDelta();
    if (a.tokens.empty() && delta.getTokens().size() > 0) a.ttft_ms = MsSince(t0);
    for (auto tok : delta.getTokens()) a.tokens.push_back(tok);
    if (delta.getFinishReason() != schema::FinishReason::NONE) {
      a.finished = true;
      a.total_ms = MsSince(t0);
      a.cached = delta.getUsage().getCachedDeviceTokens();
      a.worker_ttft_ms = static_cast<double>(delta.getUsage().getTimeToFirstTokenUs()) / 1e3;
    }
  }
  if (!a.finished) {
    std::fprintf(stderr, "no answer from %s\n", endpoint.c_str());
    std::exit(1);
  }
  return a;
}

struct RunningWorker {
  RunningWorker(const server::WorkerConfig& config, zmq::context_t& context) {
    auto started = server::Worker::Start(config, context);
    if (!started.ok()) {
      std::fprintf(stderr, "worker: %s\n", started.status().ToString().c_str());
      std::exit(1);
    }
    worker = std::move(*started);
    thread = std::thread([this] { worker->Run(); });
  }
  ~RunningWorker() {
    worker->RequestStop();
    thread.join();
  }
  std::unique_ptr<server::Worker> worker;
  std::thread thread;
};

std::vector<TokenId> RandomPrompt(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TokenId> p(n);
  for (TokenId& t : p) t = static_cast<TokenId>(1000 + rng() % 100'000);
  return p;
}

// Worker A as B sees it: its endpoints, and with --ipc the child process that runs it.
struct Holder {
  std::string requests, transfer, worker_id;
  pid_t pid = -1;
  int stop_fd = -1;  // closing it stops the child
};

Holder ForkHolder(const server::WorkerConfig& c) {
  int up[2], stop[2];
  if (pipe(up) != 0 || pipe(stop) != 0) std::exit(1);
  const pid_t pid = fork();
  if (pid < 0) std::exit(1);
  if (pid == 0) {
    close(up[0]);
    close(stop[1]);
    {
      zmq::context_t context;
      RunningWorker a(c, context);
      const std::string line = a.worker->requests_endpoint() + "\n" + a.worker->transfer_endpoint() + "\n" +
                               a.worker->worker_id() + "\n";
      if (write(up[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(1);
      char byte;
      while (read(stop[0], &byte, 1) > 0) {
      }
    }
    _exit(0);
  }
  close(up[1]);
  close(stop[0]);
  std::string text;
  char buf[512];
  for (ssize_t n; std::count(text.begin(), text.end(), '\n') < 3 && (n = read(up[0], buf, sizeof(buf))) > 0;) {
    text.append(buf, static_cast<size_t>(n));
  }
  close(up[0]);
  std::istringstream lines(text);
  Holder h;
  if (!std::getline(lines, h.requests) || !std::getline(lines, h.transfer) || !std::getline(lines, h.worker_id)) {
    std::fprintf(stderr, "worker A (child %d) did not start\n", static_cast<int>(pid));
    std::exit(1);
  }
  h.pid = pid;
  h.stop_fd = stop[1];
  return h;
}

// What one transport's rounds came to (medians), for the side-by-side summary.
struct ModeResult {
  std::string transport;
  double prefix_ms = 0, move_ms = 0, copy_gbs = 0, recompute_ttft = 0, pull_ttft = 0;
  uint64_t by_transport = 0;  // ok pulls that went this way (device or nccl answers)
  uint64_t bytes_per_block = 0;  // of the pulled blocks
  bool equal = true;
};

struct BenchOptions {
  size_t prompt_tokens = 8192;
  int decode_tokens = 4, reps = 3;
  double peak_gbs = 478;
};

// Starts B with `config_b`, warms up (one pull: the DEALER's connection, an NCCL pair's
// communicator), then runs the rounds against holder `a` and prints them.
ModeResult RunMode(const std::string& transport, zmq::context_t& context, const Holder& a,
                   const server::WorkerConfig& config_b, const BenchOptions& o, const std::optional<RunningWorker>& a_here) {
  const Clk::time_point t0 = Clk::now();
  RunningWorker b(config_b, context);
  std::printf("[%s] worker B up on GPU %d in %.1f s; A's transfer endpoint %s\n", transport.c_str(), config_b.device,
              MsSince(t0) / 1e3, a.transfer.c_str());
  const uint32_t B = config_b.block_size;
  const uint32_t hint_blocks = static_cast<uint32_t>(o.prompt_tokens / B);
  const PullHint from_a{a.transfer, "", hint_blocks, a.worker_id};
  const uint64_t seed = transport == "nccl" ? 1000 : 0;  // each transport's prompts new to A's cache

  const std::vector<TokenId> w = RandomPrompt(o.prompt_tokens, 1 + seed);
  Ask(context, a.requests, w, o.decode_tokens);
  Ask(context, b.worker->requests_endpoint(), RandomPrompt(o.prompt_tokens, 2 + seed), o.decode_tokens);
  const Answer warm = Ask(context, b.worker->requests_endpoint(), w, o.decode_tokens, from_a);
  std::printf("[%s] warm-up pull: TTFT %.1f ms, %u tokens cached\n", transport.c_str(), warm.ttft_ms, warm.cached);

  std::vector<double> own_cached, recompute, pull, pull_worker, recompute_worker, pull_ms, pull_gbs;
  std::vector<double> prefix_ms, move_ms, copy_gbs;  // A's prefix compute; the pull plus its device copy
  ModeResult out;
  out.transport = transport;
  uint64_t pulled_bytes = 0;
  for (int r = 0; r < o.reps; ++r) {
    const std::vector<TokenId> p = RandomPrompt(o.prompt_tokens, 100 + seed + static_cast<uint64_t>(r));
    std::vector<TokenId> p2 = p;
    p2[0] = p[0] + 1;
    // A computes the prefix (the pulled blocks: whole blocks before the last token), then the
    // prompt from its own cached prefix: the reference, split exactly as B's pulled request is.
    const std::vector<TokenId> prefix(p.begin(), p.begin() + (p.size() - 1) / B * B);
    const Answer computed = Ask(context, a.requests, prefix, o.decode_tokens);
    const Answer cached = Ask(context, a.requests, p, o.decode_tokens);
    const Answer re = Ask(context, b.worker->requests_endpoint(), p2, o.decode_tokens);
    const transfer::SourceStats before = b.worker->transfer_stats().pulls[from_a.source];
    const Answer pl = Ask(context, b.worker->requests_endpoint(), p, o.decode_tokens, from_a);
    const transfer::SourceStats after = b.worker->transfer_stats().pulls[from_a.source];
    const uint64_t bytes = after.bytes - before.bytes;
    const double seconds = after.seconds - before.seconds;
    const bool equal = pl.tokens == cached.tokens && pl.cached == cached.cached;
    out.equal = out.equal && equal;
    pulled_bytes = bytes;
    // The device answer's copy (CUDA IPC) or the NCCL receive on B, timed by B's engine thread
    // (IPC) or its NCCL thread (submit to done).
    const uint64_t copy_bytes = (after.device_copy_bytes - before.device_copy_bytes) +
                                (after.nccl_copy_bytes - before.nccl_copy_bytes);
    const double copy_s = (after.device_copy_seconds - before.device_copy_seconds) +
                          (after.nccl_copy_seconds - before.nccl_copy_seconds);
    if (copy_bytes > 0) {
      const double gbs = static_cast<double>(copy_bytes) / 1e9 / copy_s;
      std::printf("[%s] round %d: %s %.3f GB in %.2f ms = %.1f GB/s", transport.c_str(), r,
                  transport == "nccl" ? "NCCL receive" : "device copy", static_cast<double>(copy_bytes) / 1e9,
                  copy_s * 1e3, gbs);
      if (o.peak_gbs > 0) std::printf(" (%.1f%% of %.0f GB/s)", 100 * gbs / o.peak_gbs, o.peak_gbs);
      std::printf("\n");
      copy_gbs.push_back(gbs);
    }
    prefix_ms.push_back(computed.worker_ttft_ms);
    move_ms.push_back((seconds + copy_s) * 1e3);
    std::printf(
        "[%s] round %d: A computes the prefix in %.1f ms TTFT; B recompute TTFT %.1f ms (worker %.1f, cached %u); B "
        "pull TTFT %.1f ms (worker %.1f, cached %u); pull %llu blocks %.3f GB in %.1f ms = %.2f GB/s; tokens %s to A's "
        "from its own cached prefix (cached %u)\n",
        transport.c_str(), r, computed.ttft_ms, re.ttft_ms, re.worker_ttft_ms, re.cached, pl.ttft_ms,
        pl.worker_ttft_ms, pl.cached, static_cast<unsigned long long>(after.blocks - before.blocks),
        static_cast<double>(bytes) / 1e9, seconds * 1e3, static_cast<double>(bytes) / 1e9 / std::max(seconds, 1e-9),
        equal ? "equal" : "DIFFER", cached.cached);
    own_cached.push_back(cached.ttft_ms);
    recompute.push_back(re.ttft_ms);
    recompute_worker.push_back(re.worker_ttft_ms);
    pull.push_back(pl.ttft_ms);
    pull_worker.push_back(pl.worker_ttft_ms);
    pull_ms.push_back(seconds * 1e3);
    pull_gbs.push_back(static_cast<double>(bytes) / 1e9 / std::max(seconds, 1e-9));
  }
  if (a_here) {
    const transfer::TransferStats sa = a_here->worker->transfer_stats();
    std::printf("holder A: served %llu pulls, %llu blocks, %llu frames\n", static_cast<unsigned long long>(sa.served),
                static_cast<unsigned long long>(sa.served_blocks), static_cast<unsigned long long>(sa.served_frames));
  }
  const transfer::SourceStats sb = b.worker->transfer_stats().pulls[from_a.source];
  out.by_transport = transport == "nccl" ? sb.nccl : sb.device;
  std::printf("[%s] receiver B: %llu ok pulls from A, %llu by CUDA IPC, %llu by NCCL\n", transport.c_str(),
              static_cast<unsigned long long>(sb.ok), static_cast<unsigned long long>(sb.device),
              static_cast<unsigned long long>(sb.nccl));
  std::printf(
      "[%s] summary: prompt %zu tokens, median of %d: recompute TTFT %.1f ms (worker %.1f), pull TTFT %.1f ms (worker "
      "%.1f), ratio recompute/pull %.2fx; pull %.3f GB in %.1f ms = %.2f GB/s; greedy tokens after the pulled prefix "
      "%s (A's, from its own cached prefix)\n",
      transport.c_str(), o.prompt_tokens, o.reps, Median(recompute), Median(recompute_worker), Median(pull),
      Median(pull_worker), Median(recompute) / Median(pull), static_cast<double>(pulled_bytes) / 1e9, Median(pull_ms),
      Median(pull_gbs), out.equal ? "equal A's" : "DIFFER from A's");
  // The floor of any transport: A answering P from its own cached prefix (the same split:
  // the last block computed), which a pulled request pays plus the pull.
  std::printf("[%s] floor: A's TTFT for P from its own cached prefix, median %.1f ms: recompute/floor %.2fx; the pull "
              "adds %.1f ms to it\n",
              transport.c_str(), Median(own_cached), Median(recompute) / Median(own_cached),
              Median(pull) - Median(own_cached));
  // The prefix alone: computing it (A's worker TTFT for the prefix) against moving it (B's
  // pull, plus the device copy or NCCL receive).
  out.prefix_ms = Median(prefix_ms);
  out.move_ms = Median(move_ms);
  out.copy_gbs = copy_gbs.empty() ? 0 : Median(copy_gbs);
  out.recompute_ttft = Median(recompute);
  out.pull_ttft = Median(pull);
  std::printf("[%s] prefix: computed in %.1f ms (A's worker TTFT), moved in %.2f ms (pull + copy): %.1fx%s\n",
              transport.c_str(), out.prefix_ms, out.move_ms, out.prefix_ms / std::max(out.move_ms, 1e-6),
              copy_gbs.empty() ? "" : (", copy " + std::to_string(out.copy_gbs) + " GB/s").c_str());
  out.bytes_per_block = pulled_bytes / std::max<uint32_t>(1, hint_blocks - 1);
  if (transport == "tcp") bench::StageBreakdown(hint_blocks - 1, out.bytes_per_block, B);
  return out;
}

}  // namespace
}  // namespace kvfleet

int main(int argc, char** argv) {
  using namespace kvfleet;
  std::string model;
  BenchOptions o;
  double kv_gib = 12;
  bool ipc = false, nccl = false;
  int device_a = 0, device_b = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      model = argv[++i];
    } else if (!std::strcmp(argv[i], "--prompt-tokens") && i + 1 < argc) {
      o.prompt_tokens = std::strtoul(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--decode-tokens") && i + 1 < argc) {
      o.decode_tokens = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--kv-cache-gib") && i + 1 < argc) {
      kv_gib = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--peak-gbs") && i + 1 < argc) {
      o.peak_gbs = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--ipc")) {
      ipc = true;
    } else if (!std::strcmp(argv[i], "--nccl")) {
      nccl = true;
    } else if (!std::strcmp(argv[i], "--log-level") && i + 1 < argc) {
      LogOptions lo;
      lo.level = argv[++i];
      if (Status s = InitLogging(lo); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--devices") && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%d,%d", &device_a, &device_b) == 2 && device_a >= 0 && device_b >= 0) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: kv_transfer_bench [--model DIR] [--prompt-tokens N] [--decode-tokens N] [--reps N] "
                   "[--kv-cache-gib G] [--ipc] [--nccl] [--devices A,B] [--peak-gbs G] [--log-level L]\n");
      return 2;
    }
  }
  if (nccl && device_a == device_b) {
    std::fprintf(stderr, "--nccl needs two GPUs (--devices 0,1): NCCL refuses two ranks on one device\n");
    return 2;
  }
  const bool child = ipc || nccl;
  // The model first: the child must fork before this process touches CUDA.
  if (model.empty()) {
    const Clk::time_point t0 = Clk::now();
    model = testing::RandomModelDir("llama-3.1-8b", 7);
    std::printf("model: %s (ready in %.1f s)\n", model.c_str(), MsSince(t0) / 1e3);
  } else {
    std::printf("model: %s\n", model.c_str());
  }
  std::fflush(stdout);

  server::WorkerConfig c = server::testing::LoopbackWorkerConfig();
  c.backend = "cuda";
  c.model_dir = model;
  c.block_size = 32;
  c.max_num_tokens = 8192;
  c.max_batch_size = 8;
  c.max_context = static_cast<uint32_t>(std::max<size_t>(16384, o.prompt_tokens + 1024));
  c.kv_cache_bytes = static_cast<uint64_t>(kv_gib * (1ull << 30));
  c.transfer_deadline_ms = 60'000;  // measured, never cut short
  // A: in this process, or (--ipc, --nccl) in a child that reports its endpoints on a pipe
  // and runs until this process closes the other pipe; it answers both ways.
  server::WorkerConfig config_b = c;
  c.device = device_a;
  c.transfer_ipc = ipc;
  c.transfer_nccl = nccl;
  config_b.device = device_b;
  Holder a = child ? ForkHolder(c) : Holder{};
  zmq::context_t context;
  std::optional<RunningWorker> a_here;
  if (!child) {
    a_here.emplace(c, context);
    a = Holder{a_here->worker->requests_endpoint(), a_here->worker->transfer_endpoint(), a_here->worker->worker_id()};
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, device_b));
  std::printf("device: %s; A on GPU %d, B on GPU %d; transports: %s\n", prop.name, device_a, device_b,
              !child ? "TCP" : ipc && nccl ? "CUDA IPC, then NCCL (A in a child process)"
                     : ipc               ? "CUDA IPC (A in a child process)"
                                         : "NCCL (A in a child process)");
  std::vector<ModeResult> results;
  bool ok = true;
  for (const char* transport : {"tcp", "ipc", "nccl"}) {
    const std::string t = transport;
    if ((t == "tcp" && child) || (t == "ipc" && !ipc) || (t == "nccl" && !nccl)) continue;
    config_b.transfer_ipc = t == "ipc";
    config_b.transfer_nccl = t == "nccl";
    results.push_back(RunMode(t, context, a, config_b, o, a_here));
    ok = ok && results.back().equal;
    if (t != "tcp" && results.back().by_transport == 0) {
      std::printf("FAILED: no %s pull went device to device\n", transport);
      ok = false;
    }
  }
  if (results.size() > 1) {
    std::printf("\nside by side, GPU %d -> GPU %d, prompt %zu tokens, medians of %d:\n", device_a, device_b,
                o.prompt_tokens, o.reps);
    std::printf("  %-9s %14s %10s %8s %14s %14s %8s\n", "transport", "prefix comp.", "moved", "ratio", "copy GB/s",
                "TTFT re/pull", "tokens");
    for (const ModeResult& r : results) {
      char share[32] = "";
      if (o.peak_gbs > 0) std::snprintf(share, sizeof(share), " %.1f%%", 100 * r.copy_gbs / o.peak_gbs);
      std::printf("  %-9s %11.1f ms %7.2f ms %7.1fx %8.1f%-6s %6.1f/%-6.1f %8s\n", r.transport.c_str(), r.prefix_ms,
                  r.move_ms, r.prefix_ms / std::max(r.move_ms, 1e-6), r.copy_gbs, share, r.recompute_ttft,
                  r.pull_ttft, r.equal ? "equal" : "DIFFER");
    }
  }
  // The two same-host transports alone over the pull's bytes (one process, ncclCommInitAll).
  if (device_a != device_b && !results.empty()) {
    const uint32_t blocks = static_cast<uint32_t>(o.prompt_tokens / c.block_size) - 1;
    bench::PeerStages(blocks, results.back().bytes_per_block, device_a, device_b);
  }
  if (a.stop_fd >= 0) close(a.stop_fd);
  if (a.pid > 0) waitpid(a.pid, nullptr, 0);
  return ok ? 0 : 1;
}
