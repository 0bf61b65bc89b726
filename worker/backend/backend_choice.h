// --backend auto: which model backend this build can run here. cuda when the build has the
// CUDA backend and its kernels run on the GPU, else cpu; never the mock, which a worker runs
// only when named. deploy/choose-backend.sh makes the same choice for the quickstart, from
// outside the binary.
//
// A backend that can decline registers a probe (the cuda backend asks for a GPU and a kernel
// image for it); one without a probe always can.
//
// Thread safety: thread-safe; probes register before main() (KVF_REGISTER_BACKEND's way).
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace kvfleet::backend {

// What a backend would run on here ("NVIDIA H200, compute capability 9.0"), or why it cannot.
using BackendProbe = std::function<Result<std::string>()>;

// Adds the probe of backend `name`; returns true (for a static registrar).
// REQUIRES: no probe of that name yet.
bool RegisterBackendProbe(std::string name, BackendProbe probe);

struct BackendChoice {
  std::string name;  // "cuda" or "cpu"
  std::string why;   // "NVIDIA H200, compute capability 9.0", "this build has no CUDA backend", ...
};

// The choice of --backend auto (above).
BackendChoice ChooseBackend();

}  // namespace kvfleet::backend
