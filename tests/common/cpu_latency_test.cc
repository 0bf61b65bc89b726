#include "common/cpu_latency.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <CLI/CLI.hpp>
#include <doctest/doctest.h>

namespace kvfleet {
namespace {

// A stand-in for /dev/cpu_dma_latency: a regular file takes the same write.
std::string TempPath(const char* name) {
  return std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kvfleet_cpu_latency_" +
         std::to_string(getpid()) + "_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += fcntl(fd, F_GETFD) != -1;
  return n;
}

TEST_CASE("a held request writes the latency as a 32-bit integer and keeps the device open until destroyed") {
  const std::string path = TempPath("held");
  { std::ofstream(path).flush(); }
  const int before = OpenFds();
  {
    auto held = CpuLatencyRequest::Hold(25, path);
    REQUIRE(held.ok());
    CHECK((*held)->max_latency_us() == 25);
    CHECK(OpenFds() == before + 1);  // the request lasts as long as the file stays open
    const std::string bytes = ReadAll(path);
    REQUIRE(bytes.size() == sizeof(int32_t));
    int32_t value = -1;
    std::memcpy(&value, bytes.data(), sizeof(value));
    CHECK(value == 25);
  }
  CHECK(OpenFds() == before);
  std::remove(path.c_str());
}

TEST_CASE("a device that cannot be opened is an error that names it") {
  const std::string path = TempPath("missing") + "/no/such/device";
  auto held = CpuLatencyRequest::Hold(0, path);
  REQUIRE_FALSE(held.ok());
  CHECK(held.status().code() == StatusCode::kUnavailable);
  CHECK(held.status().message().find(path) != std::string::npos);
}

TEST_CASE("--cpu-latency-us: -1 holds nothing, a value holds that request, out of range is refused") {
  const std::string path = TempPath("option");
  { std::ofstream(path).flush(); }
  CpuLatencyOption option;
  CLI::App app;
  AddCpuLatencyOption(app, &option);

  const char* none[] = {"prog"};
  app.parse(1, const_cast<char**>(none));
  auto nothing = HoldCpuLatency(option, path);
  REQUIRE(nothing.ok());
  CHECK(*nothing == nullptr);

  const char* zero[] = {"prog", "--cpu-latency-us", "0"};
  app.parse(3, const_cast<char**>(zero));
  auto held = HoldCpuLatency(option, path);
  REQUIRE(held.ok());
  REQUIRE(*held != nullptr);
  CHECK((*held)->max_latency_us() == 0);

  const char* negative[] = {"prog", "--cpu-latency-us", "-2"};
  CHECK_THROWS_AS(app.parse(3, const_cast<char**>(negative)), CLI::ValidationError);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvfleet
