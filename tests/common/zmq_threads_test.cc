#include "common/zmq_threads.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <doctest/doctest.h>
#include <zmq.hpp>

namespace kvfleet {
namespace {

std::set<int> ThreadIds() {
  std::set<int> ids;
  DIR* dir = opendir("/proc/self/task");
  REQUIRE(dir != nullptr);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ids.insert(std::stoi(e->d_name));
  }
  closedir(dir);
  return ids;
}

// A thread's nice value, from /proc (field 19 of stat, after the parenthesized name).
int NiceOf(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 19; ++i) rest >> field;  // fields 3..19
  return std::stoi(field);
}

TEST_CASE("a context's ZMQ threads start at the background priority; the caller's is unchanged") {
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int mine = NiceOf(tid);
  const std::set<int> before = ThreadIds();
  zmq::context_t context(1);
  StartZmqThreadsAtLowerPriority(context, 3);
  const std::set<int> after = ThreadIds();
  int started = 0;
  for (int id : after) {
    if (before.count(id) != 0) continue;
    ++started;
    CHECK(NiceOf(id) == std::min(mine + 3, 19));
  }
  CHECK(started >= 2);  // the I/O thread and the reaper
  CHECK(NiceOf(tid) == mine);
  // Sockets made afterwards work as usual.
  zmq::socket_t a(context, zmq::socket_type::pair), b(context, zmq::socket_type::pair);
  a.bind("inproc://zmq-threads-test");
  b.connect("inproc://zmq-threads-test");
  REQUIRE(a.send(zmq::str_buffer("hi")));
  zmq::message_t m;
  REQUIRE(b.recv(m));
  CHECK(m.to_string() == "hi");
}

}  // namespace
}  // namespace kvfleet
