#include "cli/bench/replay.h"

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>

#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace kvfleet::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);
// Bytes read from the socket per step: a few SSE chunks; small enough that a token's
// arrival is timed when it lands, not when a large buffer fills.
constexpr size_t kReadChunkBytes = 16 * 1024;
// How often the progress line is printed.
constexpr auto kProgressPeriod = std::chrono::seconds(5);

struct Url {
  std::string text;  // as given
  std::string host;
  std::string port = "80";
  std::string base_path;  // without a trailing '/'
};

Result<Url> ParseUrl(const std::string& text) {
  constexpr std::string_view kScheme = "http://";
  if (text.rfind(kScheme, 0) != 0) return InvalidArgument("--router must be an http:// URL, got '" + text + "'");
  std::string rest = text.substr(kScheme.size());
  Url url;
  url.text = text;
  size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    url.base_path = rest.substr(slash);
    rest.resize(slash);
    while (!url.base_path.empty() && url.base_path.back() == '/') url.base_path.pop_back();
  }
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']') == std::string::npos) {
    url.port = rest.substr(colon + 1);
    rest.resize(colon);
  }
  if (rest.size() > 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  if (rest.empty() || url.port.empty()) return InvalidArgument("--router: no host or port in '" + text + "'");
  url.host = rest;
  return url;
}

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The state of one Replay() call; lives on the io_context's single thread.
class Replayer {
 public:
  // One router to send to: its URL and resolved addresses.
  struct Target {
    Url url;
    tcp::resolver::results_type endpoints;
  };

  // REQUIRES: !targets.empty().
  Replayer(asio::io_context& io, const std::vector<ScaledRequest>& requests, const PromptBuilder& prompts,
           const ReplayOptions& options, std::vector<Target> targets)
      : io_(io), requests_(requests), prompts_(prompts), options_(options), targets_(std::move(targets)), run_() {
    run_.outcomes.resize(requests.size());
  }

  ReplayRun Run() {
    start_ = std::chrono::steady_clock::now();
    char run[32];
    std::snprintf(run, sizeof(run), "bench-%llx-", static_cast<unsigned long long>(
                      std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count()));
    for (size_t i = 0; i < run_.outcomes.size(); ++i) run_.outcomes[i].request_id = run + std::to_string(i);
    asio::co_spawn(io_, Schedule(), asio::detached);
    if (options_.progress) asio::co_spawn(io_, Progress(), asio::detached);
    io_.run();
    run_.wall_s = Seconds(last_end_ - start_);
    return std::move(run_);
  }

 private:
  // Starts each request at its arrival time, or queues it behind the concurrency limit.
  asio::awaitable<void> Schedule() {
    asio::steady_timer timer(io_);
    for (size_t i = 0; i < requests_.size(); ++i) {
      auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(requests_[i].arrival_s));
      if (due > std::chrono::steady_clock::now()) {
        timer.expires_at(due);
        co_await timer.async_wait(kAwait);
      }
      run_.outcomes[i].arrival_s = requests_[i].arrival_s;
      if (in_flight_ < options_.concurrency_limit) {
        Launch(i);
      } else {
        waiting_.push_back(i);
      }
    }
  }

  void Launch(size_t i) {
    ++in_flight_;
    run_.outcomes[i].queue_s =
        std::max(0.0, Seconds(std::chrono::steady_clock::now() - start_) - requests_[i].arrival_s);
    asio::co_spawn(io_, Send(i), [this](std::exception_ptr) { OnDone(); });
  }

  void OnDone() {
    --in_flight_;
    ++done_;
    last_end_ = std::chrono::steady_clock::now();
    if (done_ == requests_.size()) progress_timer_.cancel();  // let io_.run() return now
    if (!waiting_.empty()) {
      size_t next = waiting_.front();
      waiting_.pop_front();
      Launch(next);
    }
  }

  asio::awaitable<void> Progress() {
    while (done_ < requests_.size()) {
      progress_timer_.expires_after(kProgressPeriod);
      co_await progress_timer_.async_wait(kAwait);
      if (done_ == requests_.size()) break;
      std::fprintf(stderr, "bench: %.0fs  done %zu/%zu  in flight %u  waiting %zu  errors %zu\n",
                   Seconds(std::chrono::steady_clock::now() - start_), done_, requests_.size(), in_flight_,
                   waiting_.size(), errors_);
    }
  }

  void Fail(RequestOutcome& out, std::string kind, std::string detail) {
    out.ok = false;
    out.error = std::move(kind);
    out.error_detail = std::move(detail);
    ++errors_;
  }

  // One request: connect, POST, read the SSE stream, time every chunk.
  asio::awaitable<void> Send(size_t i) {
    RequestOutcome& out = run_.outcomes[i];
    beast::tcp_stream stream(io_);
    stream.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options_.request_timeout_s)));
    const SteadyTime sent = std::chrono::steady_clock::now();
    out.sent_unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto elapsed = [&] { return Seconds(std::chrono::steady_clock::now() - sent); };
    auto socket_error = [&](const beast::error_code& ec, const char* what) {
      Fail(out, ec == beast::error::timeout ? "timeout" : what, ec.message());
    };

    // Clients spread evenly over the routers: request i goes to router i mod n. A router that
    // refuses the connection (it died) has sent nothing yet: the next one is tried.
    const Target* target = nullptr;
    for (size_t k = 0; k < targets_.size(); ++k) {
      const Target& t = targets_[(i + k) % targets_.size()];
      auto [cec, ep] = co_await stream.async_connect(t.endpoints, kAwait);
      if (!cec) {
        target = &t;
        break;
      }
      if (k + 1 == targets_.size() || cec == beast::error::timeout) co_return socket_error(cec, "connect");
      ++out.connect_retries;
      beast::error_code ignored;
      stream.socket().close(ignored);
    }
    out.router = target->url.text;

    http::request<http::string_body> req{http::verb::post, target->url.base_path + "/v1/completions", 11};
    req.set(http::field::host, target->url.host);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.set("x-request-id", out.request_id);  // the router's decision log names it
    req.body() = CompletionBody(requests_[i], prompts_, options_);
    req.prepare_payload();
    auto [wec, wn] = co_await http::async_write(stream, req, kAwait);
    if (wec) co_return socket_error(wec, "write");

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    auto [hec, hn] = co_await http::async_read_header(stream, buffer, parser, kAwait);
    if (hec) co_return socket_error(hec, "read");
    out.http_status = static_cast<int>(parser.get().result_int());
    if (auto it = parser.get().find(config::kWorkerHeader); it != parser.get().end()) {
      out.worker = std::string(it->value());
    }

    SseChunkParser sse;
    std::vector<SseChunkParser::Event> events;
    std::string error_body;
    char chunk[kReadChunkBytes];
    bool done = false, errored = false;
    double last_token = -1;
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      auto [rec, rn] = co_await http::async_read_some(stream, buffer, parser, kAwait);
      if (rec && rec != http::error::need_buffer) co_return socket_error(rec, "read");
      const size_t got = sizeof(chunk) - parser.get().body().size;
      const std::string_view bytes(chunk, got);
      if (out.http_status != 200) {
        error_body.append(bytes);
        continue;
      }
      const double now = elapsed();
      events.clear();
      sse.Feed(bytes, &events);
      for (const auto& e : events) {
        switch (e.kind) {
          case SseChunkParser::Event::kTokens:
            if (out.ttft_s < 0) {
              out.ttft_s = now;
            } else {
              out.token_gaps_s.push_back(now - last_token);
            }
            last_token = now;
            break;
          case SseChunkParser::Event::kUsage:
            out.has_usage = true;
            out.prompt_tokens = e.prompt_tokens;
            out.completion_tokens = e.completion_tokens;
            out.cached_tokens = e.cached_tokens;
            if (out.worker.empty()) out.worker = e.worker;
            break;
          case SseChunkParser::Event::kDone:
            done = true;
            break;
          case SseChunkParser::Event::kError:
            if (!errored) Fail(out, "stream_error", e.message);
            errored = true;
            break;
          case SseChunkParser::Event::kOther:
            break;
        }
      }
    }
    out.e2e_s = elapsed();
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    if (out.http_status != 200) co_return Fail(out, "http_" + std::to_string(out.http_status), error_body.substr(0, 300));
    if (errored) co_return;
    if (!done) co_return Fail(out, "incomplete", "stream ended without data: [DONE]");
    if (!out.has_usage) co_return Fail(out, "no_usage", "stream carried no usage chunk");
    out.ok = true;
  }

  asio::io_context& io_;
  const std::vector<ScaledRequest>& requests_;
  const PromptBuilder& prompts_;
  const ReplayOptions& options_;
  const std::vector<Target> targets_;
  ReplayRun run_;
  SteadyTime start_{};
  SteadyTime last_end_{};
  asio::steady_timer progress_timer_{io_};
  std::deque<size_t> waiting_;  // arrived, held back by the concurrency limit
  uint32_t in_flight_ = 0;
  size_t done_ = 0;
  size_t errors_ = 0;
};

}  // namespace

Status ReplayOptions::Validate() const {
  if (concurrency_limit == 0) return InvalidArgument("--concurrency-limit must be >= 1");
  if (!(request_timeout_s > 0)) return InvalidArgument("--request-timeout must be > 0");
  KVF_RETURN_IF_ERROR(retention.Validate());
  for (const std::string& url : RouterUrls()) KVF_RETURN_IF_ERROR(ParseUrl(url).status());
  return Status::Ok();
}

std::vector<std::string> ReplayOptions::RouterUrls() const {
  std::vector<std::string> urls;
  size_t start = 0;
  while (start <= router_url.size()) {
    const size_t comma = std::min(router_url.find(',', start), router_url.size());
    urls.push_back(router_url.substr(start, comma - start));
    start = comma + 1;
  }
  return urls;
}

Status RetentionOptions::Validate() const {
  if (priority > 100) return InvalidArgument("--retain-priority must be in [0, 100]");
  return Status::Ok();
}

std::string CompletionBody(const ScaledRequest& request, const PromptBuilder& prompts, const ReplayOptions& options) {
  nlohmann::json body = {
      {"prompt", prompts.Build(request)},
      {"max_tokens", request.output_length},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"ignore_eos", true},
      {"temperature", 0},
  };
  if (!options.model.empty()) body["model"] = options.model;
  if (!options.policy.empty()) body[config::kPolicyField] = options.policy;
  if (!options.cache_salt.empty()) body["cache_salt"] = options.cache_salt;
  if (const RetentionOptions& r = options.retention; r.prefix_tokens > 0) {
    nlohmann::json range = {{"start", 0}, {"end", std::min(r.prefix_tokens, request.input_length)},
                            {"priority", r.priority}};
    if (r.duration_ms > 0) range["duration_ms"] = r.duration_ms;
    body["kv_retention"] = {{"token_ranges", nlohmann::json::array({range})}};
  }
  return body.dump();
}

void SseChunkParser::Feed(std::string_view bytes, std::vector<Event>* out) {
  pending_.append(bytes);
  size_t start = 0;
  while (true) {
    // Events end with a blank line; accept LF and CRLF line ends.
    size_t lf = pending_.find("\n\n", start);
    size_t crlf = pending_.find("\r\n\r\n", start);
    size_t end = std::min(lf, crlf);
    if (end == std::string::npos) break;
    size_t sep = (end == crlf && crlf <= lf) ? 4 : 2;
    ParseEvent(std::string_view(pending_).substr(start, end - start), out);
    start = end + sep;
  }
  pending_.erase(0, start);
}

void SseChunkParser::ParseEvent(std::string_view block, std::vector<Event>* out) {
  std::string data;
  while (!block.empty()) {
    size_t nl = block.find('\n');
    std::string_view line = block.substr(0, nl);
    block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.rfind("data:", 0) != 0) continue;  // comments, event:, id:
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!data.empty()) data += '\n';
    data.append(line);
  }
  if (data.empty()) return;
  if (data == "[DONE]") {
    out->push_back(Event{Event::kDone, 0, 0, 0, {}, {}});
    return;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    out->push_back({Event::kError, 0, 0, 0, "unparsable stream chunk: " + data.substr(0, 200), {}});
    return;
  }
  if (auto err = j.find("error"); err != j.end() && !err->is_null()) {
    std::string message = err->is_object() && err->contains("message") && (*err)["message"].is_string()
                              ? (*err)["message"].get<std::string>()
                              : err->dump();
    out->push_back({Event::kError, 0, 0, 0, message, {}});
    return;
  }
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array() && !choices->empty()) {
    const nlohmann::json& c = (*choices)[0];
    bool has_text = c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty();
    bool final_chunk = c.contains("finish_reason") && !c["finish_reason"].is_null();
    // A chunk with tokens carries text, or is a non-final chunk whose text is held back
    // (a token that ends inside a multi-byte character).
    if (has_text || !final_chunk) out->push_back(Event{Event::kTokens, 0, 0, 0, {}, {}});
  }
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    Event e{Event::kUsage, 0, 0, 0, {}, {}};
    e.prompt_tokens = usage->value("prompt_tokens", 0u);
    e.completion_tokens = usage->value("completion_tokens", 0u);
    if (auto d = usage->find("prompt_tokens_details"); d != usage->end() && d->is_object()) {
      e.cached_tokens = d->value("cached_tokens", 0u);
    }
    // The router's extension beside usage names the worker that served the request.
    if (auto k = j.find("kvfleet"); k != j.end() && k->is_object()) {
      if (auto w = k->find("worker"); w != k->end() && w->is_string()) e.worker = w->get<std::string>();
    }
    out->push_back(e);
  }
}

Result<ReplayRun> Replay(const std::vector<ScaledRequest>& requests, const PromptBuilder& prompts,
                         const ReplayOptions& options) {
  KVF_RETURN_IF_ERROR(options.Validate());
  asio::io_context io(1);
  tcp::resolver resolver(io);
  std::vector<Replayer::Target> targets;
  for (const std::string& text : options.RouterUrls()) {
    KVF_ASSIGN_OR_RETURN(Url url, ParseUrl(text));
    beast::error_code ec;
    auto endpoints = resolver.resolve(url.host, url.port, ec);
    if (ec) return Unavailable("cannot resolve " + url.host + ":" + url.port + ": " + ec.message());
    targets.push_back(Replayer::Target{std::move(url), std::move(endpoints)});
  }
  Replayer replayer(io, requests, prompts, options, std::move(targets));
  return replayer.Run();
}

}  // namespace kvfleet::bench
