// LoraApi: loading and unloading LoRA adapters on the workers at run time, vLLM's
// `POST /v1/load_lora_adapter` {"lora_name", "lora_path"} and `POST /v1/unload_lora_adapter`
// {"lora_name"}, each with kvfleet's optional "model" (the base model; required to load when
// the fleet serves several) and "workers" (ids or names from /fleet; default: every live
// worker of the model, for an unload those serving the adapter).
//
// One request becomes one LoadLora or UnloadLora per target worker (Contract 3), sent from
// the HTTP thread's lane (router/fleet/lane.h) under its own request id and awaited for at
// most config::kLoraControlTimeout. The answer comes once every worker has answered:
//   1. all succeeded: 200, vLLM's text ("Success: LoRA adapter 'NAME' added successfully.");
//   2. every worker refused a load (LoraResult !ok, invalid request or unknown adapter: a path
//      it cannot read, a rank, target or base model it cannot serve): 400; an unload every
//      worker answered with unknown adapter: 404;
//   3. otherwise, some worker timed out: 504; some worker failed (not live, lost, an internal
//      error, or refused while others succeeded): 502.
// Each error's message names every failing worker and its reason. A worker that succeeded
// serves (or stops serving) the adapter at once (Fleet::NoteAdapter), ahead of its next Hello.
//
// Thread safety: thread-safe; Handle runs on an HTTP I/O thread and answers on it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "common/clock.h"
#include "common/http/server.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/http/openai.h"

namespace kvfleet::router {

class Lane;

namespace config {
// A LoadLora reads the adapter's files (hundreds of MB for a rank-64 adapter of an 8B
// model) and may copy it to the device: far slower than a request's first token, so it
// gets its own bound, vLLM's default HTTP timeout order of magnitude.
inline constexpr DurationNs kLoraControlTimeout = 60 * kNsPerSec;
}  // namespace config

// One load or unload request, as parsed.
struct LoraAdapterRequest {
  bool load = true;
  std::string lora_name;
  std::string lora_path;             // load only
  std::string model;                 // empty: the fleet's only model (load), the adapter's (unload)
  std::vector<std::string> workers;  // ids or names; empty: every live worker (see above)
};

// Parses the body of a load (`load`) or unload request into *out; or a 400 naming the field
// for invalid JSON, a missing or empty lora_name or (load) lora_path, a wrong type, an
// unknown field.
std::optional<ApiError> ParseLoraAdapterRequest(std::string_view body, bool load, LoraAdapterRequest* out);

class LoraApi {
 public:
  // `fleet` must outlive it. `registry` gets kvfleet_router_lora_requests_total{op,outcome}.
  LoraApi(Fleet* fleet, prometheus::Registry& registry, DurationNs timeout = config::kLoraControlTimeout);

  // Handles one request on `lane` (the exchange's I/O thread's); answers through `ex`.
  void Handle(std::shared_ptr<http::Exchange> ex, Lane* lane, bool load);

 private:
  struct Target {
    WorkerId id = 0;
    std::string name;
  };
  // The base model and the workers to send to, or the error to answer.
  std::optional<ApiError> Resolve(const LoraAdapterRequest& req, std::string* model, std::vector<Target>* targets) const;
  void Count(bool load, std::string_view outcome);

  Fleet* fleet_;
  prometheus::Family<prometheus::Counter>& requests_;
  DurationNs timeout_;
};

}  // namespace kvfleet::router
