// A small mock-backend worker on loopback (every port chosen by the system) for the fleet's
// tests that need a real worker: fleet_curve_test.cc and membership_test.cc.
#pragma once

#include <string>

#include "tests/worker/server/loopback_worker_config.h"
#include "worker/server/worker_config.h"

namespace kvfleet::router::testing {

inline server::WorkerConfig MockWorkerConfig(const std::string& model) {
  server::WorkerConfig config = server::testing::LoopbackWorkerConfig();
  config.backend = "mock";
  config.model_name = model;
  config.block_size = 16;
  config.max_num_tokens = 256;
  config.max_batch_size = 8;
  config.kv_cache_bytes = 64ull * 2 * 1024 * 1024;
  return config;
}

}  // namespace kvfleet::router::testing
