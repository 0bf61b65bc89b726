// The OpenAI API's request path, one class (ApiImpl) with its per-request stream: parse,
// tokenize, route, forward through the HTTP thread's lane, stream or collect the answer,
// map every failure to an OpenAI error. It is over 600 lines because those parts share
// ApiImpl's private state (fleet, codecs, router, metrics, lanes); parsing, the codecs and
// routing already live in openai.cc, codec.cc and router/routing, the metrics in
// api_metrics.h and /tokenize, /detokenize and /version in tokenize_api.h. The error helpers
// are the next piece to move out if it grows.
#include "router/http/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <prometheus/registry.h>

#include "common/check.h"
#include "common/http/metrics.h"
#include "common/log.h"
#include "common/tokenizer_files.h"
#include "router/fleet/lane.h"
#include "router/http/api_metrics.h"
#include "router/http/lora_api.h"
#include "router/http/tokenize_api.h"

namespace kvfleet::router {

using nlohmann::json;

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

http::Response JsonResponse(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

http::Response ErrorResponse(const ApiError& e) {
  http::Response r = JsonResponse(e.status, e.ToJson());
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

ApiError MakeError(int status, std::string message, std::string type, std::string code = "", int retry_after = 0) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.retry_after_s = retry_after;
  return e;
}

// Retry-After is whole seconds (RFC 9110): a predicted wait rounded up, at least 1.
int RetryAfterSeconds(double seconds) {
  return static_cast<int>(std::min(std::ceil(std::max(seconds, 1.0)), 3600.0));
}

// A chat the codec could not render. A missing or broken template is the operator's to fix,
// so it is a 500 naming the fix; a template's raise_exception on these messages is a 400.
ApiError ChatError(const std::string& model, const Status& s) {
  constexpr std::string_view kFix =
      ": start the router with --chat-template FILE, or put chat_template.jinja in the model directory";
  switch (s.code()) {
    case StatusCode::kFailedPrecondition:
      return MakeError(500, "model '" + model + "' cannot serve chats: " + s.message() + std::string(kFix),
                       "server_error", "chat_template_missing");
    case StatusCode::kUnimplemented:
      return MakeError(500, "model '" + model + "' cannot serve chats: " + s.message() + std::string(kFix),
                       "server_error", "chat_template_invalid");
    default: return BadRequest(s.message(), "messages");
  }
}

// Compares without an early exit, so the time taken says nothing about the key.
bool SameKey(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

std::string LoraIdHex(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

int64_t UnixSeconds(const Clock* clock) { return clock->WallNs() / kNsPerSec; }

double Seconds(DurationNs d) { return static_cast<double>(d) / kNsPerSec; }

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

}  // namespace

class ApiImpl : public std::enable_shared_from_this<ApiImpl> {
 public:
  ApiImpl(const ApiOptions& options, Fleet* fleet, Router* router, ModelCodecs codecs, const Clock* clock,
          std::shared_ptr<prometheus::Registry> registry)
      : options_(options),
        fleet_(fleet),
        router_(router),
        codecs_(std::move(codecs)),
        clock_(clock),
        started_(clock->Now()),
        registry_(std::move(registry)),
        metrics_(*registry_),
        lora_api_(fleet, *registry_, options.lora_control_timeout),
        id_rng_(std::random_device{}()) {
    options_.limits.fields.on_unknown = [this](std::string_view name) { OnUnknownField(name); };
  }

  // An unknown field admitted by --allow-unknown-fields: counted, and logged once per name
  // (the first config::kMaxLoggedUnknownFields names; a client could send endless ones).
  void OnUnknownField(std::string_view name) {
    metrics_.unknown_fields.Increment();
    std::lock_guard<std::mutex> lock(unknown_mu_);
    if (unknown_logged_.size() >= kMaxLoggedUnknownFields) return;
    if (unknown_logged_.emplace(name).second) {
      Logger("router")->debug("admitting unknown request field '{}' (--allow-unknown-fields)", name);
    }
  }

  void AddRoutes(http::Routes* routes) {
    std::weak_ptr<ApiImpl> weak = shared_from_this();
    routes->SetErrorFormatter([](int status, std::string_view message) {
      std::string type = status >= 500 ? "server_error" : "invalid_request_error";
      return ErrorResponse(MakeError(status, std::string(message), type));
    });
    auto self = shared_from_this();
    routes->Add("POST", "/v1/completions", [self](std::shared_ptr<http::Exchange> ex) { self->Complete(ex, false); });
    routes->Add("POST", "/v1/chat/completions",
                [self](std::shared_ptr<http::Exchange> ex) { self->Complete(ex, true); });
    for (const bool load : {true, false}) {
      routes->Add("POST", load ? "/v1/load_lora_adapter" : "/v1/unload_lora_adapter",
                  [self, load](std::shared_ptr<http::Exchange> ex) {
                    if (auto e = self->Authorize(ex->request())) return ex->Reply(ErrorResponse(*e));
                    Lane* lane = self->LaneOf(ex->io_thread());
                    self->lora_api_.Handle(std::move(ex), lane, load);
                  });
    }
    routes->AddSync("GET", "/v1/models", [self](const http::Request& req) { return self->Models(req); });
    routes->AddSync("GET", "/health", [](const http::Request&) { return JsonResponse(200, R"({"status":"ok"})"); });
    routes->AddSync("GET", "/ready", [self](const http::Request&) {
      bool ready = self->fleet_->Ready();
      return JsonResponse(ready ? 200 : 503, ready ? R"({"status":"ready"})" : R"({"status":"no live worker"})");
    });
    routes->AddSync("GET", "/fleet", [self](const http::Request& req) {
      if (auto e = self->Authorize(req)) return ErrorResponse(*e);
      return self->FleetJson();
    });
    routes->AddSync("POST", "/tokenize", [self](const http::Request& req) {
      if (auto e = self->Authorize(req)) return ErrorResponse(*e);
      return Answer(Tokenize(req.body, self->TokenizerLookup(), self->options_.limits.fields));
    });
    routes->AddSync("POST", "/detokenize", [self](const http::Request& req) {
      if (auto e = self->Authorize(req)) return ErrorResponse(*e);
      return Answer(Detokenize(req.body, self->TokenizerLookup(), self->options_.limits.fields));
    });
    routes->AddSync("GET", "/version", [](const http::Request&) { return JsonResponse(200, VersionJson()); });
    http::AddMetricsRoute(*routes, registry_);
    // Each I/O thread's lane exists before its first request: that request does not wait
    // for the lane's connections to the workers.
    routes->OnThreadStart([self](http::IoThread* thread) { self->LaneOf(thread); });
  }

  // --- handlers ---

  static http::Response Answer(const TokenizeAnswer& a) {
    return a.error ? ErrorResponse(*a.error) : JsonResponse(200, a.body);
  }

  // /tokenize and /detokenize serve the models the fleet knows, with their codecs.
  TokenizerModelLookup TokenizerLookup() const {
    return [this](const std::string& name) -> std::optional<TokenizerModel> {
      std::string base = name;
      auto model = FindModelOrAdapter(name, &base, nullptr);
      if (!model) return std::nullopt;
      return TokenizerModel{codecs_.For(base).get(), model->max_context};
    };
  }

  // A request's `model`: a model's name, else a LoRA adapter's (as in vLLM), which selects
  // the adapter over its base model. A name that is both is the model (docs/DESIGN.md).
  // *base: the model whose fleet serves it; *lora (may be null): the adapter, or empty.
  std::optional<ModelFleet> FindModelOrAdapter(const std::string& name, std::string* base, std::string* lora) const {
    *base = name;
    if (lora != nullptr) lora->clear();
    if (auto model = fleet_->FindModel(name)) return model;
    auto adapter = fleet_->FindAdapter(name, base);
    if (adapter && lora != nullptr) *lora = name;
    return adapter;
  }

  std::optional<ApiError> Authorize(const http::Request& req) const {
    if (options_.api_keys.empty()) return std::nullopt;
    std::string_view auth = req.Header("authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() > kBearer.size() && auth.substr(0, kBearer.size()) == kBearer) {
      std::string_view key = auth.substr(kBearer.size());
      for (const auto& k : options_.api_keys) {
        if (SameKey(key, k)) return std::nullopt;
      }
    }
    return MakeError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key");
  }

  http::Response Models(const http::Request& req) {
    if (auto e = Authorize(req)) return ErrorResponse(*e);
    json data = json::array();
    const std::vector<std::string> models = fleet_->LiveModels();
    for (const auto& m : models) {
      data.push_back({{"id", m}, {"object", "model"}, {"created", 0}, {"owned_by", "kvfleet"}, {"root", m},
                      {"parent", nullptr}});
    }
    // Each adapter a routable worker serves, as vLLM lists them: parent the base model, root
    // the adapter's base_model_name_or_path (else the base model). A name that is also a
    // model is the model's (FindModelOrAdapter), so it is not listed twice.
    std::map<std::string, std::pair<std::string, std::string>> adapters;  // name -> (parent, root)
    for (const WorkerStatus& w : fleet_->Workers()) {
      if (!w.routable) continue;
      for (const LoraAnnounce& l : w.info.loras) {
        if (std::find(models.begin(), models.end(), l.name) != models.end()) continue;
        adapters.emplace(l.name, std::make_pair(w.info.model, l.base_model.empty() ? w.info.model : l.base_model));
      }
    }
    for (const auto& [name, parent_root] : adapters) {
      data.push_back({{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "kvfleet"},
                      {"root", parent_root.second}, {"parent", parent_root.first}});
    }
    return JsonResponse(200, json{{"object", "list"}, {"data", data}}.dump());
  }

  // A worker's LoRA adapters (its Hello's, with run-time loads and unloads since), and which
  // its last load report says are on the device. lora_id as 16 hex digits (`kvfleet events`'
  // form): JSON numbers above 2^53 lose digits in JavaScript clients.
  static json LorasJson(const WorkerStatus& w) {
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
  static json KvPoolsJson(const WorkerHello& info) {
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

  http::Response FleetJson() {
    json workers = json::array();
    for (const auto& w : fleet_->Workers()) {
      json j = {{"id", w.id},
                {"name", w.info.name},
                {"model", w.info.model},
                {"block_size", w.info.block_size},
                {"kv_block_size", w.info.kv_block_size == 0 ? w.info.block_size : w.info.kv_block_size},
                {"max_context", w.info.max_context},
                {"backend", w.info.backend},
                {"epoch", w.info.epoch},
                {"tokenizer_digest", w.info.tokenizer_digest == 0 ? json(nullptr) : json(DigestHex(w.info.tokenizer_digest))},
                {"kv_pools", KvPoolsJson(w.info)},
                {"indexed_window", options_.routing_window_size.value_or(IndexedWindow(w.info))},
                {"loras", LorasJson(w)},
                {"max_loras", w.info.max_loras},
                {"lora_load_us", w.info.lora_load_us},
                {"tensor_parallel", w.info.tensor_parallel},
                {"endpoints",
                 {{"requests", w.info.requests_endpoint},
                  {"events", w.info.events_endpoint},
                  {"replay", w.info.replay_endpoint},
                  {"http", w.info.http_endpoint}}},
                {"connected", w.connected},
                {"said_bye", w.said_bye},
                {"state", WorkerStateName(w.state)},
                {"routable", w.routable},
                {"router_inflight_requests", w.inflight_requests},
                {"router_inflight_prefill_tokens", w.inflight_prefill_tokens}};
      if (w.load) {
        // Numbers as the router weighs them (double).
        j["load"] = {{"active_requests", static_cast<double>(w.load->active_requests)},
                     {"queued_requests", static_cast<double>(w.load->queued_requests)},
                     {"active_prefill_tokens", static_cast<double>(w.load->active_prefill_tokens)},
                     {"prefill_tokens_per_second", static_cast<double>(w.load->prefill_tokens_per_second)},
                     {"report_age_seconds", Seconds(clock_->Now() - w.load->received_at)}};
      } else {
        j["load"] = nullptr;
      }
      workers.push_back(std::move(j));
    }
    json refused = json::array();
    for (const auto& r : fleet_->Refused()) {
      refused.push_back({{"name", r.info.name},
                         {"model", r.info.model},
                         {"backend", r.info.backend},
                         {"requests", r.info.requests_endpoint},
                         {"reason", r.reason},
                         {"refused", r.why}});
    }
    return JsonResponse(200, json{{"workers", workers}, {"refused", refused}, {"ready", fleet_->Ready()}}.dump(2));
  }

  void Fail(const std::shared_ptr<http::Exchange>& ex, const std::string& model, const ApiError& e) {
    metrics_.requests.Add({{"model", model}, {"worker", "none"}, {"status", std::to_string(e.status)}}).Increment();
    ex->Reply(ErrorResponse(e));
  }
  // A request refused for load, answered at once and counted by reason.
  void Refuse(const std::shared_ptr<http::Exchange>& ex, const std::string& model, std::string_view reason,
              const ApiError& e) {
    metrics_.refused.Add({{"model", model}, {"reason", std::string(reason)}}).Increment();
    Fail(ex, model, e);
  }

  void Complete(std::shared_ptr<http::Exchange> ex, bool chat);

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

  ApiOptions options_;
  Fleet* fleet_;
  Router* router_;
  const ModelCodecs codecs_;  // each model's tokenizer
  const Clock* clock_;
  const TimeNs started_;  // for options_.unknown_model_grace
  std::shared_ptr<prometheus::Registry> registry_;
  ApiMetrics metrics_;
  LoraApi lora_api_;  // /v1/load_lora_adapter, /v1/unload_lora_adapter
  std::mutex id_mu_;
  std::mt19937_64 id_rng_;  // GUARDED_BY(id_mu_)
  static constexpr size_t kMaxLoggedUnknownFields = 1024;
  std::mutex unknown_mu_;
  std::unordered_set<std::string> unknown_logged_;  // GUARDED_BY(unknown_mu_)
};

// One request's answer, fed by its lane: on the HTTP I/O thread that read the request.
class RequestStream final : public ResponseSink {
 private:
  // One per choice (the worker's sequence of that index): its own detokenizer and stop strings.
  struct Choice {
    Choice(std::unique_ptr<StreamDecoder> d, StopMatcher s) : decoder(std::move(d)), stops(std::move(s)) {}
    std::unique_ptr<StreamDecoder> decoder;
    StopMatcher stops;
    std::string text;     // not streamed: the answer so far
    std::string finish;   // empty: still generating
    bool first_chunk = true;
    bool echoed = false;       // echo: the prompt went out ahead of this choice's text
    ChoiceLogprobs logprobs;   // not streamed: the whole choice's
    size_t text_offset = 0;    // the choice's text so far, in token texts (completions' text_offset)
  };

 public:
  RequestStream(std::shared_ptr<ApiImpl> api, std::shared_ptr<http::Exchange> ex, CompletionRequest req,
                std::shared_ptr<const TextCodec> codec, std::string id, TimeNs arrived, TimeNs routed,
                uint32_t prompt_tokens)
      : api_(std::move(api)),
        codec_(std::move(codec)),
        ex_(std::move(ex)),
        req_(std::move(req)),
        id_(std::move(id)),
        created_(UnixSeconds(api_->clock_)),
        arrived_(arrived),
        last_(arrived),
        prompt_tokens_(prompt_tokens) {
    timings_.read = arrived;
    timings_.routed = routed;
    for (uint32_t i = 0; i < req_.n; ++i) choices_.emplace_back(codec_->NewDecoder(), StopMatcher(req_.stop));
  }

  // The lane forwarding this request, and its handle there (for a stop string's cancel).
  void set_lane(Lane* lane, uint64_t handle) {
    lane_ = lane;
    handle_ = handle;
  }
  // The request was handed to its worker's socket.
  void MarkSent(TimeNs now) {
    timings_.sent = now;
    if (last_sent_ == 0) last_sent_ = now;
  }
  // Retry-After of a 429 that comes back from the workers (every one tried refused it, its
  // queue full): the predicted time to first token where it was routed.
  void set_retry_after(int seconds) { retry_after_s_ = seconds; }

  // echo: the prompt's text and ids, sent ahead of the first generated text. A request with
  // max_tokens 0 asks the worker for one token (a prefill samples one) and drops it.
  void set_echo(std::string text, std::vector<TokenId> prompt, bool drop_generated) {
    echo_text_ = std::move(text);
    echo_prompt_ = std::move(prompt);
    drop_generated_ = drop_generated;
  }

  void OnDelta(WorkerId worker, const WorkerDelta& d) override {
    if (done_) return;
    if (d.index >= choices_.size()) {
      // A worker that answers for a sequence the request did not ask for is broken.
      lane_->Cancel(handle_);
      return OnError(worker, Internal("worker " + api_->fleet_->WorkerName(worker) + " sent sequence " +
                                      std::to_string(d.index) + " of a request of n=" + std::to_string(req_.n)),
                     started_);
    }
    Choice& c = choices_[d.index];
    if (!c.finish.empty()) return;  // a stop string ended this choice; the worker goes on with the rest
    TimeNs now = api_->clock_->Now();
    // The echoed prompt (and its logprobs) goes first in every choice, outside the stop
    // strings. The worker sends the prompt's logprobs once, in its first Delta (sequence 0's,
    // which comes before the others: they fork from it).
    if (!d.prompt_logprobs.empty() && prompt_logprobs_.empty() && !echo_prompt_.empty()) {
      prompt_logprobs_.push_back(LogprobEntry{TokenText(echo_prompt_[0]), std::nullopt, {}});
      AppendLogprobEntries(d.prompt_logprobs, [this](TokenId t) { return TokenText(t); }, &prompt_logprobs_);
    }
    std::string echo;
    ChoiceLogprobs chunk_lp;
    chunk_lp.text_offset = c.text_offset;
    if (req_.echo && !c.echoed) {
      c.echoed = true;
      echo = echo_text_;
      if (req_.logprobs >= 0) chunk_lp.entries = prompt_logprobs_;
    }
    if (drop_generated_) {
      WorkerDelta none = d;
      none.tokens.clear();
      if (none.finish != FinishReason::kNone || !echo.empty()) EmitDelta(worker, none, c, echo, &chunk_lp, now);
      return;
    }
    if (req_.logprobs >= 0) {
      AppendLogprobEntries(d.logprobs, [this](TokenId t) { return TokenText(t); }, &chunk_lp.entries);
    }
    EmitDelta(worker, d, c, echo, &chunk_lp, now);
  }

 private:
  // A token's text alone, for logprobs.
  std::string TokenText(TokenId t) const {
    auto decoder = codec_->NewDecoder();
    std::string s = decoder->Push(t);
    return s + decoder->Finish();
  }

  void EmitDelta(WorkerId worker, const WorkerDelta& d, Choice& c, const std::string& echo, ChoiceLogprobs* lp,
                 TimeNs now) {
    if (!first_ && !d.tokens.empty()) {
      first_ = true;
      timings_.first_delta = now;
      api_->metrics_.ttft.Observe(Seconds(now - arrived_));
      api_->metrics_.queue_time.Observe(Seconds((last_sent_ > 0 ? last_sent_ : now) - arrived_));
    } else if (!d.tokens.empty() && d.index == 0) {
      // Choice 0's gaps: the n choices' deltas of one step arrive together.
      api_->metrics_.itl.Observe(Seconds(now - last_) / static_cast<double>(d.tokens.size()));
    }
    if (d.index == 0) last_ = now;
    std::string text;
    for (TokenId t : d.tokens) {
      ++completion_tokens_;
      text += c.decoder->Push(t);
    }
    if (d.finish != FinishReason::kNone) text += c.decoder->Finish();
    bool stopped = false;
    std::string out = echo + c.stops.Push(text, &stopped);
    for (const LogprobEntry& e : lp->entries) c.text_offset += e.token.size();
    const bool with_lp = req_.logprobs >= 0;
    usage_.prompt_tokens = d.usage.prompt_tokens > 0 ? d.usage.prompt_tokens : prompt_tokens_;
    usage_.cached_tokens = d.usage.cached_device_tokens + d.usage.cached_host_tokens;
    usage_.completion_tokens = completion_tokens_;  // summed over the choices
    if (stopped) {
      c.finish = "stop";
    } else if (d.finish != FinishReason::kNone) {
      out += c.stops.Flush();
      c.finish = std::string(FinishReasonText(d.finish));
    }
    const bool all_done = !c.finish.empty() && ++finished_choices_ == choices_.size();
    if (all_done) {
      usage_.worker = api_->fleet_->WorkerName(worker);
      usage_.worker_ttft_ms = static_cast<double>(d.usage.time_to_first_token_us) / 1000.0;
      if (api_->options_.report_timings) usage_.timings = timings_;
      // A choice a stop string ended may still run on the worker: it need not go on. (The
      // lane forgot the flight already when the worker ended every sequence itself.)
      lane_->Cancel(handle_);
    }
    if (req_.stream) {
      if (!started_) {
        started_ = true;
        ex_->StartStream(200, "text/event-stream", {{std::string(kWorkerHeader), api_->fleet_->WorkerName(worker)}});
      }
      if (!out.empty() || (c.first_chunk && req_.chat) || !lp->entries.empty()) {
        ex_->Write(FormatChunk(req_, id_, created_, out, "", c.first_chunk, d.index, with_lp ? lp : nullptr));
        if (timings_.first_chunk == 0 && !out.empty()) timings_.first_chunk = api_->clock_->Now();
        c.first_chunk = false;
      }
      // Each choice's finish in its own chunk, as OpenAI streams it.
      if (!c.finish.empty()) ex_->Write(FormatChunk(req_, id_, created_, "", c.finish, false, d.index));
    } else {
      c.text += out;
      if (with_lp) {
        for (LogprobEntry& e : lp->entries) c.logprobs.entries.push_back(std::move(e));
      }
    }
    if (all_done) End(worker);
  }

 public:

  void OnError(WorkerId worker, const Status& status, bool after_first_token) override {
    if (done_) return;
    done_ = true;
    ApiError e = ToApiError(status);
    api_->metrics_.duration.Observe(Seconds(api_->clock_->Now() - arrived_));
    if (first_) api_->metrics_.CountTokens(req_.model, usage_.prompt_tokens, completion_tokens_);
    if (status.code() == StatusCode::kResourceExhausted) {
      api_->metrics_.refused.Add({{"model", req_.model}, {"reason", "worker_queue_full"}}).Increment();
    }
    api_->metrics_.requests
        .Add({{"model", req_.model}, {"worker", api_->fleet_->WorkerName(worker)}, {"status", std::to_string(e.status)}})
        .Increment();
    if (started_) {
      // Tokens already went out: the stream ends with an error event.
      ex_->Write(FormatStreamError(e));
      ex_->Write(kDoneEvent);
      ex_->Finish();
      return;
    }
    http::Response r = ErrorResponse(e);
    r.headers.emplace_back(kWorkerHeader, api_->fleet_->WorkerName(worker));
    ex_->Reply(std::move(r));
  }

  // The lane sends the request again, to `to`, right after this.
  void OnRetry(WorkerId from, WorkerId to) override { last_sent_ = api_->clock_->Now(); }

 private:
  ApiError ToApiError(const Status& s) const {
    int retry = api_->options_.retry_after_s;
    switch (s.code()) {
      case StatusCode::kInvalidArgument: return MakeError(400, s.message(), "invalid_request_error");
      case StatusCode::kOutOfRange:
        return MakeError(400, s.message(), "invalid_request_error", "context_length_exceeded");
      case StatusCode::kNotFound: return MakeError(404, s.message(), "invalid_request_error", "model_not_found");
      case StatusCode::kResourceExhausted:
        return MakeError(429, s.message(), "rate_limit_error", "overloaded", retry_after_s_);
      case StatusCode::kUnavailable: return MakeError(503, s.message(), "server_error", "service_unavailable", retry);
      case StatusCode::kDeadlineExceeded: return MakeError(504, s.message(), "server_error", "timeout");
      default: return MakeError(500, s.message(), "server_error");
    }
  }

  void End(WorkerId worker) {
    done_ = true;
    api_->metrics_.actual.Increment(usage_.cached_tokens);
    api_->metrics_.CountTokens(req_.model, usage_.prompt_tokens, usage_.completion_tokens);
    api_->metrics_.requests
        .Add({{"model", req_.model}, {"worker", api_->fleet_->WorkerName(worker)}, {"status", "200"}})
        .Increment();
    if (req_.stream) {
      if (req_.include_usage) ex_->Write(FormatUsageChunk(req_, id_, created_, usage_));
      ex_->Write(kDoneEvent);
      ex_->Finish();
    } else {
      http::Response r;
      r.headers.emplace_back(kWorkerHeader, usage_.worker);
      std::vector<ChoiceText> choices;
      for (Choice& c : choices_) {
        choices.push_back(ChoiceText{std::move(c.text), c.finish, req_.logprobs >= 0 ? &c.logprobs : nullptr});
      }
      r.body = FormatCompletion(req_, id_, created_, choices, usage_);
      ex_->Reply(std::move(r));
    }
    api_->metrics_.duration.Observe(Seconds(api_->clock_->Now() - arrived_));
  }

  std::shared_ptr<ApiImpl> api_;
  std::shared_ptr<const TextCodec> codec_;  // the base model's
  std::shared_ptr<http::Exchange> ex_;
  CompletionRequest req_;
  std::string id_;
  int64_t created_;
  TimeNs arrived_;
  TimeNs last_;
  uint32_t prompt_tokens_;
  std::vector<Choice> choices_;
  size_t finished_choices_ = 0;
  Lane* lane_ = nullptr;
  uint64_t handle_ = 0;
  int retry_after_s_ = 1;
  // The lane's thread only.
  bool first_ = false;
  bool started_ = false;
  bool done_ = false;
  uint32_t completion_tokens_ = 0;
  RouterTimings timings_;
  TimeNs last_sent_ = 0;  // the latest send, a retry's included (queue time)
  UsageCounts usage_;
  // Echo (the same prompt ahead of every choice) and its logprobs.
  std::string echo_text_;
  std::vector<TokenId> echo_prompt_;
  std::vector<LogprobEntry> prompt_logprobs_;  // the prompt's entries, from the worker's first Delta
  bool drop_generated_ = false;
};

void ApiImpl::Complete(std::shared_ptr<http::Exchange> ex, bool chat) {
  TimeNs arrived = clock_->Now();
  const http::Request& http_req = ex->request();
  if (auto e = Authorize(http_req)) return Fail(ex, "", *e);
  auto parsed = ParseCompletionRequest(http_req.body, chat, options_.limits);
  if (!parsed.ok()) return Fail(ex, "", ErrorFromStatus(parsed.status()));
  CompletionRequest req = std::move(parsed).value();

  std::string base, lora;  // the model whose fleet serves it; the adapter it selects (empty: none)
  auto model = FindModelOrAdapter(req.model, &base, &lora);
  if (!model && fleet_->LiveModels().empty()) {
    // Nothing is routable at all (a router that just started, before workers register, or a
    // fleet that is down): the model may well exist, so this is "try again", not 404.
    return Refuse(ex, req.model, "no_worker",
                  MakeError(503, "no live worker yet: cannot tell whether model '" + req.model + "' exists",
                            "server_error", "service_unavailable", options_.retry_after_s));
  }
  if (!model && arrived - started_ < options_.unknown_model_grace) {
    // A router that started moments ago may not have heard from this model's workers yet.
    char since[32];
    std::snprintf(since, sizeof(since), "%.1f", Seconds(arrived - started_));
    return Fail(ex, req.model,
                MakeError(503,
                          "model '" + req.model + "' is not known yet: this router started " + since +
                              " s ago and its workers are still registering",
                          "server_error", "service_unavailable", options_.retry_after_s));
  }
  if (!model) {
    return Fail(ex, req.model,
                MakeError(404,
                          "The model '" + req.model +
                              "' does not exist: no worker serves a model or a LoRA adapter of that name.",
                          "invalid_request_error", "model_not_found"));
  }
  if (model->routable.empty()) {
    return Refuse(ex, req.model, "no_worker",
                  MakeError(503,
                            lora.empty() ? "no live worker serves model '" + req.model + "'"
                                         : "no live worker serves LoRA adapter '" + lora + "' of model '" + base + "'",
                            "server_error", "service_unavailable", options_.retry_after_s));
  }
  // Tokenize with the (base) model's codec. Byte ids sent to a real model are garbage in,
  // garbage out: refuse instead.
  const std::shared_ptr<const TextCodec>& codec_ptr = codecs_.For(base);
  const TextCodec& codec = *codec_ptr;
  if (codec.is_byte_codec() && model->needs_tokenizer && (chat || req.prompt_text)) {
    return Fail(ex, req.model,
                MakeError(500,
                          "model '" + base +
                              "' runs on cpu/cuda workers, but this router has no tokenizer and cannot turn text "
                              "into its token ids: start the router with --tokenizer MODEL_DIR (or --tokenizer " +
                              base + "=MODEL_DIR; or send the prompt as token ids)",
                          "server_error", "tokenizer_missing"));
  }
  GenerateParams params;
  if (chat) {
    auto t = codec.EncodeChat(req.messages_json, req.chat_template);
    if (!t.ok()) return Fail(ex, req.model, ChatError(req.model, t.status()));
    params.tokens = std::move(t).value();
  } else if (req.prompt_text) {
    auto t = codec.EncodePrompt(*req.prompt_text);
    if (!t.ok()) return Fail(ex, req.model, BadRequest(t.status().message(), "prompt"));
    params.tokens = std::move(t).value();
  } else {
    params.tokens = std::move(req.prompt_tokens);
  }
  if (params.tokens.empty()) return Fail(ex, req.model, BadRequest("the prompt is empty", "prompt"));
  const uint32_t prompt_tokens = static_cast<uint32_t>(params.tokens.size());
  uint32_t context = model->max_context;
  uint32_t max_tokens = req.max_tokens.value_or(chat ? options_.default_chat_max_tokens : options_.default_max_tokens);
  if (context > 0 && !req.max_tokens && chat && prompt_tokens < context) {
    max_tokens = std::min(max_tokens, context - prompt_tokens);
  }
  if (context > 0 && uint64_t{prompt_tokens} + max_tokens > context) {
    return Fail(ex, req.model,
                MakeError(400,
                          "This model's maximum context length is " + std::to_string(context) +
                              " tokens. However, you requested " +
                              std::to_string(uint64_t{prompt_tokens} + max_tokens) + " tokens (" +
                              std::to_string(prompt_tokens) + " in the prompt, " + std::to_string(max_tokens) +
                              " for the completion).",
                          "invalid_request_error", "context_length_exceeded"));
  }
  params.sampling.temperature = req.temperature;
  params.sampling.top_p = req.top_p;
  params.sampling.top_k = req.top_k;
  params.sampling.seed = req.seed;
  params.sampling.max_tokens = max_tokens;
  params.sampling.ignore_eos = req.ignore_eos;
  params.sampling.stop_token_ids = std::move(req.stop_token_ids);
  params.sampling.n = req.n;
  params.sampling.presence_penalty = req.presence_penalty;
  params.sampling.frequency_penalty = req.frequency_penalty;
  params.sampling.repetition_penalty = req.repetition_penalty;
  params.sampling.min_p = req.min_p;
  params.sampling.logit_bias = req.logit_bias;
  params.sampling.logprobs = req.logprobs;
  params.sampling.prompt_logprobs = req.echo && req.logprobs >= 0;
  // max_tokens 0 (echo only): the worker samples one token after the prompt; it is dropped.
  const bool drop_generated = req.echo && max_tokens == 0;
  if (drop_generated) params.sampling.max_tokens = 1;
  const bool echo = req.echo;
  std::string echo_text;
  std::vector<TokenId> echo_prompt;
  if (echo) {
    if (req.prompt_text) {
      echo_text = *req.prompt_text;
    } else {
      auto decoder = codec.NewDecoder();
      for (TokenId t : params.tokens) echo_text += decoder->Push(t);
      echo_text += decoder->Finish();
    }
    if (req.logprobs >= 0) echo_prompt = params.tokens;
  }
  params.retention = req.retention;
  params.cache_salt = req.cache_salt;
  params.model = base;
  params.lora = lora;

  // Route.
  Prompt prompt{base, params.tokens, req.cache_salt, req.routing.value_or(router_->options().policy)};
  prompt.lora = params.lora;
  Refusal refusal;
  auto decision = router_->Route(*model, prompt, &refusal);
  if (!decision.ok()) {
    // Refused now, not after a wait (router/routing/README.md, "Admission"): 429 when a
    // retry may be admitted later, with Retry-After from the predicted wait; 503 when no
    // worker could serve it in time even idle.
    const bool later = decision.status().code() == StatusCode::kResourceExhausted;
    return Refuse(ex, req.model, refusal.reason,
                  later ? MakeError(429, decision.status().message(), "rate_limit_error", "overloaded",
                                    RetryAfterSeconds(refusal.retry_after_s))
                        : MakeError(503, decision.status().message(), "server_error", "service_unavailable"));
  }

  std::string id;
  {
    std::lock_guard<std::mutex> lock(id_mu_);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%016llx", chat ? "chatcmpl-" : "cmpl-",
                  static_cast<unsigned long long>(id_rng_()));
    id = buf;
  }
  const TimeNs routed = clock_->Now();
  metrics_.routing.Observe(Seconds(routed - arrived));  // parse, tokenize, hash, route
  auto stream = std::make_shared<RequestStream>(shared_from_this(), ex, std::move(req), codec_ptr, std::move(id), arrived,
                                                routed, prompt_tokens);
  ForwardRequest fwd;
  fwd.worker = decision->worker;
  fwd.params = std::move(params);
  fwd.prefill_tokens = prompt_tokens - decision->predicted_cached_tokens;
  fwd.sink = stream;
  fwd.reroute = router_->Rerouter(*decision);
  // Forwarded from this I/O thread, whose lane also reads the answer and feeds the stream:
  // no other thread wakes on the request path. The client-gone callback runs here too.
  Lane* lane = LaneOf(ex->io_thread());
  uint64_t handle = lane->NewHandle();
  stream->set_lane(lane, handle);
  if (echo) stream->set_echo(std::move(echo_text), std::move(echo_prompt), drop_generated);
  stream->set_retry_after(RetryAfterSeconds(decision->estimated_ttft_s));
  lane->Submit(handle, std::move(fwd));
  stream->MarkSent(clock_->Now());
  ex->OnClientGone([lane, handle] { lane->Cancel(handle); });
  // Predicted entries go in once the request is on its way: the worker starts sooner, and
  // the next request this thread routes sees them all the same. (A request routed on
  // another I/O thread meanwhile could miss them either way; the window is tens of µs.)
  router_->Commit(*decision);
  metrics_.matched.Observe(decision->device_blocks + decision->host_blocks);
  metrics_.predicted.Increment(decision->predicted_cached_tokens);
}

Api::Api(const ApiOptions& options, Fleet* fleet, Router* router, std::shared_ptr<const TextCodec> codec,
         const Clock* clock, std::shared_ptr<prometheus::Registry> registry)
    : Api(options, fleet, router, ModelCodecs(std::move(codec)), clock, std::move(registry)) {}

Api::Api(const ApiOptions& options, Fleet* fleet, Router* router, ModelCodecs codecs, const Clock* clock,
         std::shared_ptr<prometheus::Registry> registry)
    : impl_(std::make_shared<ApiImpl>(options, fleet, router, std::move(codecs), clock, std::move(registry))) {}

Api::~Api() = default;

void Api::AddRoutes(http::Routes* routes) { impl_->AddRoutes(routes); }

}  // namespace kvfleet::router
