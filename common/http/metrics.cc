#include "common/http/metrics.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace kvfleet::http {

std::string SerializeMetrics(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
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
