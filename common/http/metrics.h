// Prometheus text exposition for kvfleet processes: prometheus-cpp's TextSerializer over
// a Registry, and a GET /metrics route that serves it.
//
// Thread safety: prometheus::Registry is thread-safe; so are these functions.
#pragma once

#include <memory>
#include <string>

#include "common/http/server.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::http {

// The content type of the Prometheus text format, version 0.0.4.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Every metric of `registry` in the text format.
std::string SerializeMetrics(const prometheus::Registry& registry);

// Registers kvfleet_build_info{version,git_sha,build_type} 1 (common/build_info.h) in `registry`.
void RegisterBuildInfo(prometheus::Registry& registry);

// Adds GET /metrics serving `registry`.
void AddMetricsRoute(Routes& routes, std::shared_ptr<const prometheus::Registry> registry);

}  // namespace kvfleet::http
