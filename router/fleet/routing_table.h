// RoutingTable: what a routing decision reads of each worker, in one dense array of small rows
// by worker id, apart from the worker's record (fleet_impl.h: its Hello, sockets and own-load
// history ring, ~11 KiB each, one heap object per worker).
//
// A decision reads every routable worker of its model twice: Resolve lists them
// (FleetImpl::FleetOf: removed, routable, context length) and Route weighs them
// (FleetImpl::Loads: own counts, role, rates, transfer ids). At 1,000 workers the scattered
// records cost several cache misses per worker each time; a row is 128 bytes (two lines),
// and ids are below max_workers and reused lowest first, so a model's rows lie close together.
// The event plane keeps the workers' load reports in its own array by id (event_plane_impl.h).
//
// Who writes a row, so that it never disagrees with the record:
//   - the membership flags (removed, said_bye, connected, refused, described) live only here:
//     WorkerRecord's are references to them;
//   - the Hello's fields routing reads are set by SetInfo (fleet_impl.h), the one place a
//     record's `info` changes, with FleetImpl::mu_ held exclusively; read under it shared;
//   - this router's own counts and their newest sample: the record's OwnLoadCounter publishes
//     them in `own` (own_load_history.h).
// A row is reset when a new worker takes its id (WorkerRecord's constructor), under mu_.
//
// Thread safety: rows are written and read as said above; the table itself never moves.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "router/core/worker.h"
#include "router/fleet/own_load_history.h"
#include "schema/registration.h"

namespace kvfleet::router {

struct alignas(64) RoutingRow {
  // Membership (see WorkerRecord): written by the fleet thread, read anywhere.
  std::atomic<bool> removed{false};
  std::atomic<bool> said_bye{false};
  std::atomic<bool> connected{false};
  std::atomic<bool> refused{false};
  std::atomic<bool> described{false};
  // Describes sent while not described (static and DNS workers): one unanswered is a worker
  // whose answer is a moment away; two (config::kDescribeInterval apart) one older than Describe.
  std::atomic<uint32_t> describes_sent{0};
  // Of the record's `info`. GUARDED_BY(FleetImpl::mu_).
  WorkerRole role = WorkerRole::kBoth;
  bool structured_outputs = false;
  bool names_device = false;     // a deviceId: routing asks for its device mates
  bool needs_tokenizer = false;  // backend cpu or cuda (ModelFleet::needs_tokenizer)
  uint32_t max_context = 0;
  uint32_t transfer_format = 0;  // LoadView's ids of the record's `transfer`
  uint32_t transfer_host = 0;
  double announced_prefill_rate = 0;
  OwnLoadSlot own;  // this router's in-flight counts there, published by the record's counter

  // A new worker's row: no flag set, no Hello, no counts. REQUIRES: FleetImpl::mu_ held
  // exclusively, no counter publishing here.
  void Reset() {
    removed = false;
    said_bye = false;
    connected = false;
    refused = false;
    described = false;
    describes_sent = 0;
    SetInfo(WorkerHello{}, 0, 0);
    own.Reset();
  }
  // The Hello's fields, and its transfer service's ids. REQUIRES: FleetImpl::mu_ held exclusively.
  void SetInfo(const WorkerHello& info, uint32_t format_id, uint32_t host_id) {
    role = info.role;
    structured_outputs = info.structured_outputs;
    names_device = !info.device_id.empty();
    needs_tokenizer = info.backend == "cpu" || info.backend == "cuda";
    max_context = info.max_context;
    transfer_format = format_id;
    transfer_host = host_id;
    announced_prefill_rate = info.prefill_tokens_per_second;
  }
};

class RoutingTable {
 public:
  explicit RoutingTable(size_t rows) : rows_(std::make_unique<RoutingRow[]>(rows)), size_(rows) {}
  size_t size() const { return size_; }
  // REQUIRES: id < size().
  RoutingRow& operator[](WorkerId id) { return rows_[id]; }
  const RoutingRow& operator[](WorkerId id) const { return rows_[id]; }

 private:
  std::unique_ptr<RoutingRow[]> rows_;
  size_t size_;
};

}  // namespace kvfleet::router
