#include "worker/backend/backend_choice.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "common/check.h"
#include "worker/backend/backend.h"

namespace kvfleet::backend {
namespace {

struct Probes {
  std::mutex mu;
  std::map<std::string, BackendProbe, std::less<>> by_name;
};

// Function-local so registrars running before main() find it constructed.
Probes& GetProbes() {
  static Probes* probes = new Probes();
  return *probes;
}

}  // namespace

bool RegisterBackendProbe(std::string name, BackendProbe probe) {
  Probes& p = GetProbes();
  std::lock_guard<std::mutex> lock(p.mu);
  bool inserted = p.by_name.emplace(std::move(name), std::move(probe)).second;
  KVF_CHECK(inserted) << "a backend probe registered twice under one name";
  return true;
}

BackendChoice ChooseBackend() {
  const std::vector<std::string> built = BackendNames();
  if (std::find(built.begin(), built.end(), "cuda") == built.end()) return {"cpu", "this build has no CUDA backend"};
  BackendProbe cuda;
  {
    Probes& p = GetProbes();
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.by_name.find("cuda");
    if (it != p.by_name.end()) cuda = it->second;
  }
  if (!cuda) return {"cuda", "this build has the CUDA backend"};
  Result<std::string> gpu = cuda();
  if (!gpu.ok()) return {"cpu", std::string(gpu.status().message())};
  return {"cuda", *gpu};
}

}  // namespace kvfleet::backend
