#include "worker/server/registration.h"

#include <cstdio>

#include "common/log.h"
#include "schema/limits.h"

namespace kvfleet::server {

namespace config {
// How long a Bye may wait in the socket for a router that is slow to take it.
constexpr int kByeLingerMs = 500;
// Hellos queued while the router is unreachable: the newest says it all, so keep few.
constexpr int kSendHighWaterMark = 4;
constexpr size_t kMaxRoutingIdBytes = 255;
}  // namespace config

std::string RegistrationRoutingId(const std::string& name, uint64_t epoch) {
  char suffix[18];
  std::snprintf(suffix, sizeof(suffix), "#%016llx", static_cast<unsigned long long>(epoch));
  return name + suffix;
}

Registration::Registration(zmq::context_t& context, const RegistrationOptions& options, const WorkerHello& info)
    : options_(options), hello_(EncodeHello(info)), bye_(EncodeBye(WorkerBye{info.name, info.epoch})), socket_(context, zmq::socket_type::dealer) {}

Result<std::unique_ptr<Registration>> Registration::Start(zmq::context_t& context, const RegistrationOptions& options,
                                                          const WorkerHello& info) {
  // ZMQ routing ids are 1..255 bytes.
  if (info.name.empty() || RegistrationRoutingId(info.name, info.epoch).size() > config::kMaxRoutingIdBytes) {
    return InvalidArgument("worker id " + EscapeForLog(info.name, 64) + " is " + std::to_string(info.name.size()) +
                           " bytes; registration takes 1 to " +
                           std::to_string(config::kMaxRoutingIdBytes - RegistrationRoutingId("", 0).size()));
  }
  std::unique_ptr<Registration> r(new Registration(context, options, info));
  try {
    r->socket_.set(zmq::sockopt::sndhwm, config::kSendHighWaterMark);
    r->socket_.set(zmq::sockopt::linger, config::kByeLingerMs);
    r->socket_.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxRegistrationReplyBytes);
    r->socket_.set(zmq::sockopt::routing_id, RegistrationRoutingId(info.name, info.epoch));
    if (!options.router_public_key.empty()) {
      KVF_RETURN_IF_ERROR(MakeCurveClient(r->socket_, options.keys, options.router_public_key));
    }
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

void Registration::Update(const WorkerHello& info, bool now) {
  std::string hello = EncodeHello(info);
  {
    std::lock_guard lock(mu_);
    hello_ = std::move(hello);
    resend_ = resend_ || now;
  }
  cv_.notify_all();
}

void Registration::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    const std::string hello = hello_;
    resend_ = false;
    lock.unlock();
    // A full queue (router down) drops this Hello: the next one carries the same news.
    (void)socket_.send(zmq::buffer(hello), zmq::send_flags::dontwait);
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(options_.interval), [&] { return stop_ || resend_; });
  }
  if (say_bye_) {
    (void)socket_.send(zmq::buffer(bye_), zmq::send_flags::dontwait);
    Logger("worker")->info("said Bye to {}", options_.router_endpoint);
  }
  lock.unlock();
  socket_.close();
}

}  // namespace kvfleet::server
