// A kvfleet-worker process (mock backend, shadow-KV verification on) driven over its real
// sockets by a test client: a DEALER on the requests socket (Contract 3), plain HTTP for
// /health, /ready and /metrics, and SIGTERM for the graceful shutdown; --backend auto,
// Describe and --version; bad attention flags, a StreamingLLM worker and a token-level KV worker. LoRA and tensor parallelism are in
// worker_lora_tp_process_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "tests/worker/model/test_models.h"
#include "tests/worker/server/worker_process.h"

namespace {

using kvfleet::testing::Client;
using kvfleet::testing::HttpGet;
using kvfleet::testing::Prompt;
using kvfleet::testing::Reply;
using kvfleet::testing::RunRefused;
using kvfleet::testing::TinyCpuBlockBytes;
using kvfleet::testing::WorkerProcess;

TEST_CASE("a worker process streams deltas, reports usage and cached tokens, refuses bad requests, stops on SIGTERM") {
  WorkerProcess worker;
  Client client(worker.requests_port);
  CHECK(HttpGet(worker.http_port, "/health").starts_with("HTTP/1.1 200"));

  // Streamed deltas: one per step, the final one with the finish reason and full usage.
  std::vector<uint32_t> first_tokens;
  int deltas = 0;
  client.Generate(1, Prompt(100, 10), 8);
  Reply last = client.Collect(1, &first_tokens, &deltas);
  CHECK(first_tokens.size() == 8);
  CHECK(deltas >= 2);
  CHECK(last.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(last.prompt_tokens == 100);
  CHECK(last.completion == 8);
  CHECK(last.cached_device == 0);
  CHECK(last.ttft_us > 0);

  // The same prompt again: its 6 full blocks (96 tokens) come from the cache.
  std::vector<uint32_t> second_tokens;
  deltas = 0;
  client.Generate(2, Prompt(100, 10), 8);
  Reply again = client.Collect(2, &second_tokens, &deltas);
  CHECK(again.cached_device == 96);
  CHECK(second_tokens == first_tokens);

  // Bad requests get an Error each; the worker stays up.
  client.Generate(3, Prompt(600, 1), 4);  // over --max-context 512
  Reply too_long = client.Next();
  CHECK(too_long.is_error);
  CHECK(too_long.request_id == 3);
  CHECK(too_long.code == kvfleet::schema::ErrorCode::CONTEXT_TOO_LONG);
  client.Generate(4, Prompt(10, 1), 4, "no-such-adapter");
  Reply lora = client.Next();
  CHECK(lora.is_error);
  CHECK(lora.code == kvfleet::schema::ErrorCode::UNKNOWN_LORA);
  client.Generate(5, Prompt(10, 1), 4, "", -0.5f);
  Reply bad_temperature = client.Next();
  CHECK(bad_temperature.is_error);
  CHECK(bad_temperature.code == kvfleet::schema::ErrorCode::INVALID_REQUEST);
  client.socket.send(zmq::str_buffer("not a capnp message"), zmq::send_flags::none);

  // Cancel: the stream ends with `cancelled`.
  client.Generate(6, Prompt(20, 3), 400);
  Reply started = client.Next();
  CHECK(started.request_id == 6);
  client.Cancel(6);
  Reply r;
  do {
    r = client.Next();
  } while (r.finish == kvfleet::schema::FinishReason::NONE);
  CHECK(r.finish == kvfleet::schema::FinishReason::CANCELLED);

  std::string metrics = HttpGet(worker.http_port, "/metrics");
  CHECK(metrics.find("kvfleet_worker_time_to_first_token_seconds_count 3") != std::string::npos);
  CHECK(metrics.find("kvfleet_worker_prefix_hit_tokens_total") != std::string::npos);
  CHECK(metrics.find("kvfleet_worker_kv_blocks{") != std::string::npos);
  // The step bound, and the step-time model as fitted to the steps above: no longer the
  // prior's 7.29 ms base (this mock's steps take ~0.5 ms).
  CHECK(metrics.find("kvfleet_worker_step_bound_seconds 0.025") != std::string::npos);
  const std::string base_series = "kvfleet_worker_step_model_seconds{term=\"base\"} ";
  const size_t at = metrics.find(base_series);
  REQUIRE(at != std::string::npos);
  const double base_s = std::atof(metrics.c_str() + at + base_series.size());
  CHECK(base_s > 0);
  CHECK(std::abs(base_s - 7290e-6) > 1e-9);
  CHECK(metrics.find("kvfleet_worker_step_model_error_ratio ") != std::string::npos);

  // SIGTERM with a request in flight: it finishes within the grace period, exit 0.
  client.Generate(7, Prompt(30, 5), 30);
  (void)client.Next();
  CHECK(worker.Terminate() == 0);
  std::vector<uint32_t> rest;
  Reply final_reply;
  do {
    final_reply = client.Next();
  } while (final_reply.finish == kvfleet::schema::FinishReason::NONE);
  CHECK(final_reply.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(final_reply.completion == 30);
}

TEST_CASE("a worker given a model directory and no --backend runs the model, never the mock, and describes itself") {
  // Regression: without --backend the worker served the mock's random tokens under the
  // model directory's name.
  const std::string tiny = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  WorkerProcess worker({"--model-dir", tiny, "--model-name", "tiny", "--worker-id", "w-tiny", "--block-size", "16",
                        "--max-num-tokens", "256", "--kv-cache-bytes", std::to_string(TinyCpuBlockBytes(16) * 64)});
  Client client(worker.requests_port);
  client.Describe();
  auto hello = client.Described();
  REQUIRE(hello.ok());
  CHECK((hello->backend == "cpu" || hello->backend == "cuda"));  // cuda only on a GPU its kernels target
  CHECK(hello->name == "w-tiny");
  CHECK(hello->model == "tiny");
  CHECK(hello->block_size == 16);
  CHECK(hello->max_context > 0);
  CHECK(hello->device_blocks > 0);
  CHECK(hello->requests_endpoint == "tcp://127.0.0.1:" + std::to_string(worker.requests_port));
  CHECK(hello->events_endpoint == "tcp://127.0.0.1:" + std::to_string(worker.events_port));
  CHECK(hello->epoch != 0);
  // Asked again, it answers the same Hello.
  client.Describe();
  auto again = client.Described();
  REQUIRE(again.ok());
  CHECK(again->epoch == hello->epoch);
  CHECK(again->name == "w-tiny");

  // No model directory and no --backend: refused, naming the mock as the way to a simulated worker.
  const auto [status, out] = RunRefused({});
  INFO(out);
  CHECK(status == 2);
  CHECK(out.find("--model-dir is required for --backend auto") != std::string::npos);
  CHECK(out.find("--backend mock") != std::string::npos);
}

TEST_CASE("kvfleet-worker --version prints its version and exits 0") {
  const auto [status, out] = RunRefused({"--version"});
  INFO(out);
  CHECK(status == 0);
  CHECK(out.starts_with("kvfleet-worker "));
  CHECK(out.find("(git ") != std::string::npos);
}

TEST_CASE("bad attention flags stop the worker at start-up with an error naming the flag") {
  const std::string tiny = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);  // full attention, 2 layers
  const std::string mistral = kvfleet::testing::SmallVocabModelDir("tiny-mistral", 2, 512);  // window 20
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const Case cases[] = {
      {{"--backend", "cpu", "--model-dir", tiny, "--sink-tokens", "4"}, "--sink-tokens needs a sliding window"},
      {{"--backend", "cpu", "--model-dir", tiny, "--sink-tokens", "16", "--max-attention-window", "8"},
       "--max-attention-window 8 is shorter than --sink-tokens 16"},
      {{"--backend", "cpu", "--model-dir", mistral, "--sink-tokens", "32"},
       "the model's sliding window of 20 tokens (config.json) is shorter than --sink-tokens 32"},
      {{"--backend", "cpu", "--model-dir", mistral, "--max-attention-window", "64"},
       "exceeds the model's sliding window of 20 (config.json)"},
      {{"--backend", "cpu", "--model-dir", tiny, "--attention-chunk-size", "40"},
       "--attention-chunk-size 40 is not a multiple of --block-size 32"},
      {{"--backend", "cpu", "--model-dir", tiny, "--streaming-llm", "--max-attention-window", "64"},
       "--streaming-llm needs --sink-tokens"},
      {{"--backend", "cpu", "--model-dir", tiny, "--streaming-llm", "--sink-tokens", "4", "--max-attention-window",
        "64", "--attention-chunk-size", "64"},
       "contradict each other"},
      {{"--backend", "cpu", "--model-dir", tiny, "--max-attention-window", "64,x"}, "--max-attention-window"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "48"}, "--block-size 48 is not a power of two"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "0"}, "--block-size 0 is not a power of two"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "1", "--routing-block-size", "24"},
       "--routing-block-size 24 is not 0 or a power of two >= --block-size 1"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--routing-block-size", "8"},
       "--routing-block-size 8 is not 0 or a power of two >= --block-size 16"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--attention-chunk-size", "24"},
       "--attention-chunk-size 24 is not a multiple of --block-size 16"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--max-attention-window", "64", "--sink-tokens",
        "4", "--kv-cache-bytes", std::to_string(5 * 2 * 2 * 2 * 16 * 4 * 16)},  // 5 blocks
       "has 5 blocks; one sequence may hold 10 (sinks, window and first-window blocks): raise --kv-cache-bytes"},
  };
  for (const Case& c : cases) {
    const auto [status, out] = RunRefused(c.flags);
    INFO(c.says << "\n" << out);
    CHECK(status != 0);
    CHECK(out.find(c.says) != std::string::npos);
  }
}

TEST_CASE("a StreamingLLM worker streams a long generation in a KV cache of its per-sequence block bound") {
  // CI streams 20,000 tokens (seconds); KVFLEET_STREAMING_TOKENS=1048576 runs the full
  // million through the same worker (a few minutes on 2 cores). Sinks 4, window 64, B = 16:
  // MaxSequenceBlocks = 1 sink block + ceil(63 / 16) + 1 + 4 first-window blocks held until
  // the window passes them = 10; the worker gets exactly 10 blocks, so one block more at any
  // step would fail the request.
  uint32_t tokens = 20'000;
  if (const char* e = std::getenv("KVFLEET_STREAMING_TOKENS"); e != nullptr && *e != 0) tokens = std::stoul(e);
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  constexpr uint32_t kPrompt = 100;  // 7 blocks, all kept until the dense context phase ends
  WorkerProcess worker({"--backend", "cpu", "--model-dir", model, "--block-size", "16", "--max-num-tokens", "256",
                        "--max-context", std::to_string(tokens + kPrompt + 1), "--kv-cache-bytes",
                        std::to_string(10 * TinyCpuBlockBytes(16)), "--max-attention-window", "64", "--sink-tokens",
                        "4", "--streaming-llm"});
  Client client(worker.requests_port);
  std::vector<uint32_t> prompt = Prompt(kPrompt, 3);
  for (uint32_t& t : prompt) t = t % 500 + 3;  // inside the 512-token vocabulary
  client.Generate(1, prompt, tokens, "", 0, /*ignore_eos=*/true);
  std::vector<uint32_t> got;
  int deltas = 0;
  Reply last = client.Collect(1, &got, &deltas);
  CHECK(last.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(last.completion == tokens);
  CHECK(got.size() == tokens);
  CHECK(std::count(got.begin(), got.end(), got[0]) < static_cast<long>(tokens));  // not one token over and over
  const std::string metrics = HttpGet(worker.http_port, "/metrics");
  CHECK(metrics.find("kvfleet_worker_kv_blocks{") != std::string::npos);

  // The same prompt again reuses its first window (64 tokens: 4 blocks), nothing further.
  client.Generate(2, prompt, 4, "", 0, true);
  std::vector<uint32_t> again;
  Reply second = client.Collect(2, &again, &deltas);
  CHECK(second.cached_device == 64);
  CHECK(std::equal(again.begin(), again.end(), got.begin()));  // greedy: the same first tokens

  // A prompt longer than the windowed pool (10 blocks, 160 tokens) cannot be allocated whole:
  // refused at once rather than queued for good.
  std::vector<uint32_t> long_prompt(161, 7);
  client.Generate(3, long_prompt, 4, "", 0, true);
  Reply refused = client.Next();
  CHECK(refused.is_error);
  CHECK(refused.code == kvfleet::schema::ErrorCode::CONTEXT_TOO_LONG);
  CHECK(refused.message.find("holds a prompt of at most 160") != std::string::npos);
}

TEST_CASE("a token-level KV worker (--block-size 1) generates what a 16-token worker does and reuses to the token") {
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  auto start = [&](const std::string& b) {
    return std::make_unique<WorkerProcess>(std::vector<std::string>{
        "--backend", "cpu", "--model-dir", model, "--block-size", b, "--max-num-tokens", "256", "--max-context", "512",
        "--kv-cache-bytes", std::to_string(1024 * TinyCpuBlockBytes(1))});
  };
  std::vector<uint32_t> prompt = Prompt(45, 5);
  for (uint32_t& t : prompt) t = t % 500 + 3;  // inside the 512-token vocabulary
  std::vector<uint32_t> by_block_size[2];
  uint32_t cached_again[2] = {0, 0};
  const std::string sizes[2] = {"1", "16"};
  for (int i = 0; i < 2; ++i) {
    auto worker = start(sizes[i]);
    Client client(worker->requests_port);
    client.Generate(1, prompt, 12, "", 0, /*ignore_eos=*/true);
    int deltas = 0;
    const Reply first = client.Collect(1, &by_block_size[i], &deltas);
    CHECK(first.cached_device == 0);
    std::vector<uint32_t> again;
    client.Generate(2, prompt, 4, "", 0, true);
    cached_again[i] = client.Collect(2, &again, &deltas).cached_device;
    CHECK(std::equal(again.begin(), again.end(), by_block_size[i].begin()));
  }
  CHECK(by_block_size[0].size() == 12);
  CHECK(by_block_size[0] == by_block_size[1]);  // greedy: the same tokens at B = 1 and B = 16
  CHECK(cached_again[0] == 44);                  // every prompt token but the last, which computes logits
}

// A LoRA adapter for `model_dir`, written once per test run into a fresh directory.

}  // namespace
