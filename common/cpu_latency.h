// CpuLatencyRequest: a CPU latency QoS request that keeps idle CPUs out of slow idle states
// while a router or worker runs (--cpu-latency-us).
//
// A request's path is a chain of thread hand-offs: the router's HTTP thread and ZMQ I/O
// thread, the worker's ZMQ I/O thread and socket thread, and back. Each hand-off that lands
// on an idle CPU pays that CPU's wake-up: a few µs from a polling idle loop, but from HLT on
// a virtual machine a VM exit and an IPI through the hypervisor, tens of µs on average with
// millisecond tails. On the 2-vCPU benchmark VM (guest halt polling off), with
// --cpu-latency-us 0 the router's added latency for 8K-token prompts went from 0.49 to 0.44 ms
// at p50 and 0.97 to 0.92 ms at p99, and the bare transport floor's p99 from 0.58 to 0.52 ms
// (medians of 5 runs each; tests/bench/results/2026-11-22-router-latency-s4.txt).
//
// Linux's CPU latency QoS (Documentation/power/pm_qos_interface.rst): a process that writes a
// 32-bit latency in µs to /dev/cpu_dma_latency and keeps the file open caps the exit latency
// of the idle states cpuidle may pick, on every CPU, until the file is closed (also when the
// process dies). 0 keeps idle CPUs polling. The price: power, and on a VM, host CPU time for
// the idle vCPUs. It is machine-wide, so one holder per machine is enough.
//
// Thread safety: thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace CLI {
class App;
}

namespace kvfleet {

inline constexpr const char* kCpuLatencyDevice = "/dev/cpu_dma_latency";

class CpuLatencyRequest {
 public:
  // Requests at most `max_latency_us` of idle-state exit latency, held until destruction.
  // Fails with the reason when `device` cannot be opened for writing (it needs root or write
  // access; a container needs the device passed in) or refuses the value.
  static Result<std::unique_ptr<CpuLatencyRequest>> Hold(uint32_t max_latency_us,
                                                         const std::string& device = kCpuLatencyDevice);
  ~CpuLatencyRequest();  // closes the device: the request ends
  CpuLatencyRequest(const CpuLatencyRequest&) = delete;
  CpuLatencyRequest& operator=(const CpuLatencyRequest&) = delete;

  uint32_t max_latency_us() const { return max_latency_us_; }

 private:
  CpuLatencyRequest(int fd, uint32_t max_latency_us) : fd_(fd), max_latency_us_(max_latency_us) {}
  int fd_;
  uint32_t max_latency_us_;
};

// The --cpu-latency-us option of a binary: -1 (default) leaves the machine as it is.
struct CpuLatencyOption {
  int64_t max_latency_us = -1;
};

// Adds --cpu-latency-us to `app`.
void AddCpuLatencyOption(CLI::App& app, CpuLatencyOption* option);

// Holds the request `option` asks for: nullptr for -1. Fails with the reason otherwise.
Result<std::unique_ptr<CpuLatencyRequest>> HoldCpuLatency(const CpuLatencyOption& option,
                                                          const std::string& device = kCpuLatencyDevice);

}  // namespace kvfleet
