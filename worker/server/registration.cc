#include "worker/server/registration.h"

#include <capnp/message.h>

#include "common/log.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet::server {

namespace config {
// How long a Bye may wait in the socket for a router that is slow to take it.
constexpr int kByeLingerMs = 500;
// Hellos queued while the router is unreachable: the newest says it all, so keep few.
constexpr int kSendHighWaterMark = 4;
}  // namespace config

std::string EncodeHello(const HelloInfo& info) {
  capnp::MallocMessageBuilder msg;
  auto hello = msg.initRoot<schema::ToRouter>().initHello();
  hello.setWorkerId(info.worker_id);
  hello.setModel(info.model);
  hello.setBlockSize(info.block_size);
  hello.setMaxContext(info.max_context);
  auto tiers = hello.initTiers(info.host_blocks > 0 ? 2 : 1);
  tiers[0].setTier(schema::Tier::DEVICE);
  tiers[0].setTotalBlocks(info.device_blocks);
  if (info.host_blocks > 0) {
    tiers[1].setTier(schema::Tier::HOST);
    tiers[1].setTotalBlocks(info.host_blocks);
  }
  auto ep = hello.initEndpoints();
  ep.setRequests(info.requests_endpoint);
  ep.setEvents(info.events_endpoint);
  ep.setReplay(info.replay_endpoint);
  ep.setHttp(info.http_endpoint);
  hello.setBackend(info.backend);
  hello.setEpoch(info.epoch);
  return wire::Encode(msg);
}

std::string EncodeBye(const HelloInfo& info) {
  capnp::MallocMessageBuilder msg;
  auto bye = msg.initRoot<schema::ToRouter>().initBye();
  bye.setWorkerId(info.worker_id);
  bye.setEpoch(info.epoch);
  return wire::Encode(msg);
}

Registration::Registration(zmq::context_t& context, const RegistrationOptions& options, const HelloInfo& info)
    : options_(options), hello_(EncodeHello(info)), bye_(EncodeBye(info)), socket_(context, zmq::socket_type::dealer) {}

Result<std::unique_ptr<Registration>> Registration::Start(zmq::context_t& context, const RegistrationOptions& options,
                                                          const HelloInfo& info) {
  std::unique_ptr<Registration> r(new Registration(context, options, info));
  try {
    r->socket_.set(zmq::sockopt::sndhwm, config::kSendHighWaterMark);
    r->socket_.set(zmq::sockopt::linger, config::kByeLingerMs);
    r->socket_.set(zmq::sockopt::routing_id, info.worker_id);
    r->socket_.connect(options.router_endpoint);
  } catch (const zmq::error_t& e) {
    return InvalidArgument("--router " + options.router_endpoint + ": " + e.what());
  }
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

Registration::~Registration() { Stop(false); }

void Registration::Stop(bool say_bye) {
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      // Already stopping; the thread is joined below (or was).
    } else {
      stop_ = true;
      say_bye_ = say_bye;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Registration::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    // A full queue (router down) drops this Hello: the next one carries the same news.
    (void)socket_.send(zmq::buffer(hello_), zmq::send_flags::dontwait);
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.interval), [&] { return stop_; });
  }
  if (say_bye_) {
    (void)socket_.send(zmq::buffer(bye_), zmq::send_flags::dontwait);
    Logger("worker")->info("said Bye to {}", options_.router_endpoint);
  }
  lock.unlock();
  socket_.close();
}

}  // namespace kvfleet::server
