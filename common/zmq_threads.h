// ZMQ background threads at a background thread's priority, and a context's socket limit.
//
// A ZMQ context runs its own I/O threads (and a reaper). They are created by the context's
// first socket, from the thread that makes it, and inherit that thread's nice value. The
// contexts that carry KV events (the worker's publisher, the router's event plane) are made
// on the main thread, so their I/O threads ran at nice 0 while the threads they feed run at
// kBackgroundNice (thread_priority.h): at a prompt's first token, the worker publishes its
// blocks and four event threads woke at the request path's priority, competing with the
// token's own hops for a core.
//
// Thread safety: call before any other socket is made on the context (afterwards its
// threads exist and keep their priority).
#pragma once

#include <cstddef>

#include "common/status.h"
#include "common/thread_priority.h"

namespace zmq {
class context_t;
}

namespace kvfleet {

// Starts `context`'s background threads from a thread at `increment` nice above the
// caller's, so they run at that priority. Returns once they exist.
void StartZmqThreadsAtLowerPriority(zmq::context_t& context, int increment = kBackgroundNice);

// Sets `context`'s ZMQ_MAX_SOCKETS (libzmq's default is 1,023) to `sockets`, or to the most
// the library allows (ZMQ_SOCKET_LIMIT) when that is less. Returns the limit set. REQUIRES:
// no socket made on the context yet (its first socket fixes the limit).
Result<size_t> SetMaxSockets(zmq::context_t& context, size_t sockets);

}  // namespace kvfleet
