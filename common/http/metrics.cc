#include "common/http/metrics.h"

#include "common/build_info.h"

#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace kvfleet::http {

std::string SerializeMetrics(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

void RegisterBuildInfo(prometheus::Registry& registry) {
  const BuildInfo& b = GetBuildInfo();
  prometheus::BuildGauge()
      .Name("kvfleet_build_info")
      .Help("kvfleet's version, git commit and build type as labels; always 1")
      .Register(registry)
      .Add({{"version", std::string(b.version)},
            {"git_sha", std::string(b.git_sha)},
            {"build_type", std::string(b.build_type)}})
      .Set(1);
}

void AddMetricsRoute(Routes& routes, std::shared_ptr<const prometheus::Registry> registry) {
  routes.AddSync("GET", "/metrics", [registry](const Request&) {
    Response r;
    r.content_type = kPrometheusContentType;
    r.body = SerializeMetrics(*registry);
    return r;
  });
}

}  // namespace kvfleet::http
