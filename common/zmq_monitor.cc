#include "common/zmq_monitor.h"

#include <atomic>
#include <cstring>

#include <zmq.h>
#include <zmq.hpp>

namespace kvfleet {

Result<std::unique_ptr<SocketMonitor>> SocketMonitor::Start(zmq::context_t& context, zmq::socket_t& socket,
                                                           int events) {
  static std::atomic<uint64_t> next{0};
  const std::string endpoint = "inproc://kvfleet-monitor-" + std::to_string(next.fetch_add(1));
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) {
    return ResourceExhausted(std::string("cannot monitor a socket: ") + zmq_strerror(zmq_errno()));
  }
  try {
    auto pair = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
    pair->set(zmq::sockopt::linger, 0);
    pair->connect(endpoint);
    return std::unique_ptr<SocketMonitor>(new SocketMonitor(std::move(pair)));
  } catch (const zmq::error_t& e) {
    return ResourceExhausted(std::string("cannot monitor a socket: ") + e.what());
  }
}

SocketMonitor::SocketMonitor(std::unique_ptr<zmq::socket_t> pair) : pair_(std::move(pair)) {}
SocketMonitor::~SocketMonitor() = default;

void SocketMonitor::Drain(const std::function<void(uint16_t event, std::string_view address)>& on_event) {
  while (true) {
    zmq::message_t event, address;
    if (!pair_->recv(event, zmq::recv_flags::dontwait)) return;
    if (!event.more() || !pair_->recv(address, zmq::recv_flags::dontwait)) return;
    uint16_t code = 0;
    if (event.size() >= sizeof(code)) std::memcpy(&code, event.data(), sizeof(code));
    on_event(code, std::string_view(static_cast<const char*>(address.data()), address.size()));
  }
}

}  // namespace kvfleet
