#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace kvfleet::internal {

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "kvfleet: check failed at %s:%d: %s%s%s\n", file, line, cond, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kvfleet::internal
