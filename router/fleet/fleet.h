// Fleet: the workers this router knows, per model, and the forwarding of requests to
// them over Contract 3 (schema/worker.capnp).
//
// Workers come from a static list of request endpoints, from Hello registrations on the
// router's ROUTER socket, and from a DNS name re-resolved periodically (a Kubernetes
// headless service). A worker is keyed by its requests endpoint, so a static entry and
// that worker's Hello are one record. Each model has one fleet; a worker whose block size
// disagrees with its model's fleet, or whose tokenizer digest is not the one the router
// holds for its model, is refused: its reason is logged once, counted, and listed by Refused().
//
// Forwarding happens in lanes (lane.h): each has its own DEALER per worker and lives on
// one thread, which sends the requests and reads their answers, so the request path needs
// no hand-off between threads. The router runs one lane per HTTP I/O thread (NewLane);
// Submit() uses a lane of the Fleet's own, on a thread started by the first Submit. The
// fleet thread keeps the registry: registrations, DNS, and one monitored DEALER per worker
// that says whether it is connected; the lanes learn of failures at their ticks. The
// router's own in-flight counts per worker are kept here, summed over the lanes.
//
// Size: at most FleetOptions::max_workers records. Each worker reached costs the Fleet's
// ZeroMQ context SocketsPerWorker() sockets: config::kFleetSocketsPerWorker (3: the liveness
// DEALER and its monitor's two PAIR ends) plus one DEALER per lane (5 with the router's
// default two HTTP threads; Submit's own lane, once started, adds one); ZMQ_MAX_SOCKETS is set
// for max_workers of them. A socket that cannot be made is logged and tried again later. A
// worker gone (said bye, removed, or registered and unreachable or DEAD since its last Hello)
// for forget_after is forgotten: its record, sockets, metric series and event subscription
// go, and its id is reused. A full fleet forgets sooner: a new worker takes the place of the
// one gone longest (said bye or removed, or unreachable past the registration lease), and is
// refused only when none is.
//
// Thread safety: thread-safe. Submit()'s sinks are called on the Fleet's lane thread, one
// request's calls in order, never after the terminal call or after the cancel was handled.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "router/core/worker.h"
#include "router/fleet/own_load_history.h"
#include "router/fleet/peer_loads.h"
#include "schema/registration.h"
#include "schema/requests.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::router {

namespace config {
// Changes of this router's in-flight counts kept per worker (Fleet::OwnLoadAt). A worker's
// load rides on each event batch (every engine step) and at least every 200 ms (heartbeat);
// each request changes the counts ~3 times, so 256 changes reach back past a 200 ms-old
// report up to ~400 requests/s to that one worker, and past a one-step-old one far beyond.
inline constexpr size_t kOwnLoadHistory = 256;
// ZeroMQ sockets the fleet's context holds per worker, besides one DEALER per lane: the
// fleet thread's liveness DEALER, and the two PAIR ends of its socket monitor.
inline constexpr size_t kFleetSocketsPerWorker = 3;
// Sockets of the fleet's context beyond its workers': the registration ROUTER, and room for
// the monitors and sockets a context makes on its own.
inline constexpr size_t kFleetSocketHeadroom = 64;
}  // namespace config

// A worker's KV transfer service, as its Hello announced it (Contract 4).
struct TransferPeer {
  std::string name;          // its workerId
  std::string endpoint;      // where peers pull its blocks
  std::string key;           // its CURVE server key (Z85); empty: plain TCP
  std::string format;        // its KV block bytes (fp32, bf16, fp8e4m3, none): pulls need equal ones
  uint64_t bytes_per_block = 0;
  std::string host_id;       // set: it copies device blocks with workers of the same host id
};

// A process-wide id for a transfer format or host id (never 0; equal ids exactly when the
// strings are equal), so that routing compares every candidate's transfer service to the pull
// source's without reading each one's TransferPeer (LoadView::transfer_format). Thread-safe.
uint32_t TransferNameId(std::string_view name);

// What the routing step reads of each worker's load (router/routing/router.h): this
// router's own in-flight counts, now and as they were when a report was written, and the
// worker's last report. Fleet implements it; tests fake it.
class WorkerLoads {
 public:
  virtual ~WorkerLoads() = default;
  virtual OwnLoadCounts OwnLoad(WorkerId worker) const = 0;
  virtual OwnLoadCounts OwnLoadAt(WorkerId worker, TimeNs at) const = 0;
  virtual std::optional<WorkerLoad> ReportedLoad(WorkerId worker) const = 0;
  // Routing blocks (block_size tokens) the worker can keep cached, device and host tiers
  // together, as its Hello said; 0 when unknown (a static entry). The approx policy's model
  // of its cache (routing/README.md).
  virtual uint64_t CacheBlocks(WorkerId /*worker*/) const { return 0; }
  // KV blocks per routing block: block_size / kv_block_size for a token-level worker, else 1.
  // Its load reports count KV blocks.
  virtual uint32_t KvBlocksPerBlock(WorkerId /*worker*/) const { return 1; }
  // Leading routing blocks of a prompt the worker stores for reuse in the pool routers index
  // (a windowed pool keeps only its first window); 0: no limit.
  virtual uint32_t StoredPrefixBlocks(WorkerId /*worker*/) const { return 0; }
  // The LoRA adapter `lora_id` (common/block_hash.h LoraId) on `worker`: nullopt when the
  // worker does not serve it (its Hello does not list it); else the seconds a request waits
  // for it to reach the device: 0 when its last load report lists it resident, else its
  // Hello's lora_load_us (routing/README.md, "LoRA adapters").
  virtual std::optional<double> AdapterLoadSeconds(WorkerId /*worker*/, uint64_t /*lora_id*/) const {
    return std::nullopt;
  }
  // How peers pull KV blocks from the worker (its Hello's TransferInfo); null when it serves
  // no pulls (routing/README.md, "Pulling a prefix"). Shared, not copied: routing asks it of
  // every candidate.
  virtual std::shared_ptr<const TransferPeer> Transfer(WorkerId /*worker*/) const { return nullptr; }
  // What `receiver`'s pulls from the holder at `holder_endpoint` took, as its load reports say
  // (WorkerSignals::MeasuredPulls); none without them.
  virtual std::optional<PullFit> MeasuredPulls(WorkerId /*receiver*/, std::string_view /*holder_endpoint*/) const {
    return std::nullopt;
  }
  // When a worker's load report last said one of its pulls failed (WorkerSignals::
  // LastPullFailure; router monotonic clock): 0, never.
  virtual TimeNs LastPullFailure() const { return 0; }
  // The prefill rate its Hello announced (tokens/s): what the worker expects before its load
  // reports carry a measured one. 0: none announced.
  virtual double AnnouncedPrefillRate(WorkerId /*worker*/) const { return 0; }
  // Its part in P/D disaggregation, as its Hello said (--role); kBoth for a static entry.
  virtual WorkerRole Role(WorkerId /*worker*/) const { return WorkerRole::kBoth; }
  // Its Hello's structuredOutputs: it decodes under a request's constraint (response_format,
  // guided_*, forced tool calls). False for a static entry.
  virtual bool StructuredOutputs(WorkerId /*worker*/) const { return false; }
  // Whether new requests may go to the worker now (it may have left since a decision listed
  // it: a retry does not aim there). True for a static entry not declared dead.
  virtual bool Routable(WorkerId /*worker*/) const { return true; }
  // The fleet's other routers' in-flight counts on the worker, as their gossip last said
  // (peer_loads.h), now and as they stood at `at`; zero without gossip or peers. Routing adds
  // them to this router's own (routing/README.md, "Several routers").
  virtual OwnLoadCounts PeerLoad(WorkerId /*worker*/) const { return {}; }
  virtual OwnLoadCounts PeerLoadAt(WorkerId /*worker*/, TimeNs /*at*/) const { return {}; }
  // The other routers' routed work on `model` (uncached prefill tokens/s); 0 without gossip.
  virtual double PeerWorkRate(std::string_view /*model*/) const { return 0; }
  // The other live workers whose Hello names the worker's device (deviceId: they share its
  // compute); empty when it names none. Routing counts their prefill queues in its wait
  // (routing/README.md, "Workers sharing a device").
  virtual std::vector<WorkerId> DeviceMates(WorkerId /*worker*/) const { return {}; }

  // What routing reads of a worker's load (Router::AddLoad), for every candidate at once.
  struct LoadView {
    OwnLoadCounts own;                  // OwnLoad
    std::optional<WorkerLoad> report;   // ReportedLoad
    OwnLoadCounts own_at_report;        // OwnLoadAt(report->received_at); zeros without a report
    double announced_prefill_rate = 0;  // AnnouncedPrefillRate
    WorkerRole role = WorkerRole::kBoth;  // Role
    bool structured_outputs = false;      // StructuredOutputs
    OwnLoadCounts peers;                // PeerLoad
    OwnLoadCounts peers_at_report;      // PeerLoadAt(report->received_at); zeros without a report
    std::vector<WorkerId> device_mates;  // DeviceMates
    // Transfer, as pulls compare it: TransferNameId of its format (0: it serves no pulls, Transfer
    // is null) and of its host id (0: none).
    uint32_t transfer_format = 0;
    uint32_t transfer_host = 0;
  };
  // The LoadView of each of `workers`, in order. This one asks the calls above worker by
  // worker; the Fleet takes each of its locks once for the lot (a request's routing reads
  // every worker of its model).
  virtual void Loads(std::span<const WorkerId> workers, std::vector<LoadView>* out) const {
    out->clear();
    for (WorkerId id : workers) {
      LoadView v;
      v.own = OwnLoad(id);
      v.report = ReportedLoad(id);
      if (v.report) v.own_at_report = OwnLoadAt(id, v.report->received_at);
      v.announced_prefill_rate = AnnouncedPrefillRate(id);
      v.role = Role(id);
      v.structured_outputs = StructuredOutputs(id);
      v.peers = PeerLoad(id);
      if (v.report) v.peers_at_report = PeerLoadAt(id, v.report->received_at);
      v.device_mates = DeviceMates(id);
      if (const std::shared_ptr<const TransferPeer> t = Transfer(id)) {
        v.transfer_format = TransferNameId(t->format);
        v.transfer_host = t->host_id.empty() ? 0 : TransferNameId(t->host_id);
      }
      out->push_back(std::move(v));
    }
  }
};

// CURVE on the request DEALERs (common/curve_keys.h files), as the event plane's
// EventPlaneCurve: both set, or both empty for plaintext.
struct FleetCurve {
  std::string client_keypair_file;     // this router's key pair (kvfleet keygen)
  std::string server_public_key_file;  // the workers' server public key
};

// Static and DNS workers of one model: they send no Hello, so the router takes their
// model, block size and context length from here (router_config.h: --workers and
// --workers-dns, plain or MODEL=...).
struct StaticFleet {
  std::string model = "default";
  uint32_t block_size = 32;
  uint32_t max_context = 8192;
  // Requests endpoints (tcp://host:5556). Their events and replay endpoints are the next two
  // ports, the worker's defaults.
  std::vector<std::string> workers;
  std::vector<std::string> dns_names;  // "host:port", each resolving to many workers
};

// Who may register on the registration socket (router/README.md, "Membership").
struct RegistrationAuth {
  // Worker public keys admitted, one per line (common/curve_keys.h). Set: the registration
  // socket is a CURVE server with curve.client_keypair_file's key pair, and a Hello or Bye
  // from any other key never reaches the fleet. Empty: no CURVE on registration.
  std::string authorized_keys_file;
  // Without authorized keys, bind registration on an address other hosts can reach anyway.
  bool insecure = false;
  // A worker's claim on its id and endpoints holds this long after its last Hello (workers
  // re-send theirs every 2 s): meanwhile no other peer may register them.
  DurationNs lease = 10 * kNsPerSec;
};

struct FleetOptions {
  // Hello/Bye ROUTER; empty: none. Loopback by default: another address needs
  // registration_auth (keys, or insecure).
  std::string registration_endpoint = "tcp://127.0.0.1:5555";
  RegistrationAuth registration_auth;
  // One model's static and DNS workers in flat fields (static_workers, dns_name,
  // static_model, static_block_size, static_max_context); static_fleets adds any number of
  // models. The router's main fills static_fleets only.
  std::vector<std::string> static_workers;
  std::string dns_name;                   // "host:port" resolving to many workers; empty: none
  DurationNs dns_interval = 10 * kNsPerSec;
  std::string static_model = "default";   // model served by static and DNS workers
  uint32_t static_block_size = 32;
  uint32_t static_max_context = 8192;
  std::vector<StaticFleet> static_fleets;
  // The digest of the router's tokenizer for models without their own entry in
  // tokenizer_digests (common/tokenizer_files.h): a worker announcing a different non-zero
  // one is refused. 0: the byte codec, every worker accepted.
  uint64_t tokenizer_digest = 0;
  // Per model: the digest of that model's tokenizer (--tokenizer MODEL=DIR); 0 compares nothing.
  std::map<std::string, uint64_t, std::less<>> tokenizer_digests;
  // The digest a worker of `model` is compared with.
  uint64_t TokenizerDigestFor(std::string_view model) const {
    auto it = tokenizer_digests.find(model);
    return it == tokenizer_digests.end() ? tokenizer_digest : it->second;
  }
  // static_fleets with the flat fields' model first, when they name any worker.
  std::vector<StaticFleet> AllStaticFleets() const;
  DurationNs request_timeout = 600 * kNsPerSec;      // whole request
  DurationNs first_token_timeout = 60 * kNsPerSec;   // no first token: retry elsewhere
  int max_attempts = 2;                   // the first try and one retry before the first token
  DurationNs tick = 20 * kNsPerMs;        // timeouts and liveness are checked this often
  FleetCurve curve;
  // Workers known at once (records, live or waiting to be forgotten); a new one beyond is
  // refused ("max-workers"). Sizes the ZeroMQ socket limit. At most config::kMaxWorkers.
  size_t max_workers = 1024;
  // Lanes that may connect to every worker: the router's HTTP I/O threads, and Submit's own.
  size_t lanes = 3;
  // A worker gone this long (said bye, removed, its event stream DEAD, or unreachable and
  // silent) is forgotten: its record, sockets and id are released. Back within it, it resumes.
  DurationNs forget_after = 60 * kNsPerSec;
  // Called on the fleet thread for each worker forgotten, with its id and name, and whether no
  // other worker has that name: the router drops what it keeps per worker elsewhere (the
  // approx policy's predicted entries by id, Api::ForgetWorker's series by name).
  std::function<void(WorkerId id, const std::string& name, bool last_of_name)> on_forgotten;
  // What the fleet's other routers said over the gossip channel (gossip.h); null: no
  // gossip, this router's own counts alone. Not owned; it must outlive the Fleet, which tells
  // it the name of each of its worker ids (PeerLoads::NameWorker).
  PeerLoads* peers = nullptr;
  // Called each time this router's own in-flight counts change (Gossip::OwnStateChanged), on
  // the lane's thread, with no fleet lock held. `routed`: a request was counted on its worker
  // and is about to be sent there. Null: none.
  std::function<void(bool routed)> on_own_load_change;
  // ZeroMQ sockets each worker costs the fleet's context, and the context's limit.
  size_t SocketsPerWorker() const { return config::kFleetSocketsPerWorker + lanes; }
  size_t MaxSockets() const { return SocketsPerWorker() * max_workers + config::kFleetSocketHeadroom; }
};

// Called on the thread of the lane that forwards the request.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void OnDelta(WorkerId worker, const WorkerDelta& delta) = 0;
  // Terminal. `after_first_token`: some tokens were already delivered.
  virtual void OnError(WorkerId worker, const Status& status, bool after_first_token) = 0;
  // A retry moved the request to `worker` (before any token).
  virtual void OnRetry(WorkerId from, WorkerId to) {}
};

// A split request's first stage (router/routing/README.md, "Prefill and decode on different
// workers"): the prompt is computed on a prefill worker (a Generate of one token the lane
// drops), then the request goes to ForwardRequest::worker, which pulls the prompt's KV from
// the worker that computed it.
struct PrefillStage {
  WorkerId worker = 0;
  uint32_t prefill_tokens = 0;  // uncached there: its queued prefill until the stage ends
  // Another prefill worker for a retry, excluding `tried` (the stage's own attempts).
  std::function<Result<WorkerId>(std::span<const WorkerId> tried)> reroute;
  // The decode's pull once `prefill_worker` has computed the prompt; empty: compute it.
  std::function<PullHint(WorkerId prefill_worker)> pull_from;
  double estimated_s = 0;  // the router's prediction of the stage (its debug log compares)
  // Called with the stage's seconds from send to its end, when it ends on the first prefill
  // worker tried (on the lane's thread); may be empty.
  std::function<void(double seconds)> on_done;
};

struct ForwardRequest {
  WorkerId worker = 0;  // the worker that streams the tokens (after `prefill`, when set)
  GenerateParams params;
  // Prompt tokens the worker is expected to prefill (the uncached part); counted in the
  // router's own queued-prefill load until the first token.
  uint32_t prefill_tokens = 0;
  std::shared_ptr<ResponseSink> sink;
  // Picks the worker for a retry, excluding `tried`. Runs on the lane's thread.
  std::function<Result<WorkerId>(std::span<const WorkerId> tried)> reroute;
  std::optional<PrefillStage> prefill;  // set: the prompt is computed elsewhere first
  // Called on the lane's thread with the first token's delay after the send, when it comes
  // from `worker` on the first attempt (no retry, no prefill stage). May be empty.
  std::function<void(double seconds)> on_first_token;
};

struct ModelFleet {
  uint32_t block_size = 0;
  uint32_t max_context = 0;             // the smallest of its workers'
  // No routable worker has described itself yet, and one's first Describe is unanswered:
  // max_context is the flags' guess (--max-context), which its answer replaces in a moment.
  bool max_context_guessed = false;
  std::vector<WorkerId> routable;       // live workers, ascending
  size_t workers = 0;                   // known workers, routable or not
  // Some known worker runs a real model (backend cpu or cuda): its ids are a tokenizer's,
  // so the byte codec cannot speak to it.
  bool needs_tokenizer = false;
};

// A request's `model` resolved (Fleet::Resolve): a model's name, else a LoRA adapter's (as
// in vLLM), which selects the adapter over its base model. A name that is both is the model.
struct ServedModel {
  ModelFleet fleet;   // the workers serving it; an adapter's: those of its base model serving it
  std::string model;  // the (base) model
  std::string lora;   // the adapter; empty: the base model
};

// One known model's state, for GET /ready: "serving" with a routable worker, else "unavailable".
struct ModelReadiness {
  std::string model;
  size_t workers = 0;   // known, not removed
  size_t routable = 0;  // of those, routable now and able to decode (not --role prefill)
};
// The readiness rule (Fleet::Ready, GET /ready): some model has a routable worker.
inline bool AnyServing(const std::vector<ModelReadiness>& models) {
  for (const ModelReadiness& m : models) {
    if (m.routable > 0) return true;
  }
  return false;
}

// A registration the fleet refused, latest per requests endpoint; gone once that endpoint
// is accepted or says bye.
struct RefusedWorker {
  WorkerHello info;
  std::string reason;  // the metric's label: "tokenizer-mismatch", "block-size-mismatch", ...
  std::string why;     // for people: "tokenizer digest 0x... differs from the router's 0x..."
};

struct WorkerStatus {
  WorkerId id = 0;
  WorkerHello info;
  bool connected = false;
  bool said_bye = false;
  WorkerState state = WorkerState::kUnknown;  // its event stream's
  bool routable = false;
  int64_t inflight_requests = 0;       // this router's
  int64_t inflight_prefill_tokens = 0; // this router's, not yet past the first token
  int64_t peer_inflight_requests = 0;       // the other routers', as their gossip said (peer_loads.h)
  int64_t peer_inflight_prefill_tokens = 0; // theirs, not yet past the first token
  std::optional<WorkerLoad> load;
};

class FleetImpl;
class Lane;
class LaneLoop;

class Fleet final : public WorkerLoads {
 public:
  // `signals` and `registry` may be null; both must outlive the Fleet.
  static Result<std::unique_ptr<Fleet>> Start(const FleetOptions& options, WorkerSignals* signals, const Clock* clock,
                                              prometheus::Registry* registry);
  ~Fleet() override;  // Stop()s
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Ends every request (sinks get Unavailable: at once on Submit's lane, at the next tick
  // on the others), closes the sockets, joins. Idempotent.
  void Stop();

  // A lane living on `loop`'s thread (lane.h). REQUIRES: called on that thread; the lane is
  // destroyed there (or after the thread stopped) and before this Fleet.
  std::unique_ptr<Lane> NewLane(LaneLoop* loop);

  // A fresh request handle, for Submit (known before any sink call can happen).
  uint64_t NewHandle();
  // Queues a request under `handle` (from NewHandle()) on the Fleet's own lane.
  void Submit(uint64_t handle, ForwardRequest request);
  // Ends a request early and cancels it on its worker. Its sink gets no further call
  // once the lane thread has handled the cancel (calls already running may finish).
  void Cancel(uint64_t handle);

  // nullopt: no worker has ever announced `model`.
  std::optional<ModelFleet> FindModel(std::string_view model) const;
  // What a request's `model` names (ServedModel): a model, else a LoRA adapter. nullopt:
  // neither is known. The one place that rule lives: completions, /tokenize, /v1/models and
  // the LoRA API all resolve names here.
  std::optional<ServedModel> Resolve(std::string_view name) const;
  // Records the outcome of a run-time LoadLora (`loaded`) or UnloadLora on `worker` at
  // once, ahead of its next Hello (which replaces its list).
  void NoteAdapter(WorkerId worker, const LoraAnnounce& adapter, bool loaded);
  // Models with at least one routable worker.
  std::vector<std::string> LiveModels() const;
  // Each known model (one with a worker not removed), by name, with its worker counts.
  std::vector<ModelReadiness> Readiness() const;
  // This router can serve: some model has a routable worker (GET /ready's 200). A model
  // without one is refused on its own (503), while the others serve.
  bool Ready() const;
  std::vector<WorkerStatus> Workers() const;
  std::vector<RefusedWorker> Refused() const;
  // This router's own load on `worker`: requests in flight; for those without a first
  // token yet, the tokens it expects uncached and their whole prompts.
  using OwnLoadCounts = router::OwnLoadCounts;
  OwnLoadCounts OwnLoad(WorkerId worker) const override;
  // This router's own load on `worker` as it was at time `at` (the fleet's clock): what a
  // load report received then already counted of this router's requests. The counts after
  // the last change at or before `at`; the current counts when `at` is older than the last
  // config::kOwnLoadHistory changes (a report that old is stale anyway).
  OwnLoadCounts OwnLoadAt(WorkerId worker, TimeNs at) const override;
  // The worker's last load report (from the WorkerSignals; nullopt without them).
  std::optional<WorkerLoad> ReportedLoad(WorkerId worker) const override;
  // What `worker`'s pulls took, by holder endpoint, as its load reports said (empty: none, or
  // no WorkerSignals). Only /fleet asks: Workers() leaves them out.
  std::map<std::string, PullFit, std::less<>> PullFits(WorkerId worker) const;
  uint64_t CacheBlocks(WorkerId worker) const override;
  uint32_t KvBlocksPerBlock(WorkerId worker) const override;
  uint32_t StoredPrefixBlocks(WorkerId worker) const override;
  std::optional<double> AdapterLoadSeconds(WorkerId worker, uint64_t lora_id) const override;
  std::shared_ptr<const TransferPeer> Transfer(WorkerId worker) const override;
  std::optional<PullFit> MeasuredPulls(WorkerId receiver, std::string_view holder_endpoint) const override;
  TimeNs LastPullFailure() const override;
  double AnnouncedPrefillRate(WorkerId worker) const override;
  WorkerRole Role(WorkerId worker) const override;
  bool StructuredOutputs(WorkerId worker) const override;
  bool Routable(WorkerId worker) const override;
  void Loads(std::span<const WorkerId> workers, std::vector<LoadView>* out) const override;
  // This router's own load on every worker where it has a request in flight, by the
  // worker's name (what it tells its peers, gossip.h); a name two records share is summed.
  std::map<std::string, OwnLoadCounts, std::less<>> OwnLoadsByName() const;
  OwnLoadCounts PeerLoad(WorkerId worker) const override;
  OwnLoadCounts PeerLoadAt(WorkerId worker, TimeNs at) const override;
  double PeerWorkRate(std::string_view model) const override;
  std::vector<WorkerId> DeviceMates(WorkerId worker) const override;
  // The worker's announced name ("" when unknown).
  std::string WorkerName(WorkerId worker) const;
  // The registration endpoint as bound (tcp://0.0.0.0:PORT when the port was 0 or *).
  std::string registration_endpoint() const;
  // ZeroMQ sockets the fleet thread holds: the registration ROUTER and, per worker it reaches,
  // config::kFleetSocketsPerWorker. Each lane holds one DEALER per worker besides (Lane::dealers()).
  size_t SocketsOpen() const;
  // Workers on record: known, or gone and not yet forgotten (FleetOptions::forget_after).
  size_t Records() const;

 private:
  explicit Fleet(std::unique_ptr<FleetImpl> impl);
  std::unique_ptr<FleetImpl> impl_;
};

}  // namespace kvfleet::router
