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
  auto dealer = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
  ConfigureDealer(*dealer);
  return dealer;
}

void FleetImpl::ConfigureDealer(zmq::socket_t& dealer) {
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxToRouterBytes);
  dealer.set(zmq::sockopt::reconnect_ivl, 100);
  dealer.set(zmq::sockopt::reconnect_ivl_max, 2000);
  // ZMTP heartbeats: a peer that vanishes without closing TCP is noticed in seconds.
  dealer.set(zmq::sockopt::heartbeat_ivl, 1000);
  dealer.set(zmq::sockopt::heartbeat_timeout, 3000);
  if (curve_) KVF_CHECK(MakeCurveClient(dealer, curve_keys_, curve_server_public_).ok());
}

// The fleet thread's own DEALER to a worker carries no requests (the lanes have theirs);
// its monitor tells whether the worker is connected, and when it drops.
void FleetImpl::Connect(WorkerRecord& w) {
  w.dealer = NewDealer();
  std::string monitor_ep = "inproc://fleet-monitor-" + std::to_string(w.id) + "-" + std::to_string(++monitors_);
  KVF_CHECK(zmq_socket_monitor(w.dealer->handle(), monitor_ep.c_str(),
                               ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) == 0);
  w.monitor = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
  w.monitor->set(zmq::sockopt::linger, 0);
  w.monitor->connect(monitor_ep);
  generation_.fetch_add(1, std::memory_order_release);
  try {
    w.dealer->connect(w.info.requests_endpoint);
  } catch (const zmq::error_t& e) {
    Logger("fleet")->warn("worker {}: cannot connect to {}: {}", w.info.name, w.info.requests_endpoint, e.what());
  }
}

void FleetImpl::Disconnect(WorkerRecord& w) {
  generation_.fetch_add(1, std::memory_order_release);
  w.connected = false;
  w.monitor.reset();
  w.dealer.reset();
}

void FleetImpl::DrainMonitors() {
  std::vector<WorkerRecord*> with_monitor;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& w : workers_) {
      if (w->monitor) with_monitor.push_back(w.get());
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
