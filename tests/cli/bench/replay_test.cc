// kvfleet bench against a fake OpenAI server: the replay sends what the router expects,
// times streamed chunks, and its report counts completions, errors, workers and tokens.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "cli/bench/ideal_cache.h"
#include "cli/bench/replay.h"
#include "cli/bench/report.h"
#include "tests/cli/bench/fake_openai_server.h"

namespace kvfleet::bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

std::vector<TraceRequest> MakeTrace() {
  // Ten requests at t = 0..9 ms; output lengths pick the fake server's behaviour.
  const int outputs[] = {5, 3, 6, 4, 2, 7, 3, 5, 8, 1};
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 10; ++i) {
    TraceRequest r;
    r.timestamp_ms = i;
    r.input_length = 100 + 10 * i;
    r.output_length = outputs[i];
    r.hash_ids = {static_cast<uint64_t>(1 + i % 3)};
    r.line = i + 1;
    trace.push_back(r);
  }
  return trace;
}

TEST_CASE("a replay against a fake server reports completions, errors, workers and usage") {
  testing::FakeOpenAiServer server;
  const auto trace = MakeTrace();
  TraceScale scale;
  const auto requests = ScaleTrace(trace, scale);
  PromptBuilder prompts(32000, scale.block_tokens());
  ReplayOptions options;
  options.router_url = server.url();
  options.model = "tiny";
  options.policy = "kv";
  options.cache_salt = "salt-1";
  options.concurrency_limit = 3;
  options.progress = false;
  auto run = Replay(requests, prompts, options);
  REQUIRE(run.ok());
  REQUIRE(run->outcomes.size() == 10);

  // What the router received: the fields the bench contract names.
  auto bodies = server.bodies();
  REQUIRE(bodies.size() == 10);
  for (const auto& b : bodies) {
    CHECK(b["stream"] == true);
    CHECK(b["stream_options"]["include_usage"] == true);
    CHECK(b["ignore_eos"] == true);
    CHECK(b["model"] == "tiny");
    CHECK(b[config::kPolicyField] == "kv");
    CHECK(b["cache_salt"] == "salt-1");
    CHECK(b["prompt"].is_array());
  }
  CHECK(server.max_concurrent() <= 3);

  RunReport r = Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens()));
  CHECK(r.requests == 10);
  CHECK(r.completed == 7);
  CHECK(r.failed == 3);
  CHECK(r.errors["http_503"] == 2);
  CHECK(r.errors["incomplete"] == 1);
  // Workers follow the prompt's first token; every request is counted, failed or not.
  std::map<std::string, size_t> expected_workers;
  uint64_t prompt_tokens = 0, completion_tokens = 0, cached = 0;
  size_t gaps = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto tokens = prompts.Build(requests[i]);
    ++expected_workers["w" + std::to_string(tokens[0] % 2)];
    const auto& o = run->outcomes[i];
    if (requests[i].output_length == 3 || requests[i].output_length == 4) {
      CHECK_FALSE(o.ok);
      continue;
    }
    CHECK(o.ok);
    CHECK(o.prompt_tokens == tokens.size());
    prompt_tokens += tokens.size();
    cached += tokens.size() / 2;
    completion_tokens += requests[i].output_length;
    gaps += requests[i].output_length - 1;
    CHECK(o.token_gaps_s.size() == requests[i].output_length - 1);
    CHECK(o.ttft_s >= 0);
    CHECK(o.e2e_s >= o.ttft_s);
  }
  CHECK(r.requests_by_worker == expected_workers);
  CHECK(r.prompt_tokens == prompt_tokens);
  CHECK(r.cached_tokens == cached);
  CHECK(r.completion_tokens == completion_tokens);
  CHECK(r.cached_ratio == doctest::Approx(double(cached) / double(prompt_tokens)));
  CHECK(r.ttft.count == 7);
  CHECK(r.itl.count == gaps);
  CHECK(r.ttft.p50 <= r.ttft.p99);

  BenchSettings settings{server.url(), "t.jsonl", "tiny", scale, 32000, 3};
  auto j = ResultsJson(settings, {r});
  CHECK(j["runs"][0]["completed"] == 7);
  CHECK(j["runs"][0]["errors"]["http_503"] == 2);
  CHECK(j["settings"]["block_tokens"] == 512);

  SUBCASE("the plot is a PNG") {
    std::string png = "/tmp/kvfleet_bench_test_" + std::to_string(getpid()) + ".png";
    REQUIRE(WritePlot(png, {r, r}, "test").ok());
    std::ifstream in(png, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    CHECK(std::string(magic + 1, 3) == "PNG");
    std::remove(png.c_str());
  }
}

TEST_CASE("the report counts errors by status (429, 503, 504, other) and goodput within a TTFT SLO") {
  testing::FakeOpenAiServer server;
  // Output lengths pick the fake server's answer: 9 -> 429, 10 -> 504, 3 -> 503, 4 -> a
  // stream cut short, 11 -> a first token 300 ms late; the others stream at once.
  const int outputs[] = {5, 9, 10, 3, 11, 6, 9, 4};
  std::vector<TraceRequest> trace;
  for (int i = 0; i < 8; ++i) {
    TraceRequest t;
    t.timestamp_ms = i;
    t.input_length = 50;
    t.output_length = outputs[i];
    t.hash_ids = {static_cast<uint64_t>(i + 1)};
    t.line = i + 1;
    trace.push_back(t);
  }
  TraceScale scale;
  const auto requests = ScaleTrace(trace, scale);
  ReplayOptions options;
  options.router_url = server.url();
  options.model = "tiny";
  options.progress = false;
  auto run = Replay(requests, PromptBuilder(32000, scale.block_tokens()), options);
  REQUIRE(run.ok());
  RunReport r = Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens()), 0.150);
  CHECK(r.completed == 3);
  CHECK(r.errors_by_status["429"] == 2);
  CHECK(r.errors_by_status["503"] == 1);
  CHECK(r.errors_by_status["504"] == 1);
  CHECK(r.errors_by_status["other"] == 1);  // the cut stream
  CHECK(r.refusal.count == 3);              // the 429s and the 503
  CHECK(r.slo_met == 2);                    // the late first token misses 150 ms
  REQUIRE(r.wall_s > 0.3);
  CHECK(r.goodput_rps == doctest::Approx(2 / r.wall_s));

  BenchSettings settings{server.url(), "t.jsonl", "tiny", scale, 32000, 512, 0.150};
  auto j = ResultsJson(settings, {r});
  CHECK(j["settings"]["ttft_slo_ms"] == doctest::Approx(150));
  CHECK(j["runs"][0]["errors_by_status"]["504"] == 1);
  CHECK(j["runs"][0]["slo_met"] == 2);
  CHECK(j["runs"][0]["goodput_rps"].get<double>() == doctest::Approx(r.goodput_rps));
  CHECK(j["runs"][0]["refusal_ms"]["count"] == 3);
  std::ostringstream table;
  PrintTable(table, {r});
  CHECK(table.str().find("goodput") != std::string::npos);
  CHECK(table.str().find("TTFT <= 150 ms") != std::string::npos);

  // Without an SLO every completed request counts.
  CHECK(Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens())).slo_met == 3);

  // A warm-up of the first four arrivals (0-3 ms): the rest counted (the late token, a stream, a
  // 429, the cut stream), the rates per second after it.
  RunReport warm = Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens(), 0.0035), 0.150, 0.0035);
  CHECK(warm.requests == 4);
  CHECK(warm.completed == 2);
  CHECK(warm.slo_met == 1);
  CHECK(warm.ttft.count == 2);
  CHECK(warm.errors_by_status["429"] == 1);
  CHECK(warm.errors_by_status["503"] == 0);
  CHECK(warm.errors_by_status["504"] == 0);
  CHECK(warm.errors_by_status["other"] == 1);
  CHECK(warm.ideal.prompt_tokens == 4 * 50);
  CHECK(warm.wall_s == doctest::Approx(r.wall_s - 0.0035));
  CHECK(warm.goodput_rps == doctest::Approx(1 / warm.wall_s));
}

TEST_CASE("a router that is not there gives connect errors, not a hang") {
  // Bind then close a port so nothing listens on it.
  uint16_t port;
  {
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  auto trace = MakeTrace();
  trace.resize(3);
  TraceScale scale;
  PromptBuilder prompts(32000, 512);
  ReplayOptions options;
  options.router_url = "http://127.0.0.1:" + std::to_string(port);
  options.progress = false;
  auto run = Replay(ScaleTrace(trace, scale), prompts, options);
  REQUIRE(run.ok());
  for (const auto& o : run->outcomes) CHECK(o.error == "connect");
  options.router_url = "ftp://x";
  CHECK_FALSE(Replay(ScaleTrace(trace, scale), prompts, options).ok());
}

TEST_CASE("the SSE parser handles events split across reads and CRLF line ends") {
  SseChunkParser p;
  std::vector<SseChunkParser::Event> ev;
  std::string stream =
      "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\r\n\r\n"
      ": a comment\n\n"
      "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
      "data: {\"choices\":[],\"kvfleet\":{\"worker\":\"worker-3\"},\"usage\":{\"prompt_tokens\":9,"
      "\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
      "data: {\"error\":{\"message\":\"worker died\"}}\n\n"
      "data: [DONE]\n\n";
  for (char c : stream) p.Feed(std::string_view(&c, 1), &ev);
  REQUIRE(ev.size() == 4);
  CHECK(ev[0].kind == SseChunkParser::Event::kTokens);
  CHECK(ev[1].kind == SseChunkParser::Event::kUsage);
  CHECK(ev[1].prompt_tokens == 9);
  CHECK(ev[1].completion_tokens == 2);
  CHECK(ev[1].cached_tokens == 4);
  CHECK(ev[1].worker == "worker-3");  // the router's usage extension names the worker
  CHECK(ev[2].kind == SseChunkParser::Event::kError);
  CHECK(ev[2].message == "worker died");
  CHECK(ev[3].kind == SseChunkParser::Event::kDone);
}

}  // namespace
}  // namespace kvfleet::bench

namespace kvfleet::bench {

TEST_CASE("requests spread evenly over several routers given as one comma-separated --router") {
  testing::FakeOpenAiServer first, second;
  const std::vector<TraceRequest> trace = MakeTrace();  // the scaled requests point into it
  const auto requests = ScaleTrace(trace, TraceScale{});
  PromptBuilder prompts(32000, TraceScale{}.block_tokens());
  ReplayOptions options;
  options.router_url = first.url() + "," + second.url();
  options.model = "tiny";
  options.progress = false;
  REQUIRE(options.RouterUrls().size() == 2);
  auto run = Replay(requests, prompts, options);
  REQUIRE(run.ok());
  CHECK(first.bodies().size() == 5);
  CHECK(second.bodies().size() == 5);
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    CHECK(run->outcomes[i].router == (i % 2 == 0 ? first.url() : second.url()));
  }
  options.router_url = first.url() + ",ftp://nowhere";
  CHECK(!Replay(requests, prompts, options).ok());  // every URL is checked before any request
}

TEST_CASE("a request whose router refuses the connection goes to the next router") {
  uint16_t port;  // a port nothing listens on: a router that died
  {
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  testing::FakeOpenAiServer alive;
  const std::string dead = "http://127.0.0.1:" + std::to_string(port);
  const std::vector<TraceRequest> trace = MakeTrace();  // the scaled requests point into it
  const auto requests = ScaleTrace(trace, TraceScale{});
  PromptBuilder prompts(32000, TraceScale{}.block_tokens());
  ReplayOptions options;
  options.router_url = dead + "," + alive.url();
  options.model = "tiny";
  options.progress = false;
  auto run = Replay(requests, prompts, options);
  REQUIRE(run.ok());
  CHECK(alive.bodies().size() == 10);  // all of them, the dead router's share included
  for (size_t i = 0; i < run->outcomes.size(); ++i) {
    CHECK(run->outcomes[i].error != "connect");
    CHECK(run->outcomes[i].router == alive.url());
    CHECK(run->outcomes[i].connect_retries == (i % 2 == 0 ? 1u : 0u));
  }
}

}  // namespace kvfleet::bench
