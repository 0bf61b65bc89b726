// A whole router for the API tests: fleet, predicted index, router, API and an HTTP server on
// an ephemeral port of 127.0.0.1. Workers are the fleet options' static ones, or register with
// Hellos on the fleet's registration endpoint (an ephemeral port too). RouterUnderTest is one
// over static workers of model "m"; Events reads a streamed answer.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <prometheus/registry.h>

#include "common/http/metrics.h"
#include "router/http/api.h"
#include "router/routing/predicted_index.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router::testing {

struct ApiRouter {
  explicit ApiRouter(FleetOptions fleet_options = {}, ApiOptions api_options = {}, RoutingOptions routing = {},
                     ModelCodecs codecs = ModelCodecs(MakeByteCodec()), WorkerSignals* signals = nullptr,
                     const Clock* fleet_clock = SystemClock::Default())
      : registry(std::make_shared<prometheus::Registry>()), index(SystemClock::Default()) {
    fleet_options.registration_endpoint = "tcp://127.0.0.1:*";
    fleet = std::move(Fleet::Start(fleet_options, signals, fleet_clock, registry.get())).value();
    router = std::make_unique<Router>(routing, fleet.get(), &index, &index);
    api = std::make_unique<Api>(std::move(api_options), fleet.get(), router.get(), std::move(codecs),
                                SystemClock::Default(), registry);
    http::Routes routes;
    api->AddRoutes(&routes);
    http::ServerOptions o;
    o.address = "127.0.0.1";
    o.port = 0;
    o.max_body_bytes = 64 * 1024;
    server = std::move(http::Server::Start(o, std::move(routes), registry)).value();
  }
  ~ApiRouter() {
    server->Stop();
    fleet->Stop();
  }
  ApiRouter(const ApiRouter&) = delete;
  ApiRouter& operator=(const ApiRouter&) = delete;

  std::string Post(const std::string& path, const std::string& body, const std::string& headers = "") {
    return http::testing::Roundtrip(server->port(), "POST", path, body, headers);
  }
  std::string Get(const std::string& path) { return http::testing::Roundtrip(server->port(), "GET", path); }
  std::string Metrics() const { return http::SerializeMetrics(*registry); }
  uint16_t port() const { return server->port(); }

  std::shared_ptr<prometheus::Registry> registry;
  PredictedIndex index;
  std::unique_ptr<Fleet> fleet;
  std::unique_ptr<Router> router;
  std::unique_ptr<Api> api;
  std::unique_ptr<http::Server> server;
};

// A router over static workers of model "m" (max context 4096).
inline FleetOptions WithStaticWorkers(std::vector<std::string> workers, FleetOptions o) {
  o.static_workers = std::move(workers);
  o.static_model = "m";
  o.static_max_context = 4096;
  return o;
}

struct RouterUnderTest : ApiRouter {
  explicit RouterUnderTest(std::vector<std::string> workers, ApiOptions api_options = {},
                           RoutingOptions routing = {}, FleetOptions fleet_options = {},
                           ModelCodecs codecs = ModelCodecs(MakeByteCodec()))
      : ApiRouter(WithStaticWorkers(std::move(workers), std::move(fleet_options)), std::move(api_options), routing,
                  std::move(codecs)) {}
  void WaitRoutable(size_t n) {
    REQUIRE(WaitFor([&] {
      auto m = fleet->FindModel("m");
      return m && m->routable.size() == n;
    }));
  }
};

// The JSON objects of an SSE body, [DONE] excluded; *done says whether it came.
inline std::vector<nlohmann::json> Events(const std::string& response, bool* done) {
  std::vector<nlohmann::json> out;
  *done = false;
  size_t at = 0;
  while ((at = response.find("data: ", at)) != std::string::npos) {
    size_t end = response.find("\n\n", at);
    std::string data = response.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(nlohmann::json::parse(data));
  }
  return out;
}

}  // namespace kvfleet::router::testing
