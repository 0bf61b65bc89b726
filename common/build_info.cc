#include "common/build_info.h"

// Set for this file only (common/CMakeLists.txt), at configure time: a commit without a
// re-configure keeps the sha of the last one.
#ifndef KVFLEET_VERSION
#define KVFLEET_VERSION "unknown"
#endif
#ifndef KVFLEET_GIT_SHA
#define KVFLEET_GIT_SHA "unknown"
#endif
#ifndef KVFLEET_BUILD_TYPE
#define KVFLEET_BUILD_TYPE "unknown"
#endif

namespace kvfleet {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info{KVFLEET_VERSION, KVFLEET_GIT_SHA, KVFLEET_BUILD_TYPE};
  return info;
}

}  // namespace kvfleet
