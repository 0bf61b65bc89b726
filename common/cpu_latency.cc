#include "common/cpu_latency.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <CLI/CLI.hpp>

namespace kvfleet {

Result<std::unique_ptr<CpuLatencyRequest>> CpuLatencyRequest::Hold(uint32_t max_latency_us,
                                                                   const std::string& device) {
  int fd = ::open(device.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string why = "cannot open " + device + " to hold a CPU latency request: " + std::strerror(err);
    if (err == EACCES || err == EPERM) why += " (it needs root or write access; a container needs the device)";
    return Unavailable(why);
  }
  // The device takes the latency as a binary 32-bit integer.
  const int32_t value = static_cast<int32_t>(max_latency_us);
  if (::write(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) {
    const int err = errno;
    ::close(fd);
    return Unavailable("cannot write a CPU latency request to " + device + ": " + std::strerror(err));
  }
  return std::unique_ptr<CpuLatencyRequest>(new CpuLatencyRequest(fd, max_latency_us));
}

CpuLatencyRequest::~CpuLatencyRequest() { ::close(fd_); }

void AddCpuLatencyOption(CLI::App& app, CpuLatencyOption* option) {
  app.add_option("--cpu-latency-us", option->max_latency_us,
                 "hold a CPU latency QoS request (/dev/cpu_dma_latency) of this many µs while running: idle "
                 "CPUs wake faster (0: they poll; costs idle power). -1: leave the machine as it is")
      ->check(CLI::Range(int64_t{-1}, int64_t{2'000'000'000}))
      ->capture_default_str();
}

Result<std::unique_ptr<CpuLatencyRequest>> HoldCpuLatency(const CpuLatencyOption& option, const std::string& device) {
  if (option.max_latency_us < 0) return std::unique_ptr<CpuLatencyRequest>();
  return CpuLatencyRequest::Hold(static_cast<uint32_t>(option.max_latency_us), device);
}

}  // namespace kvfleet
