#include "router/router_config.h"

#include <filesystem>

#include "common/curve_keys.h"
#include "common/tokenizer_files.h"

namespace kvfleet::router {

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
  app.add_option("--chat-template", c->chat_template_file,
                 "Jinja chat template file replacing the --tokenizer directory's (default: its chat_template.jinja, "
                 "else chat_template.json, else tokenizer_config.json's)");
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
  app.add_option("--unknown-model-grace-s", c->unknown_model_grace_s,
                 "for this long after start, a model no worker has announced yet is 503 with Retry-After, not 404 "
                 "(a restarted router re-learns the fleet; workers re-send Hello every 2 s)")
      ->check(CLI::NonNegativeNumber)
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
  app.add_option("--admission-ttft-s", c->admission_ttft_s,
                 "refuse at once (429, Retry-After) a request predicted to wait longer than this for its first "
                 "token on every worker (0: 0.8 x --first-token-timeout-s); at most --first-token-timeout-s")
      ->capture_default_str();
  app.add_option("--max-waiting-requests", c->routing.max_waiting_requests,
                 "requests of one model sent by this router and without a first token; beyond, 429")
      ->capture_default_str();
}

Status Prepare(RouterConfig* c) {
  KVF_ASSIGN_OR_RETURN(c->routing.policy, ParsePolicy(c->policy));
  c->routing.predicted_ttl = c->predicted_ttl_ms * kNsPerMs;
  if (!(c->first_token_timeout_s > 0)) return InvalidArgument("--first-token-timeout-s must be > 0");
  if (!(c->admission_ttft_s >= 0) || c->admission_ttft_s > c->first_token_timeout_s) {
    return InvalidArgument("--admission-ttft-s must be between 0 and --first-token-timeout-s (" +
                           std::to_string(c->first_token_timeout_s) + "): a request admitted beyond the timeout "
                           "would time out (504) after its wait");
  }
  c->routing.admission_ttft_s = c->admission_ttft_s > 0
                                    ? c->admission_ttft_s
                                    : config::kAdmissionShareOfFirstTokenTimeout * c->first_token_timeout_s;
  if (!(c->routing.max_waiting_requests >= 1)) return InvalidArgument("--max-waiting-requests must be >= 1");
  KVF_RETURN_IF_ERROR(c->routing.Validate());
  c->fleet.request_timeout = static_cast<DurationNs>(c->request_timeout_s * kNsPerSec);
  c->fleet.first_token_timeout = static_cast<DurationNs>(c->first_token_timeout_s * kNsPerSec);
  c->fleet.dns_interval = static_cast<DurationNs>(c->dns_interval_s * kNsPerSec);
  c->api.unknown_model_grace = static_cast<DurationNs>(c->unknown_model_grace_s * kNsPerSec);
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
  if (!c->chat_template_file.empty()) {
    if (c->tokenizer_dir.empty()) {
      return InvalidArgument("--chat-template needs --tokenizer: the byte codec renders chats as plain text");
    }
    std::error_code ec;
    Result<std::string> text = ReadModelFile(c->chat_template_file);
    if (!std::filesystem::is_regular_file(c->chat_template_file, ec) || !text.ok()) {
      return InvalidArgument("--chat-template " + c->chat_template_file + ": cannot read the file");
    }
    c->chat_template = std::move(text).value();
  }
  if (!c->api_key_file.empty()) {
    KVF_ASSIGN_OR_RETURN(c->api.api_keys, LoadApiKeys(c->api_key_file));
  }
  return Status::Ok();
}

}  // namespace kvfleet::router
