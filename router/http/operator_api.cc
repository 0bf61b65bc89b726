#include "router/http/operator_api.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/tokenizer_files.h"
#include "router/http/api_errors.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

std::string LoraIdHex(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

// A worker's LoRA adapters (its Hello's, with run-time loads and unloads since), and which
// its last load report says are on the device. lora_id as 16 hex digits (`kvfleet events`'
// form): JSON numbers above 2^53 lose digits in JavaScript clients.
json LorasJson(const WorkerStatus& w) {
  json loras = json::array();
  for (const LoraAnnounce& l : w.info.loras) {
    const bool resident = w.load && std::find(w.load->resident_loras.begin(), w.load->resident_loras.end(),
                                              l.lora_id) != w.load->resident_loras.end();
    loras.push_back({{"name", l.name},
                     {"lora_id", LoraIdHex(l.lora_id)},
                     {"rank", l.rank},
                     {"base_model", l.base_model},
                     {"resident", resident}});
  }
  return loras;
}

// A worker's KV pools as its Hello announced them (window 0: full attention).
json KvPoolsJson(const WorkerHello& info) {
  json pools = json::array();
  for (const KvPoolAnnounce& p : info.kv_pools) {
    pools.push_back({{"window", p.window},
                     {"sink_tokens", p.sink_tokens},
                     {"dense_context", p.dense_context},
                     {"attention_chunk", p.attention_chunk},
                     {"layers", p.layers},
                     {"device_blocks", p.device_blocks},
                     {"host_blocks", p.host_blocks},
                     {"reuse", p.reuse},
                     {"reuse_tokens", p.reuse_tokens}});
  }
  return pools;
}

// Numbers as the router weighs them (double); null without a report.
json LoadJson(const WorkerStatus& w, TimeNs now) {
  if (!w.load) return nullptr;
  return {{"active_requests", static_cast<double>(w.load->active_requests)},
          {"queued_requests", static_cast<double>(w.load->queued_requests)},
          {"active_prefill_tokens", static_cast<double>(w.load->active_prefill_tokens)},
          {"prefill_tokens_per_second", static_cast<double>(w.load->prefill_tokens_per_second)},
          {"report_age_seconds", static_cast<double>(now - w.load->received_at) / kNsPerSec}};
}

// What the worker's pulls took, per holder, as its load reports said (router/core/pull_fit.h):
// totals as this router heard them, the pulls' mean bandwidth, and the share of its pulls from
// that holder that failed lately, which routing weighs a pull from it by.
json PullsJson(const std::map<std::string, PullFit, std::less<>>& pulls, TimeNs now) {
  json out = json::array();
  for (const auto& [holder, fit] : pulls) {
    const PullFit::Totals& t = fit.totals();
    out.push_back({{"holder", holder},
                   {"pulls", static_cast<uint64_t>(t.pulls)},  // counts, summed from whole increments
                   {"bytes", static_cast<uint64_t>(t.bytes)},
                   {"seconds", t.seconds},
                   {"bytes_per_second", t.seconds > 0 ? json(t.bytes / t.seconds) : json(nullptr)},
                   {"failed", static_cast<uint64_t>(t.failed)},
                   {"failed_seconds", t.failed_seconds},
                   {"failed_share", fit.FailedShare(now)}});
  }
  return out;
}

json WorkerJson(const WorkerStatus& w, std::optional<uint32_t> routing_window_size, TimeNs now) {
  const WorkerHello& info = w.info;
  return {{"id", w.id},
          {"name", info.name},
          {"model", info.model},
          {"block_size", info.block_size},
          {"kv_block_size", info.kv_block_size == 0 ? info.block_size : info.kv_block_size},
          {"max_context", info.max_context},
          {"backend", info.backend},
          {"role", WorkerRoleName(info.role)},
          {"epoch", info.epoch},
          {"tokenizer_digest", info.tokenizer_digest == 0 ? json(nullptr) : json(DigestHex(info.tokenizer_digest))},
          {"kv_pools", KvPoolsJson(info)},
          {"indexed_window", routing_window_size.value_or(IndexedWindow(info))},
          {"loras", LorasJson(w)},
          {"max_loras", info.max_loras},
          {"lora_load_us", info.lora_load_us},
          {"tensor_parallel", info.tensor_parallel},
          {"announced_prefill_tokens_per_second", info.prefill_tokens_per_second},
          {"device_id", info.device_id.empty() ? json(nullptr) : json(info.device_id)},
          {"transfer", info.transfer_endpoint.empty()
                           ? json(nullptr)
                           : json{{"endpoint", info.transfer_endpoint},
                                  {"curve", !info.transfer_key.empty()},
                                  {"format", info.transfer_format},
                                  {"bytes_per_block", info.transfer_bytes_per_block},
                                  {"host_id", info.transfer_host_id}}},
          {"endpoints",
           {{"requests", info.requests_endpoint},
            {"events", info.events_endpoint},
            {"replay", info.replay_endpoint},
            {"http", info.http_endpoint}}},
          {"connected", w.connected},
          {"said_bye", w.said_bye},
          {"state", WorkerStateName(w.state)},
          {"routable", w.routable},
          {"router_inflight_requests", w.inflight_requests},
          {"router_inflight_prefill_tokens", w.inflight_prefill_tokens},
          {"peer_routers_inflight_requests", w.peer_inflight_requests},
          {"peer_routers_inflight_prefill_tokens", w.peer_inflight_prefill_tokens},
          {"load", LoadJson(w, now)}};
}

json ModelEntry(const std::string& id, const std::string& root, const json& parent) {
  return {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "kvfleet"}, {"root", root}, {"parent", parent}};
}

}  // namespace

std::string FleetJson(const Fleet& fleet, const Clock& clock, std::optional<uint32_t> routing_window_size) {
  const TimeNs now = clock.Now();
  json workers = json::array();
  for (const WorkerStatus& w : fleet.Workers()) {
    json worker = WorkerJson(w, routing_window_size, now);
    worker["pulls"] = PullsJson(fleet.PullFits(w.id), now);  // read here alone: Workers() has other callers
    workers.push_back(std::move(worker));
  }
  json refused = json::array();
  for (const RefusedWorker& r : fleet.Refused()) {
    refused.push_back({{"name", r.info.name},
                       {"model", r.info.model},
                       {"backend", r.info.backend},
                       {"requests", r.info.requests_endpoint},
                       {"reason", r.reason},
                       {"refused", r.why}});
  }
  return json{{"workers", workers}, {"refused", refused}, {"ready", fleet.Ready()}}.dump(2);
}

std::string ModelsJson(const Fleet& fleet) {
  json data = json::array();
  for (const std::string& m : fleet.LiveModels()) data.push_back(ModelEntry(m, m, nullptr));
  std::map<std::string, std::pair<std::string, std::string>> adapters;  // name -> (parent, root)
  const std::vector<WorkerStatus> workers = fleet.Workers();
  for (const WorkerStatus& w : workers) {
    if (!w.routable) continue;
    for (const LoraAnnounce& l : w.info.loras) {
      if (adapters.contains(l.name)) continue;
      const std::optional<ServedModel> served = fleet.Resolve(l.name);
      if (!served || served->lora.empty() || served->model != w.info.model) continue;  // another's name
      adapters.emplace(l.name, std::make_pair(w.info.model, l.base_model.empty() ? w.info.model : l.base_model));
    }
  }
  for (const auto& [name, parent_root] : adapters) {
    data.push_back(ModelEntry(name, parent_root.second, parent_root.first));
  }
  return json{{"object", "list"}, {"data", data}}.dump();
}

http::Response ReadyResponse(const std::vector<ModelReadiness>& models) {
  json states = json::object();
  size_t serving = 0;
  for (const ModelReadiness& m : models) {
    serving += m.routable > 0 ? 1 : 0;
    states[m.model] = {{"state", m.routable > 0 ? "serving" : "unavailable"},
                       {"workers", m.workers},
                       {"routable_workers", m.routable}};
  }
  const bool ready = AnyServing(models);
  const char* status = !ready ? "no live worker" : serving == models.size() ? "ready" : "degraded";
  return JsonResponse(ready ? 200 : 503, json{{"status", status}, {"models", states}}.dump());
}

}  // namespace kvfleet::router
