// Worker: one kvfleet-worker serving one model, assembled from its parts.
//
//   backend ──────────────┐ (KV memory, forward pass)
//   KvCacheManager ───────┤ events, taken by the WorkerLoop → EventPublisher (PUB + replay ROUTER)
//   Engine ───────────────┘ driven by WorkerLoop on the engine thread
//   RequestServer (requests ROUTER; answers a Describe with the Hello), Registration
//   (Hello/Bye to --router), HTTP (/health /ready /metrics)
//
// After each engine step the WorkerLoop publishes the KV manager's events with the load
// (one EventBatch per step that changed the cache) and answers snapshot requests between
// steps, since only the engine thread may read the KV manager; metrics are updated there too.
//
// Lifecycle: Start() binds every socket and loads the model (HTTP first, so /health
// answers and /ready says false during a long load). Run() serves until RequestStop()
// (SIGTERM), then: Bye to the router, new requests refused, in-flight ones finished or,
// after the grace period, cancelled, a last event flush; Run() returns and the process
// exits 0.
//
// Thread safety: Start/Run/destructor on one thread; RequestStop from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "common/status.h"
#include "schema/registration.h"
#include "worker/server/worker_config.h"
#include "worker/transfer/transfer_service.h"

namespace prometheus {
class Registry;
}
namespace kvfleet::http {
class Server;
}
namespace kvfleet::backend {
class ModelBackend;
}
namespace kvfleet::kv {
class KvCacheManager;
}
namespace kvfleet::events {
class EventPublisher;
}
namespace kvfleet::engine {
class Engine;
class StructuredOutputs;
}
namespace kvfleet::server {

class KvPulls;
class TransferMetrics;
class RequestServer;
class Registration;
class WorkerLoop;
class WorkerMetrics;

class Worker {
 public:
  // `context` outlives the worker.
  static Result<std::unique_ptr<Worker>> Start(const WorkerConfig& config, zmq::context_t& context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until RequestStop() and the drain; the calling thread is the engine thread.
  void Run();
  void RequestStop();

  const std::string& worker_id() const { return worker_id_; }
  const std::string& model_name() const { return model_name_; }
  const std::string& requests_endpoint() const;  // as bound
  const std::string& events_endpoint() const;
  uint16_t http_port() const;
  // Where other workers pull this one's KV blocks (as its Hello says); empty: no transfer.
  const std::string& transfer_endpoint() const { return transfer_endpoint_; }
  // The transfer service's counters (pulls by holder, with bytes and seconds; serves); empty
  // without transfer. Any thread.
  transfer::TransferStats transfer_stats() const;
  bool ready() const { return ready_.load(std::memory_order_acquire); }

 private:
  explicit Worker(const WorkerConfig& config);
  Status Init(zmq::context_t& context);
  // Serves the --lora adapters and lets LoadLora read more (on the request server's loader thread).
  Status InitLoras();
  // The prefill rate the Hello announces (prefill_rate_): --prefill-rate, else the backend's
  // cost model, else timed on the backend. REQUIRES: the backend, and no KV manager yet.
  Status InitPrefillRate(const Clock* clock);
  // The KV transfer service and its engine-thread side (--transfer). REQUIRES: steps 1-5 of Init.
  Status InitTransfer(const std::string& host, const Clock* clock);
  // Fills hello_ but its adapter fields. REQUIRES: every part up (Init's steps 1-5).
  void BuildHello(const std::string& host, uint32_t max_context);
  // The Hello's adapter fields from the engine (engine thread); hands the Hello to the
  // request server (Describe) and re-sends it to the router at once when `now`.
  void UpdateHelloLoras(bool now);
  // Builds the grammar vocabulary and hands the request server its StructuredOutputs, when
  // the backend masks logits (constrained decoding); otherwise leaves structured_ null.
  void InitStructuredOutputs(const std::vector<TokenId>& eos_token_ids);

  const WorkerConfig config_;
  std::string worker_id_;
  std::string model_name_;
  std::atomic<bool> ready_{false};     // the model is loaded and every socket is up
  std::atomic<bool> stopping_{false};  // RequestStop() was called: /ready says no
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<backend::ModelBackend> backend_;
  std::unique_ptr<events::EventPublisher> publisher_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<RequestServer> requests_;
  std::shared_ptr<engine::StructuredOutputs> structured_;  // null: no constrained decoding
  std::unique_ptr<transfer::TransferService> transfer_;  // null: --transfer ""
  std::string transfer_endpoint_;                       // as peers should reach it
  std::string transfer_key_;                            // its CURVE public key (Z85); empty: plain TCP
  std::unique_ptr<backend::KvNccl> kv_nccl_;             // null: no --transfer-nccl
  std::unique_ptr<KvPulls> pulls_;
  std::unique_ptr<TransferMetrics> transfer_metrics_;
  std::unique_ptr<WorkerLoop> loop_;
  std::unique_ptr<Registration> registration_;
  double prefill_rate_ = 0;      // tokens/s the Hello announces (InitPrefillRate)
  WorkerHello hello_;            // what registration_ sends and Describe answers; engine thread after Init
  uint64_t hello_lora_loads_ = 0;  // the adapter loads hello_.lora_load_us has seen
};

}  // namespace kvfleet::server
