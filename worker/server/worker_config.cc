#include "worker/server/worker_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "schema/registration.h"
#include "worker/backend/backend.h"
#include "worker/backend/backend_choice.h"

namespace kvfleet::server {

void AddWorkerFlags(CLI::App& app, WorkerConfig* c) {
  app.add_option("--backend", c->backend,
                 "model backend: auto (cuda when this build has the CUDA backend and its kernels run on the GPU, "
                 "else cpu), cuda, cpu, or mock (a simulated model: random tokens, for tests and benchmarks)")
      ->capture_default_str();
  app.add_option("--model-dir", c->model_dir, "Hugging Face model directory (config.json, *.safetensors)");
  app.add_option("--model-name", c->model_name, "served model name (default: the directory's name)");
  app.add_option("--worker-id", c->worker_id, "worker id in events and Hello (default: hostname:port)");
  app.add_option("--requests", c->requests, "requests ROUTER endpoint")->capture_default_str();
  app.add_option("--events", c->events, "KV events PUB endpoint")->capture_default_str();
  app.add_option("--replay", c->replay, "replay/snapshot ROUTER endpoint")->capture_default_str();
  app.add_option("--event-ring-batches", c->event_ring_batches,
                 "event batches (heartbeats included) kept for replay; a router further behind gets a snapshot")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--http-port", c->http_port, "HTTP port for /health, /ready, /metrics (0: any)")
      ->capture_default_str();
  app.add_option("--http-host", c->http_host, "HTTP listen address (127.0.0.1: this host only)")
      ->capture_default_str();
  app.add_option("--router", c->router, "router registration endpoint, e.g. tcp://host:5555 (optional)");
  app.add_option("--advertise-host", c->advertise_host, "host name routers use to reach this worker (default: hostname)");
  app.add_option("--curve-keypair", c->curve_keypair,
                 "CURVE server key pair file for the requests, events and replay sockets (kvfleet keygen)");
  app.add_option("--curve-authorized-keys", c->curve_authorized_keys,
                 "router public keys admitted, one per line (default: any router with the server key)");
  app.add_option("--router-key", c->router_key,
                 "the router's public key file: registration (--router) goes over CURVE, this worker "
                 "authenticating with --registration-keypair (default: --curve-keypair)");
  app.add_option("--registration-keypair", c->registration_keypair,
                 "this worker's own key pair for registration, when workers share --curve-keypair: the "
                 "router then tells them apart, and none can speak for another");
  app.add_option("--transfer", c->transfer,
                 "KV transfer ROUTER endpoint: other workers pull cached prefixes from here instead of "
                 "recomputing them (Contract 4); empty: no pulls either way")
      ->capture_default_str();
  app.add_option("--transfer-authorized-keys", c->transfer_authorized_keys,
                 "with --curve-keypair: the public keys (one per line) of the workers that may pull from this one");
  app.add_flag("--transfer-insecure", c->transfer_insecure,
               "allow a --transfer bind other hosts can reach without CURVE (anyone reaching it can read the KV cache)");
  app.add_flag("--transfer-ipc,!--no-transfer-ipc", c->transfer_ipc,
               "cuda: a pull between two workers on this host copies the holder's device blocks (CUDA IPC) "
               "instead of sending their bytes; a holder that cannot be mapped gets asked for bytes")
      ->capture_default_str();
  app.add_flag("--transfer-nccl,!--no-transfer-nccl", c->transfer_nccl,
               "cuda: where CUDA IPC is not possible (another host or IPC namespace, --no-transfer-ipc), a pull "
               "between two workers that both set this moves the holder's device blocks by NCCL send/recv "
               "(a communicator per pair, set up on their first pull) instead of sending their bytes")
      ->capture_default_str();
  app.add_option("--transfer-deadline-ms", c->transfer_deadline_ms,
                 "the longest a pull may take before its prefix is computed instead; a router's hint names a "
                 "shorter one (twice its predicted time)")
      ->check(CLI::Range(1u, 60'000u))
      ->capture_default_str();
  app.add_option("--role", c->role,
                 "prefill: only split prefills, whose KV decode workers pull; decode: whole requests and "
                 "split requests' decode; both: whole requests (router/routing/README.md, \"Prefill and decode on different workers\")")
      ->capture_default_str();
  app.add_option("--mock-transfer-bytes-per-s", c->mock_transfer_bytes_per_s,
                 "mock: the bandwidth of the simulated link pulled blocks cross (their modelled bytes); 0: instant")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--block-size", c->block_size, "tokens per KV block (power of two; 1: token-level KV)")
      ->capture_default_str();
  app.add_option("--routing-block-size", c->routing_block_size,
                 "tokens per block of the KV events and the routers' hashing (power of two >= --block-size); "
                 "0: --block-size, or 16 when it is 1")
      ->capture_default_str();
  app.add_option("--max-num-tokens", c->max_num_tokens, "tokens computed per step (multiple of the block size)")
      ->capture_default_str();
  app.add_option("--max-batch-size", c->max_batch_size, "running sequences at most")->capture_default_str();
  app.add_option("--max-context", c->max_context, "tokens per request, prompt + output (0: the model's)")
      ->capture_default_str();
  app.add_option("--tensor-parallel", c->tensor_parallel,
                 "ranks the model is split over, Megatron-style (1, 2, 4 or 8); cpu: in-process ranks, cuda: GPUs; "
                 "the model's attention heads, KV heads and intermediate size must shard over them")
      ->capture_default_str();
  app.add_option("--device", c->device,
                 "cuda: the GPU ordinal to run on (with --tensor-parallel, ranks take GPUs from it on); keep every "
                 "GPU visible to workers on one host so their pulls copy device to device")
      ->check(CLI::Range(0, 1023))
      ->capture_default_str();
  app.add_option("--max-queued", c->max_queued, "waiting requests before refusing with 'overloaded'")
      ->capture_default_str();
  app.add_option("--max-step-ms", c->max_step_ms,
                 "while requests decode, cut each step's prefill chunk so the step takes at most this long "
                 "(ms; or twice the decodes' own time if longer): the inter-token latency a prefill may add. "
                 "0: no bound, prefill fills --max-num-tokens")
      ->capture_default_str();
  app.add_option("--decode-step-cap", c->decode_step_cap,
                 "--role decode: a step with prefill takes at most this many times its decodes alone (the "
                 "inter-token p99/p50 the split keeps); 0: only --max-step-ms bounds it")
      ->capture_default_str();
  app.add_option("--decode-cap-wait-ms", c->decode_cap_wait_ms,
                 "--role decode: --decode-step-cap yields to --max-step-ms while a prompt has waited this long "
                 "for its first token (first tokens before even inter-token gaps when the prefill pool is "
                 "short); 0: it never yields")
      ->capture_default_str();
  app.add_option("--prefill-rate", c->prefill_rate,
                 "prefill tokens/s announced to routers until this worker's load reports measure one; 0: measured "
                 "at start-up by timing a few prefill steps within --max-step-ms (the mock: its cost model)")
      ->capture_default_str();
  app.add_option("--device-id", c->device_id,
                 "the compute device as the workers sharing it name it: routers count their prefill queues "
                 "against it together (default: cuda the GPU's UUID, cpu the host name + \"/cpu\", mock none)");
  app.add_option("--kv-cache-bytes", c->kv_cache_bytes,
                 "device KV cache bytes, per GPU with --tensor-parallel (0: backend default)")
      ->capture_default_str();
  app.add_option("--gpu-memory-fraction", c->gpu_memory_fraction,
                 "cuda: share of free GPU memory for the KV cache when --kv-cache-bytes is 0")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", c->kv_cache_dtype,
                 "KV cache element type: auto (the backend's: cuda bf16, cpu fp32), bf16, or fp8 / fp8_e4m3 "
                 "(cuda on sm_89+: half the bytes per block, twice the blocks; scales from the checkpoint's "
                 "k_scale/v_scale or calibrated at start-up)")
      ->capture_default_str();
  app.add_option("--host-cache-bytes", c->host_cache_bytes, "host-memory KV tier bytes (0: none)")
      ->capture_default_str();
  app.add_option("--offload-min-priority", c->offload_min_priority,
                 "evicted blocks of at least this retention priority move to the host tier (a request that "
                 "pulled its prefix from another worker stores its blocks at 34: 34 offloads those too)")
      ->capture_default_str();
  app.add_flag("--events-include-tokens", c->events_include_tokens, "stored KV events carry the block tokens");
  app.add_option("--max-attention-window", c->max_attention_window,
                 "attention window per layer in tokens, N[,N...] repeated to the number of layers (TensorRT-LLM's "
                 "max_attention_window); a window >= the context is full attention (default: config.json's)")
      ->delimiter(',');
  app.add_option("--sink-tokens", c->sink_tokens,
                 "StreamingLLM attention sinks: the first tokens every windowed layer keeps (needs a window)")
      ->capture_default_str();
  app.add_flag("--streaming-llm", c->streaming_llm,
               "StreamingLLM on the windowed layers: RoPE positions within the cache and a dense context phase "
               "(the prompt attends to the whole prompt; then only the sinks and the window are kept)");
  app.add_option("--attention-chunk-size", c->attention_chunk_size,
                 "chunked attention (Llama 4): a query sees only its own chunk of this many tokens, a multiple of "
                 "--block-size (default: config.json's attention_chunk_size)")
      ->capture_default_str();
  app.add_option("--lora", c->loras,
                 "NAME=DIR (repeatable): serve the PEFT LoRA adapter in DIR (adapter_config.json, "
                 "adapter_model.safetensors) to requests whose model is NAME; more load at run time (LoadLora)");
  app.add_option("--max-loras", c->max_loras,
                 "LoRA adapters on the device at once; the others wait in host memory and are loaded when a request "
                 "needs one (0: no adapters)")
      ->capture_default_str();
  app.add_option("--max-lora-rank", c->max_lora_rank, "the largest LoRA rank served (1..64)")->capture_default_str();
  app.add_option("--shutdown-grace-s", c->shutdown_grace_s, "seconds in-flight requests get after SIGTERM")
      ->capture_default_str();
  app.add_option("--mock-step-base-us", c->mock_cost.step_base_us, "mock: fixed cost per step (a), µs")
      ->capture_default_str();
  app.add_option("--mock-prefill-token-us", c->mock_cost.prefill_token_us, "mock: per prefill token (b), µs")
      ->capture_default_str();
  app.add_option("--mock-decode-seq-us", c->mock_cost.decode_seq_us, "mock: per decoding sequence (c), µs")
      ->capture_default_str();
  app.add_option("--mock-kv-token-read-us", c->mock_cost.kv_token_read_us, "mock: per KV token read (d), µs")
      ->capture_default_str();
  app.add_option("--mock-tier-copy-us-per-mib", c->mock_cost.tier_copy_us_per_mib,
                 "mock: per MiB of KV offloaded to or onboarded from the host tier (e), µs")
      ->capture_default_str();
  app.add_flag("--mock-verify-kv", c->mock_verify_kv, "mock: check KV contents through a shadow cache (tests)");
  app.add_option("--mock-workers", c->mock_workers, "mock: workers in this process (fleet benchmarks)")
      ->capture_default_str();
  app.add_option("--port-stride", c->port_stride, "port offset between the workers of one process")
      ->capture_default_str();
}

Status WorkerConfig::Validate() const {
  if (backend != "auto" && backend != "mock" && backend != "cpu" && backend != "cuda") {
    return InvalidArgument("--backend must be auto, cuda, cpu or mock, got '" + backend + "'");
  }
  if (backend != "mock" && model_dir.empty()) {
    return InvalidArgument("--model-dir is required for --backend " + backend +
                           (backend == "auto" ? " (the default; a simulated worker needs --backend mock)" : ""));
  }
  if (block_size == 0 || (block_size & (block_size - 1)) != 0) {
    return InvalidArgument("--block-size " + std::to_string(block_size) + " is not a power of two (1, 2, 4, ...)");
  }
  if (!router_key.empty() && (router.empty() || (curve_keypair.empty() && registration_keypair.empty()))) {
    return InvalidArgument("--router-key needs --router and a key to register with (--registration-keypair or "
                           "--curve-keypair)");
  }
  if (!registration_keypair.empty() && router_key.empty()) {
    return InvalidArgument("--registration-keypair needs --router-key (the router's public key)");
  }
  if (routing_block_size != 0 &&
      ((routing_block_size & (routing_block_size - 1)) != 0 || routing_block_size < block_size)) {
    return InvalidArgument("--routing-block-size " + std::to_string(routing_block_size) +
                           " is not 0 or a power of two >= --block-size " + std::to_string(block_size));
  }
  if (max_num_tokens == 0 || max_num_tokens % block_size != 0) {
    return InvalidArgument("--max-num-tokens must be a positive multiple of --block-size");
  }
  if (max_batch_size == 0) return InvalidArgument("--max-batch-size must be >= 1");
  KVF_ASSIGN_OR_RETURN(const WorkerRole parsed_role, ParseWorkerRole(role));
  if (parsed_role != WorkerRole::kBoth && transfer.empty()) {
    return InvalidArgument("--role " + role + " needs KV transfer (--transfer): split requests move their KV between workers");
  }
  // The model's shape is checked by the backend (heads, KV heads, intermediate size).
  if (tensor_parallel != 1 && tensor_parallel != 2 && tensor_parallel != 4 && tensor_parallel != 8) {
    return InvalidArgument("--tensor-parallel must be 1, 2, 4 or 8, got " + std::to_string(tensor_parallel));
  }
  if (transfer_nccl && (backend == "cpu" || backend == "mock")) {  // auto: checked again once resolved
    return InvalidArgument("--transfer-nccl moves device KV blocks by NCCL; it needs --backend cuda, not " + backend);
  }
  if (transfer_nccl && transfer.empty()) {
    return InvalidArgument("--transfer-nccl needs KV transfer (--transfer): its answers go over the transfer socket");
  }
  if (device != 0 && (backend == "cpu" || backend == "mock")) {  // auto: checked again once resolved
    return InvalidArgument("--device " + std::to_string(device) + " picks a GPU; it needs --backend cuda");
  }
  if (!std::isfinite(max_step_ms) || (max_step_ms != 0 && (max_step_ms < 1 || max_step_ms > 60'000))) {
    return InvalidArgument("--max-step-ms must be 0 (no bound) or between 1 and 60000, got " +
                           NumberText(max_step_ms));
  }
  if (!std::isfinite(decode_step_cap) || (decode_step_cap != 0 && (decode_step_cap < 1 || decode_step_cap > 100))) {
    return InvalidArgument("--decode-step-cap must be 0 (no cap) or between 1 and 100, got " +
                           NumberText(decode_step_cap));
  }
  if (!std::isfinite(decode_cap_wait_ms) || decode_cap_wait_ms < 0 || decode_cap_wait_ms > 3'600'000) {
    return InvalidArgument("--decode-cap-wait-ms must be between 0 (never yields) and 3600000, got " +
                           NumberText(decode_cap_wait_ms));
  }
  if (!std::isfinite(prefill_rate) || prefill_rate < 0 || prefill_rate > 1e9) {
    return InvalidArgument("--prefill-rate must be 0 (measure) or a rate in tokens/s up to 1e9, got " +
                           NumberText(prefill_rate));
  }
  if (device_id.size() > 256 ||
      std::any_of(device_id.begin(), device_id.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; })) {
    return InvalidArgument("--device-id must be at most 256 bytes without control characters");
  }
  // The rest of the attention rules need the model: backend::CheckAttentionOptions.
  for (int32_t w : max_attention_window) {
    if (w <= 0) return InvalidArgument("--max-attention-window: window " + std::to_string(w) + " is not a positive token count");
  }
  if (sink_tokens < 0) return InvalidArgument("--sink-tokens must be >= 0");
  if (attention_chunk_size < 0 || attention_chunk_size % static_cast<int32_t>(block_size) != 0) {
    return InvalidArgument("--attention-chunk-size " + std::to_string(attention_chunk_size) +
                           " is not a multiple of --block-size " + std::to_string(block_size));
  }
  auto dtype = backend::ParseKvCacheDtype(kv_cache_dtype);
  if (!dtype.ok()) return dtype.status();
  if (backend == "cpu" && *dtype != backend::KvCacheDtype::kAuto) {
    return InvalidArgument("--kv-cache-dtype " + kv_cache_dtype +
                           " needs --backend cuda: the cpu backend keeps its KV cache in fp32 (auto)");
  }
  if (offload_min_priority > 100) return InvalidArgument("--offload-min-priority must be 0..100");
  if (gpu_memory_fraction <= 0 || gpu_memory_fraction > 1) return InvalidArgument("--gpu-memory-fraction must be in (0, 1]");
  if (shutdown_grace_s < 0) return InvalidArgument("--shutdown-grace-s must be >= 0");
  if (mock_workers == 0) return InvalidArgument("--mock-workers must be >= 1");
  if (mock_workers > 1 && backend != "mock") return InvalidArgument("--mock-workers needs --backend mock");
  if (http_port < 0 || http_port > 65535) return InvalidArgument("--http-port must be 0..65535");
  if (max_loras < 0) return InvalidArgument("--max-loras must be >= 0, got " + std::to_string(max_loras));
  if (max_lora_rank < 1 || max_lora_rank > 64) {
    return InvalidArgument("--max-lora-rank must be 1..64, got " + std::to_string(max_lora_rank));
  }
  if (!loras.empty() && max_loras == 0) return InvalidArgument("--lora needs --max-loras >= 1");
  std::vector<std::string> names;
  for (const std::string& flag : loras) {
    const size_t eq = flag.find('=');
    if (eq == std::string::npos) return InvalidArgument("--lora " + flag + ": expected NAME=DIR");
    const std::string name = flag.substr(0, eq), dir = flag.substr(eq + 1);
    if (name.empty()) return InvalidArgument("--lora " + flag + ": the NAME is empty");
    if (name == ModelName()) {
      return InvalidArgument("--lora " + flag + ": NAME '" + name + "' is the served model's name (--model-name)");
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return InvalidArgument("--lora " + flag + ": NAME '" + name + "' is given twice");
    }
    names.push_back(name);
    if (dir.empty() || !std::filesystem::is_directory(dir)) {
      return InvalidArgument("--lora " + flag + ": '" + dir + "' is not a directory");
    }
  }
  for (const std::string* e : {&requests, &events, &replay}) {
    if (EndpointPort(*e) < 0) return InvalidArgument("endpoint '" + *e + "' needs a port");
  }
  return mock_cost.Validate();
}

std::string WorkerConfig::ResolveBackend() {
  if (backend != "auto") return "";
  backend::BackendChoice choice = backend::ChooseBackend();
  backend = choice.name;
  return choice.why;
}

std::vector<std::pair<std::string, std::string>> WorkerConfig::LoraDirs() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& flag : loras) {
    const size_t eq = flag.find('=');
    out.emplace_back(flag.substr(0, eq), flag.substr(eq + 1));
  }
  return out;
}

std::string WorkerConfig::ModelName() const {
  if (!model_name.empty()) return model_name;
  if (!model_dir.empty()) {
    std::filesystem::path p(model_dir);
    std::string name = p.filename().string();
    if (name.empty()) name = p.parent_path().filename().string();
    if (!name.empty()) return name;
  }
  return "mock";
}

int EndpointPort(const std::string& endpoint) {
  auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 >= endpoint.size()) return -1;
  try {
    size_t used = 0;
    int port = std::stoi(endpoint.substr(colon + 1), &used);
    return used == endpoint.size() - colon - 1 ? port : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

std::string WithPort(const std::string& endpoint, int port, const std::string& host) {
  auto scheme_end = endpoint.find("://");
  auto colon = endpoint.rfind(':');
  std::string scheme = scheme_end == std::string::npos ? "tcp" : endpoint.substr(0, scheme_end);
  std::string h = scheme_end == std::string::npos ? "" : endpoint.substr(scheme_end + 3, colon - scheme_end - 3);
  if ((h == "*" || h == "0.0.0.0") && !host.empty()) h = host;
  return scheme + "://" + h + ":" + std::to_string(port);
}

WorkerConfig WorkerConfig::ForInstance(uint32_t index) const {
  WorkerConfig c = *this;
  if (index == 0) return c;
  const int shift = static_cast<int>(index * port_stride);
  auto shifted = [shift](int port) { return port == 0 ? 0 : port + shift; };  // 0 stays ephemeral
  c.requests = WithPort(requests, shifted(EndpointPort(requests)));
  c.events = WithPort(events, shifted(EndpointPort(events)));
  c.replay = WithPort(replay, shifted(EndpointPort(replay)));
  if (!transfer.empty() && EndpointPort(transfer) > 0) c.transfer = WithPort(transfer, shifted(EndpointPort(transfer)));
  c.http_port = shifted(http_port);
  if (!worker_id.empty()) c.worker_id = worker_id + "-" + std::to_string(index);
  return c;
}

}  // namespace kvfleet::server
