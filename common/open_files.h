// The process's open-file limit (RLIMIT_NOFILE). Every ZeroMQ socket holds a descriptor for
// its mailbox and every TCP connection one more, so a router with many workers needs more
// than the usual soft limit of 1,024.
//
// Thread safety: call at start-up, before other threads open files.
#pragma once

#include <cstdint>

namespace kvfleet {

struct OpenFileLimit {
  uint64_t soft = 0;  // the limit in force now
  uint64_t hard = 0;  // the most an unprivileged process may raise it to
  bool raised = false;
};

// Raises the soft limit to `wanted`, or as far as the hard limit allows, when it is lower.
// Never lowers it.
OpenFileLimit RaiseOpenFileLimit(uint64_t wanted);

}  // namespace kvfleet
