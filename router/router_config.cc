#include "router/router_config.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>

#include <unistd.h>

#include "common/block_hash.h"
#include "common/curve_keys.h"
#include "common/tokenizer_files.h"
#include "router/index/global_index.h"
#include "schema/limits.h"

namespace kvfleet::router {

namespace {

// Each [MODEL=]N of `option`, by model ("" for a plain N).
Status ParseCounts(std::string_view option, const std::vector<std::string>& values,
                   std::map<std::string, uint32_t>* out) {
  for (const auto& value : values) {
    KVF_ASSIGN_OR_RETURN(auto mv, SplitModelValue(option, value));
    uint32_t n = 0;
    const char* end = mv.second.data() + mv.second.size();
    auto [ptr, ec] = std::from_chars(mv.second.data(), end, n);
    if (ec != std::errc() || ptr != end || n == 0) {
      return InvalidArgument(std::string(option) + " " + value + ": '" + mv.second + "' is not a positive integer");
    }
    if (!out->emplace(mv.first, n).second) {
      return InvalidArgument(std::string(option) + " " + value + ": " +
                             (mv.first.empty() ? std::string("a plain value") : "model '" + mv.first + "'") +
                             " is given twice");
    }
  }
  return Status::Ok();
}

// --workers, --workers-dns, --block-size and --max-context into FleetOptions::static_fleets.
Status PrepareStaticFleets(RouterConfig* c) {
  c->fleet.static_fleets.clear();
  std::map<std::string, StaticFleet> fleets;
  std::map<std::string, std::string> owner;  // endpoint or DNS name -> its model
  auto fleet_of = [&](const std::string& model) -> StaticFleet& {
    StaticFleet& f = fleets[model];
    f.model = model;
    return f;
  };
  for (const auto& value : c->workers) {
    KVF_ASSIGN_OR_RETURN(auto mv, SplitModelValue("--workers", value));
    const std::string model = mv.first.empty() ? c->fleet.static_model : mv.first;
    std::string rest = mv.second;
    size_t start = 0;
    while (start <= rest.size()) {
      size_t comma = rest.find(',', start);
      std::string ep = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? rest.size() + 1 : comma + 1;
      if (ep.empty()) continue;
      if (ep.find("://") == std::string::npos) {
        return InvalidArgument("--workers " + value + ": '" + ep + "' is not an endpoint (tcp://HOST:PORT)");
      }
      auto [it, fresh] = owner.emplace(ep, model);
      if (!fresh) {
        return InvalidArgument("--workers " + value + ": " + ep + " is listed twice (models '" + it->second +
                               "' and '" + model + "')");
      }
      fleet_of(model).workers.push_back(ep);
    }
  }
  for (const auto& value : c->workers_dns) {
    KVF_ASSIGN_OR_RETURN(auto mv, SplitModelValue("--workers-dns", value));
    const std::string model = mv.first.empty() ? c->fleet.static_model : mv.first;
    size_t colon = mv.second.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == mv.second.size() ||
        mv.second.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return InvalidArgument("--workers-dns " + value + ": '" + mv.second + "' is not HOST:PORT");
    }
    auto [it, fresh] = owner.emplace("dns:" + mv.second, model);
    if (!fresh) {
      return InvalidArgument("--workers-dns " + value + ": " + mv.second + " is given twice (models '" + it->second +
                             "' and '" + model + "')");
    }
    fleet_of(model).dns_names.push_back(mv.second);
  }
  std::map<std::string, uint32_t> block_sizes, max_contexts;
  KVF_RETURN_IF_ERROR(ParseCounts("--block-size", c->block_sizes, &block_sizes));
  KVF_RETURN_IF_ERROR(ParseCounts("--max-context", c->max_contexts, &max_contexts));
  for (const auto& [option, counts] : std::initializer_list<std::pair<std::string, const std::map<std::string, uint32_t>*>>{
           {"--block-size", &block_sizes}, {"--max-context", &max_contexts}}) {
    for (const auto& [model, n] : *counts) {
      // Registered workers announce their own sizes: a size for a model without static
      // or DNS workers would be silently unused.
      if (!model.empty() && !fleets.count(model)) {
        return InvalidArgument(option + " " + model + "=" + std::to_string(n) + ": model '" + model +
                               "' has no --workers or --workers-dns (registered workers announce their own)");
      }
    }
  }
  for (auto& [model, f] : fleets) {
    auto pick = [&](const std::map<std::string, uint32_t>& m, uint32_t fallback) {
      auto it = m.find(model);
      if (it != m.end()) return it->second;
      it = m.find("");
      return it != m.end() ? it->second : fallback;
    };
    f.block_size = pick(block_sizes, StaticFleet{}.block_size);
    f.max_context = pick(max_contexts, StaticFleet{}.max_context);
    if (!IsValidBlockSize(f.block_size)) {
      return InvalidArgument("--block-size: " + std::to_string(f.block_size) + " (model '" + model +
                             "') is not a power of two");
    }
    if (f.max_context > wire::limits::kMaxContextTokens) {
      return InvalidArgument("--max-context: " + std::to_string(f.max_context) + " (model '" + model +
                             "') is over the " + std::to_string(wire::limits::kMaxContextTokens) +
                             " tokens a request frame carries (schema/limits.h)");
    }
    c->fleet.static_fleets.push_back(f);
  }
  return Status::Ok();
}

// --tokenizer and --chat-template into RouterConfig::tokenizers, each template file read.
Status PrepareTokenizers(RouterConfig* c) {
  std::map<std::string, RouterConfig::ModelTokenizer> by_model;
  for (const auto& value : c->tokenizer_dirs) {
    KVF_ASSIGN_OR_RETURN(auto mv, SplitModelValue("--tokenizer", value));
    std::error_code ec;
    if (!std::filesystem::is_directory(mv.second, ec)) {
      return InvalidArgument("--tokenizer " + value + ": " + mv.second + " is not a directory");
    }
    if (by_model.count(mv.first)) {
      return InvalidArgument("--tokenizer " + value + ": " +
                             (mv.first.empty() ? std::string("a plain --tokenizer") : "model '" + mv.first + "'") +
                             " is given twice");
    }
    by_model[mv.first] = RouterConfig::ModelTokenizer{mv.first, mv.second, {}, {}};
  }
  std::set<std::string> templated;
  for (const auto& value : c->chat_template_files) {
    KVF_ASSIGN_OR_RETURN(auto mv, SplitModelValue("--chat-template", value));
    if (!templated.insert(mv.first).second) {
      return InvalidArgument("--chat-template " + value + ": " +
                             (mv.first.empty() ? std::string("a plain --chat-template") : "model '" + mv.first + "'") +
                             " is given twice");
    }
    auto it = by_model.find(mv.first);
    if (it == by_model.end()) {
      auto fallback = by_model.find("");
      if (mv.first.empty() || fallback == by_model.end()) {
        if (by_model.empty()) {
          return InvalidArgument("--chat-template needs --tokenizer: the byte codec renders chats as plain text");
        }
        return InvalidArgument("--chat-template " + value + ": no --tokenizer for " +
                               (mv.first.empty() ? std::string("the plain --chat-template (give a plain --tokenizer "
                                                               "DIR, or name the model: --chat-template MODEL=FILE)")
                                                 : "model '" + mv.first + "'"));
      }
      // The default tokenizer directory with this model's own template.
      it = by_model.emplace(mv.first, RouterConfig::ModelTokenizer{mv.first, fallback->second.dir, {}, {}}).first;
    }
    std::error_code ec;
    Result<std::string> text = ReadModelFile(mv.second);
    if (!std::filesystem::is_regular_file(mv.second, ec) || !text.ok()) {
      return InvalidArgument("--chat-template " + value + ": cannot read the file");
    }
    it->second.chat_template_file = mv.second;
    it->second.chat_template = std::move(text).value();
  }
  c->tokenizers.clear();
  for (auto& [model, t] : by_model) c->tokenizers.push_back(std::move(t));
  return Status::Ok();
}

}  // namespace

Result<std::pair<std::string, std::string>> SplitModelValue(std::string_view option, const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    if (text.empty()) return InvalidArgument(std::string(option) + ": an empty value");
    return std::make_pair(std::string(), text);
  }
  std::string model = text.substr(0, eq), value = text.substr(eq + 1);
  if (model.empty() || value.empty()) {
    return InvalidArgument(std::string(option) + " " + text + ": expected MODEL=VALUE with neither empty");
  }
  return std::make_pair(std::move(model), std::move(value));
}

void AddOptions(CLI::App& app, RouterConfig* c) {
  app.add_option("--http-host", c->http.address, "HTTP listen address")->capture_default_str();
  app.add_option("--http-port", c->http.port, "HTTP port (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--http-threads", c->http.io_threads, "HTTP I/O threads")->capture_default_str();
  app.add_option("--http-max-connections", c->http.max_connections,
                 "HTTP connections open at once; one accepted beyond is closed at once and counted in "
                 "kvfleet_http_connections_refused_total (keep it under the open-file limit, ulimit -n)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-bytes", c->http.max_body_bytes, "largest request body (413 beyond)")
      ->capture_default_str();
  app.add_option("--max-header-bytes", c->http.max_header_bytes, "largest request header (431 beyond)")
      ->capture_default_str();
  app.add_option("--api-key-file", c->api_key_file,
                 "file of accepted API keys, one per line (default: no auth); guards /v1/*, /tokenize, /detokenize "
                 "and /fleet");
  app.add_flag("--cache-salt-per-key", c->api.cache_salt_per_key,
               "each API key's requests get their own KV cache namespace: no tenant hits, or can detect through "
               "cached_tokens, prompts another tenant sent (costs the hits tenants would share)");
  app.add_flag("--metrics-need-key", c->api.metrics_need_key,
               "/metrics also needs one of the API keys (--api-key-file); /health, /ready and /version stay open");
  app.add_flag("--allow-unknown-fields", c->api.limits.fields.allow_unknown,
               "admit request fields kvfleet does not know (default: 400 naming the field, as OpenAI answers); "
               "each is logged once at debug and counted in kvfleet_router_unknown_fields_total");
  app.add_option_function<std::string>(
      "--tool-call-parser",
      [c](const std::string& v) {
        auto kind = ToolParserFromName(v);
        if (!kind.ok()) throw CLI::ValidationError("--tool-call-parser", kind.status().message());
        c->api.tool_parser = *kind;
      },
      "how chat answers' tool calls are written, for every model: llama3_json, hermes, mistral or none "
      "(default: from each model's chat template)");
  app.add_option_function<std::string>(
      "--reasoning-parser",
      [c](const std::string& v) {
        auto kind = ReasoningParserFromName(v);
        if (!kind.ok()) throw CLI::ValidationError("--reasoning-parser", kind.status().message());
        c->api.reasoning_parser = *kind;
      },
      "where chat answers' reasoning is, for every model: qwen3 or deepseek_r1 (<think> blocks, to "
      "reasoning_content) or none (default: from each model's chat template)");
  app.add_option("--registration", c->fleet.registration_endpoint,
                 "ROUTER endpoint workers send Hello to (empty: none). Unless it is a loopback address, it needs "
                 "--registration-authorized-keys or --registration-insecure")
      ->capture_default_str();
  app.add_option("--registration-authorized-keys", c->fleet.registration_auth.authorized_keys_file,
                 "worker public keys admitted to registration, one per line (kvfleet keygen): registration becomes "
                 "CURVE with this router's --curve-keypair, and a Hello or Bye from any other key is refused");
  app.add_flag("--registration-insecure", c->fleet.registration_auth.insecure,
               "accept unauthenticated Hellos and Byes on a registration address other hosts can reach (a network "
               "where every host is trusted)");
  app.add_option("--registration-lease-s", c->registration_lease_s,
                 "a registered worker's id and endpoints stay its own for this long after its last Hello: no other "
                 "peer may register them meanwhile")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // The per-model options take one value per occurrence, `--tokenizer a=X --tokenizer b=Y`,
  // or several split at ';', which is how the environment gives several:
  // KVFLEET_TOKENIZER="a=X;b=Y".
  app.add_option("--workers", c->workers,
                 "static workers: [MODEL=]EP,EP,... requests endpoints (tcp://HOST:PORT); plain: --model's; repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--workers-dns", c->workers_dns,
                 "[MODEL=]HOST:PORT resolving to many workers, re-resolved; plain: --model's; repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--dns-interval-s", c->dns_interval_s,
                 "DNS re-resolution period of --workers-dns and --peer-routers-dns (seconds)")
      ->check(CLI::Range(0.1, 86'400.0))
      ->capture_default_str();
  app.add_option("--model", c->fleet.static_model, "model of a plain --workers and --workers-dns")
      ->capture_default_str();
  app.add_option("--block-size", c->block_sizes,
                 "[MODEL=]N: block size of static and DNS workers (default 32; plain: every model's); repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--max-context", c->max_contexts,
                 "[MODEL=]N: context length of static and DNS workers (default 8192; plain: every model's); "
                 "repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--tokenizer", c->tokenizer_dirs,
                 "[MODEL=]DIR: model directory whose tokenizer the router uses for MODEL (plain: for every model "
                 "without its own; none: bytes, for mock fleets); repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--chat-template", c->chat_template_files,
                 "[MODEL=]FILE: Jinja chat template replacing the tokenizer directory's (default: its "
                 "chat_template.jinja, else chat_template.json, else tokenizer_config.json's); plain: the plain "
                 "--tokenizer's; repeatable")
      ->allow_extra_args(false)
      ->delimiter(';');
  app.add_option("--routing-policy", c->policy,
                 "round_robin, least_loaded, kv, approx or kv_retention; for comparison dynamo, llmd, sglang or preble")
      ->capture_default_str();
  app.add_option("--routing-temperature", c->routing.temperature, "softmax temperature over kv costs (0: argmin)")
      ->capture_default_str();
  app.add_option("--uncached-work-weight", c->routing.uncached_work_weight,
                 "kv cost: weight of the prefill a choice adds to the fleet (higher: stickier prefixes)")
      ->capture_default_str();
  app.add_option("--max-fleet-load", c->routing.max_fleet_load,
                 "kv cost: bound on the fleet load (uncached prefill sent / the fleet's prefill rate) that stretches "
                 "the prefill a choice adds by 1 / (1 - load); in [0, 1), 0: no stretch")
      ->capture_default_str();
  app.add_option("--decode-s-per-running-request", c->routing.decode_s_per_running_request,
                 "kv cost: seconds each running request adds to a new request's first token, on a worker that has not "
                 "reported its decode rate (and in preble's rule)")
      ->capture_default_str();
  app.add_option("--hot-spot-factor", c->routing.hot_spot_factor, "skip workers above k x median load (0: off)")
      ->capture_default_str();
  app.add_option("--max-queued-requests", c->routing.max_queued_requests, "a worker with this many queued is saturated")
      ->capture_default_str();
  app.add_option("--routing-window-size", c->routing_window_size,
                 "KV pool whose events are indexed: auto (each worker's Hello names the pool a prefix hit is "
                 "limited by: full attention, or an all-windowed model's windowed pool) or a windowSize in tokens "
                 "for every worker (0: full attention)")
      ->capture_default_str();
  app.add_option("--predicted-ttl-ms", c->predicted_ttl_ms,
                 "lifetime of predicted index entries beyond the decision's predicted first token")
      ->capture_default_str();
  app.add_option("--transfer-bytes-per-s", c->routing.transfer_bytes_per_s,
                 "bandwidth assumed between two workers for pulling a cached prefix (kv, kv_retention); 0: the "
                 "router never asks a worker to pull")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--pd-split-tokens", c->routing.split_prefill_tokens,
                 "with --role prefill workers in the fleet: a prompt with at least this many tokens no decode "
                 "worker holds is prefilled on a prefill worker and pulled by a decode worker (kv, kv_retention); "
                 "0: never split")
      ->capture_default_str();
  app.add_option("--transfer-ipc-bytes-per-s", c->routing.transfer_ipc_bytes_per_s,
                 "bandwidth assumed between two workers on one host that copy device to device (their Hellos "
                 "name the same host id; CUDA IPC)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--transfer-setup-ms", c->transfer_setup_ms, "the fixed cost of one pull, added to its bytes' time")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--ttft-calibration,!--no-ttft-calibration", c->routing.calibrate_ttft,
               "fit the kv cost model's queue, own-prefill and step terms to the first tokens that come "
               "(router/routing/README.md, \"Calibrating the estimate\"); off: the terms as they are")
      ->capture_default_str();
  app.add_flag("--transfer-measured,!--no-transfer-measured", c->routing.transfer_measured,
               "price a pull by what that pair's pulls took (the workers' load reports), the transfer flags "
               "being the prior; off: by the flags alone")
      ->capture_default_str();
  app.add_option("--max-workers", c->fleet.max_workers,
                 "workers known at once; a new one beyond takes the place of the one gone longest, or is refused "
                 "(max-workers) when none is gone; sizes the ZeroMQ socket "
                 "and open-file limits")
      ->capture_default_str();
  app.add_option("--forget-after-s", c->forget_after_s,
                 "a worker gone this long (bye, removed, dead, unreachable) is forgotten: record, sockets, id")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", c->heartbeat_timeout_ms,
                 "a worker silent this long on its event stream is dead")
      ->capture_default_str();
  app.add_option("--unknown-model-grace-s", c->unknown_model_grace_s,
                 "for this long after start, a model no worker has announced yet is 503 with Retry-After, not 404 "
                 "(a restarted router re-learns the fleet; workers re-send Hello every 2 s)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--curve-keypair", c->curve_keypair,
                 "CURVE: this router's key pair file, for the request, event and replay sockets (kvfleet keygen)");
  app.add_option("--curve-server-key", c->curve_server_key, "CURVE: the workers' server public key file");
  app.add_option("--peer-routers", c->peer_routers,
                 "the gossip endpoints of this fleet's other routers (EP,EP,...; this router's own is skipped): "
                 "they share their in-flight counts per worker and routed work, and routing counts them all")
      ->delimiter(',');
  app.add_option("--peer-routers-dns", c->gossip.peers_dns,
                 "HOST:PORT whose every address is a peer router's gossip endpoint (a Kubernetes headless Service "
                 "over the routers), re-resolved every --dns-interval-s; with --peer-routers or alone");
  app.add_option("--gossip-endpoint", c->gossip.endpoint,
                 "this router's gossip PUB endpoint, bound when --peer-routers is set. Unless it is a loopback "
                 "address, it needs --gossip-keypair or --gossip-insecure")
      ->capture_default_str();
  app.add_option("--router-id", c->gossip.router_id,
                 "this router's name on the gossip channel, unique in the fleet (default: its gossip endpoint)");
  app.add_option("--gossip-keypair", c->gossip.keypair_file,
                 "CURVE on the gossip channel: the fleet's gossip key pair file (kvfleet keygen), the same on every "
                 "router; only its holders may subscribe");
  app.add_flag("--gossip-insecure", c->gossip.insecure,
               "gossip without CURVE on an address other hosts can reach, or beside --curve-keypair (a network "
               "where every host is trusted)");
  app.add_option("--gossip-interval-ms", c->gossip_interval_ms,
                 "this router sends its state to its peers at least this often (a heartbeat while its counts do "
                 "not change)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}))
      ->capture_default_str();
  app.add_option("--gossip-on-change", c->gossip.on_change,
                 "send this router's state to its peers as soon as its counts change (at most once per "
                 "--gossip-min-gap-us), and after --gossip-interval-ms without a message; false: only every interval")
      ->capture_default_str();
  app.add_option("--gossip-min-gap-us", c->gossip_min_gap_us,
                 "the least time between two messages sent on change; changes meanwhile go out together")
      ->check(CLI::Range(int64_t{0}, int64_t{10000000}))
      ->capture_default_str();
  app.add_option("--gossip-ttl-ms", c->gossip_ttl_ms,
                 "a peer router not heard for this long is forgotten, its requests no longer counted")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--debug-drop-events", c->debug_drop_events,
                 "TESTING ONLY: drop this fraction of received KV event batches (fault injection)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--debug-drop-gossip", c->debug_drop_gossip,
                 "TESTING ONLY: AT_S:FOR_S, the gossip channel to the peer routers down for FOR_S seconds from AT_S "
                 "seconds after start-up (fault injection)");
  app.add_option("--decision-log", c->decision_log,
                 "append one JSON line per routing decision to this file: the choice and every candidate's load view "
                 "and estimated first token (for diagnosis: a write per decision)");
  app.add_option("--request-timeout-s", c->request_timeout_s, "whole-request timeout")->capture_default_str();
  app.add_option("--report-timings", c->api.report_timings,
                 "add the router's own timestamps of each request (monotonic ns of this host) to its usage's "
                 "kvfleet extension, for latency breakdowns (router_loadgen)")
      ->capture_default_str();
  AddCpuLatencyOption(app, &c->cpu_latency);
  app.add_option("--first-token-timeout-s", c->first_token_timeout_s, "no first token by then: retry elsewhere")
      ->capture_default_str();
  app.add_option("--admission-ttft-s", c->admission_ttft_s,
                 "refuse at once (429, Retry-After) a request predicted to wait longer than this for its first "
                 "token on every worker (0: 0.8 x --first-token-timeout-s); at most --first-token-timeout-s")
      ->capture_default_str();
  app.add_option("--max-waiting-requests", c->routing.max_waiting_requests,
                 "requests of one model sent by this router and without a first token; beyond, 429")
      ->capture_default_str();
}

namespace {

Status PrepareGossip(RouterConfig* c) {
  c->gossip.peers = c->peer_routers;
  c->gossip.interval = c->gossip_interval_ms * kNsPerMs;
  c->gossip.ttl = c->gossip_ttl_ms * kNsPerMs;
  c->gossip.min_gap = c->gossip_min_gap_us * kNsPerUs;
  c->gossip.dns_interval = static_cast<DurationNs>(c->dns_interval_s * kNsPerSec);
  const bool gossip = !c->peer_routers.empty() || !c->gossip.peers_dns.empty();
  if (!c->debug_drop_gossip.empty()) {
    if (!gossip) return InvalidArgument("--debug-drop-gossip needs --peer-routers or --peer-routers-dns (a gossip channel)");
    KVF_ASSIGN_OR_RETURN(c->gossip_outage, ParseGossipOutage(c->debug_drop_gossip));
  }
  if (!gossip) return Status::Ok();
  if (const std::string& dns = c->gossip.peers_dns; !dns.empty()) {
    const size_t colon = dns.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == dns.size() || dns.find("://") != std::string::npos) {
      return InvalidArgument("--peer-routers-dns: '" + dns + "' is not HOST:PORT");
    }
  }
  if (c->gossip.min_gap > c->gossip.interval) {
    return InvalidArgument("--gossip-min-gap-us must not be longer than --gossip-interval-ms: the heartbeat "
                           "would send changes sooner than the gap allows");
  }
  if (c->gossip.ttl <= c->gossip.interval) {
    return InvalidArgument("--gossip-ttl-ms must be longer than --gossip-interval-ms: peers would be forgotten "
                           "between their messages");
  }
  for (const std::string& peer : c->peer_routers) {
    if (!peer.starts_with("tcp://") && !peer.starts_with("ipc://")) {
      return InvalidArgument("--peer-routers: '" + peer + "' is not a tcp:// or ipc:// endpoint");
    }
  }
  if (c->gossip.keypair_file.empty()) {
    // A fleet that keys its workers' sockets keys its routers' gossip too, unless told not to.
    if (!c->curve_keypair.empty() && !c->gossip.insecure) {
      return InvalidArgument("gossip (--peer-routers) with --curve-keypair needs --gossip-keypair (the fleet's gossip key "
                             "pair), or --gossip-insecure for plaintext gossip");
    }
  } else {
    KVF_RETURN_IF_ERROR(LoadCurveKeyPair(c->gossip.keypair_file).status());
  }
  return Status::Ok();
}

}  // namespace

Status Prepare(RouterConfig* c) {
  KVF_ASSIGN_OR_RETURN(c->routing.policy, ParsePolicy(c->policy));
  if (c->routing_window_size != "auto") {
    const std::string& v = c->routing_window_size;
    const bool digits = !v.empty() && v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      return InvalidArgument("--routing-window-size must be auto or a window in tokens (0: full attention), got '" +
                             v + "'");
    }
    c->routing_window = static_cast<uint32_t>(std::stoul(v));
  }
  c->api.routing_window_size = c->routing_window;
  c->routing.predicted_ttl = c->predicted_ttl_ms * kNsPerMs;
  c->routing.transfer_setup_s = c->transfer_setup_ms / 1e3;
  if (!(c->first_token_timeout_s > 0)) return InvalidArgument("--first-token-timeout-s must be > 0");
  if (!(c->admission_ttft_s >= 0) || c->admission_ttft_s > c->first_token_timeout_s) {
    return InvalidArgument("--admission-ttft-s must be between 0 and --first-token-timeout-s (" +
                           NumberText(c->first_token_timeout_s) + "): a request admitted beyond the timeout "
                           "would time out (504) after its wait");
  }
  c->routing.admission_ttft_s = c->admission_ttft_s > 0
                                    ? c->admission_ttft_s
                                    : config::kAdmissionShareOfFirstTokenTimeout * c->first_token_timeout_s;
  if (!(c->routing.max_waiting_requests >= 1)) return InvalidArgument("--max-waiting-requests must be >= 1");
  if (!c->gossip.peers.empty() || !c->gossip.peers_dns.empty()) {  // its own order among equal costs
    // Unique per router: its --router-id, else its host and gossip endpoint.
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::string name = c->gossip.router_id.empty() ? std::string(host) + " " + c->gossip.endpoint
                                                         : c->gossip.router_id;
    c->routing.tie_salt = std::hash<std::string>{}(name) | 1;
  }
  KVF_RETURN_IF_ERROR(c->routing.Validate());
  c->fleet.request_timeout = static_cast<DurationNs>(c->request_timeout_s * kNsPerSec);
  c->fleet.first_token_timeout = static_cast<DurationNs>(c->first_token_timeout_s * kNsPerSec);
  c->fleet.dns_interval = static_cast<DurationNs>(c->dns_interval_s * kNsPerSec);
  if (c->fleet.max_workers < 1 || c->fleet.max_workers > config::kMaxWorkers) {
    return InvalidArgument("--max-workers must be 1.." + std::to_string(config::kMaxWorkers) +
                           " (the global index's worker limit)");
  }
  if (!(c->forget_after_s > 0)) return InvalidArgument("--forget-after-s must be > 0");
  c->fleet.forget_after = static_cast<DurationNs>(c->forget_after_s * kNsPerSec);
  c->fleet.lanes = static_cast<size_t>(std::max(c->http.io_threads, 1)) + 1;  // the I/O threads', and Submit's
  c->api.unknown_model_grace = static_cast<DurationNs>(c->unknown_model_grace_s * kNsPerSec);
  c->fleet.registration_auth.lease = static_cast<DurationNs>(c->registration_lease_s * kNsPerSec);
  if (!c->fleet.registration_auth.authorized_keys_file.empty()) {
    if (c->curve_keypair.empty()) {
      return InvalidArgument("--registration-authorized-keys needs --curve-keypair (the registration socket's key)");
    }
    KVF_RETURN_IF_ERROR(LoadAuthorizedKeys(c->fleet.registration_auth.authorized_keys_file).status());
  }
  if (c->curve_keypair.empty() != c->curve_server_key.empty()) {
    return InvalidArgument("--curve-keypair and --curve-server-key go together");
  }
  c->fleet.curve = {c->curve_keypair, c->curve_server_key};
  if (!c->curve_keypair.empty()) {  // fail here with the reason, not later in a socket setup
    KVF_RETURN_IF_ERROR(LoadCurveKeyPair(c->curve_keypair).status());
    KVF_RETURN_IF_ERROR(LoadCurvePublicKey(c->curve_server_key).status());
  }
  KVF_RETURN_IF_ERROR(PrepareGossip(c));
  KVF_RETURN_IF_ERROR(PrepareStaticFleets(c));
  KVF_RETURN_IF_ERROR(PrepareTokenizers(c));
  if (!c->api_key_file.empty()) {
    KVF_ASSIGN_OR_RETURN(c->api.api_keys, LoadApiKeys(c->api_key_file));
  }
  if (c->api.cache_salt_per_key && c->api.api_keys.empty()) {
    return InvalidArgument("--cache-salt-per-key needs --api-key-file (the keys that name the tenants)");
  }
  if (c->api.metrics_need_key && c->api.api_keys.empty()) {
    return InvalidArgument("--metrics-need-key needs --api-key-file (the keys /metrics then asks for)");
  }
  return Status::Ok();
}

uint64_t OpenFilesWanted(const RouterConfig& c) {
  constexpr uint64_t kEventFilesPerWorker = 3;  // the replay DEALER's mailbox and connection, the SUB's
  constexpr uint64_t kOtherFiles = 4096;        // HTTP clients, tokenizers, logs, the contexts' own
  const uint64_t fleet_sockets = c.fleet.SocketsPerWorker();
  const uint64_t fleet_connections = 1 + c.fleet.lanes;  // the liveness DEALER's and each lane's
  return c.fleet.max_workers * (fleet_sockets + fleet_connections + kEventFilesPerWorker) + kOtherFiles;
}

}  // namespace kvfleet::router
