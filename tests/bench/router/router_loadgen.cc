// router_loadgen: drives a running kvfleet-router with streaming completions and prints
// what the router adds to time to first token.
//
//   router_loadgen --port 8000 --prompt-tokens 8192 --rate 200 --seconds 10
//   router_loadgen --port 8000 --prompt-tokens 1024 --concurrency 32 --seconds 5   (closed loop: max req/s)
//   router_loadgen --port 8000 --direct 1 --prompt-tokens 8192 --rate 200 --seconds 10
//
// Each request is a fresh random prompt (the byte codec: one token per byte), streamed with
// include_usage. Router-added latency = the time to the first text chunk seen here minus
// the worker's own time to first token for that same request (the response's
// "kvfleet.worker_ttft_ms": the worker's clock from decoding the request frame to handing its
// first token to the socket). So it covers the HTTP read, parse, tokenization, hashing,
// routing, the forward over ZMQ both ways, the SSE write and the client's wake-up, and also
// the worker's side of the transport: its ZMQ I/O thread before the decode and after the
// send. The router's own routing step is also read from its /metrics.
//
// With a router started with --report-timings 1, each response also carries the router's own
// timestamps (monotonic ns: this host's clock, which this process reads too), and the
// router-added time is split into hops: client -> router (the request's send to its read),
// route, send, the worker round trip (send to the first token's read, minus the worker's own
// TTFT), the router's answer (first token read to its SSE chunk queued), and the chunk's
// write to the client's read. Each hop's p50, p99 and its mean over the slowest 2% of
// requests say which hop makes the tail.
//
// Streaming decode (tests/bench/stall_bench.sh): --max-tokens 128 --warmup-seconds 10 also
// prints the inter-token latency (gaps between a request's successive text chunks: one token
// each) and the output tokens per second, both over the steady window after the warm-up;
// --token-ids 1 sends each prompt as token ids, so it is exactly --prompt-tokens long
// whatever the tokenizer; --json FILE writes the figures for scripts.
//
// --direct 1 measures that worker-side floor: the same requests (Contract 3 Generate, the
// token ids the byte codec would make) sent straight to the workers the router lists in
// /fleet, round robin, from a DEALER per worker per client thread, and the same subtraction
// (time to the first delta minus the delta's time_to_first_token_us). What remains of
// router-added above this floor is what the router itself adds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "schema/requests.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int port = 8000;
  int prompt_tokens = 1024;
  double rate = 200;       // open loop, requests/s; 0: closed loop
  int concurrency = 32;    // closed loop
  double seconds = 10;
  int max_tokens = 4;
  std::string model = "mock";
  bool direct = false;
  bool token_ids = false;    // prompts as token ids instead of text
  double warmup_seconds = 0;  // requests sent before this, and tokens read before it, are not measured
  std::string json_path;      // write the figures here too
};

// The router's own timestamps of a request (--report-timings), in the order of its hops.
constexpr int kRouterStamps = 5;
constexpr const char* kStampNames[kRouterStamps] = {"read", "routed", "sent", "first_delta", "first_chunk"};

struct Sample {
  double client_ttft_ms = 0;
  double worker_ttft_ms = 0;
  bool ok = false;
  int64_t sent_ns = 0;         // this process's clock: the request's send
  int64_t first_ns = 0;        // and the first text chunk's read
  bool has_router_stamps = false;
  int64_t router_ns[kRouterStamps] = {};
  std::vector<int64_t> token_ns;  // the read of each text chunk (one token each)
};

int64_t MonotonicNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Reads the router's "router_timings_ns" object out of a response, if there is one.
void ReadRouterStamps(const std::string& response, Sample* s) {
  size_t at = response.find("\"router_timings_ns\":");
  if (at == std::string::npos) return;
  size_t open = response.find('{', at);
  size_t close = response.find('}', open);
  if (open == std::string::npos || close == std::string::npos) return;
  auto j = nlohmann::json::parse(response.substr(open, close - open + 1), nullptr, false);
  if (j.is_discarded()) return;
  for (int k = 0; k < kRouterStamps; ++k) {
    if (!j.contains(kStampNames[k]) || !j[kStampNames[k]].is_number_integer()) return;
    s->router_ns[k] = j[kStampNames[k]].get<int64_t>();
  }
  s->has_router_stamps = true;
}

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

std::string RandomPrompt(std::mt19937_64& rng, int n) {
  std::string s(static_cast<size_t>(n), ' ');
  for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

// Token ids below every supported vocabulary's special tokens (Llama 2 has 32,000 ids).
std::vector<int> RandomTokenIds(std::mt19937_64& rng, int n) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int& id : ids) id = 256 + static_cast<int>(rng() % 31000);
  return ids;
}

// Text chunks in `in` from `from` on: `"text":"` followed by at least one character.
int CountTextChunks(const std::string& in, size_t from, size_t* next) {
  static const std::string kText = "\"text\":\"";
  int n = 0;
  size_t at = from;
  while ((at = in.find(kText, at)) != std::string::npos) {
    if (at + kText.size() >= in.size()) break;  // the rest has not arrived: look again later
    if (in[at + kText.size()] != '"') ++n;
    at += kText.size();
  }
  *next = at == std::string::npos ? (in.size() >= kText.size() ? in.size() - kText.size() + 1 : 0) : at;
  return n;
}

// One streamed request on connection *fd (reconnecting when needed).
Sample RunOne(int* fd, const Args& a, std::mt19937_64& rng) {
  Sample s;
  nlohmann::json prompt = a.token_ids ? nlohmann::json(RandomTokenIds(rng, a.prompt_tokens))
                                      : nlohmann::json(RandomPrompt(rng, a.prompt_tokens));
  std::string body = nlohmann::json{{"model", a.model},
                                    {"prompt", std::move(prompt)},
                                    {"max_tokens", a.max_tokens},
                                    {"ignore_eos", true},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}}}
                         .dump();
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  if (*fd < 0) *fd = Connect(a.port);
  if (*fd < 0) return s;
  auto t0 = Clock::now();
  if (send(*fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(*fd);
    *fd = -1;
    return s;
  }
  std::string in;
  bool first = false;
  size_t scanned = 0;
  char buf[16384];
  s.sent_ns = MonotonicNs(t0);
  while (in.find("0\r\n\r\n") == std::string::npos || in.find("[DONE]") == std::string::npos) {
    ssize_t n = recv(*fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      close(*fd);
      *fd = -1;
      return s;
    }
    in.append(buf, static_cast<size_t>(n));
    const auto now = Clock::now();
    const int chunks = CountTextChunks(in, scanned, &scanned);
    for (int c = 0; c < chunks; ++c) s.token_ns.push_back(MonotonicNs(now));
    if (!first && chunks > 0) {
      first = true;
      s.client_ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
      s.first_ns = MonotonicNs(now);
    }
  }
  size_t at = in.find("\"worker_ttft_ms\":");
  if (!first || at == std::string::npos || in.find(" 200 ") == std::string::npos) return s;
  s.worker_ttft_ms = std::atof(in.c_str() + at + 17);
  s.ok = true;
  ReadRouterStamps(in, &s);
  return s;
}

// The requests endpoints the router lists in /fleet.
std::vector<std::string> WorkerEndpoints(int port);

// One Generate straight to a worker over `dealer` (Contract 3); the same subtraction.
Sample RunDirect(zmq::socket_t& dealer, uint64_t request_id, const Args& a, std::mt19937_64& rng) {
  Sample s;
  kvfleet::GenerateParams p;
  std::string prompt = RandomPrompt(rng, a.prompt_tokens);
  p.tokens.assign(prompt.begin(), prompt.end());
  p.sampling.max_tokens = static_cast<uint32_t>(a.max_tokens);
  p.sampling.ignore_eos = true;
  p.model = a.model;
  std::string frame = kvfleet::EncodeGenerate(request_id, p);
  auto t0 = Clock::now();
  if (!dealer.send(zmq::buffer(frame), zmq::send_flags::none)) return s;
  while (true) {
    zmq::message_t msg;
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::seconds(30)) <= 0) return s;
    if (!dealer.recv(msg, zmq::recv_flags::dontwait)) continue;
    auto decoded = kvfleet::DecodeFromWorker(msg.data(), msg.size());
    if (!decoded.ok()) return s;
    auto* d = std::get_if<kvfleet::WorkerDelta>(&*decoded);
    if (d == nullptr || d->request_id != request_id) return s;
    if (!s.ok && !d->tokens.empty()) {
      s.client_ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      s.worker_ttft_ms = static_cast<double>(d->usage.time_to_first_token_us) / 1000.0;
      s.ok = true;
    }
    if (d->finish != kvfleet::FinishReason::kNone) return s;
  }
}

// GET `path` with Connection: close; the whole response, head included ("" if no connection).
std::string HttpGet(int port, const std::string& path) {
  int fd = Connect(port);
  if (fd < 0) return "";
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string in;
  char buf[16384];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) in.append(buf, static_cast<size_t>(n));
  close(fd);
  return in;
}

// GET /metrics; the value of the first sample line that starts with `name ` (0 if none).
double ScrapeMetric(int port, const std::string& name) {
  const std::string in = HttpGet(port, "/metrics");
  size_t at = in.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::atof(in.c_str() + at + name.size() + 2);
}

std::vector<std::string> WorkerEndpoints(int port) {
  std::vector<std::string> out;
  const std::string in = HttpGet(port, "/fleet");
  size_t body = in.find("\r\n\r\n");
  if (body == std::string::npos) return out;
  auto j = nlohmann::json::parse(in.substr(body + 4), nullptr, false);
  if (j.is_discarded()) return out;
  for (const auto& w : j["workers"]) {
    if (w.value("routable", false)) out.push_back(w["endpoints"]["requests"].get<std::string>());
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The router-added time of the samples that carry router stamps, split into hops.
void PrintHops(const std::vector<Sample>& samples) {
  constexpr int kHops = 6;
  constexpr const char* kHopNames[kHops] = {
      "client -> router read", "route (parse, tokenize, hash, pick)", "send to the worker socket",
      "worker round trip - worker TTFT", "first token read -> chunk queued", "chunk queued -> client read"};
  std::vector<std::vector<double>> hops(kHops);
  std::vector<std::pair<double, size_t>> by_added;  // (router-added, index in hops)
  for (const Sample& s : samples) {
    if (!s.ok || !s.has_router_stamps) continue;
    const int64_t* r = s.router_ns;
    const double ms[kHops] = {static_cast<double>(r[0] - s.sent_ns) / 1e6, static_cast<double>(r[1] - r[0]) / 1e6,
                              static_cast<double>(r[2] - r[1]) / 1e6,
                              static_cast<double>(r[3] - r[2]) / 1e6 - s.worker_ttft_ms,
                              static_cast<double>(r[4] - r[3]) / 1e6, static_cast<double>(s.first_ns - r[4]) / 1e6};
    by_added.emplace_back(s.client_ttft_ms - s.worker_ttft_ms, hops[0].size());
    for (int k = 0; k < kHops; ++k) hops[k].push_back(ms[k]);
  }
  if (by_added.empty()) return;
  std::sort(by_added.rbegin(), by_added.rend());
  const size_t slowest = std::max<size_t>(1, by_added.size() / 50);
  std::printf("  router-added by hop (router --report-timings; ms): p50 / p99 / mean over the slowest 2%% of requests\n");
  for (int k = 0; k < kHops; ++k) {
    double sum = 0;
    for (size_t j = 0; j < slowest; ++j) sum += hops[k][by_added[j].second];
    std::printf("    %-36s %6.3f / %6.3f / %6.3f\n", kHopNames[k], Percentile(hops[k], 0.5), Percentile(hops[k], 0.99),
                sum / static_cast<double>(slowest));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--port") a.port = std::stoi(v);
    else if (k == "--prompt-tokens") a.prompt_tokens = std::stoi(v);
    else if (k == "--rate") a.rate = std::stod(v);
    else if (k == "--concurrency") a.concurrency = std::stoi(v);
    else if (k == "--seconds") a.seconds = std::stod(v);
    else if (k == "--max-tokens") a.max_tokens = std::stoi(v);
    else if (k == "--model") a.model = v;
    else if (k == "--direct") a.direct = v == "1";
    else if (k == "--token-ids") a.token_ids = v == "1";
    else if (k == "--warmup-seconds") a.warmup_seconds = std::stod(v);
    else if (k == "--json") a.json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const double routing_sum0 = ScrapeMetric(a.port, "kvfleet_router_routing_seconds_sum");
  const double routing_count0 = ScrapeMetric(a.port, "kvfleet_router_routing_seconds_count");
  std::mutex mu;
  std::vector<Sample> samples;
  std::atomic<int64_t> next{0};
  int64_t total = a.rate > 0 ? static_cast<int64_t>(a.rate * a.seconds) : INT64_MAX;
  int threads = a.rate > 0 ? std::max(8, static_cast<int>(a.rate / 10)) : a.concurrency;
  auto start = Clock::now() + std::chrono::milliseconds(100);
  auto end = start + std::chrono::duration<double>(a.seconds);
  std::vector<std::string> endpoints;
  if (a.direct) {
    endpoints = WorkerEndpoints(a.port);
    if (endpoints.empty()) {
      std::fprintf(stderr, "--direct: the router at port %d lists no routable worker\n", a.port);
      return 1;
    }
  }
  zmq::context_t zmq_ctx(1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) * 7919 + 1);
      std::vector<std::unique_ptr<zmq::socket_t>> dealers;
      for (const auto& ep : endpoints) {
        dealers.push_back(std::make_unique<zmq::socket_t>(zmq_ctx, zmq::socket_type::dealer));
        dealers.back()->set(zmq::sockopt::linger, 0);
        dealers.back()->connect(ep);
      }
      if (!dealers.empty()) std::this_thread::sleep_until(start);  // connected before the first send
      int fd = -1;
      while (true) {
        int64_t i = next.fetch_add(1);
        if (i >= total) break;
        if (a.rate > 0) {
          std::this_thread::sleep_until(start + std::chrono::duration<double>(static_cast<double>(i) / a.rate));
        } else if (Clock::now() >= end) {
          break;
        }
        Sample s = a.direct ? RunDirect(*dealers[static_cast<size_t>(i) % dealers.size()],
                                        static_cast<uint64_t>(i) + 1, a, rng)
                            : RunOne(&fd, a, rng);
        std::lock_guard<std::mutex> lock(mu);
        samples.push_back(s);
      }
      if (fd >= 0) close(fd);
    });
  }
  for (auto& t : pool) t.join();
  double wall = std::chrono::duration<double>(Clock::now() - start).count();
  // The steady window: from the end of the warm-up to the last send (closed loop) or now.
  // Without a warm-up every request counts (closed-loop clients start before `start`).
  const int64_t window_start =
      a.warmup_seconds > 0 ? MonotonicNs(start + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(a.warmup_seconds)))
                           : INT64_MIN;
  const int64_t window_end =
      a.rate > 0 ? MonotonicNs(Clock::now()) : MonotonicNs(std::chrono::time_point_cast<Clock::duration>(end));
  std::vector<double> added, client, worker, itl;
  size_t failed = 0, window_tokens = 0;
  for (const auto& s : samples) {
    if (!s.ok) {
      ++failed;
      continue;
    }
    for (size_t t = 0; t < s.token_ns.size(); ++t) {
      if (s.token_ns[t] < window_start || s.token_ns[t] > window_end) continue;
      ++window_tokens;
      if (t > 0) itl.push_back(static_cast<double>(s.token_ns[t] - s.token_ns[t - 1]) / 1e6);
    }
    if (s.sent_ns < window_start) continue;  // sent during the warm-up
    added.push_back(s.client_ttft_ms - s.worker_ttft_ms);
    client.push_back(s.client_ttft_ms);
    worker.push_back(s.worker_ttft_ms);
  }
  const double window_s =
      static_cast<double>(window_end - (a.warmup_seconds > 0 ? window_start : MonotonicNs(start))) / 1e9;
  const double output_tps = window_s > 0 ? static_cast<double>(window_tokens) / window_s : 0;
  const double routing_s = ScrapeMetric(a.port, "kvfleet_router_routing_seconds_sum") - routing_sum0;
  const double routed = ScrapeMetric(a.port, "kvfleet_router_routing_seconds_count") - routing_count0;
  std::string mode = std::string(a.direct ? "DIRECT to the workers (no router), " : "") + (a.rate > 0 ? "open loop at " + std::to_string(static_cast<int>(a.rate)) + " req/s offered"
                                : "closed loop, " + std::to_string(a.concurrency) + " in flight");
  std::printf("%d-token prompts, %s: %zu requests, %zu failed, %.1f s, %.1f req/s sustained\n", a.prompt_tokens,
              mode.c_str(), samples.size(), failed, wall, static_cast<double>(added.size()) / wall);
  std::printf("  %s: p50 %.3f ms  p99 %.3f ms\n",
              a.direct ? "worker-side transport floor (client TTFT - worker TTFT, no router)"
                       : "router-added latency (client TTFT - worker TTFT)",
              Percentile(added, 0.5), Percentile(added, 0.99));
  std::printf("  client TTFT: p50 %.3f ms  p99 %.3f ms;  worker's own TTFT: p50 %.3f ms  p99 %.3f ms\n",
              Percentile(client, 0.5), Percentile(client, 0.99), Percentile(worker, 0.5), Percentile(worker, 0.99));
  if (routed > 0 && !a.direct) {
    std::printf("  router routing step (parse, tokenize, hash, route; kvfleet_router_routing_seconds): mean %.3f ms\n",
                1000.0 * routing_s / routed);
  }
  if (a.max_tokens > 1 && !a.direct) {
    std::printf("  inter-token latency: p50 %.3f ms  p99 %.3f ms (%zu gaps); output %.1f tok/s (%zu tokens in the "
                "%.1f s after a %.1f s warm-up)\n",
                Percentile(itl, 0.5), Percentile(itl, 0.99), itl.size(), output_tps, window_tokens, window_s,
                a.warmup_seconds);
  }
  if (!a.direct) PrintHops(samples);
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"prompt_tokens", a.prompt_tokens},
                        {"max_tokens", a.max_tokens},
                        {"concurrency", a.rate > 0 ? 0 : a.concurrency},
                        {"rate", a.rate},
                        {"requests", samples.size()},
                        {"failed", failed},
                        {"measured_requests", client.size()},
                        {"window_s", window_s},
                        {"ttft_ms", {{"p50", Percentile(client, 0.5)}, {"p99", Percentile(client, 0.99)}}},
                        {"itl_ms", {{"p50", Percentile(itl, 0.5)}, {"p99", Percentile(itl, 0.99)}, {"gaps", itl.size()}}},
                        {"output_tokens_per_s", output_tps}};
    FILE* f = std::fopen(a.json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", a.json_path.c_str());
      return 2;
    }
    std::fprintf(f, "%s\n", j.dump(2).c_str());
    std::fclose(f);
  }
  return failed > samples.size() / 100 ? 1 : 0;
}
