// request_parse_bench: the router's CPU per request body, ParseCompletionRequest (every
// check that earns a 400), beside nlohmann::json::parse of the same body alone.
//
//   build/bench/request_parse_bench [--iterations 2000]
//
// Also the median of ParseJsonBody alone, the JSON step inside ParseCompletionRequest.
//
// Bodies: completions with 1K, 8K and 32K-character text prompts (English-like words with
// the escapes and non-ASCII real prompts carry), an 8K token-id prompt, and a chat request
// whose user message is 8K characters. Each call is timed on its own; prints the mean and the
// median in microseconds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/http/json_body.h"
#include "router/http/openai.h"

namespace {

using Clock = std::chrono::steady_clock;

// Text with the JSON escapes (\n, \", \t) and UTF-8 that chat prompts carry.
std::string PromptText(size_t chars, std::mt19937& rng) {
  static const char* kWords[] = {"the ",  "router ", "caches ", "prefix ", "blocks\\n", "über ",
                                 "naïve ", "\\\"kv\\\" ", "tokens, ", "and ",    "workers.\\t"};
  std::string s;
  while (s.size() < chars) s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  s.resize(chars);
  while (!s.empty() && (s.back() == '\\' || (static_cast<unsigned char>(s.back()) & 0xC0) == 0xC0 ||
                        (static_cast<unsigned char>(s.back()) & 0x80))) {
    s.pop_back();  // no cut escape or UTF-8 sequence at the end
  }
  return s;
}

const char* kCommon = R"("model":"llama-3-8b","max_tokens":128,"temperature":0.7,"top_p":0.95,"stream":true,)"
                      R"("stream_options":{"include_usage":true},"stop":["</s>","\n\nUser:"],"user":"bench")";

struct Body {
  std::string name;
  std::string json;
  bool chat;
};

std::vector<Body> Bodies() {
  std::mt19937 rng(7);
  std::vector<Body> bodies;
  for (size_t chars : {1024, 8192, 32768}) {
    bodies.push_back({"completion, " + std::to_string(chars / 1024) + "K-char prompt",
                      std::string("{") + kCommon + R"(,"prompt":")" + PromptText(chars, rng) + "\"}", false});
  }
  std::string ids;
  for (int i = 0; i < 8192; ++i) ids += (i ? "," : "") + std::to_string(rng() % 128256);
  bodies.push_back({"completion, 8K token-id prompt", std::string("{") + kCommon + R"(,"prompt":[)" + ids + "]}", false});
  bodies.push_back({"chat, 8K-char user message",
                    std::string("{") + kCommon +
                        R"(,"messages":[{"role":"system","content":"You are a helpful assistant."},)"
                        R"({"role":"user","content":")" +
                        PromptText(8192, rng) + "\"}]}",
                    true});
  return bodies;
}

struct Stats {
  double mean_us;
  double median_us;
};

template <typename F>
Stats Time(int iterations, F&& f) {
  for (int i = 0; i < iterations / 10 + 1; ++i) f();  // warm caches and allocators
  std::vector<double> us(iterations);
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    f();
    us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  double sum = 0;
  for (double v : us) sum += v;
  std::nth_element(us.begin(), us.begin() + iterations / 2, us.end());
  return {sum / iterations, us[iterations / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::max(1, std::atoi(argv[i + 1]));
  }
  std::printf("%-34s %9s %26s %26s %14s\n", "body", "bytes", "ParseCompletionRequest us", "nlohmann::json::parse us",
              "ParseJsonBody");
  std::printf("%-34s %9s %13s %12s %13s %12s %14s\n", "", "", "mean", "median", "mean", "median", "median us");
  for (const Body& b : Bodies()) {
    auto check = kvfleet::router::ParseCompletionRequest(b.json, b.chat);
    if (!check.ok()) {
      std::fprintf(stderr, "%s: %s\n", b.name.c_str(), check.status().message().c_str());
      return 1;
    }
    size_t sink = 0;
    Stats parse = Time(iterations, [&] { sink += kvfleet::router::ParseCompletionRequest(b.json, b.chat)->model.size(); });
    Stats nl = Time(iterations, [&] { sink += nlohmann::json::parse(b.json).size(); });
    Stats body = Time(iterations, [&] { sink += kvfleet::router::ParseJsonBody(b.json)->size(); });
    std::printf("%-34s %9zu %13.2f %12.2f %13.2f %12.2f %14.2f\n", b.name.c_str(), b.json.size(), parse.mean_us,
                parse.median_us, nl.mean_us, nl.median_us, body.median_us);
    if (sink == 0) return 2;  // keeps the timed calls from being optimized away
  }
  return 0;
}
