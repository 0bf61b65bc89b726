#include "worker/backend/backend.h"

#include <algorithm>
#include <mutex>

#include "common/check.h"

namespace kvfleet::backend {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory, std::less<>> factories;
};

// Function-local so registrars running before main() find it constructed.
Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

bool RegisterBackend(std::string name, BackendFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  bool inserted = r.factories.emplace(std::move(name), std::move(factory)).second;
  KVF_CHECK(inserted) << "a backend registered twice under one name";
  return true;
}

Result<std::unique_ptr<ModelBackend>> CreateBackend(std::string_view name, const BackendOptions& options) {
  BackendFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : BackendNames()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("unknown backend '" + std::string(name) + "' (built in: " +
                    (known.empty() ? "none" : known) + ")");
  }
  return factory(options);
}

std::vector<std::string> BackendNames() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

}  // namespace kvfleet::backend
