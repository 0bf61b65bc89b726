// What the tests that run kvfleet's binaries as child processes share: a scratch directory,
// reading a log, and a child process that is stopped and reaped when the test ends.
//
// Thread safety: thread-compatible.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace kvfleet::testing {

// <temp>/<prefix><pid>, created now and removed with everything in it at the end.
struct TempDir {
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  std::filesystem::path path;
};

// The file's contents; empty when it cannot be read.
std::string ReadFile(const std::filesystem::path& path);

// `bin args...` with stdout and stderr to `log` and `env` added to this process's
// environment; SIGTERMed and reaped on destruction.
class ChildProcess {
 public:
  ChildProcess(const std::string& bin, std::vector<std::string> args, const std::filesystem::path& log,
               const std::vector<std::pair<std::string, std::string>>& env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool Running() const;
  // Waits for the exit: its status (128 when killed by a signal), or -1 after `timeout_s`.
  int Wait(double timeout_s);
  const std::filesystem::path& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_path_;
};

}  // namespace kvfleet::testing
