// Thread priorities for work that may wait behind the request path.
//
// On a small machine the threads that apply KV events, publish them, or keep the registry
// wake at the very moments a request's answer is flowing (a worker stores a prompt's blocks
// as it emits the first token). Giving those threads a higher nice value lets the kernel
// run the request path first when both are runnable; they still get every spare cycle.
#pragma once

namespace kvfleet {

// Nice increment for background threads: a runnable nice-5 thread gets ~1/3 of the CPU
// share of a nice-0 one under CFS, enough to keep an index current at 10M events/s of
// capacity while a request thread is never queued behind it for a whole slice.
constexpr int kBackgroundNice = 5;

// Raises the calling thread's nice value by `increment` (Linux: per thread). Best effort:
// a failure (e.g. a seccomp policy) leaves the priority as it was.
void LowerThisThreadPriority(int increment = kBackgroundNice);

}  // namespace kvfleet
