// RouterConfig: every setting of kvfleet-router, with its command-line option (and env
// KVFLEET_<OPTION>), default and unit. AddOptions registers them; Prepare validates them
// once at start-up and derives the component options (FleetOptions, RoutingOptions,
// ApiOptions) from the flat values.
//
// Thread safety: a value, filled and prepared on the main thread before anything starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/cpu_latency.h"
#include "common/http/server.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/fleet/gossip.h"
#include "router/http/api.h"
#include "router/routing/policy.h"

namespace kvfleet::router {

namespace config {
// The default admission bound as a share of the first-token timeout. Predictions err by
// about an engine step (the router's view of a worker lags by one load report, and a
// prompt's first token comes at the end of a step that also computes others' tokens); the
// rest of the timeout is the margin that keeps a request admitted at the bound from timing
// out (504) all the same.
inline constexpr double kAdmissionShareOfFirstTokenTimeout = 0.8;
}  // namespace config

struct RouterConfig {
  CommonOptions common;          // logging and the like (common/config.h)
  CpuLatencyOption cpu_latency;  // --cpu-latency-us
  http::ServerOptions http;      // --http-host, --http-port, --http-threads, --http-max-connections, limits
  FleetOptions fleet;            // registration, static and DNS workers; derived fields set by Prepare
  RoutingOptions routing;        // the kv cost model; policy and predicted_ttl set by Prepare
  ApiOptions api;                // api_keys set by Prepare
  std::string policy = "kv";     // --routing-policy: round_robin, least_loaded, kv, approx, kv_retention (or a peer rule)
  std::string api_key_file;      // empty: no authentication
  // Per-model options (repeatable). Each value is VALUE or MODEL=VALUE, split at the first
  // '='. A plain --workers / --workers-dns belongs to --model; a plain --tokenizer,
  // --chat-template, --block-size or --max-context is the default of every model without
  // a MODEL= value of its own.
  std::vector<std::string> workers;         // --workers: [MODEL=]EP,EP,... requests endpoints
  std::vector<std::string> workers_dns;     // --workers-dns: [MODEL=]HOST:PORT
  std::vector<std::string> block_sizes;     // --block-size: [MODEL=]N, of static and DNS workers (32)
  std::vector<std::string> max_contexts;    // --max-context: [MODEL=]N, of static and DNS workers (8192)
  std::vector<std::string> tokenizer_dirs;  // --tokenizer: [MODEL=]DIR; none: the byte codec (mock fleets)
  std::vector<std::string> chat_template_files;  // --chat-template: [MODEL=]FILE, replaces the directory's
  // Derived by Prepare: each tokenizer, the default's model "" (every model without its own).
  struct ModelTokenizer {
    std::string model;  // "": the default
    std::string dir;
    std::string chat_template_file;            // empty: the directory's template
    std::optional<std::string> chat_template;  // that file's text
  };
  std::vector<ModelTokenizer> tokenizers;
  int64_t predicted_ttl_ms = config::kPredictedTtl / kNsPerMs;  // ms
  double transfer_setup_ms = config::kTransferSetupSeconds * 1e3;  // the fixed cost of one pull
  double request_timeout_s = 600;                                // s, whole request
  double first_token_timeout_s = 60;                             // s, then retry elsewhere
  // s: a request predicted to wait longer for its first token on every worker is refused at
  // once (429); 0: config::kAdmissionShareOfFirstTokenTimeout × first_token_timeout_s.
  double admission_ttft_s = 0;
  double dns_interval_s = 10;                                    // s between DNS resolutions
  int64_t heartbeat_timeout_ms = 3000;                           // ms of event silence: dead
  double forget_after_s = 60;  // s a worker is gone (bye, removed, dead, unreachable) before it is forgotten
  double unknown_model_grace_s = 10;  // s after start: an unannounced model is 503, not 404
  double registration_lease_s = 10;   // s a registered worker's id and endpoints stay its own after its last Hello
  // --routing-window-size: "auto" indexes, per worker, the KV pool its Hello says a prefix
  // hit is limited by (IndexedWindow); a number indexes that windowSize for every worker.
  std::string routing_window_size = "auto";
  std::optional<uint32_t> routing_window;  // parsed by Prepare; none: auto
  std::string curve_keypair;     // empty: plaintext to workers
  std::string curve_server_key;  // the workers' public key; set with curve_keypair
  // Routers that act as one (router/README.md, "Several routers"): gossip runs when
  // --peer-routers names a peer. gossip.peers, interval and ttl are set by Prepare.
  GossipOptions gossip;             // --gossip-endpoint, --gossip-keypair, --gossip-insecure, --router-id
  std::vector<std::string> peer_routers;  // --peer-routers: EP,EP,... the peers' gossip endpoints
  int64_t gossip_interval_ms = config::kGossipInterval / kNsPerMs;  // ms between this router's messages
  int64_t gossip_ttl_ms = config::kGossipTtl / kNsPerMs;            // ms a silent peer is kept
  // us at least between two messages sent on change (--gossip-on-change=false: heartbeat only)
  int64_t gossip_min_gap_us = config::kGossipMinGap / kNsPerUs;
  // TESTING ONLY (chaos tests): drop this fraction of received KV event batches, as a lossy
  // network would, through router/events/fault_injection.h. 0 in production.
  double debug_drop_events = 0;
  // TESTING ONLY (chaos tests): "AT_S:FOR_S", the gossip channel down for FOR_S seconds from
  // AT_S after start-up (router/fleet/gossip_faults.h); parsed by Prepare. Empty in production.
  std::string debug_drop_gossip;
  std::optional<GossipOutage> gossip_outage;
  // --decision-log: append one JSON line per routing decision here (router/routing/decision_log.h);
  // empty: none.
  std::string decision_log;
};

// Registers every option of `c` on `app` (--help prints them with their defaults).
void AddOptions(CLI::App& app, RouterConfig* c);

// Validates the parsed options and derives the component options from them: the routing
// policy, durations in ns, each model's static and DNS workers (FleetOptions::static_fleets),
// each model's tokenizer directory and chat template file (read here, so a bad one fails at
// start-up with its reason), CURVE key files and the API keys. Every error names its option.
Status Prepare(RouterConfig* c);

// Open files a router with `c`'s fleet may need: per worker, each socket's mailbox and TCP
// connection (the fleet's and every lane's DEALER, the replay DEALER, the SUB's connection),
// and room for HTTP clients and the rest.
uint64_t OpenFilesWanted(const RouterConfig& c);

// "MODEL=VALUE" -> {MODEL, VALUE}; "VALUE" (no '=') -> {"", VALUE}. InvalidArgument, naming
// `option`, for an empty MODEL or VALUE.
Result<std::pair<std::string, std::string>> SplitModelValue(std::string_view option, const std::string& text);

}  // namespace kvfleet::router
