// WorkerConfig: every setting of kvfleet-worker, with its default and unit, and the
// command-line flags that set them (common/config.h conventions: flag, KVFLEET_<FLAG>
// environment variable, config file, default). `kvfleet up` passes these same flags.
//
// Thread safety: a value; filled at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "worker/backend/mock/cost_model.h"
#include "worker/engine/scheduler.h"

namespace kvfleet::server {

struct WorkerConfig {
  // --- model and backend ---
  // auto (cuda when this build's kernels run on the GPU, else cpu: ResolveBackend), cuda,
  // cpu, or mock (a simulated model: random tokens), which must be named.
  std::string backend = "auto";
  std::string model_dir;             // HF directory; the mock may run without one
  std::string model_name;            // served name; default: the model directory's name ("mock" without one)
  std::string worker_id;             // default: hostname:<requests port>

  // --- sockets ---
  std::string requests = "tcp://*:5556";  // requests ROUTER (Contract 3)
  std::string events = "tcp://*:5557";    // KV events PUB (Contract 2)
  std::string replay = "tcp://*:5558";    // replay/snapshot ROUTER
  int http_port = 9400;                   // /health, /ready, /metrics; 0: ephemeral
  std::string http_host = "0.0.0.0";      // the HTTP listen address
  std::string router;                     // registration ROUTER to send Hello to; empty: none
  std::string advertise_host;             // host routers should connect to; default: hostname
  // CURVE (common/curve_keys.h files) on the requests, events and replay sockets: this
  // worker's server key pair, and the router public keys it admits (empty: any router
  // that knows the server key). Both empty: plaintext.
  std::string curve_keypair;
  std::string curve_authorized_keys;
  // The router's public key for registration: the Hello and Bye go over CURVE, this worker
  // authenticating with registration_keypair, else curve_keypair (the router must list its
  // public key in --registration-authorized-keys). Empty: plaintext registration.
  std::string router_key;
  std::string registration_keypair;  // this worker's own key; lets workers share curve_keypair
  // KV transfer (Contract 4, worker/transfer): where other workers pull this one's blocks;
  // empty: it neither serves nor makes pulls. With --curve-keypair the socket is a CURVE
  // server admitting the keys in transfer_authorized_keys (the fleet's workers), and pulls
  // present that key pair (a keyed worker without that list moves no KV); without keys, a
  // bind other hosts can reach needs transfer_insecure.
  std::string transfer = "tcp://127.0.0.1:0";  // port 0: one the system picks, advertised as bound
  std::string transfer_authorized_keys;
  bool transfer_insecure = false;
  // Same-host pulls copy device blocks (CUDA IPC) between cuda workers; off: always bytes.
  bool transfer_ipc = true;
  // cuda: pulls may move device blocks by NCCL point-to-point (a communicator per pair of
  // workers, made on the first pull between them) where CUDA IPC is not possible: another
  // host, another IPC namespace, or --no-transfer-ipc. Both workers need it; off: bytes.
  bool transfer_nccl = false;
  uint32_t transfer_deadline_ms = 10'000;  // the longest a pull may take (a hint's own deadline is capped by it)
  // mock: the simulated link a pulled block crosses (bytes/s); 0: no delay
  double mock_transfer_bytes_per_s = 2e9;  // the router's default assumption (routing README)
  // Tests only (no flag): this worker flips a byte of every block it serves, so that its pullers'
  // checksums fail (transfer::TransferOptions::test_corrupt_served_data).
  bool test_corrupt_served_blocks = false;
  // Its part in P/D disaggregation (schema/registration.h WorkerRole), announced in the Hello:
  // "both" (whole requests), "prefill" (split prefills only) or "decode"; the last two need transfer.
  std::string role = "both";

  // --- engine ---
  uint32_t block_size = 32;          // tokens per KV block (B); 1: token-level KV
  // Tokens per block of the KV events and of the routers' hashing (G, Contract 1's B as
  // routers see it): a power of two >= B; 0: B, or config::kTokenKvRoutingBlockSize at B = 1.
  uint32_t routing_block_size = 0;
  uint32_t max_num_tokens = 8192;    // tokens computed per step; a multiple of B
  uint32_t max_batch_size = 256;     // running sequences
  uint32_t max_context = 0;          // tokens per request; 0: the model's, capped by the cache
  // Ranks one model is split over (Megatron tensor parallelism): 1, 2, 4 or 8. cpu: in-process
  // ranks; cuda: one GPU per rank (cuda_backend.h invariant 8); mock: announced only, its costs do not change.
  int32_t tensor_parallel = 1;
  // cuda: the device ordinal the worker runs on (its first rank with --tensor-parallel). Workers
  // that share a host name their GPUs here rather than by CUDA_VISIBLE_DEVICES, so that each can
  // still map the others' KV pools for device-to-device pulls (worker/transfer/README.md).
  int32_t device = 0;
  uint32_t max_queued = 1024;        // waiting requests before new ones get `overloaded`
  // ms a step may take while decodes run (engine::SchedulerOptions::max_step_ms); 0: no bound
  double max_step_ms = engine::config::kDefaultMaxStepMs;
  // --role decode: a step with prefill takes at most this many times its decodes alone
  // (engine::SchedulerOptions::max_step_over_decodes; 0: no cap), until a prompt has waited
  // decode_cap_wait_ms (max_capped_wait_ms; 0: the cap never yields).
  double decode_step_cap = engine::config::kDecodeRoleStepOverDecodes;
  double decode_cap_wait_ms = engine::config::kDecodeRoleMaxCappedWaitMs;
  // The prefill rate (tokens/s) the Hello announces until load reports measure one; 0: the
  // mock's cost model, else measured at start-up (engine/prefill_calibration.h).
  double prefill_rate = 0;
  // The compute device, as every worker sharing it names it (routers count their queues
  // together); empty: cuda its GPU's UUID, cpu the host name + "/cpu", mock not shared.
  std::string device_id;

  // --- KV memory ---
  uint64_t kv_cache_bytes = 0;       // device KV bytes (per GPU with --tensor-parallel); 0: the backend's default
  double gpu_memory_fraction = 0.9;  // cuda, when kv_cache_bytes is 0: share of free memory
  std::string kv_cache_dtype = "auto";  // auto, bf16, fp8 (= fp8_e4m3): cuda; mock models fp8's capacity
  uint64_t host_cache_bytes = 0;     // host tier bytes; 0: no host tier
  uint32_t offload_min_priority = 35;  // evicted blocks at or above it go to the host tier
  bool events_include_tokens = false;  // stored events carry block tokens
  uint32_t event_ring_batches = 10'000;  // event batches (heartbeats included) kept for replay

  // --- attention (worker/backend/kv_setup.h checks them against the model) ---
  std::vector<int32_t> max_attention_window;  // tokens per layer, repeated to the layers; empty: config.json's
  int32_t sink_tokens = 0;                    // StreamingLLM sinks kept by windowed layers
  bool streaming_llm = false;                 // position shift + dense context phase
  int32_t attention_chunk_size = 0;           // Llama 4 chunked attention, tokens; 0: config.json's

  // --- LoRA adapters ---
  std::vector<std::string> loras;    // --lora NAME=DIR (repeatable): PEFT adapters served from the start
  int32_t max_loras = 1;             // adapters on the device at once (others wait in host memory); 0: none
  int32_t max_lora_rank = 64;        // the largest adapter rank served, 1..64

  // --- shutdown ---
  double shutdown_grace_s = 30;      // seconds in-flight requests get after SIGTERM

  // --- mock backend ---
  backend::mock::CostModel mock_cost;  // --mock-step-base-us and friends
  bool mock_verify_kv = false;         // shadow KV check (tests; costs O(context) per step)
  uint32_t mock_workers = 1;           // workers in this process (mock only; fleet benchmarks)
  uint32_t port_stride = 10;           // port offset between the workers of one process

  Status Validate() const;
  // Makes --backend auto concrete (backend::ChooseBackend) and returns why it chose what it
  // did; "" when the backend was named.
  std::string ResolveBackend();
  // The --lora flags as (name, directory), in order. REQUIRES: Validate().ok().
  std::vector<std::pair<std::string, std::string>> LoraDirs() const;
  // The served model name (model_name, else the directory's last component, else "mock").
  std::string ModelName() const;
  // This config for worker `index` of a multi-worker process: ports + index·stride, id
  // suffixed "-<index>". index 0 is this config unchanged.
  WorkerConfig ForInstance(uint32_t index) const;
};

// Adds every flag to `app`.
void AddWorkerFlags(CLI::App& app, WorkerConfig* config);

// "tcp://*:5556" -> 5556; -1 when the endpoint has no port.
int EndpointPort(const std::string& endpoint);
// The endpoint with its port replaced; "*" hosts become `host` when `host` is non-empty.
std::string WithPort(const std::string& endpoint, int port, const std::string& host = "");

}  // namespace kvfleet::server
