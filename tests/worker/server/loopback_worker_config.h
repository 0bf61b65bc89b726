// A worker whose sockets all listen on loopback at ports the system picks, announcing
// 127.0.0.1: the start of every in-process worker the tests and benches run
// (in_process_worker.h, tests/router/fleet/mock_worker_config.h, kv_transfer_bench).
#pragma once

#include "worker/server/worker_config.h"

namespace kvfleet::server::testing {

inline WorkerConfig LoopbackWorkerConfig() {
  WorkerConfig c;
  c.requests = c.events = c.replay = "tcp://127.0.0.1:0";
  c.http_port = 0;
  c.http_host = "127.0.0.1";
  c.advertise_host = "127.0.0.1";
  c.shutdown_grace_s = 1;
  c.transfer_ipc = false;  // CUDA IPC cannot map memory of its own process: in-process workers send bytes
  return c;
}

}  // namespace kvfleet::server::testing
