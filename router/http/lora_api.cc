#include "router/http/lora_api.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "common/log.h"
#include "router/fleet/lane.h"
#include "router/http/json_body.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

ApiError Error(int status, std::string message, std::string type, std::string code = "", std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

http::Response ErrorResponse(const ApiError& e) {
  http::Response r;
  r.status = e.status;
  r.body = e.ToJson();
  return r;
}

// One request's gathering of its workers' answers, on the lane's thread.
struct Gather {
  std::shared_ptr<http::Exchange> ex;
  LoraAdapterRequest req;
  std::string model;
  size_t pending = 0;
  std::vector<std::string> succeeded;
  std::vector<std::string> failures;  // "worker NAME: why"
  size_t refused = 0;                 // LoraResult !ok, invalid request
  size_t unknown = 0;                 // LoraResult !ok, unknown adapter
  size_t timed_out = 0;
};

}  // namespace

std::optional<ApiError> ParseLoraAdapterRequest(std::string_view body, bool load, LoraAdapterRequest* out) {
  auto parsed = ParseJsonBody(body);
  if (!parsed.ok()) return BadRequest(std::string(parsed.status().message()));
  const json& j = *parsed;
  if (!j.is_object()) return BadRequest("the body must be a JSON object");
  *out = LoraAdapterRequest{};
  out->load = load;
  for (const auto& [key, value] : j.items()) {
    if (key == "lora_name" || key == "lora_path" || key == "model") {
      if (key == "lora_path" && !load) {
        return BadRequest("'lora_path' is not a field of an unload request", key);
      }
      if (!value.is_string()) return BadRequest("'" + key + "' must be a string", key);
      std::string v = value.get<std::string>();
      if (key == "lora_name") out->lora_name = std::move(v);
      else if (key == "lora_path") out->lora_path = std::move(v);
      else out->model = std::move(v);
    } else if (key == "workers") {
      if (!value.is_array() || value.empty()) {
        return BadRequest("'workers' must be a non-empty array of worker ids or names (GET /fleet)", key);
      }
      for (const json& w : value) {
        if (w.is_number_unsigned()) out->workers.push_back(std::to_string(w.get<uint64_t>()));
        else if (w.is_string() && !w.get<std::string>().empty()) out->workers.push_back(w.get<std::string>());
        else return BadRequest("'workers' must hold worker ids (integers) or names (strings)", key);
      }
    } else {
      return BadRequest("unknown field '" + key + "'", key);
    }
  }
  if (out->lora_name.empty()) return BadRequest("'lora_name' is required", "lora_name");
  if (load && out->lora_path.empty()) return BadRequest("'lora_path' is required", "lora_path");
  return std::nullopt;
}

LoraApi::LoraApi(Fleet* fleet, prometheus::Registry& registry, DurationNs timeout)
    : fleet_(fleet),
      requests_(prometheus::BuildCounter()
                    .Name("kvfleet_router_lora_requests_total")
                    .Help("LoRA adapter loads and unloads asked of the router, by outcome")
                    .Register(registry)),
      timeout_(timeout) {}

void LoraApi::Count(bool load, std::string_view outcome) {
  requests_.Add({{"op", load ? "load" : "unload"}, {"outcome", std::string(outcome)}}).Increment();
}

std::optional<ApiError> LoraApi::Resolve(const LoraAdapterRequest& req, std::string* model,
                                         std::vector<Target>* targets) const {
  const std::optional<ServedModel> named = fleet_->Resolve(req.lora_name);
  if (named && named->lora.empty()) {
    return BadRequest("lora_name '" + req.lora_name + "' is the name of a model: an adapter needs a name of its own",
                      "lora_name");
  }
  *model = req.model;
  if (model->empty() && !req.load && named) {
    // An unload names the adapter: its base model is the one whose workers serve it.
    *model = named->model;
  }
  if (model->empty()) {
    const std::vector<std::string> live = fleet_->LiveModels();
    if (live.empty()) return Error(503, "no live worker", "server_error", "service_unavailable");
    if (live.size() > 1) {
      std::string names;
      for (const auto& m : live) names += (names.empty() ? "" : ", ") + m;
      return BadRequest("'model' is required: the fleet serves several models (" + names + ")", "model");
    }
    *model = live[0];
  } else if (!fleet_->FindModel(*model)) {
    return Error(404, "The model '" + *model + "' does not exist.", "invalid_request_error", "model_not_found",
                 "model");
  }
  const std::vector<WorkerStatus> workers = fleet_->Workers();
  auto serves = [&](const WorkerStatus& w) {
    return std::any_of(w.info.loras.begin(), w.info.loras.end(),
                       [&](const LoraAnnounce& l) { return l.name == req.lora_name; });
  };
  if (!req.workers.empty()) {
    for (const std::string& want : req.workers) {
      auto it = std::find_if(workers.begin(), workers.end(), [&](const WorkerStatus& w) {
        return w.info.name == want || std::to_string(w.id) == want;
      });
      if (it == workers.end() || it->info.model != *model) {
        return BadRequest("worker '" + want + "' is not a worker of model '" + *model + "' (GET /fleet)", "workers");
      }
      if (std::none_of(targets->begin(), targets->end(), [&](const Target& t) { return t.id == it->id; })) {
        targets->push_back({it->id, it->info.name});
      }
    }
    return std::nullopt;
  }
  for (const WorkerStatus& w : workers) {
    if (w.info.model != *model || !w.routable) continue;
    if (!req.load && !serves(w)) continue;
    targets->push_back({w.id, w.info.name});
  }
  if (targets->empty()) {
    if (!req.load) {
      return Error(404, "no live worker of model '" + *model + "' serves LoRA adapter '" + req.lora_name + "'",
                   "invalid_request_error", "lora_not_found", "lora_name");
    }
    return Error(503, "no live worker serves model '" + *model + "'", "server_error", "service_unavailable");
  }
  return std::nullopt;
}

void LoraApi::Handle(std::shared_ptr<http::Exchange> ex, Lane* lane, bool load) {
  LoraAdapterRequest req;
  if (auto e = ParseLoraAdapterRequest(ex->request().body, load, &req)) {
    Count(load, "bad_request");
    return ex->Reply(ErrorResponse(*e));
  }
  std::string model;
  std::vector<Target> targets;
  if (auto e = Resolve(req, &model, &targets)) {
    Count(load, e->status == 400 ? "bad_request" : e->status == 404 ? "not_found" : "unavailable");
    return ex->Reply(ErrorResponse(*e));
  }
  auto g = std::make_shared<Gather>();
  g->ex = std::move(ex);
  g->req = req;
  g->model = model;
  g->pending = targets.size();
  auto finish = [this, g] {
    const std::string& name = g->req.lora_name;
    const char* verb = g->req.load ? "load" : "unload";
    if (g->failures.empty()) {
      Count(g->req.load, "ok");
      Logger("router")->info("LoRA adapter {} {}ed on {} worker(s) of model {}", EscapeForLog(name), verb,
                             g->succeeded.size(), EscapeForLog(g->model));
      http::Response r;
      r.content_type = "text/plain";
      r.body = "Success: LoRA adapter '" + name + "' " + (g->req.load ? "added" : "removed") + " successfully.";
      return g->ex->Reply(std::move(r));
    }
    std::string why;
    for (const std::string& f : g->failures) why += (why.empty() ? "" : "; ") + f;
    const size_t failed = g->failures.size();
    std::string message = "LoRA adapter '" + name + "': " + verb + " failed on " + std::to_string(failed) + " of " +
                          std::to_string(failed + g->succeeded.size()) + " workers of model '" + g->model +
                          "': " + why;
    if (!g->succeeded.empty()) message += " (it succeeded on the others)";
    ApiError e;
    if (g->succeeded.empty() && g->refused == failed) {
      e = Error(400, message, "invalid_request_error", "invalid_lora_adapter", "lora_path");
      Count(g->req.load, "refused");
    } else if (g->succeeded.empty() && g->unknown == failed) {
      e = Error(404, message, "invalid_request_error", "lora_not_found", "lora_name");
      Count(g->req.load, "not_found");
    } else if (g->timed_out > 0) {
      e = Error(504, message, "server_error", "timeout");
      Count(g->req.load, "timeout");
    } else {
      e = Error(502, message, "server_error", "worker_failed");
      Count(g->req.load, "failed");
    }
    g->ex->Reply(ErrorResponse(e));
  };
  const LoraControl control{req.lora_name, req.lora_path};
  const auto kind = load ? ToWorkerMessage::Kind::kLoadLora : ToWorkerMessage::Kind::kUnloadLora;
  for (const Target& t : targets) {
    lane->SendLoraControl(t.id, kind, control, timeout_, [this, g, t, finish](Result<WorkerLoraResult> result) {
      if (result.ok() && result->ok) {
        g->succeeded.push_back(t.name);
        fleet_->NoteAdapter(t.id, LoraAnnounce{g->req.lora_name, LoraId(g->req.lora_name), 0, ""}, g->req.load);
      } else if (result.ok()) {
        // A load's adapter the worker cannot read or serve is the request's fault; so is an
        // unload of an adapter it does not have.
        const bool unknown = result->code == WorkerErrorCode::kUnknownLora;
        g->refused += g->req.load && (unknown || result->code == WorkerErrorCode::kInvalidRequest);
        g->unknown += !g->req.load && unknown;
        g->failures.push_back("worker " + t.name + ": " + result->message);
      } else {
        g->timed_out += result.status().code() == StatusCode::kDeadlineExceeded;
        g->failures.push_back("worker " + t.name + ": " + std::string(result.status().message()));
      }
      if (--g->pending == 0) finish();
    });
  }
}

}  // namespace kvfleet::router
