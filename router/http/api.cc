// The router's HTTP API: the route table, API-key authentication, and each handler's glue.
// A completion is parsed (openai.h), made ready for its model (completion_params.h),
// dispatched (router/routing/dispatch.h) and answered by its CompletionStream
// (completion_stream.h); /fleet, /v1/models and /ready are operator_api.h's.
#include "router/http/api.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <unordered_set>

#include <prometheus/registry.h>

#include "common/block_hash.h"
#include "common/check.h"
#include "common/http/metrics.h"
#include "common/log.h"
#include "router/fleet/lane.h"
#include "router/http/api_errors.h"
#include "router/http/api_metrics.h"
#include "router/http/completion_params.h"
#include "router/http/completion_stream.h"
#include "router/http/lora_api.h"
#include "router/http/operator_api.h"
#include "router/http/responses_api.h"
#include "router/http/tokenize_api.h"
#include "router/routing/dispatch.h"

namespace kvfleet::router {

Result<std::vector<std::string>> LoadApiKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read API key file " + path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    keys.push_back(line.substr(start));
  }
  if (keys.empty()) return InvalidArgument("API key file " + path + " holds no key");
  return keys;
}

namespace {

// Compares without an early exit, so the time taken says nothing about the key.
bool SameKey(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

double Seconds(DurationNs d) { return static_cast<double>(d) / kNsPerSec; }

// X-Request-Id: the client's name for a completion, echoed on its answer and written to the
// decision log. It reaches headers and logs, so only characters that cannot end or split
// either: at most kMaxRequestIdBytes of A-Z a-z 0-9 and - _ . : / + =.
constexpr std::string_view kRequestIdHeader = "x-request-id";
constexpr size_t kMaxRequestIdBytes = 128;

bool ValidRequestId(std::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdBytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           std::string_view("-_.:/+=").find(c) != std::string_view::npos;
  });
}

// The id to echo: the request's X-Request-Id when it is valid, else empty.
std::string_view RequestIdOf(const http::Request& req) {
  std::string_view id = req.Header(kRequestIdHeader);
  return ValidRequestId(id) ? id : std::string_view();
}

void EchoRequestId(const http::Request& req, http::Headers* headers) {
  if (std::string_view id = RequestIdOf(req); !id.empty()) headers->emplace_back(kRequestIdHeader, id);
}

// An HTTP I/O thread as a lane's loop.
class IoThreadLoop final : public LaneLoop {
 public:
  explicit IoThreadLoop(http::IoThread* thread) : thread_(thread) {}
  void Post(std::function<void()> fn) override { thread_->Post(std::move(fn)); }
  std::unique_ptr<Watch> WatchReadable(int fd, std::function<void()> on_readable) override {
    auto w = std::make_unique<HttpWatch>();
    w->watch = thread_->WatchReadable(fd, std::move(on_readable));
    return w;
  }

 private:
  struct HttpWatch final : Watch {
    std::unique_ptr<http::IoThread::Watch> watch;
  };
  http::IoThread* thread_;
};

// The lane of one HTTP I/O thread, kept as that thread's attachment.
struct ThreadLane {
  const void* owner;  // the ApiImpl that made it
  IoThreadLoop loop;
  std::unique_ptr<Lane> lane;  // destroyed before `loop`
};

// A completion's answer, written to its client's exchange.
class ExchangeWriter final : public AnswerWriter {
 public:
  explicit ExchangeWriter(std::shared_ptr<http::Exchange> ex) : ex_(std::move(ex)) {}
  void Reply(http::Response response) override {
    EchoRequestId(ex_->request(), &response.headers);
    ex_->Reply(std::move(response));
  }
  void StartStream(int status, std::string_view content_type, http::Headers headers) override {
    EchoRequestId(ex_->request(), &headers);
    ex_->StartStream(status, content_type, std::move(headers));
  }
  void Write(std::string_view data) override { ex_->Write(data); }
  void Finish() override { ex_->Finish(); }

 private:
  std::shared_ptr<http::Exchange> ex_;
};

}  // namespace

// Wraps a request's answer writer (the Responses API's translation); empty: none.
using WrapWriter = std::function<std::shared_ptr<AnswerWriter>(std::shared_ptr<AnswerWriter>)>;

class ApiImpl : public std::enable_shared_from_this<ApiImpl> {
 public:
  ApiImpl(const ApiOptions& options, Fleet* fleet, Router* router, ModelCodecs codecs, const Clock* clock,
          std::shared_ptr<prometheus::Registry> registry)
      : options_(options),
        fleet_(fleet),
        router_(router),
        dispatcher_(fleet, router, clock, options.unknown_model_grace),
        codecs_(std::move(codecs)),
        clock_(clock),
        registry_(std::move(registry)),
        metrics_(*registry_),
        lora_api_(fleet, *registry_, options.lora_control_timeout),
        id_rng_(std::random_device{}()) {
    options_.limits.fields.on_unknown = [this](std::string_view name) { OnUnknownField(name); };
    stream_context_.metrics = &metrics_;
    stream_context_.clock = clock;
    stream_context_.worker_name = [fleet](WorkerId w) { return fleet->WorkerName(w); };
    stream_context_.report_timings = options.report_timings;
    stream_context_.retry_after_s = options.retry_after_s;
  }

  void AddRoutes(http::Routes* routes);
  void ForgetWorker(const std::string& worker) { metrics_.ForgetWorker(worker); }
  void Complete(std::shared_ptr<http::Exchange> ex, bool chat);
  // POST /v1/responses: served as a chat completion, its answer written back by a
  // ResponsesWriter (responses_api.h).
  void Respond(std::shared_ptr<http::Exchange> ex);

 private:
  // An unknown field admitted by --allow-unknown-fields: counted, and logged once per name
  // (the first kMaxLoggedUnknownFields names; a client could send endless ones).
  void OnUnknownField(std::string_view name) {
    metrics_.unknown_fields.Increment();
    std::lock_guard<std::mutex> lock(unknown_mu_);
    if (unknown_logged_.size() >= kMaxLoggedUnknownFields) return;
    if (unknown_logged_.emplace(name).second) {
      Logger("router")->debug("admitting unknown request field {} (--allow-unknown-fields)", EscapeForLog(name));
    }
  }

  static std::string_view BearerKey(const http::Request& req) {
    std::string_view auth = req.Header("authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() <= kBearer.size() || auth.substr(0, kBearer.size()) != kBearer) return {};
    return auth.substr(kBearer.size());
  }

  std::optional<ApiError> Authorize(const http::Request& req) const {
    if (options_.api_keys.empty()) return std::nullopt;
    std::string_view key = BearerKey(req);
    if (!key.empty()) {
      for (const auto& k : options_.api_keys) {
        if (SameKey(key, k)) return std::nullopt;
      }
    }
    return MakeError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key");
  }

  // The cache namespace of an (authorized) key: a digest, so the key never leaves the router.
  static std::string TenantSalt(std::string_view key) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(HashSeed(HashNamespace{"kvfleet-tenant", "", key})));
    return std::string("tenant-") + hex + ":";
  }

  // A synchronous route behind the API key.
  template <typename Handler>
  void AddAuthorized(http::Routes* routes, const char* method, const char* path, Handler handler) {
    auto self = shared_from_this();
    routes->AddSync(method, path, [self, handler](const http::Request& req) {
      if (auto e = self->Authorize(req)) return ErrorResponse(*e);
      return handler(*self, req);
    });
  }

  static http::Response Answer(const TokenizeAnswer& a) {
    return a.error ? ErrorResponse(*a.error) : JsonResponse(200, a.body);
  }

  // /tokenize and /detokenize serve the models and adapters the fleet knows, with the (base)
  // model's codec.
  TokenizerModelLookup TokenizerLookup() const {
    return [this](const std::string& name) -> std::optional<TokenizerModel> {
      auto served = fleet_->Resolve(name);
      if (!served) return std::nullopt;
      return TokenizerModel{codecs_.For(served->model).get(), served->fleet.max_context};
    };
  }

  // The `model` label of a request's failure: its name when the fleet knows it (a model or
  // adapter a worker announced), else "other", so that names a client makes up do not each
  // add a series. "" (no model parsed yet) stays "".
  std::string ModelLabel(const std::string& model) const {
    return model.empty() || fleet_->Resolve(model) ? model : std::string(kOtherModelLabel);
  }

  void Fail(http::Exchange& ex, const std::string& model, const ApiError& e) {
    metrics_.requests.Add({{"model", ModelLabel(model)}, {"worker", "none"}, {"status", std::to_string(e.status)}})
        .Increment();
    http::Response r = ErrorResponse(e);
    EchoRequestId(ex.request(), &r.headers);
    ex.Reply(std::move(r));
  }
  // A completion's X-Request-Id, when sent, must be one RequestIdOf echoes.
  static std::optional<ApiError> CheckRequestId(const http::Request& req) {
    std::string_view id = req.Header(kRequestIdHeader);
    if (id.empty() || ValidRequestId(id)) return std::nullopt;
    return MakeError(400,
                     "X-Request-Id must be 1 to " + std::to_string(kMaxRequestIdBytes) +
                         " characters of A-Z a-z 0-9 - _ . : / + = (got " + std::to_string(id.size()) + " bytes)",
                     "invalid_request_error", "invalid_request_id");
  }
  // A request refused for load, answered at once and counted by `reason` (empty: not a
  // refusal for load, answered as any failure).
  void Refuse(http::Exchange& ex, const std::string& model, std::string_view reason, const ApiError& e) {
    if (!reason.empty()) {
      metrics_.refused.Add({{"model", ModelLabel(model)}, {"reason", std::string(reason)}}).Increment();
    }
    Fail(ex, model, e);
  }

  std::string NewId(const char* prefix) {
    std::lock_guard<std::mutex> lock(id_mu_);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(id_rng_()));
    return buf;
  }

  // The lane of the I/O thread running this handler (made as the thread starts).
  Lane* LaneOf(http::IoThread* thread) {
    auto* tl = static_cast<ThreadLane*>(thread->attachment());
    if (tl == nullptr) {
      auto made = std::make_shared<ThreadLane>(ThreadLane{this, IoThreadLoop(thread), nullptr});
      made->lane = fleet_->NewLane(&made->loop);
      tl = made.get();
      thread->set_attachment(std::move(made));
    }
    KVF_CHECK(tl->owner == this);  // one Api per server
    return tl->lane.get();
  }

  // Steps 2 to 7 of a parsed completion: resolve, tokenize, route, send; the answer goes to
  // the client's exchange through `wrap`.
  void Serve(std::shared_ptr<http::Exchange> ex, CompletionRequest req, TimeNs arrived, WrapWriter wrap);

  // How a chat's answer splits into reasoning, content and tool calls: the router's flags,
  // else what the model's template writes. A request with tools (tool_choice auto) for a
  // model whose call format is unknown is refused: its calls could not be returned.
  std::optional<ApiError> ChatOutputFor(const CompletionRequest& req, const TextCodec& codec,
                                        const std::vector<TokenId>& prompt, ChatOutputSetup* out) const {
    if (!req.chat) return std::nullopt;
    const std::string_view tmpl = codec.chat_template_text();
    ToolParserKind format = ToolParserKind::kNone;  // how the model writes calls
    if (req.tools.tools) {
      // The byte codec (mock fleets) writes calls as <tool_call>...</tool_call>.
      format = options_.tool_parser.value_or(codec.is_byte_codec() ? ToolParserKind::kHermes : DetectToolParser(tmpl));
      out->mistral_ids = format == ToolParserKind::kMistral;  // its template checks the ids that come back
    }
    if (req.tools.parse_calls()) {
      out->tools = format;
      if (out->tools == ToolParserKind::kNone) {
        return BadRequest("the model's chat template writes no tool-call format kvfleet knows; the router needs "
                          "--tool-call-parser to return its calls (or send tool_choice \"none\")",
                          "tools");
      }
      if (!req.tools.parallel) out->max_calls = 1;
    }
    if (req.tools.forced()) {  // decoded under ForcedCallSchema's grammar: the text is the call(s)
      out->tools = ToolParserKind::kNone;
      out->forced = req.tools.choice;
      out->forced_name = req.tools.named;
      if (!req.tools.parallel) out->max_calls = 1;
    }
    out->reasoning = options_.reasoning_parser.value_or(DetectReasoningParser(tmpl));
    if (out->reasoning != ReasoningParserKind::kNone && !req.chat_template.kwargs_json.empty()) {
      // chat_template_kwargs {"enable_thinking": false}: the template closes the block itself.
      auto kwargs = nlohmann::json::parse(req.chat_template.kwargs_json, nullptr, false);
      auto thinking = kwargs.is_object() ? kwargs.find("enable_thinking") : kwargs.end();
      if (thinking != kwargs.end() && thinking->is_boolean() && !thinking->get<bool>()) {
        out->reasoning = ReasoningParserKind::kNone;
      }
    }
    if (out->reasoning != ReasoningParserKind::kNone && !prompt.empty()) {
      constexpr size_t kTail = 8;  // tokens enough for "<think>\n" and a turn marker
      const size_t from = prompt.size() > kTail ? prompt.size() - kTail : 0;
      out->starts_inside_think = PromptOpensThink(codec.Decode(std::span<const TokenId>(prompt).subspan(from)));
    }
    return std::nullopt;
  }

  ApiOptions options_;
  Fleet* fleet_;
  Router* router_;  // the calibration's coefficients, for /metrics
  Dispatcher dispatcher_;
  const ModelCodecs codecs_;  // each model's tokenizer
  const Clock* clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  ApiMetrics metrics_;
  StreamContext stream_context_;  // the streams hold it with this ApiImpl (aliasing shared_ptr)
  LoraApi lora_api_;  // /v1/load_lora_adapter, /v1/unload_lora_adapter
  std::mutex id_mu_;
  std::mt19937_64 id_rng_;  // GUARDED_BY(id_mu_)
  static constexpr size_t kMaxLoggedUnknownFields = 1024;
  std::mutex unknown_mu_;
  std::unordered_set<std::string> unknown_logged_;  // GUARDED_BY(unknown_mu_)
};

void ApiImpl::AddRoutes(http::Routes* routes) {
  routes->SetErrorFormatter([](int status, std::string_view message) {
    std::string type = status >= 500 ? "server_error" : "invalid_request_error";
    return ErrorResponse(MakeError(status, std::string(message), type));
  });
  auto self = shared_from_this();
  routes->Add("POST", "/v1/completions", [self](std::shared_ptr<http::Exchange> ex) { self->Complete(ex, false); });
  routes->Add("POST", "/v1/chat/completions", [self](std::shared_ptr<http::Exchange> ex) { self->Complete(ex, true); });
  routes->Add("POST", "/v1/responses", [self](std::shared_ptr<http::Exchange> ex) { self->Respond(ex); });
  for (const bool load : {true, false}) {
    routes->Add("POST", load ? "/v1/load_lora_adapter" : "/v1/unload_lora_adapter",
                [self, load](std::shared_ptr<http::Exchange> ex) {
                  if (auto e = self->Authorize(ex->request())) return ex->Reply(ErrorResponse(*e));
                  Lane* lane = self->LaneOf(ex->io_thread());
                  self->lora_api_.Handle(std::move(ex), lane, load);
                });
  }
  AddAuthorized(routes, "GET", "/v1/models",
                [](ApiImpl& api, const http::Request&) { return JsonResponse(200, ModelsJson(*api.fleet_)); });
  routes->AddSync("GET", "/health", [](const http::Request&) { return JsonResponse(200, R"({"status":"ok"})"); });
  routes->AddSync("GET", "/ready", [self](const http::Request&) { return ReadyResponse(self->fleet_->Readiness()); });
  AddAuthorized(routes, "GET", "/fleet", [](ApiImpl& api, const http::Request&) {
    return JsonResponse(200, FleetJson(*api.fleet_, *api.clock_, api.options_.routing_window_size));
  });
  AddAuthorized(routes, "POST", "/tokenize", [](ApiImpl& api, const http::Request& req) {
    return Answer(Tokenize(req.body, api.TokenizerLookup(), api.options_.limits.fields));
  });
  AddAuthorized(routes, "POST", "/detokenize", [](ApiImpl& api, const http::Request& req) {
    return Answer(Detokenize(req.body, api.TokenizerLookup(), api.options_.limits.fields));
  });
  routes->AddSync("GET", "/version", [](const http::Request&) { return JsonResponse(200, VersionJson()); });
  if (options_.metrics_need_key) {
    AddAuthorized(routes, "GET", "/metrics", [](ApiImpl& api, const http::Request&) {
      return http::Response{200, http::kPrometheusContentType, {}, http::SerializeMetrics(*api.registry_)};
    });
  } else {
    http::AddMetricsRoute(*routes, registry_);
  }
  // Each I/O thread's lane exists before its first request: that request does not wait
  // for the lane's connections to the workers.
  routes->OnThreadStart([self](http::IoThread* thread) { self->LaneOf(thread); });
}

void ApiImpl::Complete(std::shared_ptr<http::Exchange> ex, bool chat) {
  const TimeNs arrived = clock_->Now();
  if (auto e = Authorize(ex->request())) return Fail(*ex, "", *e);
  if (auto e = CheckRequestId(ex->request())) return Fail(*ex, "", *e);
  auto parsed = ParseCompletionRequest(ex->request().body, chat, options_.limits);
  if (!parsed.ok()) return Fail(*ex, "", ErrorFromStatus(parsed.status()));
  Serve(std::move(ex), std::move(parsed).value(), arrived, nullptr);
}

void ApiImpl::Respond(std::shared_ptr<http::Exchange> ex) {
  const TimeNs arrived = clock_->Now();
  if (auto e = Authorize(ex->request())) return Fail(*ex, "", *e);
  if (auto e = CheckRequestId(ex->request())) return Fail(*ex, "", *e);
  auto parsed = ParseResponsesRequest(ex->request().body, options_.limits);
  if (!parsed.ok()) return Fail(*ex, "", ErrorFromStatus(parsed.status()));
  CompletionRequest req = std::move(parsed->chat);
  parsed->chat.model = req.model;  // the writer's copy keeps the echoed fields and the model
  const std::string id = NewId("resp_");
  const int64_t created = clock_->WallNs() / kNsPerSec;
  Serve(std::move(ex), std::move(req), arrived,
        [id, created, r = std::move(parsed).value()](std::shared_ptr<AnswerWriter> out) {
          return NewResponsesWriter(std::move(out), id, created, r);
        });
}

void ApiImpl::Serve(std::shared_ptr<http::Exchange> ex, CompletionRequest req, TimeNs arrived, WrapWriter wrap) {
  const bool chat = req.chat;
  if (options_.cache_salt_per_key) req.cache_salt = TenantSalt(BearerKey(ex->request())) + req.cache_salt;
  Refusal refusal;
  Result<ServedModel> served = dispatcher_.Resolve(req.model, &refusal);
  if (!served.ok()) return Refuse(*ex, req.model, refusal.reason, ResolveError(served.status(), options_.retry_after_s));
  const std::shared_ptr<const TextCodec>& codec = codecs_.For(served->model);
  PreparedCompletion prepared;
  const CompletionDefaults defaults{options_.default_max_tokens, options_.default_chat_max_tokens};
  if (auto e = PrepareCompletion(req, *served, *codec, defaults, &prepared)) return Fail(*ex, req.model, *e);

  ChatOutputSetup output;
  if (auto e = ChatOutputFor(req, *codec, prepared.params.tokens, &output)) return Fail(*ex, req.model, *e);

  const std::string model = req.model;  // req moves into the stream
  const std::optional<Policy> policy = req.routing;
  const auto prompt_tokens = static_cast<uint32_t>(prepared.params.tokens.size());
  std::shared_ptr<CompletionStream> stream;
  auto make_stream = [&](const Routed& routed) -> std::shared_ptr<ResponseSink> {
    StreamSetup setup;
    setup.id = NewId(chat ? "chatcmpl-" : "cmpl-");
    setup.arrived = arrived;
    setup.routed = clock_->Now();
    metrics_.routing.Observe(Seconds(setup.routed - arrived));  // parse, tokenize, hash, route
    setup.prompt_tokens = prompt_tokens;
    setup.retry_after_s = RetryAfterSeconds(routed.estimated_ttft_s);
    setup.cancel = [lane = routed.lane, handle = routed.handle] { lane->Cancel(handle); };
    setup.echo = std::move(prepared.echo);
    setup.output = output;
    std::shared_ptr<AnswerWriter> writer = std::make_shared<ExchangeWriter>(ex);
    if (wrap) writer = wrap(std::move(writer));
    stream = std::make_shared<CompletionStream>(std::shared_ptr<const StreamContext>(shared_from_this(), &stream_context_),
                                                std::move(writer), std::move(req), codec, std::move(setup));
    return stream;
  };
  // Sent from this I/O thread, whose lane also reads the answer and feeds the stream.
  Lane* lane = LaneOf(ex->io_thread());
  const std::string constrained_field = req.structured_field;  // req moves into the stream
  Result<Dispatched> sent =
      dispatcher_.Dispatch(*served, std::move(prepared.params), policy, lane, make_stream, &refusal, constrained_field,
                           RequestIdOf(ex->request()));
  if (!sent.ok()) {
    ApiError e = RouteError(sent.status(), refusal);
    if (sent.status().code() == StatusCode::kInvalidArgument) e.param = constrained_field;
    return Refuse(*ex, model, refusal.reason, e);
  }
  stream->MarkSent(sent->sent);
  ex->OnClientGone([self = shared_from_this(), lane, handle = sent->handle] {
    lane->Cancel(handle);
    self->metrics_.abandoned.Increment();
  });
  metrics_.matched.Observe(sent->matched_blocks);
  if (sent->passed_over_blocks > 0) metrics_.passed_over_blocks.Increment(sent->passed_over_blocks);
  if (sent->split) metrics_.split.Increment();
  if (sent->pulled_blocks > 0) {
    metrics_.pulls.Increment();
    metrics_.pulled_blocks.Increment(sent->pulled_blocks);
    if (sent->pull_computing) metrics_.pulls_of_computing.Increment();
  }
  metrics_.predicted.Increment(sent->predicted_cached_tokens);
  const TtftCoefficients k = router_->calibration().coefficients();
  metrics_.coefficient_queue.Set(k.queue);
  metrics_.coefficient_own.Set(k.own);
  metrics_.coefficient_step.Set(k.step);
  metrics_.pull_bias.Set(router_->calibration().pull_bias_s());
  const TtftCoefficients p = router_->prefill_calibration().coefficients();
  metrics_.prefill_coefficient_queue.Set(p.queue);
  metrics_.prefill_coefficient_own.Set(p.own);
  metrics_.prefill_coefficient_step.Set(p.step);
}

Api::Api(const ApiOptions& options, Fleet* fleet, Router* router, std::shared_ptr<const TextCodec> codec,
         const Clock* clock, std::shared_ptr<prometheus::Registry> registry)
    : Api(options, fleet, router, ModelCodecs(std::move(codec)), clock, std::move(registry)) {}

Api::Api(const ApiOptions& options, Fleet* fleet, Router* router, ModelCodecs codecs, const Clock* clock,
         std::shared_ptr<prometheus::Registry> registry)
    : impl_(std::make_shared<ApiImpl>(options, fleet, router, std::move(codecs), clock, std::move(registry))) {}

Api::~Api() = default;

void Api::AddRoutes(http::Routes* routes) { impl_->AddRoutes(routes); }
void Api::ForgetWorker(const std::string& worker) { impl_->ForgetWorker(worker); }

}  // namespace kvfleet::router
