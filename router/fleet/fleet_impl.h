// FleetImpl: the Fleet behind fleet.h, and WorkerRecord, its record of one worker.
// Internal to the fleet: included only by fleet.cc (start and stop, the registry, the
// fleet thread's loop, DNS, the Fleet's queries) and fleet_connections.cc (the DEALERs to
// the workers and the monitors that say whether each is connected).
//
// Thread safety: thread-safe, as Fleet. The registry is guarded by mu_, the command queue by
// cmd_mu_; what is marked "fleet thread only" is used by the fleet thread alone (or by Init
// before that thread starts).
#pragma once

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
#include "router/fleet/discovery.h"
#include "router/fleet/fleet.h"
#include "router/fleet/lane.h"
#include "router/fleet/poll_loop.h"

namespace kvfleet::router {

namespace config {
// A static or DNS worker is asked for its Hello on connecting and this often after, as often
// as a registered worker re-sends its own (worker/server/registration.h), so a change
// (adapters loaded by another router, a restart with other flags) is seen as soon.
inline constexpr DurationNs kDescribeInterval = 2 * kNsPerSec;
}  // namespace config

// Where a Hello came from (FleetImpl::AddOrUpdate).
enum class HelloSource {
  kListed,      // the router's own guess for a static or DNS worker, from its flags
  kDescribed,   // a static or DNS worker's answer to a Describe
  kRegistered,  // a Hello on the registration socket
};

// One worker. Fields read by other threads are atomics or guarded by the registry lock.
struct WorkerRecord {
  WorkerId id = 0;
  WorkerHello info;                       // GUARDED_BY(FleetImpl::mu_)
  WorkerHello listed;                     // GUARDED_BY(FleetImpl::mu_); from_static: the flags' guess
  bool from_static = false;               // static list or DNS: removed when DNS drops it
  // `info` is the worker's own (a Hello, or its answer to a Describe), not the flags' guess.
  std::atomic<bool> described{false};
  // Its last answer to a Describe was refused (another model, tokenizer or block size): not
  // routable until an answer is accepted.
  std::atomic<bool> refused{false};
  std::atomic<bool> connected{false};
  std::atomic<bool> said_bye{false};
  std::atomic<bool> removed{false};
  OwnLoadCounter<config::kOwnLoadHistory> own;  // this router's in-flight counts there
  std::atomic<uint64_t> failures{0};      // see LaneFleet::Failures
  std::string last_failure;               // GUARDED_BY(FleetImpl::mu_)
  prometheus::Gauge* inflight_gauge = nullptr;
  // Fleet thread only.
  std::unique_ptr<zmq::socket_t> dealer;
  std::unique_ptr<zmq::socket_t> monitor;
  TimeNs described_asked_at = 0;  // the last Describe sent on `dealer` (from_static)
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
  std::vector<std::string> LiveModels() const;
  std::vector<ModelReadiness> Readiness() const;
  bool Ready() const;
  std::vector<WorkerStatus> Workers() const;
  std::vector<RefusedWorker> Refused() const;
  Fleet::OwnLoadCounts OwnLoad(WorkerId id) const;
  Fleet::OwnLoadCounts OwnLoadAt(WorkerId id, TimeNs at) const;
  std::optional<WorkerLoad> ReportedLoad(WorkerId id) const;
  uint64_t CacheBlocks(WorkerId id) const;
  uint32_t KvBlocksPerBlock(WorkerId id) const;
  uint32_t StoredPrefixBlocks(WorkerId id) const;
  std::string registration_endpoint() const { return registration_.endpoint(); }

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

  bool Routable(const WorkerRecord& w) const;
  ModelFleet FleetOf(const ModelEntry& entry, std::string_view adapter) const;
  void Post(Command cmd);
  void Wake();

  // --- registry (fleet thread, or Init before the thread starts) ---

  std::optional<WorkerId> AddOrUpdate(const WorkerHello& hello, HelloSource source);
  WorkerId UpdateRecord(std::unique_lock<std::shared_mutex>& lock, WorkerRecord& w, ModelEntry& model,
                        const WorkerHello& hello, HelloSource source);
  // A static or DNS worker's answer to a Describe: recorded as its Hello, or refused.
  void OnDescribed(WorkerRecord& w, const WorkerHello& answer);
  void Refuse(const WorkerHello& hello, const std::string& reason, const std::string& why);
  // Takes the accepted worker at `endpoint` (if any) out of routing: it now announces
  // something this router refuses.
  void Withdraw(const std::string& endpoint);

  // --- connections (fleet_connections.cc) ---

  void ConfigureDealer(zmq::socket_t& dealer);
  void Connect(WorkerRecord& w);
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

  // Registry: records are never deleted (ids stay dense and valid), only marked removed.
  mutable std::shared_mutex mu_;
  std::vector<std::unique_ptr<WorkerRecord>> workers_;        // GUARDED_BY(mu_)
  std::map<std::string, WorkerId> by_endpoint_;               // GUARDED_BY(mu_)
  std::map<std::string, ModelEntry, std::less<>> models_;     // GUARDED_BY(mu_)
  std::map<std::string, RefusedWorker> refused_;              // GUARDED_BY(mu_); by requests endpoint

  std::atomic<uint64_t> generation_{0};  // see LaneFleet::Generation
  std::atomic<bool> stopping_flag_{false};

  ThreadLane own_lane_{this};  // Fleet::Submit's

  // Fleet thread only.
  uint64_t monitors_ = 0;
  std::set<std::string> refusals_logged_;

  prometheus::Counter* retries_ = nullptr;
  prometheus::Family<prometheus::Gauge>* inflight_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* refused_family_ = nullptr;
};

}  // namespace kvfleet::router
