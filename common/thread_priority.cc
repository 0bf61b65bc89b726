#include "common/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace kvfleet {

void LowerThisThreadPriority(int increment) {
  // On Linux a thread id names one thread for PRIO_PROCESS (not POSIX, but documented in
  // setpriority(2) and relied on by the kernel's own tools).
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return;
  (void)setpriority(PRIO_PROCESS, tid, current + increment);
}

}  // namespace kvfleet
