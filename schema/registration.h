// Contract 3's registration messages (schema/worker.capnp ToRouter) as plain structs, and
// their one encoding: a worker's Hello (who it is, what it serves, where to reach it) and
// Bye (it is shutting down). The worker encodes them (worker/server/registration.h), the
// router decodes them (router/fleet); tests of either side encode the other's.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"

namespace kvfleet {

// A worker's part in serving requests (schema/worker.capnp WorkerRole; kvfleet-worker --role).
enum class WorkerRole : uint8_t {
  kBoth = 0,     // whole requests: prefill and decode
  kPrefill = 1,  // only the prefill of split requests, served to decode workers by pulls
  kDecode = 2,   // whole requests and the decode of split ones; never a split prefill
};
// "both", "prefill" or "decode".
std::string_view WorkerRoleName(WorkerRole role);
// InvalidArgument naming the accepted values for anything else.
Result<WorkerRole> ParseWorkerRole(std::string_view name);
// Whether routers may send it a request to generate from (every role but prefill).
inline bool ServesDecode(WorkerRole role) { return role != WorkerRole::kPrefill; }

// One KV pool as a worker announces it (schema/worker.capnp KvPool).
struct KvPoolAnnounce {
  uint32_t window = 0;           // tokens; 0 = full attention (the pool's events' window_size)
  uint32_t sink_tokens = 0;      // StreamingLLM sinks
  bool dense_context = false;    // StreamingLLM position shift and dense context phase
  uint32_t attention_chunk = 0;  // tokens; 0 = off
  uint32_t layers = 0;
  uint64_t device_blocks = 0;
  uint64_t host_blocks = 0;
  bool reuse = true;             // stores (and publishes) blocks for reuse
  uint32_t reuse_tokens = 0;     // only a sequence's first reuse_tokens tokens are stored; 0 = no limit

  bool operator==(const KvPoolAnnounce&) const = default;
};

// One LoRA adapter a worker serves (schema/worker.capnp LoraAdapter).
struct LoraAnnounce {
  std::string name;        // requests select it by this name (their model field)
  uint64_t lora_id = 0;    // LoraId(name), common/block_hash.h
  uint32_t rank = 0;
  std::string base_model;  // adapter_config.json's base_model_name_or_path

  bool operator==(const LoraAnnounce&) const = default;
};

struct WorkerHello {
  std::string name;               // the wire's workerId
  std::string model;
  uint32_t block_size = 0;        // Contract 1's B: tokens per block of its events and hashing
  uint32_t kv_block_size = 0;     // tokens per KV block when smaller (token-level KV: 1); 0: block_size.
                                  // deviceBlocks, hostBlocks, kv_pools and load reports count KV blocks
  uint32_t max_context = 0;
  uint64_t device_blocks = 0;
  uint64_t host_blocks = 0;       // 0: no host tier (left out of the Hello's tiers)
  std::string requests_endpoint;  // tcp://host:5556, as routers should connect
  std::string events_endpoint;
  std::string replay_endpoint;
  std::string http_endpoint;      // http://host:9400
  std::string backend;            // cpu, cuda, mock (or "static" for a router's static entry)
  uint64_t epoch = 0;             // the worker's event publisher epoch
  // XXH3-64 of its tokenizer.json and chat template (common/tokenizer_files.h); 0: none
  // (a mock, a directory without tokenizer.json, or a static entry).
  uint64_t tokenizer_digest = 0;
  std::vector<KvPoolAnnounce> kv_pools;  // empty: a worker older than the field, or a static entry
  std::vector<LoraAnnounce> loras;       // the adapters it serves, device- or host-resident
  uint32_t max_loras = 0;                // adapters on the device at once; 0: no LoRA support
  uint64_t lora_load_us = 0;             // host -> device load time of one adapter; 0: unknown
  uint32_t tensor_parallel = 1;          // ranks the model is split over (--tensor-parallel); 1 when not sent
  // The prefill rate it expects before it has measured one (its load reports' rate then
  // replaces it), under its step bound: its backend's cost model. 0: unknown.
  float prefill_tokens_per_second = 0;
  // KV transfer (Contract 4): where peers pull its blocks, its CURVE server key (Z85; empty:
  // plain TCP) and its block format (fp32, bf16, fp8e4m3, none); empty endpoint: no pulls.
  std::string transfer_endpoint;
  std::string transfer_key;
  std::string transfer_format;
  uint64_t transfer_bytes_per_block = 0;  // bytes one block moves (every pool); the pull's cost
  // Set when it copies device blocks with workers on its host (CUDA IPC): the host's boot id.
  // Two workers with the same one pull device to device.
  std::string transfer_host_id;
  WorkerRole role = WorkerRole::kBoth;  // --role; kBoth from a worker older than the field
  // It enforces SamplingParams::structured (a grammar vocabulary and a backend that masks
  // logits); false from a worker older than the field: routers send it no constrained request.
  bool structured_outputs = false;
  // The device it computes on, as every worker sharing it names it (cuda: the GPU's UUID,
  // cpu: "<host>/cpu", or --device-id); routers count the prefill queued on all of them
  // against it. Empty: shared with no other worker (and from a worker older than the field).
  std::string device_id;
};

// The pool whose KV events a router indexes for this worker (Contract 2): a prefix hit needs
// every pool to match, so it is the pool storing the shortest prefix (a windowed pool stores
// only its first window, a chunked one its first chunk); ties go to the smaller window, full
// attention first. Pools that store nothing are passed over. 0 (full attention) when the
// Hello names no pool or none stores blocks.
uint32_t IndexedWindow(const WorkerHello& hello);
// That pool's stored prefix in tokens (its reuse_tokens); 0: no limit, or no such pool.
uint32_t IndexedReuseTokens(const WorkerHello& hello);

struct WorkerBye {
  std::string name;
  uint64_t epoch = 0;  // 0: every epoch of that worker
};

using ToRouterMessage = std::variant<WorkerHello, WorkerBye>;

std::string EncodeHello(const WorkerHello& hello);
std::string EncodeBye(const WorkerBye& bye);
// An untrusted frame: DataLoss when it does not decode or is neither Hello nor Bye.
Result<ToRouterMessage> DecodeToRouter(const void* data, size_t size);

}  // namespace kvfleet
