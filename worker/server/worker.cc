#include "worker/server/worker.h"

#include <unistd.h>

#include <thread>

#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include "common/curve_keys.h"
#include "common/http/metrics.h"
#include "common/http/server.h"
#include "common/log.h"
#include "common/tokenizer_files.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
#include "worker/engine/prefill_calibration.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/event_publisher.h"
#include "worker/server/grammar_vocabulary.h"
#include "worker/server/kv_pulls.h"
#include "worker/server/registration.h"
#include "worker/server/request_server.h"
#include "worker/server/transfer_metrics.h"
#include "worker/server/worker_loop.h"
#include "worker/server/worker_metrics.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::server {

namespace config {
// The KV gauges read the manager's full statistics; a few times a second is plenty for a
// Prometheus scrape and keeps the per-step cost flat.
constexpr DurationNs kKvMetricsInterval = 250 * kNsPerMs;
// After the loop's last publish on shutdown: the publisher thread polls every 20 ms, so
// this lets it send the final batches before it is stopped.
constexpr auto kPublisherDrain = std::chrono::milliseconds(100);
}  // namespace config

namespace {

// The KV gauges, at most every kKvMetricsInterval: after steps and while idle.
class KvGauges {
 public:
  KvGauges(WorkerMetrics* metrics, const kv::KvCacheManager* kv, const Clock* clock, TransferMetrics* transfer,
           const KvPulls* pulls, const transfer::TransferService* service)
      : metrics_(metrics), kv_(kv), clock_(clock), transfer_(transfer), pulls_(pulls), service_(service) {}
  void MaybeUpdate() {
    const TimeNs now = clock_->Now();
    if (now - last_ < config::kKvMetricsInterval) return;
    metrics_->UpdateKv(kv_->Stats());
    if (service_ != nullptr) transfer_->Update(pulls_->stats(), service_->Stats());
    last_ = now;
  }

 private:
  WorkerMetrics* metrics_;
  const kv::KvCacheManager* kv_;
  const Clock* clock_;
  TransferMetrics* transfer_;
  const KvPulls* pulls_;
  const transfer::TransferService* service_;
  TimeNs last_ = 0;
};

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

}  // namespace

Worker::Worker(const WorkerConfig& config) : config_(config) {}

Worker::~Worker() {
  if (registration_) registration_->Stop(false);
  if (requests_) requests_->Stop();
  if (http_) http_->Stop();
}

Result<std::unique_ptr<Worker>> Worker::Start(const WorkerConfig& config, zmq::context_t& context) {
  KVF_RETURN_IF_ERROR(config.Validate());
  WorkerConfig resolved = config;
  const std::string why = resolved.ResolveBackend();
  if (Status st = resolved.Validate(); !st.ok()) {  // with the backend chosen (--kv-cache-dtype needs cuda)
    return why.empty() ? st : st.WithContext("--backend auto picked " + resolved.backend + " (" + why + ")");
  }
  auto log = Logger("worker");
  if (resolved.backend == "cuda" && !why.empty()) {
    log->info("backend cuda (--backend auto: {})", why);
  } else if (!why.empty()) {
    log->warn("backend cpu (--backend auto: {}); --backend names one", why);
  } else if (resolved.backend == "mock" && !resolved.model_dir.empty()) {
    log->warn("backend mock (--backend mock): a simulated model whose tokens are random, served as '{}' although "
              "--model-dir names a real one", resolved.ModelName());
  }
  std::unique_ptr<Worker> w(new Worker(resolved));
  KVF_RETURN_IF_ERROR(w->Init(context));
  return w;
}

const std::string& Worker::requests_endpoint() const { return requests_->bound_endpoint(); }
const std::string& Worker::events_endpoint() const { return publisher_->events_endpoint(); }
uint16_t Worker::http_port() const { return http_->port(); }
transfer::TransferStats Worker::transfer_stats() const {
  return transfer_ != nullptr ? transfer_->Stats() : transfer::TransferStats{};
}

Status Worker::Init(zmq::context_t& context) {
  auto log = Logger("worker");
  SystemClock* clock = SystemClock::Default();
  const std::string host = config_.advertise_host.empty() ? HostName() : config_.advertise_host;
  model_name_ = config_.ModelName();

  // 1. HTTP first: /health answers and /ready says false while the model loads.
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<WorkerMetrics>(*registry_);
  http::RegisterBuildInfo(*registry_);
  http::Routes routes;
  routes.AddSync("GET", "/health", [](const http::Request&) { return http::Response{200, "application/json", {}, R"({"status":"ok"})"}; });
  routes.AddSync("GET", "/ready", [this](const http::Request&) {
    const bool ready = ready_.load(std::memory_order_acquire) && !stopping_.load(std::memory_order_acquire);
    nlohmann::json body = {{"ready", ready}, {"model", model_name_}, {"worker_id", worker_id_}};
    return http::Response{ready ? 200 : 503, "application/json", {}, body.dump()};
  });
  http::AddMetricsRoute(routes, registry_);
  http::ServerOptions http_options;
  http_options.address = config_.http_host;
  http_options.port = static_cast<uint16_t>(config_.http_port);
  http_options.io_threads = 1;
  KVF_ASSIGN_OR_RETURN(http_, http::Server::Start(http_options, std::move(routes)));

  // 2. The requests socket is bound early so the worker id can name its port.
  RequestServerOptions request_options;
  request_options.endpoint = config_.requests;
  request_options.curve.server_keypair_file = config_.curve_keypair;
  request_options.curve.authorized_keys_file = config_.curve_authorized_keys;
  request_options.on_first_token = [metrics = metrics_.get()](DurationNs ttft) { metrics->OnFirstToken(ttft); };
  request_options.on_error = [metrics = metrics_.get()](WorkerErrorCode code) { metrics->OnRefused(code); };
  KVF_ASSIGN_OR_RETURN(requests_, RequestServer::Start(context, request_options, clock));
  worker_id_ = config_.worker_id.empty() ? host + ":" + std::to_string(EndpointPort(requests_->bound_endpoint()))
                                         : config_.worker_id;

  // 3. The model.
  backend::BackendOptions bo;
  bo.model_dir = config_.model_dir;
  bo.block_size = static_cast<int32_t>(config_.block_size);
  bo.max_num_tokens = static_cast<int32_t>(config_.max_num_tokens);
  bo.max_batch_size = static_cast<int32_t>(config_.max_batch_size);
  bo.max_context = config_.max_context;
  bo.kv_cache_bytes = config_.kv_cache_bytes;
  bo.kv_memory_fraction = config_.gpu_memory_fraction;
  bo.host_kv_bytes = config_.host_cache_bytes;
  bo.kv_cache_dtype = *backend::ParseKvCacheDtype(config_.kv_cache_dtype);  // checked by Validate
  bo.attention.max_attention_window = config_.max_attention_window;
  bo.attention.sink_tokens = config_.sink_tokens;
  bo.attention.streaming_llm = config_.streaming_llm;
  bo.attention.attention_chunk_size = config_.attention_chunk_size;
  bo.max_loras = config_.max_loras;
  bo.max_lora_rank = config_.max_lora_rank;
  bo.tensor_parallel = config_.tensor_parallel;
  bo.device = config_.device;
  if (config_.backend == "mock") {
    bo.extra["mock.step_base_us"] = std::to_string(config_.mock_cost.step_base_us);
    bo.extra["mock.prefill_token_us"] = std::to_string(config_.mock_cost.prefill_token_us);
    bo.extra["mock.decode_seq_us"] = std::to_string(config_.mock_cost.decode_seq_us);
    bo.extra["mock.kv_token_read_us"] = std::to_string(config_.mock_cost.kv_token_read_us);
    bo.extra["mock.tier_copy_us_per_mib"] = std::to_string(config_.mock_cost.tier_copy_us_per_mib);
    bo.extra["mock.verify_kv"] = config_.mock_verify_kv ? "1" : "0";
    if (!config_.device_id.empty()) bo.extra["mock.device"] = config_.device_id;  // this process's mocks naming it take turns
  }
  const TimeNs load_start = clock->Now();
  auto backend = backend::CreateBackend(config_.backend, bo);
  if (!backend.ok()) return backend.status().WithContext("backend " + config_.backend);
  backend_ = std::move(*backend);
  if (!config_.loras.empty() && backend_->max_loras() == 0) {
    return InvalidArgument("--lora: the " + config_.backend + " backend serves no LoRA adapters");
  }
  log->info("{} backend ready for {} in {:.2f} s", config_.backend, model_name_,
            static_cast<double>(clock->Now() - load_start) / kNsPerSec);
  // Before the KV manager: the calibration's steps write blocks no sequence owns yet.
  KVF_RETURN_IF_ERROR(InitPrefillRate(clock));

  // 4. Events and the KV cache manager over the backend's memory.
  events::EventPublisherOptions po;
  po.worker_id = worker_id_;
  po.events_endpoint = config_.events;
  po.replay_endpoint = config_.replay;
  po.ring_batches = config_.event_ring_batches;
  po.curve.server_keypair_file = config_.curve_keypair;
  po.curve.authorized_keys_file = config_.curve_authorized_keys;
  KVF_ASSIGN_OR_RETURN(publisher_, events::EventPublisher::Make(po, clock, registry_.get()));
  const auto pools = backend_->pools();
  if (pools.empty()) return Internal("the backend reports no KV pool");
  backend::KvMemorySettings memory = backend::KvMemoryOf(*backend_);
  memory.offload_min_priority = static_cast<uint8_t>(config_.offload_min_priority);
  memory.events_include_tokens = config_.events_include_tokens;
  memory.routing_block_size = config_.routing_block_size;
  KVF_ASSIGN_OR_RETURN(kv_, kv::KvCacheManager::Make(backend::KvCacheConfigFor(backend_->config(), memory, bo.attention),
                                                     &backend_->block_copier(), clock));
  KVF_RETURN_IF_ERROR(backend::CheckPoolsAgree(kv_->pools(), pools));

  // 5. The engine. A request never needs more blocks than the cache has.
  engine::EngineOptions eo;
  eo.model_name = model_name_;
  eo.scheduler.max_num_tokens = config_.max_num_tokens;
  eo.scheduler.max_batch_size = config_.max_batch_size;
  eo.scheduler.max_step_ms = config_.max_step_ms;
  // A decode-role worker keeps its steps near pure-decode time (scheduler.h).
  eo.scheduler.max_step_over_decodes = config_.role == "decode" ? config_.decode_step_cap : 0;
  eo.scheduler.max_capped_wait_ms = config_.decode_cap_wait_ms;
  if (config_.role != "decode" && (config_.decode_step_cap != engine::config::kDecodeRoleStepOverDecodes ||
                                   config_.decode_cap_wait_ms != engine::config::kDecodeRoleMaxCappedWaitMs)) {
    log->warn("--decode-step-cap and --decode-cap-wait-ms act on --role decode only; this worker's role is {}",
              config_.role);
  }
  uint64_t max_context = static_cast<uint64_t>(backend_->max_context());
  uint64_t cache_tokens = UINT64_MAX;
  for (const auto& l : kv_->pools()) {
    if (!l.windowed()) cache_tokens = std::min<uint64_t>(cache_tokens, uint64_t{l.device_blocks} * config_.block_size);
  }
  if (max_context > cache_tokens) {
    log->warn("max context {} tokens exceeds the KV cache ({} tokens): requests are limited to {}", max_context,
              cache_tokens, cache_tokens);
    max_context = cache_tokens;
  }
  eo.limits.max_context = static_cast<uint32_t>(max_context);
  // A windowed pool holds a prompt whole for a while (it allocates the prompt's blocks at once),
  // then at most MaxSequenceBlocks however long the sequence runs: refuse a cache that cannot.
  for (uint32_t p = 0; p < kv_->pools().size(); ++p) {
    const kv::PoolLayout& l = kv_->pools()[p];
    const uint32_t bound = kv_->MaxSequenceBlocks(p);
    if (bound == 0) continue;
    if (l.device_blocks < bound) {
      return InvalidArgument("the KV pool of window " + std::to_string(l.window) + " has " +
                             std::to_string(l.device_blocks) + " blocks; one sequence may hold " + std::to_string(bound) +
                             " (sinks, window and first-window blocks): raise --kv-cache-bytes");
    }
    eo.limits.max_prompt = std::min<uint64_t>(eo.limits.max_prompt, uint64_t{l.device_blocks} * config_.block_size);
  }
  eo.limits.max_queued = config_.max_queued;
  eo.limits.vocab_size = static_cast<uint32_t>(backend_->config().vocab_size);
  for (int64_t e : backend_->config().eos_token_ids) eo.eos_token_ids.push_back(static_cast<TokenId>(e));
  eo.max_lora_rank = config_.max_lora_rank;
  KVF_RETURN_IF_ERROR(eo.Validate(config_.block_size));
  engine_ = std::make_unique<engine::Engine>(eo, backend_.get(), kv_.get(), clock);
  KVF_RETURN_IF_ERROR(InitLoras());
  InitStructuredOutputs(eo.eos_token_ids);
  metrics_->UpdateStepModel(engine_->scheduler().step_model(), config_.max_step_ms);  // the prior, until a step

  KVF_RETURN_IF_ERROR(InitTransfer(host, clock));

  WorkerLoopOptions lo;
  lo.model_name = model_name_;
  lo.shutdown_grace = static_cast<DurationNs>(config_.shutdown_grace_s * kNsPerSec);
  transfer_metrics_ = std::make_unique<TransferMetrics>(*registry_);
  auto gauges = std::make_shared<KvGauges>(metrics_.get(), kv_.get(), clock, transfer_metrics_.get(), pulls_.get(),
                                           transfer_.get());
  loop_ = std::make_unique<WorkerLoop>(lo, engine_.get(), kv_.get(), publisher_.get(), requests_.get(), clock,
                                       [this, gauges] {
                                         if (!engine_->HasWork()) gauges->MaybeUpdate();
                                       });
  loop_->SetPulls(pulls_.get());
  loop_->SetLoraObserver([this] {
    metrics_->UpdateLoras(engine_->loras());
    UpdateHelloLoras(true);
  });
  loop_->SetStepObserver([this, gauges](const engine::StepReport& step, const std::vector<engine::RequestOutput>& outs) {
    metrics_->OnStep(step);
    if (engine_->loras().counters().loads != hello_lora_loads_) {  // a measured load time for the next Hello
      metrics_->UpdateLoras(engine_->loras());
      UpdateHelloLoras(false);
    }
    metrics_->UpdateStepModel(engine_->scheduler().step_model(), config_.max_step_ms);
    gauges->MaybeUpdate();
    metrics_->OnOutputs(outs);
  });

  // 6. The Hello: sent to the router given by --router (Registration), and the answer to a
  // Describe from a router that was given this worker's address. Kept (hello_) so adapter
  // changes can re-send it.
  metrics_->UpdateLoras(engine_->loras());
  BuildHello(host, eo.limits.max_context);
  UpdateHelloLoras(false);
  if (!config_.router.empty()) {
    RegistrationOptions ro;
    ro.router_endpoint = config_.router;
    if (!config_.router_key.empty()) {
      KVF_ASSIGN_OR_RETURN(ro.keys, LoadCurveKeyPair(config_.registration_keypair.empty()
                                                          ? config_.curve_keypair
                                                          : config_.registration_keypair));
      KVF_ASSIGN_OR_RETURN(ro.router_public_key, LoadCurvePublicKey(config_.router_key));
    }
    KVF_ASSIGN_OR_RETURN(registration_, Registration::Start(context, ro, hello_));
  }
  ready_.store(true, std::memory_order_release);
  log->info("worker {} serving {} on {} (events {}, http :{}), block size {}, max context {}", worker_id_,
            model_name_, requests_->bound_endpoint(), publisher_->events_endpoint(), http_->port(),
            config_.block_size, eo.limits.max_context);
  return Status::Ok();
}

Status Worker::InitPrefillRate(const Clock* clock) {
  auto log = Logger("worker");
  if (config_.prefill_rate > 0) {
    prefill_rate_ = config_.prefill_rate;
    log->info("announcing a prefill rate of {:.0f} tokens/s (--prefill-rate)", prefill_rate_);
    return Status::Ok();
  }
  prefill_rate_ = backend_->ExpectedPrefillTokensPerSecond(config_.max_num_tokens, config_.max_step_ms);
  if (prefill_rate_ > 0) {
    log->info("announcing a prefill rate of {:.0f} tokens/s (the {} backend's cost model)", prefill_rate_,
              backend_->name());
    return Status::Ok();
  }
  engine::PrefillCalibrationOptions options;
  options.max_tokens = config_.max_num_tokens;
  options.max_step_ms = config_.max_step_ms;
  auto measured = engine::MeasurePrefillRate(backend_.get(), options, clock);
  if (!measured.ok()) return measured.status().WithContext("measuring the prefill rate (--prefill-rate sets one)");
  prefill_rate_ = measured->tokens_per_second;
  log->info("announcing a prefill rate of {:.0f} tokens/s, measured: a {}-token step{} ({} timed steps up to {} "
            "tokens, {:.0f} ms in all)",
            prefill_rate_, measured->step_tokens,
            config_.max_step_ms > 0 ? fmt::format(" within --max-step-ms {}", config_.max_step_ms) : std::string(),
            measured->steps.size(), measured->steps.back().tokens,
            static_cast<double>(measured->elapsed) / kNsPerMs);
  return Status::Ok();
}

Status Worker::InitTransfer(const std::string& host, const Clock* clock) {
  KvPullsOptions po;
  po.model = model_name_;
  po.deadline = static_cast<DurationNs>(config_.transfer_deadline_ms) * kNsPerMs;
  // A keyed worker moves KV only over CURVE, to the workers its allow-list names: without
  // one it serves and makes no pulls rather than fall back to plain TCP.
  const bool keyed_without_peers = !config_.curve_keypair.empty() && config_.transfer_authorized_keys.empty();
  if (!config_.transfer.empty() && keyed_without_peers) {
    Logger("worker")->info("KV transfer off: --curve-keypair without --transfer-authorized-keys (the workers "
                           "that may pull from this one)");
  }
  if (!config_.transfer.empty() && !keyed_without_peers) {
    transfer::TransferOptions to;
    to.bind = config_.transfer;
    to.insecure = config_.transfer_insecure;
    to.default_deadline = po.deadline;
    if (config_.backend == "mock") to.simulated_bandwidth_bytes_per_s = config_.mock_transfer_bytes_per_s;
    to.test_corrupt_served_data = config_.test_corrupt_served_blocks;
    if (!config_.curve_keypair.empty()) {
      KVF_ASSIGN_OR_RETURN(to.keypair, LoadCurveKeyPair(config_.curve_keypair));
      KVF_ASSIGN_OR_RETURN(to.authorized_keys, LoadAuthorizedKeys(config_.transfer_authorized_keys));
      transfer_key_ = to.keypair->public_key;
    }
    RequestServer* requests = requests_.get();
    to.on_ready = [requests] { requests->Wake(); };
    auto service = transfer::TransferService::Start(std::move(to), clock);
    if (!service.ok()) return service.status().WithContext("--transfer " + config_.transfer);
    transfer_ = std::move(*service);
    const std::string& bound = transfer_->endpoint();
    transfer_endpoint_ = WithPort(bound, EndpointPort(bound), host);  // as the Hello's other endpoints
  }
  po.own_endpoint = transfer_endpoint_;
  if (config_.transfer_ipc) po.host_id = ThisHostId();
  if (config_.transfer_nccl && transfer_ != nullptr) {
    RequestServer* requests = requests_.get();
    auto nccl = backend_->MakeKvNccl([requests] { requests->Wake(); });
    if (!nccl.ok()) return nccl.status().WithContext("--transfer-nccl");
    kv_nccl_ = std::move(*nccl);
  }
  pulls_ = std::make_unique<KvPulls>(po, transfer_.get(), kv_.get(), backend_.get(), engine_.get(), kv_nccl_.get());
  if (transfer_ != nullptr && !pulls_->layout()) {
    Logger("worker")->info("KV transfer off: {}", pulls_->unsupported());
  } else if (transfer_ != nullptr) {
    Logger("worker")->info("KV transfer on {} ({} blocks of {} bytes{}{})", transfer_endpoint_,
                           transfer::KvDtypeName(pulls_->layout()->dtype), pulls_->layout()->BytesPerBlock(),
                           pulls_->device() ? "; CUDA IPC on this host" : "", pulls_->nccl() ? "; NCCL" : "");
  }
  if (config_.role != "both" && (transfer_ == nullptr || !pulls_->layout())) {
    // A split request's KV must cross between the pools: a worker that cannot move it has no part there.
    return FailedPrecondition("--role " + config_.role + " needs KV transfer, which is off: " +
                              (transfer_ == nullptr ? std::string("see --transfer and --transfer-authorized-keys")
                                                    : pulls_->unsupported()));
  }
  return Status::Ok();
}

// Constrained decoding needs a backend that masks logits and the model's vocabulary; a
// worker without either serves unconstrained requests and says so in its Hello.
void Worker::InitStructuredOutputs(const std::vector<TokenId>& eos_token_ids) {
  if (!backend_->applies_token_bitmask()) {
    Logger("worker")->info("no constrained decoding: the {} backend does not mask logits", backend_->name());
    return;
  }
  auto vocab = LoadGrammarVocabulary(config_.model_dir, static_cast<size_t>(backend_->config().vocab_size),
                                     eos_token_ids);
  if (!vocab.ok()) {
    Logger("worker")->warn("no constrained decoding: the grammar vocabulary: {}", vocab.status().ToString());
    return;
  }
  backend_->UseVocabulary(*vocab);
  structured_ = std::make_shared<engine::StructuredOutputs>(std::move(*vocab));
  requests_->SetStructuredOutputs(structured_);
}

Status Worker::InitLoras() {
  const model::ModelConfig model = backend_->config();
  const int32_t slots = backend_->max_loras();
  const std::string model_name = model_name_, model_dir = config_.model_dir, backend = config_.backend;
  auto load = [=](const std::string& name, const std::string& dir) -> Result<std::shared_ptr<const model::LoraAdapter>> {
    if (slots == 0) {
      return FailedPrecondition("this worker serves no LoRA adapters (--max-loras 0, or the " + backend +
                                " backend has no adapter slots)");
    }
    if (name.empty()) return InvalidArgument("the LoRA adapter's name is empty");
    if (name == model_name) return InvalidArgument("the LoRA adapter's name '" + name + "' is the served model's");
    auto adapter = model::LoadLoraAdapter(name, dir, model, model_name, model_dir);
    // Missing files are a bad request here (Contract 3: invalidRequest), not an unknown adapter.
    if (!adapter.ok() && adapter.status().code() == StatusCode::kNotFound) return InvalidArgument(adapter.status().message());
    if (!adapter.ok()) return adapter.status();
    return std::make_shared<const model::LoraAdapter>(*std::move(adapter));
  };
  for (const auto& [name, dir] : config_.LoraDirs()) {
    auto adapter = load(name, dir);
    Status st = adapter.ok() ? engine_->AddLora(*adapter) : adapter.status();
    if (!st.ok()) return st.WithContext("--lora " + name + "=" + dir);
    Logger("worker")->info("serving LoRA adapter '{}' (rank {}) from {}", name, (*adapter)->rank, dir);
  }
  requests_->SetLoraLoader(load);
  return Status::Ok();
}

void Worker::BuildHello(const std::string& host, uint32_t max_context) {
  WorkerHello& hello = hello_;
  hello.name = worker_id_;
  hello.model = model_name_;
  // Routers hash and index blocks of G tokens, the events' (token-level KV: 16 by default).
  hello.block_size = config_.routing_block_size != 0 ? config_.routing_block_size
                                                      : kv::DefaultRoutingBlockSize(config_.block_size);
  if (hello.block_size != config_.block_size) hello.kv_block_size = config_.block_size;
  hello.max_context = max_context;
  hello.device_blocks = kv_->TotalBlocks(kv::Tier::kDevice);
  hello.host_blocks = kv_->TotalBlocks(kv::Tier::kHost);
  hello.requests_endpoint = WithPort(requests_->bound_endpoint(), EndpointPort(requests_->bound_endpoint()), host);
  hello.events_endpoint = WithPort(publisher_->events_endpoint(), EndpointPort(publisher_->events_endpoint()), host);
  hello.replay_endpoint = WithPort(publisher_->replay_endpoint(), EndpointPort(publisher_->replay_endpoint()), host);
  hello.http_endpoint = "http://" + host + ":" + std::to_string(http_->port());
  hello.backend = config_.backend;
  hello.epoch = publisher_->epoch();
  for (uint32_t i = 0; i < kv_->pools().size(); ++i) {
    const kv::PoolLayout& l = kv_->pools()[i];
    hello.kv_pools.push_back(KvPoolAnnounce{l.window, l.sink_tokens, l.dense_context, l.attention_chunk,
                                            static_cast<uint32_t>(l.layers.size()), l.device_blocks, l.host_blocks,
                                            kv_->reuse_enabled(), kv_->ReuseLimit(i)});
  }
  // Routers refuse a worker whose tokenizer is not theirs. A mock's ids mean nothing: none.
  if (config_.backend != "mock") {
    auto digest = TokenizerDigest(config_.model_dir);
    if (digest.ok()) {
      hello.tokenizer_digest = *digest;
    } else {
      Logger("worker")->warn("announcing no tokenizer digest: {}", digest.status().ToString());
    }
  }
  hello.max_loras = static_cast<uint32_t>(backend_->max_loras());
  hello.structured_outputs = structured_ != nullptr;
  hello.prefill_tokens_per_second = static_cast<float>(prefill_rate_);
  // Workers on one device share its compute: routers count their queues together.
  hello.device_id = config_.device_id;
  if (hello.device_id.empty()) hello.device_id = backend_->device_id();
  if (hello.device_id.empty() && config_.backend == "cpu") hello.device_id = HostName() + "/cpu";
  if (auto role = ParseWorkerRole(config_.role); role.ok()) hello.role = *role;  // validated at start-up
  hello.tensor_parallel = static_cast<uint32_t>(config_.tensor_parallel);  // the backend refused what it cannot run
  if (transfer_ != nullptr && pulls_->layout()) {
    hello.transfer_endpoint = transfer_endpoint_;
    hello.transfer_key = transfer_key_;
    hello.transfer_format = std::string(transfer::KvDtypeName(pulls_->layout()->dtype));
    hello.transfer_bytes_per_block = pulls_->layout()->BytesPerBlock();
    if (pulls_->device()) hello.transfer_host_id = pulls_->host_id();
  }
}

void Worker::UpdateHelloLoras(bool now) {
  hello_.loras.clear();
  for (const engine::LoraInfo& l : engine_->loras().List()) {
    hello_.loras.push_back(LoraAnnounce{l.name, l.lora_id, static_cast<uint32_t>(l.rank), l.base_model});
  }
  hello_.lora_load_us = engine_->loras().load_us();
  hello_lora_loads_ = engine_->loras().counters().loads;
  requests_->SetHello(hello_);
  if (registration_) registration_->Update(hello_, now);
}

void Worker::RequestStop() {
  stopping_.store(true, std::memory_order_release);
  if (registration_) registration_->Stop(true);  // routers stop sending at once
  loop_->RequestStop();
}

void Worker::Run() {
  loop_->Run();  // publishes the KV manager's last events as it returns
  std::this_thread::sleep_for(config::kPublisherDrain);
  requests_->Stop();  // sends the final Deltas
  Logger("worker")->info("worker {} stopped", worker_id_);
}

}  // namespace kvfleet::server
