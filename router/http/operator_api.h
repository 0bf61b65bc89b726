// The router's answers about its fleet: GET /fleet (every worker as the router sees it),
// GET /v1/models (OpenAI's list: the models and adapters a routable worker serves) and
// GET /ready (whether this router can serve, and each model's state).
//
// /ready's rule: 200 while at least one model has a routable worker. A model that lost its
// last worker is refused on its own (503 with Retry-After) while the others serve, so one
// model's outage does not take the router out of service (on Kubernetes, every router
// replica would go at once: they all see the same fleet). 503 when no model has a routable
// worker, a router that has not yet heard from any included.
//
// Thread safety: thread-safe (the fleet's queries are).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/http/server.h"
#include "router/fleet/fleet.h"

namespace kvfleet::router {

// /fleet's body. `routing_window_size`: --routing-window-size's override of each worker's
// indexed KV pool (none: IndexedWindow of its Hello).
std::string FleetJson(const Fleet& fleet, const Clock& clock, std::optional<uint32_t> routing_window_size);

// /v1/models' body: each model with a routable worker, then each adapter such a worker
// serves, as vLLM lists them (parent: the base model; root: the adapter's
// base_model_name_or_path, else the base model). A name that is a model is the model's
// (Fleet::Resolve), so it is listed once.
std::string ModelsJson(const Fleet& fleet);

// /ready's answer for `models` (Fleet::Readiness): 200 when one of them has a routable
// worker. The body: {"status": "ready" (every model serving) | "degraded" (some) |
// "no live worker", "models": {NAME: {"state": "serving" | "unavailable", "workers",
// "routable_workers"}}}.
http::Response ReadyResponse(const std::vector<ModelReadiness>& models);

}  // namespace kvfleet::router
