// A small mock-backend worker on loopback (every port chosen by the system) for the fleet's
// tests that need a real worker: fleet_curve_test.cc and membership_test.cc.
#pragma once

#include <string>

#include "worker/server/worker_config.h"

namespace kvfleet::router::testing {

inline server::WorkerConfig MockWorkerConfig(const std::string& model) {
  server::WorkerConfig config;
  config.backend = "mock";
  config.model_name = model;
  config.requests = "tcp://127.0.0.1:0";
  config.events = "tcp://127.0.0.1:0";
  config.replay = "tcp://127.0.0.1:0";
  config.http_port = 0;
  config.http_host = "127.0.0.1";
  config.advertise_host = "127.0.0.1";
  config.block_size = 16;
  config.max_num_tokens = 256;
  config.max_batch_size = 8;
  config.kv_cache_bytes = 64ull * 2 * 1024 * 1024;
  config.shutdown_grace_s = 1;
  return config;
}

}  // namespace kvfleet::router::testing
