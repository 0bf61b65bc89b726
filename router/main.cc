// kvfleet-router: the OpenAI-compatible front of a kvfleet fleet. It tokenizes each
// request, finds the worker where it will start soonest (prefix cache hit against load),
// forwards it over Contract 3 and streams the answer back.
//
//   kvfleet-router --http-port 8000 --registration tcp://*:5555
//   kvfleet-router --workers tcp://10.0.0.5:5556,tcp://10.0.0.6:5556 --model llama --block-size 32
#include <csignal>
#include <iostream>

#include <prometheus/registry.h>

#include "common/config.h"
#include "common/cpu_latency.h"
#include "common/curve_keys.h"
#include "common/http/server.h"
#include "common/log.h"
#include "router/events/event_plane.h"
#include "router/events/fault_injection.h"
#include "router/fleet/event_signals.h"
#include "router/fleet/fleet.h"
#include "router/http/api.h"
#include "router/http/codec.h"
#include "router/routing/policy.h"
#include "router/routing/predicted_index.h"

namespace kvfleet::router {
namespace {

struct RouterConfig {
  CommonOptions common;
  CpuLatencyOption cpu_latency;
  http::ServerOptions http;
  FleetOptions fleet;
  RoutingOptions routing;
  ApiOptions api;
  std::string policy = "kv";
  std::string static_workers;            // comma-separated requests endpoints
  std::string api_key_file;              // empty: no authentication
  std::string tokenizer_dir;             // empty: the byte codec (mock fleets)
  int64_t predicted_ttl_ms = config::kPredictedTtl / kNsPerMs;
  double request_timeout_s = 600;
  double first_token_timeout_s = 60;
  double dns_interval_s = 10;
  int64_t heartbeat_timeout_ms = 3000;
  std::string curve_keypair;     // empty: plaintext to workers
  std::string curve_server_key;
  // TESTING ONLY (chaos tests): drop this fraction of received KV event batches, as a lossy
  // network would, through router/events/fault_injection.h. 0 in production.
  double debug_drop_events = 0;
};

void AddOptions(CLI::App& app, RouterConfig* c) {
  app.add_option("--http-host", c->http.address, "HTTP listen address")->capture_default_str();
  app.add_option("--http-port", c->http.port, "HTTP port (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--http-threads", c->http.io_threads, "HTTP I/O threads")->capture_default_str();
  app.add_option("--max-body-bytes", c->http.max_body_bytes, "largest request body (413 beyond)")
      ->capture_default_str();
  app.add_option("--max-header-bytes", c->http.max_header_bytes, "largest request header (431 beyond)")
      ->capture_default_str();
  app.add_option("--api-key-file", c->api_key_file, "file of accepted API keys, one per line (default: no auth)");
  app.add_option("--registration", c->fleet.registration_endpoint,
                 "ROUTER endpoint workers send Hello to (empty: none)")
      ->capture_default_str();
  app.add_option("--workers", c->static_workers, "static workers: comma-separated requests endpoints");
  app.add_option("--workers-dns", c->fleet.dns_name, "host:port resolving to many workers (re-resolved)");
  app.add_option("--dns-interval-s", c->dns_interval_s, "DNS re-resolution period (seconds)")->capture_default_str();
  app.add_option("--model", c->fleet.static_model, "model served by static and DNS workers")->capture_default_str();
  app.add_option("--block-size", c->fleet.static_block_size, "block size of static and DNS workers")
      ->capture_default_str();
  app.add_option("--max-context", c->fleet.static_max_context, "context length of static and DNS workers")
      ->capture_default_str();
  app.add_option("--tokenizer", c->tokenizer_dir, "model directory whose tokenizer the router uses (default: bytes)");
  app.add_option("--routing-policy", c->policy, "round_robin, least_loaded, kv or approx")->capture_default_str();
  app.add_option("--routing-temperature", c->routing.temperature, "softmax temperature over kv costs (0: argmin)")
      ->capture_default_str();
  app.add_option("--uncached-work-weight", c->routing.uncached_work_weight,
                 "kv cost: weight of the prefill a choice adds to the fleet (higher: stickier prefixes)")
      ->capture_default_str();
  app.add_option("--decode-s-per-running-request", c->routing.decode_s_per_running_request,
                 "kv cost: seconds each running request adds to a new request's first token")
      ->capture_default_str();
  app.add_option("--hot-spot-factor", c->routing.hot_spot_factor, "skip workers above k x median load (0: off)")
      ->capture_default_str();
  app.add_option("--max-queued-requests", c->routing.max_queued_requests, "a worker with this many queued is saturated")
      ->capture_default_str();
  app.add_option("--predicted-ttl-ms", c->predicted_ttl_ms, "lifetime of predicted index entries")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", c->heartbeat_timeout_ms,
                 "a worker silent this long on its event stream is dead")
      ->capture_default_str();
  app.add_option("--curve-keypair", c->curve_keypair,
                 "CURVE: this router's key pair file, for the request, event and replay sockets (kvfleet keygen)");
  app.add_option("--curve-server-key", c->curve_server_key, "CURVE: the workers' server public key file");
  app.add_option("--debug-drop-events", c->debug_drop_events,
                 "TESTING ONLY: drop this fraction of received KV event batches (fault injection)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--request-timeout-s", c->request_timeout_s, "whole-request timeout")->capture_default_str();
  app.add_option("--report-timings", c->api.report_timings,
                 "add the router's own timestamps of each request (monotonic ns of this host) to its usage's "
                 "kvfleet extension, for latency breakdowns (router_loadgen)")
      ->capture_default_str();
  AddCpuLatencyOption(app, &c->cpu_latency);
  app.add_option("--first-token-timeout-s", c->first_token_timeout_s, "no first token by then: retry elsewhere")
      ->capture_default_str();
}

Status Prepare(RouterConfig* c) {
  KVF_ASSIGN_OR_RETURN(c->routing.policy, ParsePolicy(c->policy));
  c->routing.predicted_ttl = c->predicted_ttl_ms * kNsPerMs;
  KVF_RETURN_IF_ERROR(c->routing.Validate());
  c->fleet.request_timeout = static_cast<DurationNs>(c->request_timeout_s * kNsPerSec);
  c->fleet.first_token_timeout = static_cast<DurationNs>(c->first_token_timeout_s * kNsPerSec);
  c->fleet.dns_interval = static_cast<DurationNs>(c->dns_interval_s * kNsPerSec);
  if (c->curve_keypair.empty() != c->curve_server_key.empty()) {
    return InvalidArgument("--curve-keypair and --curve-server-key go together");
  }
  c->fleet.curve = {c->curve_keypair, c->curve_server_key};
  if (!c->curve_keypair.empty()) {  // fail here with the reason, not later in a socket setup
    KVF_RETURN_IF_ERROR(LoadCurveKeyPair(c->curve_keypair).status());
    KVF_RETURN_IF_ERROR(LoadCurvePublicKey(c->curve_server_key).status());
  }
  std::string rest = c->static_workers;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string ep = rest.substr(0, comma);
    if (!ep.empty()) c->fleet.static_workers.push_back(ep);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  if (!c->api_key_file.empty()) {
    KVF_ASSIGN_OR_RETURN(c->api.api_keys, LoadApiKeys(c->api_key_file));
  }
  return Status::Ok();
}

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
  // Signals are taken by sigwait below; threads started from here on inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::shared_ptr<const TextCodec> codec;
  if (c.tokenizer_dir.empty()) {
    codec = MakeByteCodec();
  } else {
    auto loaded = LoadTokenizerCodec(c.tokenizer_dir);
    if (!loaded.ok()) {
      log->error("{}", loaded.status().message());
      return 2;
    }
    codec = *loaded;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  const Clock* clock = SystemClock::Default();
  // KV events and load reports: the global index, worker liveness and load.
  EventPlaneOptions events;
  events.heartbeat_timeout = c.heartbeat_timeout_ms * kNsPerMs;
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
  EventPlaneSignals worker_signals(&plane);
  GlobalPrefixIndex global_index(&plane.index());
  PredictedIndex approx_index(clock);  // the approx policy: this router's decisions only
  auto fleet = Fleet::Start(c.fleet, &worker_signals, clock, registry.get());
  if (!fleet.ok()) {
    log->error("{}", fleet.status().message());
    return 1;
  }
  Picker picker(c.routing);
  Api api(c.api, fleet->get(), &picker, &global_index, &approx_index, codec, clock, registry);
  http::Routes routes;
  api.AddRoutes(&routes);
  auto server = http::Server::Start(c.http, std::move(routes));
  if (!server.ok()) {
    log->error("{}", server.status().message());
    return 1;
  }
  log->info("listening on http://{}:{} (policy {}, codec {}, registration {})", c.http.address, (*server)->port(),
            c.policy, codec->name(), (*fleet)->registration_endpoint());
  int sig = 0;
  sigwait(&signals, &sig);
  log->info("signal {}: stopping", sig);
  (*server)->Stop();   // no new requests; in-flight exchanges see their clients gone
  (*fleet)->Stop();    // ends what is still in flight and drops its exchanges
  server->reset();
  return 0;
}

}  // namespace
}  // namespace kvfleet::router

int main(int argc, char** argv) {
  CLI::App app{"kvfleet-router: the OpenAI-compatible, cache-aware router of a kvfleet fleet"};
  kvfleet::router::RouterConfig config;
  kvfleet::AddCommonOptions(app, &config.common);
  kvfleet::router::AddOptions(app, &config);
  int rc = kvfleet::ParseCommandLine(app, &config.common, argc, argv);
  if (rc >= 0) return rc;
  return kvfleet::router::Run(config);
}
