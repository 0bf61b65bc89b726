#include "common/open_files.h"

#include <sys/resource.h>

#include <algorithm>

namespace kvfleet {

OpenFileLimit RaiseOpenFileLimit(uint64_t wanted) {
  OpenFileLimit out;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return out;
  out.soft = lim.rlim_cur;
  out.hard = lim.rlim_max;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < wanted) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? wanted : std::min<rlim_t>(wanted, lim.rlim_max);
    if (raised.rlim_cur > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      out.soft = raised.rlim_cur;
      out.raised = true;
    }
  }
  return out;
}

}  // namespace kvfleet
