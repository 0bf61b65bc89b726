#include "common/zmq_threads.h"

#include <thread>

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

}  // namespace kvfleet
