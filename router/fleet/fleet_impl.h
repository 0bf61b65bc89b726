// FleetImpl: the Fleet behind fleet.h, and WorkerRecord, its record of one worker.
// Internal to the fleet: included only by its own files: fleet.cc (start and stop, the
// registry, the fleet thread's loop), fleet_membership.cc (registrations and DNS answers),
// fleet_queries.cc (the Fleet's queries), fleet_forget.cc (departed workers forgotten) and
// fleet_connections.cc (the DEALERs to the workers and the monitors that say whether each is
// connected).
//
// Thread safety: thread-safe, as Fleet. The registry is guarded by mu_, the command queue by
// cmd_mu_; what is marked "fleet thread only" is used by the fleet thread alone (or by Init
// before that thread starts).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <zmq.hpp>

#include "common/curve_keys.h"
#include "common/log.h"
#include "router/fleet/discovery.h"
#include "router/fleet/fleet.h"
#include "router/fleet/lane.h"
#include "router/fleet/poll_loop.h"
#include "router/fleet/routing_table.h"

namespace kvfleet::router {

namespace config {
// A static or DNS worker is asked for its Hello on connecting and this often after, as often
// as a registered worker re-sends its own (worker/server/registration.h), so a change
// (adapters loaded by another router, a restart with other flags) is seen as soon.
inline constexpr DurationNs kDescribeInterval = 2 * kNsPerSec;
// The longest worker id accepted (it names the worker in headers, logs and metric labels).
inline constexpr size_t kMaxWorkerNameBytes = 256;
// A worker whose sockets could not be made (the socket or file limit) is tried again this
// often, not every tick: each try costs a socket and a log line.
inline constexpr DurationNs kConnectRetryInterval = kNsPerSec;
}  // namespace config

// Where a Hello came from (FleetImpl::AddOrUpdate).
enum class HelloSource {
  kListed,      // the router's own guess for a static or DNS worker, from its flags
  kDescribed,   // a static or DNS worker's answer to a Describe
  kRegistered,  // a Hello on the registration socket
};

// A Hello's transfer service as routing reads it; null when the worker serves no pulls.
std::shared_ptr<const TransferPeer> TransferPeerOf(const WorkerHello& info);
struct WorkerRecord;
// Sets w's `info`, its transfer (TransferPeerOf(info)), and what its routing row holds of them:
// the one way a record's `info` changes. REQUIRES: FleetImpl::mu_ held exclusively.
void SetInfo(WorkerRecord& w, const WorkerHello& info);

// One worker. Fields read by other threads are atomics or guarded by the registry lock. What
// routing reads of it is in its row of the fleet's RoutingTable (routing_table.h).
struct WorkerRecord {
  // Takes the row of `id` and resets it. REQUIRES: FleetImpl::mu_ held exclusively.
  WorkerRecord(WorkerId worker, RoutingRow& routing_row) : id(worker), row(routing_row), own(&routing_row.own) {
    row.Reset();
  }
  WorkerId id = 0;
  RoutingRow& row;
  WorkerHello info;                       // GUARDED_BY(FleetImpl::mu_); set by SetInfo
  WorkerHello listed;                     // GUARDED_BY(FleetImpl::mu_); from_static: the flags' guess
  // `info`'s transfer service (TransferPeerOf), made whenever `info` is set; null: no pulls.
  std::shared_ptr<const TransferPeer> transfer;  // GUARDED_BY(FleetImpl::mu_)
  bool from_static = false;               // static list or DNS: removed when DNS drops it
  // The flags are stored in `row`. `info` is the worker's own (a Hello, or its answer to a
  // Describe), not the flags' guess:
  std::atomic<bool>& described = row.described;
  // Its last answer to a Describe was refused (another model, tokenizer or block size): not
  // routable until an answer is accepted.
  std::atomic<bool>& refused = row.refused;
  std::atomic<bool>& connected = row.connected;
  std::atomic<bool>& said_bye = row.said_bye;
  std::atomic<bool>& removed = row.removed;
  // This router's in-flight counts there, published in row.own.
  OwnLoadCounter<config::kOwnLoadHistory> own;
  std::atomic<uint64_t> failures{0};      // see LaneFleet::Failures
  std::string last_failure;               // GUARDED_BY(FleetImpl::mu_)
  prometheus::Gauge* inflight_gauge = nullptr;
  // Fleet thread only.
  std::unique_ptr<zmq::socket_t> dealer;
  std::unique_ptr<zmq::socket_t> monitor;
  TimeNs described_asked_at = 0;  // the last Describe sent on `dealer` (from_static)
  TimeNs connect_retry_at = 0;    // no `dealer` (its sockets could not be made): tried again then
  TimeNs last_hello = 0;          // its last Hello on the registration socket
  TimeNs gone_since = 0;          // first seen said bye or removed (FleetImpl::GoneSince); 0: not
};

class FleetImpl final : public LaneFleet {
 public:
  FleetImpl(const FleetOptions& options, WorkerSignals* signals, const Clock* clock, prometheus::Registry* registry);
  ~FleetImpl() override { Stop(); }

  Status Init();
  void Stop();

  uint64_t NewHandle() { return next_handle_.fetch_add(1) + 1; }

  void Submit(uint64_t handle, ForwardRequest request) { own_lane_.Submit(handle, std::move(request)); }
  void Cancel(uint64_t handle) { own_lane_.Cancel(handle); }

  std::unique_ptr<Lane> NewLane(LaneLoop* loop) { return std::make_unique<Lane>(this, loop); }

  // --- LaneFleet ---

  uint64_t Generation() const override { return generation_.load(std::memory_order_acquire); }
  std::vector<WorkerEndpoint> Endpoints() const override;
  std::unique_ptr<zmq::socket_t> NewDealer() override;  // fleet_connections.cc
  bool Routable(WorkerId id) const override;
  bool Serving(WorkerId id) const override;
  uint64_t Failures(WorkerId id, std::string* why) const override;
  void CountInflight(WorkerId id, const OwnLoadDelta& delta) override;
  void CountRetry() override;
  bool Stopping() const override { return stopping_flag_.load(std::memory_order_acquire); }
  const FleetOptions& options() const override { return options_; }
  const Clock* clock() const override { return clock_; }
  std::string WorkerName(WorkerId id) const override;

  // --- the Fleet's queries ---

  std::optional<ModelFleet> FindModel(std::string_view model) const;
  std::optional<ServedModel> Resolve(std::string_view name) const;
  void NoteAdapter(WorkerId id, const LoraAnnounce& adapter, bool loaded);
  std::optional<double> AdapterLoadSeconds(WorkerId id, uint64_t lora_id) const;
  std::shared_ptr<const TransferPeer> Transfer(WorkerId id) const;
  std::optional<PullFit> MeasuredPulls(WorkerId receiver, std::string_view holder_endpoint) const {
    return signals_ ? signals_->MeasuredPulls(receiver, holder_endpoint) : std::nullopt;
  }
  TimeNs LastPullFailure() const { return signals_ ? signals_->LastPullFailure() : 0; }
  std::map<std::string, PullFit, std::less<>> PullFits(WorkerId worker) const {
    return signals_ ? signals_->PullFits(worker) : std::map<std::string, PullFit, std::less<>>{};
  }
  double AnnouncedPrefillRate(WorkerId id) const;
  WorkerRole Role(WorkerId id) const;
  bool StructuredOutputs(WorkerId id) const;
  std::vector<std::string> LiveModels() const;
  std::vector<ModelReadiness> Readiness() const;
  bool Ready() const;
  std::vector<WorkerStatus> Workers() const;
  std::vector<RefusedWorker> Refused() const;
  Fleet::OwnLoadCounts OwnLoad(WorkerId id) const;
  Fleet::OwnLoadCounts OwnLoadAt(WorkerId id, TimeNs at) const;
  std::map<std::string, OwnLoadCounts, std::less<>> OwnLoadsByName() const;
  std::optional<WorkerLoad> ReportedLoad(WorkerId id) const;
  void Loads(std::span<const WorkerId> ids, std::vector<WorkerLoads::LoadView>* out) const;
  std::vector<WorkerId> DeviceMates(WorkerId id) const;
  uint64_t CacheBlocks(WorkerId id) const;
  uint32_t KvBlocksPerBlock(WorkerId id) const;
  uint32_t StoredPrefixBlocks(WorkerId id) const;
  std::string registration_endpoint() const { return registration_.endpoint(); }
  // Sockets the fleet thread holds: the registration ROUTER and, per connected worker, its
  // liveness DEALER and monitor (config::kFleetSocketsPerWorker). The lanes hold their own.
  size_t SocketsOpen() const { return sockets_open_.load(std::memory_order_relaxed); }
  size_t Records() const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return records_;
  }

 private:
  struct DnsCmd {
    size_t source = 0;  // index into dns_sources_
    std::vector<std::string> endpoints;
  };
  // One DNS name of one model's static fleet.
  struct DnsSource {
    StaticFleet fleet;
    std::string name;
    DnsMembership members;  // fleet thread only
  };
  using Command = std::variant<DnsCmd>;

  struct ModelEntry {
    uint32_t block_size = 0;
    std::vector<WorkerId> members;
  };

  bool Routable(const WorkerRecord& w) const { return Routable(w.id, w.row); }
  bool Routable(WorkerId id, const RoutingRow& row) const;
  // Routable but for a Bye: it still answers what it was sent (LaneFleet::Serving).
  bool Serving(const WorkerRecord& w) const;
  // by_device_: `id` leaves device `from`'s workers and joins `to`'s ("": none). REQUIRES: mu_ held.
  void MoveDevice(WorkerId id, const std::string& from, const std::string& to);
  // The routable workers but `w` that name its device. REQUIRES: mu_ held.
  std::vector<WorkerId> DeviceMatesOf(const WorkerRecord& w) const;
  // Why a prefill worker's Hello cannot serve `model`'s split prefills, or nullopt: it offers no
  // transfer service, or no live decode-capable member takes its KV blocks (format and block
  // bytes differ: another dtype, model or block size). REQUIRES: mu_ held.
  std::optional<std::string> PrefillMismatch(const ModelEntry& model, const WorkerHello& hello,
                                             std::optional<WorkerId> self) const;
  ModelFleet FleetOf(const ModelEntry& entry, std::string_view adapter) const;
  void Post(Command cmd);
  void Wake();

  // --- registry (fleet thread, or Init before the thread starts) ---

  std::optional<WorkerId> AddOrUpdate(const WorkerHello& hello, HelloSource source);
  WorkerId AddRecord(std::unique_lock<std::shared_mutex>& lock, ModelEntry& model, const WorkerHello& hello,
                     HelloSource source);
  WorkerId UpdateRecord(std::unique_lock<std::shared_mutex>& lock, WorkerRecord& w, ModelEntry& model,
                        const WorkerHello& hello, HelloSource source);
  // A static or DNS worker's answer to a Describe: recorded as its Hello, or refused.
  void OnDescribed(WorkerRecord& w, const WorkerHello& answer);
  void Refuse(const WorkerHello& hello, const std::string& reason, const std::string& why);
  // The record of `id`; null when unknown or forgotten. REQUIRES: mu_ held.
  WorkerRecord* Record(WorkerId id) const { return id < workers_.size() ? workers_[id].get() : nullptr; }
  // An id for a new record: the lowest a forgotten worker freed, else the next. REQUIRES: mu_.
  WorkerId TakeId();
  // Takes the accepted worker at `endpoint` (if any) out of routing: it now announces
  // something this router refuses.
  void Withdraw(const std::string& endpoint);

  // --- connections (fleet_connections.cc) ---

  Result<std::unique_ptr<zmq::socket_t>> MakeDealer();
  Status ConfigureDealer(zmq::socket_t& dealer);
  // Makes the worker's liveness DEALER and its monitor and connects them. On failure the
  // worker has neither, and is tried again after config::kConnectRetryInterval.
  Status Connect(WorkerRecord& w);
  Status OpenConnection(WorkerRecord& w);
  void RetryConnects();
  void Disconnect(WorkerRecord& w);
  void DrainMonitors();
  void DrainMonitor(WorkerRecord& w);
  // Static and DNS workers: sends a Describe when none was sent for config::kDescribeInterval
  // (at once after a connect), and reads the answers on the fleet's own DEALER.
  void Describe(WorkerRecord& w, bool now);
  void DrainDescribed(WorkerRecord& w);

  // --- the loop ---

  void Loop();
  void DrainCommands();
  void FailWorker(WorkerId id, const Status& why);

  // --- forgetting (fleet_forget.cc) ---

  // When `w` went: it said bye or was removed (first seen then), or, registered, it is
  // unreachable or its event stream DEAD, since its last Hello. 0: not gone. Static and DNS
  // workers still listed are never gone.
  TimeNs GoneSince(WorkerRecord& w, TimeNs now) const;
  // Forgets the workers gone for longer than forget_after, and stale refusals.
  void ForgetGone();
  // A full fleet's room for a new worker: forgets the worker gone longest among those that
  // said bye or were removed, or are unreachable or DEAD past the registration lease.
  // Returns whether it forgot one.
  bool ForgetLongestGone();
  // Deletes the record of `id`: its sockets closed, its blocks out of the index, its metric
  // series removed, its id free for a new worker. `why` ends the log line.
  void Forget(WorkerId id, const std::string& why);
  // A Hello or Bye from `peer`: applied when Membership admits it, refused and counted else.
  void OnRegistration(const ToRouterMessage& message, const RegistrationPeer& peer);
  Status BindRegistration();

  // --- DNS ---

  void ApplyDns(size_t source, const std::vector<std::string>& endpoints);
  void RemoveByEndpoint(const std::string& endpoint);

  FleetOptions options_;
  WorkerSignals* signals_;
  const Clock* clock_;
  zmq::context_t ctx_{1};
  bool curve_ = false;  // set by Init: every DEALER is a CURVE client
  CurveKeyPair curve_keys_;
  std::string curve_server_public_;
  Registration registration_;  // bound by Init; read on the fleet thread
  Membership membership_{options_.registration_auth.lease};  // fleet thread only
  RateLimit registration_log_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::vector<DnsSource> dns_sources_;            // set by Init
  std::vector<std::unique_ptr<DnsWatcher>> dns_;  // one per source (--workers-dns)

  std::mutex cmd_mu_;
  std::deque<Command> commands_;  // GUARDED_BY(cmd_mu_)
  bool stopping_ = false;         // GUARDED_BY(cmd_mu_)
  std::atomic<uint64_t> next_handle_{0};

  // Registry: a record is marked removed when its worker leaves, and deleted (its slot null,
  // its id reused) once it has been gone for forget_after. Ids stay below max_workers.
  mutable std::shared_mutex mu_;
  // By id: each record's row (declared first: the records refer to theirs).
  RoutingTable table_{std::min(options_.max_workers, size_t{config::kMaxWorkers})};
  std::vector<std::unique_ptr<WorkerRecord>> workers_;        // GUARDED_BY(mu_); by id, null: free
  std::set<WorkerId> free_ids_;                               // GUARDED_BY(mu_)
  size_t records_ = 0;                                        // GUARDED_BY(mu_); non-null in workers_
  // Failures of forgotten ids (LaneFleet::Failures): a lane's request sent to the forgotten
  // worker sees a change, and a new worker on the id starts past it.
  std::map<WorkerId, uint64_t> retired_failures_;             // GUARDED_BY(mu_)
  std::map<std::string, WorkerId> by_endpoint_;               // GUARDED_BY(mu_)
  std::map<std::string, std::vector<WorkerId>, std::less<>> by_device_;  // GUARDED_BY(mu_); Hello's deviceId
  std::map<std::string, ModelEntry, std::less<>> models_;     // GUARDED_BY(mu_)
  std::map<std::string, RefusedWorker> refused_;              // GUARDED_BY(mu_); by requests endpoint
  std::map<std::string, TimeNs> refused_at_;                  // GUARDED_BY(mu_); forgotten after forget_after

  std::atomic<uint64_t> generation_{0};  // see LaneFleet::Generation
  std::atomic<bool> stopping_flag_{false};
  std::atomic<size_t> sockets_open_{0};

  ThreadLane own_lane_{this};  // Fleet::Submit's

  // Fleet thread only.
  uint64_t monitors_ = 0;
  std::set<std::string> refusals_logged_;
  TimeNs last_forget_check_ = 0;
  TimeNs last_trim_ = 0;  // ForgetGone's last malloc_trim
  RateLimit socket_errors_log_;

  prometheus::Counter* retries_ = nullptr;
  prometheus::Family<prometheus::Gauge>* inflight_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* refused_family_ = nullptr;
};

}  // namespace kvfleet::router
