#include "common/zmq_threads.h"

#include <algorithm>
#include <string>
#include <thread>

#include <zmq.h>
#include <zmq.hpp>

namespace kvfleet {

void StartZmqThreadsAtLowerPriority(zmq::context_t& context, int increment) {
  std::thread([&context, increment] {
    LowerThisThreadPriority(increment);
    // The context's first socket starts its threads, here, at this thread's priority.
    zmq::socket_t first(context, zmq::socket_type::pair);
    first.set(zmq::sockopt::linger, 0);
  }).join();
}

Result<size_t> SetMaxSockets(zmq::context_t& context, size_t sockets) {
  const int limit = zmq_ctx_get(context.handle(), ZMQ_SOCKET_LIMIT);
  const int want = static_cast<int>(std::min<size_t>(sockets, limit > 0 ? static_cast<size_t>(limit) : sockets));
  if (zmq_ctx_set(context.handle(), ZMQ_MAX_SOCKETS, want) != 0) {
    return ResourceExhausted("ZMQ_MAX_SOCKETS " + std::to_string(want) + ": " + zmq_strerror(zmq_errno()));
  }
  return static_cast<size_t>(want);
}

}  // namespace kvfleet
