// FleetImpl's connections to the workers (fleet_impl.h): the DEALER every request socket
// starts as (NewDealer: socket options, heartbeats, CURVE), and the fleet thread's own
// DEALER per worker with the socket monitor that says whether that worker is connected;
// the monitors are drained each tick, and a disconnect counts as a failure of the worker.
// On that DEALER the fleet asks each static or DNS worker to describe itself (Describe, on
// connecting and every config::kDescribeInterval) and records its answer as its Hello.
//
// Thread safety: thread-safe, as FleetImpl. NewDealer may be called from any lane's thread;
// the rest runs on the fleet thread (or in Init before it starts).
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <zmq.h>
#include <zmq.hpp>

#include "common/check.h"
#include "common/curve_keys.h"
#include "common/log.h"
#include "router/fleet/fleet_impl.h"
#include "schema/describe.h"
#include "schema/limits.h"

namespace kvfleet::router {

std::unique_ptr<zmq::socket_t> FleetImpl::NewDealer() {
  auto dealer = MakeDealer();
  if (dealer.ok()) return std::move(*dealer);
  uint64_t suppressed = 0;
  if (socket_errors_log_.Allow(&suppressed)) {
    Logger("fleet")->error("{} ({} more suppressed)", dealer.status().message(), suppressed);
  }
  return nullptr;
}

Result<std::unique_ptr<zmq::socket_t>> FleetImpl::MakeDealer() {
  try {
    auto dealer = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    KVF_RETURN_IF_ERROR(ConfigureDealer(*dealer));
    return dealer;
  } catch (const zmq::error_t& e) {
    // EMFILE: the context's ZMQ_MAX_SOCKETS (FleetOptions::MaxSockets) or the process's
    // open-file limit is spent.
    return ResourceExhausted(std::string("cannot make a DEALER to a worker: ") + e.what());
  }
}

Status FleetImpl::ConfigureDealer(zmq::socket_t& dealer) {
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxToRouterBytes);
  dealer.set(zmq::sockopt::reconnect_ivl, 100);
  dealer.set(zmq::sockopt::reconnect_ivl_max, 2000);
  // ZMTP heartbeats: a peer that vanishes without closing TCP is noticed in seconds.
  dealer.set(zmq::sockopt::heartbeat_ivl, 1000);
  dealer.set(zmq::sockopt::heartbeat_timeout, 3000);
  if (curve_) return MakeCurveClient(dealer, curve_keys_, curve_server_public_);
  return Status::Ok();
}

// The fleet thread's own DEALER to a worker carries no requests (the lanes have theirs);
// its monitor tells whether the worker is connected, and when it drops.
Status FleetImpl::Connect(WorkerRecord& w) {
  Status st = OpenConnection(w);
  generation_.fetch_add(1, std::memory_order_release);
  if (st.ok()) return st;
  if (w.monitor) sockets_open_.fetch_sub(2);
  if (w.dealer) sockets_open_.fetch_sub(1);
  w.monitor.reset();
  w.dealer.reset();
  w.connect_retry_at = clock_->Now() + config::kConnectRetryInterval;
  uint64_t suppressed = 0;
  if (socket_errors_log_.Allow(&suppressed)) {
    Logger("fleet")->error("worker {}: {}; trying again in {} ms ({} more suppressed)", w.info.name, st.message(),
                           config::kConnectRetryInterval / kNsPerMs, suppressed);
  }
  return st;
}

Status FleetImpl::OpenConnection(WorkerRecord& w) {
  KVF_ASSIGN_OR_RETURN(w.dealer, MakeDealer());
  sockets_open_.fetch_add(1);
  std::string monitor_ep = "inproc://fleet-monitor-" + std::to_string(w.id) + "-" + std::to_string(++monitors_);
  if (zmq_socket_monitor(w.dealer->handle(), monitor_ep.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return ResourceExhausted(std::string("cannot monitor the DEALER to a worker: ") + zmq_strerror(zmq_errno()));
  }
  try {
    w.monitor = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
    sockets_open_.fetch_add(2);  // with the monitor's own end
    w.monitor->set(zmq::sockopt::linger, 0);
    w.monitor->connect(monitor_ep);
  } catch (const zmq::error_t& e) {
    return ResourceExhausted(std::string("cannot monitor the DEALER to a worker: ") + e.what());
  }
  try {
    w.dealer->connect(w.info.requests_endpoint);
  } catch (const zmq::error_t& e) {
    // A malformed endpoint: kept, never connected, so never routable.
    Logger("fleet")->warn("worker {}: cannot connect to {}: {}", w.info.name, w.info.requests_endpoint, e.what());
  }
  return Status::Ok();
}

void FleetImpl::RetryConnects() {
  const TimeNs now = clock_->Now();
  std::vector<WorkerRecord*> retry;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& w : workers_) {
      if (w && !w->dealer && !w->removed.load() && now >= w->connect_retry_at) retry.push_back(w.get());
    }
  }
  for (WorkerRecord* w : retry) (void)Connect(*w);
}

void FleetImpl::Disconnect(WorkerRecord& w) {
  generation_.fetch_add(1, std::memory_order_release);
  w.connected = false;
  if (w.monitor) sockets_open_.fetch_sub(2);
  if (w.dealer) sockets_open_.fetch_sub(1);
  w.monitor.reset();
  w.dealer.reset();
}

void FleetImpl::DrainMonitors() {
  std::vector<WorkerRecord*> with_monitor;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& w : workers_) {
      if (w && w->monitor) with_monitor.push_back(w.get());
    }
  }
  for (WorkerRecord* w : with_monitor) {
    if (!w->monitor) continue;
    DrainMonitor(*w);
    if (w->from_static && w->dealer && w->connected.load()) {
      DrainDescribed(*w);
      Describe(*w, /*now=*/false);
    }
  }
}

void FleetImpl::Describe(WorkerRecord& w, bool now) {
  const TimeNs t = clock_->Now();
  if (!now && t - w.described_asked_at < config::kDescribeInterval) return;
  w.described_asked_at = t;
  if (!w.described.load()) w.row.describes_sent.fetch_add(1, std::memory_order_relaxed);
  static const std::string frame = EncodeDescribe();
  // A full queue (the worker is not reading) drops this one: the next interval asks again.
  (void)w.dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait);
}

void FleetImpl::DrainDescribed(WorkerRecord& w) {
  for (int i = 0; i < 16; ++i) {  // answers are few: one per Describe
    zmq::message_t frame;
    if (!w.dealer->recv(frame, zmq::recv_flags::dontwait)) return;
    auto answer = DecodeDescribed(frame.data(), frame.size());
    if (!answer.ok()) {
      Logger("fleet")->warn("worker {}: an answer to Describe that is not a Hello: {}", w.info.name,
                            answer.status().message());
      continue;
    }
    OnDescribed(w, *answer);
  }
}

void FleetImpl::OnDescribed(WorkerRecord& w, const WorkerHello& answer) {
  WorkerHello listed;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    listed = w.listed;
  }
  const WorkerHello hello = DescribedHello(listed, answer);
  if (hello.model != listed.model) {
    w.refused = true;
    Refuse(hello, "model-mismatch",
           "listed for model '" + listed.model + "' (--workers, --workers-dns, --model) but serves '" + hello.model +
               "' (its --model-name)");
    return;
  }
  const bool first = !w.described.load();
  const bool accepted = AddOrUpdate(hello, HelloSource::kDescribed).has_value();
  w.refused = !accepted;
  if (accepted && first && (hello.block_size != listed.block_size || hello.max_context != listed.max_context)) {
    Logger("fleet")->info("worker {} ({}): block size {} and max context {} from the worker, not the router's {} and {}",
                          hello.name, hello.requests_endpoint, hello.block_size, hello.max_context, listed.block_size,
                          listed.max_context);
  }
}

void FleetImpl::DrainMonitor(WorkerRecord& w) {
  while (true) {
    zmq::message_t event, address;
    if (!w.monitor->recv(event, zmq::recv_flags::dontwait)) return;
    if (!event.more() || !w.monitor->recv(address, zmq::recv_flags::dontwait)) return;
    uint16_t code = 0;
    if (event.size() >= sizeof(code)) std::memcpy(&code, event.data(), sizeof(code));
    if (code == ZMQ_EVENT_CONNECTED) {
      w.connected = true;
      if (w.from_static) Describe(w, /*now=*/true);
    } else if (code == ZMQ_EVENT_DISCONNECTED) {
      if (w.connected.exchange(false)) {
        Logger("fleet")->warn("worker {} disconnected", w.info.name);
      }
      FailWorker(w.id, Unavailable("worker " + w.info.name + " disconnected"));
    }
  }
}

}  // namespace kvfleet::router
