// FleetSim: N simulated workers (sim_worker.h) in one process, for router scale tests:
// `kvfleet simulate`. Workers are split over a few shards; each shard is one thread with
// one poll loop over its workers' sockets and timers. Churn replaces a fraction of the
// fleet per minute: a worker says Bye and a new one, with a new id and new ports, takes
// its place.
//
// Ports: worker slot k binds base_port + 3k (requests), + 3k + 1 (events), + 3k + 2
// (replay) on `host`, for 2N + 64 slots (fewer where they would pass 65535). A departed
// worker's slot is reused only after the cursor has been round every other slot, so a new
// worker gets endpoints no recent worker had. Keep them below the kernel's ephemeral range
// (ip_local_port_range, usually from 32768), where the router's own connections take ports.
//
// Thread safety: Run() from one thread; Totals() from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "cli/simulate/sim_worker.h"
#include "common/status.h"

namespace kvfleet::sim {

struct FleetSimOptions {
  uint32_t workers = 100;
  std::string name_prefix = "sim";  // worker ids: <prefix>-<n>, n counting every worker started
  uint16_t base_port = 20000;
  uint32_t threads = 2;             // shards
  double churn_per_min = 0.10;      // fraction of the fleet replaced per minute
  double duration_s = 0;           // 0: until stopped
  double stats_interval_s = 10;     // a progress line this often; 0: none
  uint64_t seed = 1;
  // Every worker's settings; name, ports and seed are set per worker.
  SimWorkerOptions worker;
};

// Validates what flags can get wrong; the message names the flag.
Status ValidateFleetSimOptions(const FleetSimOptions& options);

// Hands out port slots (three ports each), round-robin over the free ones.
class PortSlots {
 public:
  PortSlots(uint16_t base_port, uint32_t slots);
  // A free slot, marked in use; Unavailable when every slot is.
  Result<uint32_t> Take();
  void Release(uint32_t slot);
  uint16_t port(uint32_t slot, int which) const { return static_cast<uint16_t>(base_ + 3 * slot + which); }
  uint32_t size() const { return static_cast<uint32_t>(in_use_.size()); }

 private:
  std::mutex mu_;
  const uint32_t base_;
  std::vector<bool> in_use_;  // GUARDED_BY(mu_)
  uint32_t cursor_ = 0;       // GUARDED_BY(mu_)
};

class FleetSim {
 public:
  explicit FleetSim(const FleetSimOptions& options);
  ~FleetSim();

  // Starts every worker, runs until `stop` is set or duration_s passes, then every worker
  // says Bye. An error when the fleet could not start (ports taken, say).
  Status Run(const std::atomic<bool>& stop);

  // What every worker did so far (refreshed by each shard a few times a second).
  SimCounters Totals() const;
  // Workers up now.
  uint32_t live_workers() const { return live_.load(std::memory_order_relaxed); }

 private:
  class Shard;
  friend class Shard;
  // Starts one worker in a free slot (trying the next on a taken port).
  Result<std::unique_ptr<SimWorker>> StartWorker(TimeNs now, SimCounters* counters, uint32_t* slot);
  void LogProgress(const SimCounters& now, const SimCounters& before, double seconds) const;

  const FleetSimOptions options_;
  zmq::context_t context_;
  PortSlots slots_;
  std::atomic<uint64_t> next_worker_{0};
  std::atomic<uint32_t> live_{0};
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace kvfleet::sim
