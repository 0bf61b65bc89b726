#include "schema/gossip_codec.h"

#include <cmath>
#include <set>
#include <string_view>

#include <capnp/message.h>

#include "schema/gossip.capnp.h"
#include "schema/limits.h"
#include "schema/wire.h"

namespace kvfleet {

namespace {

// A name a router would accept from a Hello: 1..kMaxNameBytes bytes, no control characters.
bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > static_cast<size_t>(wire::limits::kMaxNameBytes)) return false;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

Status CheckWorker(const GossipWorker& w) {
  if (!ValidName(w.worker)) return InvalidArgument("gossip: a worker name that is empty, too long or not printable");
  if (w.waiting > w.requests) return InvalidArgument("gossip: worker '" + w.worker + "' has more waiting than requests");
  // A request's prompt is at most the longest context: more tokens than that per waiting
  // request is a count no router keeps.
  const auto most = static_cast<uint64_t>(w.waiting) * static_cast<uint64_t>(wire::limits::kMaxContextTokens);
  if (w.prompt_tokens > most || w.prefill_tokens > w.prompt_tokens) {
    return InvalidArgument("gossip: worker '" + w.worker + "' has token counts its requests cannot hold");
  }
  return Status::Ok();
}

Status Check(const RouterGossip& g) {
  if (!ValidName(g.router_id)) return InvalidArgument("gossip: a router id that is empty, too long or not printable");
  std::set<std::string_view> seen;
  for (const GossipWorker& w : g.workers) {
    KVF_RETURN_IF_ERROR(CheckWorker(w));
    if (!seen.insert(w.worker).second) return InvalidArgument("gossip: worker '" + w.worker + "' listed twice");
  }
  seen.clear();
  for (const GossipModel& m : g.models) {
    if (!ValidName(m.model)) return InvalidArgument("gossip: a model name that is empty, too long or not printable");
    if (!std::isfinite(m.prefill_tokens_per_second) || m.prefill_tokens_per_second < 0) {
      return InvalidArgument("gossip: model '" + m.model + "' has a rate that is negative or not finite");
    }
    if (!seen.insert(m.model).second) return InvalidArgument("gossip: model '" + m.model + "' listed twice");
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeGossip(const RouterGossip& g) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<schema::RouterGossip>();
  out.setRouterId(wire::AsText(g.router_id));
  out.setIncarnation(g.incarnation);
  out.setSeq(g.seq);
  auto workers = out.initWorkers(static_cast<unsigned>(g.workers.size()));
  for (unsigned i = 0; i < g.workers.size(); ++i) {
    const GossipWorker& w = g.workers[i];
    workers[i].setWorker(wire::AsText(w.worker));
    workers[i].setRequests(w.requests);
    workers[i].setWaiting(w.waiting);
    workers[i].setPrefillTokens(w.prefill_tokens);
    workers[i].setPromptTokens(w.prompt_tokens);
  }
  auto models = out.initModels(static_cast<unsigned>(g.models.size()));
  for (unsigned i = 0; i < g.models.size(); ++i) {
    models[i].setModel(wire::AsText(g.models[i].model));
    models[i].setPrefillTokensPerSecond(g.models[i].prefill_tokens_per_second);
  }
  return wire::Encode(message);
}

Result<RouterGossip> DecodeGossip(const void* data, size_t size) {
  auto decoded = wire::Decode<schema::RouterGossip>(data, size);
  if (!decoded.ok()) return decoded.status();
  Result<RouterGossip> read = wire::Guard([&]() -> Result<RouterGossip> {
    auto root = (*decoded)->Root<schema::RouterGossip>();
    auto workers = root.getWorkers();
    auto models = root.getModels();
    if (workers.size() > wire::limits::kMaxGossipWorkers || models.size() > wire::limits::kMaxGossipModels) {
      return InvalidArgument("gossip: more workers or models than a router holds");
    }
    RouterGossip g;
    g.router_id = wire::FromText(root.getRouterId());
    g.incarnation = root.getIncarnation();
    g.seq = root.getSeq();
    g.workers.reserve(workers.size());
    for (auto w : workers) {
      g.workers.push_back(GossipWorker{wire::FromText(w.getWorker()), w.getRequests(), w.getWaiting(), w.getPrefillTokens(),
                                       w.getPromptTokens()});
    }
    g.models.reserve(models.size());
    for (auto m : models) g.models.push_back(GossipModel{wire::FromText(m.getModel()), m.getPrefillTokensPerSecond()});
    return g;
  });
  if (!read.ok()) return read.status();
  KVF_RETURN_IF_ERROR(Check(*read));
  return read;
}

}  // namespace kvfleet
