// kvfleet-router: the OpenAI-compatible front of a kvfleet fleet. It tokenizes each
// request, finds the worker where it will start soonest (prefix cache hit against load),
// forwards it over Contract 3 and streams the answer back.
//
//   kvfleet-router --http-port 8000 --registration tcp://*:5555
//   kvfleet-router --workers tcp://10.0.0.5:5556,tcp://10.0.0.6:5556 --model llama --block-size 32
//   kvfleet-router --tokenizer llama=/models/llama --tokenizer qwen=/models/qwen   (several models)
#include <cmath>
#include <csignal>
#include <iostream>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>

#include <prometheus/registry.h>

#include "common/config.h"
#include "common/cpu_latency.h"
#include "common/http/server.h"
#include "common/log.h"
#include "common/open_files.h"
#include "common/tokenizer_files.h"
#include "router/events/event_plane.h"
#include "router/events/fault_injection.h"
#include "router/fleet/fleet.h"
#include "router/fleet/gossip.h"
#include "router/http/api.h"
#include "router/http/codec.h"
#include "router/router_config.h"
#include "router/routing/predicted_index.h"
#include "router/routing/router.h"

namespace kvfleet::router {
namespace {

// The fleet forgets workers on its own thread; the Api, made after the fleet, drops their
// series. Set to null before the Api goes.
class ForgottenRelay {
 public:
  void Set(Api* api) {
    std::lock_guard<std::mutex> lock(mu_);
    api_ = api;
  }
  void Forget(const std::string& worker) {
    std::lock_guard<std::mutex> lock(mu_);
    if (api_ != nullptr) api_->ForgetWorker(worker);
  }

 private:
  std::mutex mu_;
  Api* api_ = nullptr;  // GUARDED_BY(mu_)
};

// The lanes count requests on the HTTP threads; the Gossip, made after the fleet, tells the
// peers of each change (Gossip::OwnStateChanged). Set to null before the Gossip goes.
class GossipRelay {
 public:
  void Set(Gossip* gossip) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    gossip_ = gossip;
  }
  void OwnStateChanged(bool routed) {
    std::shared_lock<std::shared_mutex> lock(mu_);  // lanes on every HTTP thread at once
    if (gossip_ != nullptr) gossip_->OwnStateChanged(routed);
  }

 private:
  std::shared_mutex mu_;
  Gossip* gossip_ = nullptr;  // GUARDED_BY(mu_)
};

// The gossip channel to the fleet's other routers, when --peer-routers names any (null
// otherwise): it tells them this router's own counts and routed work as they change.
Result<std::unique_ptr<Gossip>> StartGossip(const RouterConfig& c, const Fleet* fleet, const Router* router,
                                            PeerLoads* peers, const Clock* clock, prometheus::Registry* registry) {
  if (c.gossip.peers.empty() && c.gossip.peers_dns.empty()) return std::unique_ptr<Gossip>();
  auto source = [fleet, router, clock](RouterGossip* out) {
    for (const auto& [name, own] : fleet->OwnLoadsByName()) out->workers.push_back(ToGossipWorker(name, own));
    for (const auto& [model, rate] : router->RoutedWork(clock->Now())) {
      if (rate > 0 && std::isfinite(rate)) out->models.push_back(GossipModel{model, rate});
    }
  };
  GossipOptions options = c.gossip;
  if (c.gossip_outage) {
    options.faults = std::make_shared<GossipFaults>(clock->Now() + c.gossip_outage->after, c.gossip_outage->length);
    Logger("router")->warn("--debug-drop-gossip {}: the gossip channel goes down for {:.1f} s (testing only)",
                           c.debug_drop_gossip, static_cast<double>(c.gossip_outage->length) / kNsPerSec);
  }
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Gossip> gossip, Gossip::Start(options, source, peers, clock, registry));
  Logger("router")->info("gossip on {} as '{}', {} peer routers listed{}{}", gossip->endpoint(), gossip->router_id(),
                         c.gossip.peers.size(), c.gossip.peers_dns.empty() ? "" : ", and " + c.gossip.peers_dns + "'s",
                         c.gossip.keypair_file.empty() ? "" : " (CURVE)");
  return gossip;
}

// Builds the router's parts, bottom up, and serves until SIGINT or SIGTERM.
int Run(RouterConfig& c) {
  auto log = Logger("router");
  if (Status st = Prepare(&c); !st.ok()) {
    log->error("{}", st.message());
    return 2;
  }
  auto cpu_latency = HoldCpuLatency(c.cpu_latency);
  if (!cpu_latency.ok()) {
    log->error("--cpu-latency-us: {}", cpu_latency.status().message());
    return 2;
  }
  if (*cpu_latency) log->info("holding a CPU latency request of {} µs", (*cpu_latency)->max_latency_us());
  const OpenFileLimit files = RaiseOpenFileLimit(OpenFilesWanted(c));
  if (files.soft < OpenFilesWanted(c)) {
    log->warn("open-file limit {} (hard {}) is below the {} that --max-workers {} may need; raise it (ulimit -n)",
              files.soft, files.hard, OpenFilesWanted(c), c.fleet.max_workers);
  } else {
    log->info("open-file limit {}{} (hard {}), for up to {} workers (the fleet's sockets sized for {} each)",
              files.soft, files.raised ? " (raised)" : "", files.hard, c.fleet.max_workers, c.fleet.SocketsPerWorker());
  }
  // Signals are taken by sigwait below; threads started from here on inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Each model's codec: its own --tokenizer MODEL=DIR, else the plain --tokenizer's, else
  // the byte codec. Workers are compared on the model directory's own tokenizer.json and
  // template: a --chat-template changes only how this router renders chats, not the token
  // ids a worker's model was trained on, so it does not make every worker a stranger.
  std::shared_ptr<const TextCodec> fallback = MakeByteCodec();
  std::map<std::string, std::shared_ptr<const TextCodec>> own;
  for (const RouterConfig::ModelTokenizer& t : c.tokenizers) {
    const std::string flag = t.model.empty() ? t.dir : t.model + "=" + t.dir;
    auto loaded = LoadTokenizerCodec(t.dir, t.chat_template);
    if (!loaded.ok()) {
      if (t.chat_template) {
        log->error("--tokenizer {} with --chat-template {}: {}", flag, t.chat_template_file, loaded.status().message());
      } else {
        log->error("--tokenizer {}: {}", flag, loaded.status().message());
      }
      return 2;
    }
    auto digest = TokenizerDigest(t.dir);
    if (!digest.ok()) {
      log->error("--tokenizer {}: {}", flag, digest.status().message());
      return 2;
    }
    if (t.model.empty()) {
      fallback = *loaded;
      c.fleet.tokenizer_digest = *digest;
    } else {
      own[t.model] = *loaded;
      c.fleet.tokenizer_digests[t.model] = *digest;
    }
    log->info("tokenizer of {}: {} (digest {}, chat template: {})",
              t.model.empty() ? std::string("every model without its own") : "model " + t.model, t.dir,
              DigestHex(*digest),
              t.chat_template ? "--chat-template " + t.chat_template_file : std::string("the directory's"));
  }
  ModelCodecs codecs(fallback);
  for (auto& [model, codec] : own) codecs.Set(model, std::move(codec));
  auto registry = std::make_shared<prometheus::Registry>();
  const Clock* clock = SystemClock::Default();
  // KV events and load reports: the global index, worker liveness and load.
  EventPlaneOptions events;
  events.heartbeat_timeout = c.heartbeat_timeout_ms * kNsPerMs;
  events.max_workers = c.fleet.max_workers;
  events.routing_window_size = c.routing_window;
  events.curve.client_keypair_file = c.curve_keypair;
  events.curve.server_public_key_file = c.curve_server_key;
  if (c.debug_drop_events > 0) {
    FaultOptions faults;
    faults.drop_rate = c.debug_drop_events;
    faults.duplicate_rate = 0;
    faults.reorder_window = 0;
    events.fault_injector = std::make_shared<FaultInjector>(faults);
    log->warn("--debug-drop-events {}: dropping that fraction of KV event batches (testing only)",
              c.debug_drop_events);
  }
  EventPlane plane(events, SystemClock::Default(), registry.get());
  if (!plane.status().ok()) {
    log->error("{}", plane.status().message());
    return 1;
  }
  PredictedIndex approx_index(clock);  // the approx policy: this router's decisions only
  // The plane tells the fleet each worker's liveness and load.
  ForgottenRelay forgotten;
  c.fleet.on_forgotten = [&forgotten, &approx_index](WorkerId id, const std::string& worker, bool last_of_name) {
    approx_index.RemoveWorker(id);  // its id goes to the next worker
    if (last_of_name) forgotten.Forget(worker);
  };
  // What the fleet's other routers say of themselves; routing counts it (peer_loads.h).
  PeerLoads peer_loads(c.gossip.ttl);
  GossipRelay gossip_relay;
  if (!c.gossip.peers.empty() || !c.gossip.peers_dns.empty()) {
    c.fleet.peers = &peer_loads;
    c.fleet.on_own_load_change = [&gossip_relay](bool routed) { gossip_relay.OwnStateChanged(routed); };
  }
  auto fleet = Fleet::Start(c.fleet, &plane, clock, registry.get());
  if (!fleet.ok()) {
    log->error("{}", fleet.status().message());
    return 1;
  }
  Router router(c.routing, fleet->get(), &plane.index(), &approx_index, &plane.index().retention());
  std::unique_ptr<DecisionLog> decision_log;
  if (!c.decision_log.empty()) {
    auto opened = DecisionLog::Open(c.decision_log);
    if (!opened.ok()) {
      log->error("{}", opened.status().message());
      return 1;
    }
    decision_log = std::move(*opened);
    router.SetDecisionLog(decision_log.get());
    log->info("every routing decision is logged to {}", c.decision_log);
  }
  const std::string codec_name =
      codecs.fallback()->name() + (codecs.by_model().empty() ? "" : " and " + std::to_string(codecs.by_model().size()) +
                                                                         " per-model tokenizers");
  auto gossip = StartGossip(c, fleet->get(), &router, &peer_loads, clock, registry.get());
  if (!gossip.ok()) {
    log->error("{}", gossip.status().message());
    return 1;
  }
  gossip_relay.Set(gossip->get());
  struct UnsetGossip {
    GossipRelay& relay;
    ~UnsetGossip() { relay.Set(nullptr); }
  } unset_gossip{gossip_relay};
  Api api(c.api, fleet->get(), &router, std::move(codecs), clock, registry);
  forgotten.Set(&api);
  struct Unset {
    ForgottenRelay& relay;
    ~Unset() { relay.Set(nullptr); }
  } unset{forgotten};
  http::Routes routes;
  api.AddRoutes(&routes);
  auto server = http::Server::Start(c.http, std::move(routes), registry);
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  log->info("listening on http://{}:{} (policy {}, codec {}, registration {})", c.http.address, (*server)->port(),
            c.policy, codec_name, (*fleet)->registration_endpoint());
  int sig = 0;
  sigwait(&signals, &sig);
  log->info("signal {}: stopping", sig);
  (*server)->Stop();   // no new requests; in-flight exchanges see their clients gone
  if (*gossip) (*gossip)->Stop();  // reads the fleet and the router
  (*fleet)->Stop();    // ends what is still in flight and drops its exchanges
  server->reset();
  return 0;
}

}  // namespace
}  // namespace kvfleet::router

int main(int argc, char** argv) {
  CLI::App app{"kvfleet-router: the OpenAI-compatible, cache-aware router of a kvfleet fleet"};
  kvfleet::router::RouterConfig config;
  kvfleet::AddCommonOptions(app, &config.common, "kvfleet-router");
  kvfleet::router::AddOptions(app, &config);
  int rc = kvfleet::ParseCommandLine(app, &config.common, argc, argv);
  if (rc >= 0) return rc;
  return kvfleet::router::Run(config);
}
