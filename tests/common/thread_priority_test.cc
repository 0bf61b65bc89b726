#include "common/thread_priority.h"

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

namespace kvfleet {
namespace {

int NiceOf(pid_t tid) { return getpriority(PRIO_PROCESS, static_cast<id_t>(tid)); }

TEST_CASE("LowerThisThreadPriority raises the calling thread's nice value and no other thread's") {
  const auto main_tid = static_cast<pid_t>(syscall(SYS_gettid));
  const int main_before = NiceOf(main_tid);
  int before = 0, after = 0;
  std::thread t([&] {
    const auto tid = static_cast<pid_t>(syscall(SYS_gettid));
    before = NiceOf(tid);
    LowerThisThreadPriority(3);
    after = NiceOf(tid);
  });
  t.join();
  CHECK(after == std::min(before + 3, 19));  // 19 is the lowest priority Linux allows
  CHECK(NiceOf(main_tid) == main_before);
}

}  // namespace
}  // namespace kvfleet
