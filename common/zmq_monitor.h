// SocketMonitor: the events of one ZeroMQ socket (zmq_socket_monitor), read without
// blocking. It costs two sockets of the monitored socket's context (the monitor's two PAIR
// ends). A connection ZeroMQ drops because its peer sent a frame over ZMQ_MAXMSGSIZE shows
// here as ZMQ_EVENT_DISCONNECTED, as does a peer that went away.
//
// Thread safety: thread-compatible; used on the monitored socket's thread. Destroy it before
// the monitored socket.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace kvfleet {

class SocketMonitor {
 public:
  // Monitors `socket` (made on `context`) for `events` (ZMQ_EVENT_* bits).
  static Result<std::unique_ptr<SocketMonitor>> Start(zmq::context_t& context, zmq::socket_t& socket, int events);
  ~SocketMonitor();

  // Calls `on_event` with each event and its peer's address, until none is queued.
  void Drain(const std::function<void(uint16_t event, std::string_view address)>& on_event);

 private:
  explicit SocketMonitor(std::unique_ptr<zmq::socket_t> pair);
  std::unique_ptr<zmq::socket_t> pair_;
};

}  // namespace kvfleet
