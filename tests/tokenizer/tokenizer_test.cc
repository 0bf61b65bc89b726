// Behaviour of the tokenizer on small synthetic tokenizer.json files: loading errors,
// added tokens and their flags, invalid UTF-8, streaming decode, threads. The exact
// match with the reference on real tokenizers is tokenizer_reference_test.cc.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/tokenizer/byte_level_bpe.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok {
namespace {

using json = nlohmann::json;

json AddedToken(TokenId id, const std::string& content, bool special = true) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

// A byte-level BPE: the 256 byte symbols (ids 0..255 in byte order), merges that spell
// "he", "ll", "hell", "hello", "Ġw", and two added tokens.
json ByteLevelTokenizer() {
  json t;
  t["added_tokens"] = json::array({AddedToken(300, "<|eot|>"), AddedToken(301, "<tool>", false)});
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<|eot|>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = testing::ByteLevelBpeModel({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}});
  return t;
}

std::shared_ptr<const Tokenizer> Load(const json& t, const json& config = json::object()) {
  auto tok = Tokenizer::FromJson(t.dump(), config.dump());
  REQUIRE_MESSAGE(tok.ok(), tok.status().ToString());
  return *tok;
}

std::vector<TokenId> Encode(const Tokenizer& tok, std::string_view text, EncodeOptions options = {}) {
  auto ids = tok.Encode(text, options);
  REQUIRE(ids.ok());
  return *ids;
}

TEST_CASE("merges apply lowest rank first and the post-processor adds its special token") {
  auto tok = Load(ByteLevelTokenizer());
  // "hello" -> he, ll -> hell -> hello; " w" -> Ġw; then "o", "r", "l", "d" bytes.
  CHECK(Encode(*tok, "hello world") == std::vector<TokenId>{300, 259, 260, 'o', 'r', 'l', 'd'});
  CHECK(Encode(*tok, "hello", {.add_special_tokens = false}) == std::vector<TokenId>{259});
  CHECK(tok->Decode(Encode(*tok, "hello world")) == "<|eot|>hello world");
  CHECK(tok->Decode(Encode(*tok, "hello world"), true) == "hello world");
  CHECK(tok->vocab_size() == 302);
}

TEST_CASE("special-token text is a special token only when parse_special is on") {
  auto tok = Load(ByteLevelTokenizer());
  EncodeOptions plain{.add_special_tokens = false};
  CHECK(Encode(*tok, "a<|eot|>b", plain) == std::vector<TokenId>{'a', 300, 'b'});
  EncodeOptions literal{.add_special_tokens = false, .parse_special = false};
  std::vector<TokenId> ids = Encode(*tok, "a<|eot|>b", literal);
  CHECK(std::find(ids.begin(), ids.end(), 300) == ids.end());
  CHECK(tok->Decode(ids) == "a<|eot|>b");
  // Non-special added tokens are still matched.
  CHECK(Encode(*tok, "<tool>", literal) == std::vector<TokenId>{301});
}

TEST_CASE("lstrip and rstrip eat the whitespace beside an added token; single_word needs word boundaries") {
  json t = ByteLevelTokenizer();
  t["added_tokens"][0]["lstrip"] = true;
  t["added_tokens"][0]["rstrip"] = true;
  t["added_tokens"][1]["single_word"] = true;
  auto tok = Load(t);
  EncodeOptions plain{.add_special_tokens = false};
  CHECK(Encode(*tok, "a \t<|eot|>  b", plain) == std::vector<TokenId>{'a', 300, 'b'});
  std::vector<TokenId> glued = Encode(*tok, "x<tool>y", plain);
  CHECK(std::find(glued.begin(), glued.end(), 301) == glued.end());
  std::vector<TokenId> spaced = Encode(*tok, "x <tool> y", plain);
  CHECK(std::find(spaced.begin(), spaced.end(), 301) != spaced.end());
}

TEST_CASE("a tokenizer.json with an unsupported component fails to load and names it") {
  struct Case {
    const char* field;
    json value;
    const char* name;
  };
  for (const Case& c : {Case{"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
                        Case{"pre_tokenizer", {{"type", "Whitespace"}}, "Whitespace"},
                        Case{"decoder", {{"type", "CTC"}}, "CTC"},
                        Case{"post_processor", {{"type", "RobertaProcessing"}}, "RobertaProcessing"}}) {
    json t = ByteLevelTokenizer();
    t[c.field] = c.value;
    auto tok = Tokenizer::FromJson(t.dump(), "{}");
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == StatusCode::kUnimplemented);
    CHECK(tok.status().message().find(c.name) != std::string::npos);
  }
  json t = ByteLevelTokenizer();
  t["model"]["type"] = "WordPiece";
  auto tok = Tokenizer::FromJson(t.dump(), "{}");
  REQUIRE_FALSE(tok.ok());
  CHECK(tok.status().message().find("WordPiece") != std::string::npos);
  json split = ByteLevelTokenizer();
  split["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "MergedWithPrevious"}};
  auto split_tok = Tokenizer::FromJson(split.dump(), "{}");
  REQUIRE_FALSE(split_tok.ok());
  CHECK(split_tok.status().message().find("MergedWithPrevious") != std::string::npos);
}

TEST_CASE("invalid UTF-8 is replaced as a WHATWG TextDecoder replaces it") {
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(RepairUtf8("a\xC3") == "a" + fffd);
  CHECK(RepairUtf8("\xE2\x82z") == fffd + "z");  // a truncated sequence is one U+FFFD
  CHECK(RepairUtf8("\xF0\x9F\x98" "A") == fffd + "A");
  CHECK(RepairUtf8("\xED\xA0\x80") == fffd + fffd + fffd);  // a UTF-16 surrogate
  CHECK(RepairUtf8("\xC0\xAF") == fffd + fffd);              // an overlong
  CHECK(RepairUtf8("\xF4\x90\x80\x80") == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(RepairUtf8("ok \xC3\xA9") == "ok \xC3\xA9");
  CHECK_FALSE(IsValidUtf8("\xED\xA0\x80"));
  auto tok = Load(ByteLevelTokenizer());
  EncodeOptions plain{.add_special_tokens = false};
  CHECK(Encode(*tok, "x\xFFy", plain) == Encode(*tok, "x" + fffd + "y", plain));
}

TEST_CASE("the incremental decoder holds back half a character and never rewrites sent text") {
  auto tok = Load(ByteLevelTokenizer());
  // "é" is two byte tokens (0xC3 0xA9); "👍" four.
  std::vector<TokenId> ids = Encode(*tok, "hello é 👍!", {.add_special_tokens = false});
  IncrementalDecoder stream(tok);
  std::string text;
  size_t held = 0;
  for (TokenId id : ids) {
    std::string chunk = stream.Push(id);
    CHECK(IsValidUtf8(chunk));
    if (chunk.empty()) ++held;
    text += chunk;
  }
  text += stream.Finish();
  CHECK(text == "hello é 👍!");
  CHECK(held >= 4);  // the first byte of é and the first three of 👍
  // Special tokens are skipped by default.
  IncrementalDecoder skip(tok);
  std::string s;
  for (TokenId id : Encode(*tok, "hello<|eot|>")) s += skip.Push(id);
  s += skip.Finish();
  CHECK(s == "hello");
}

TEST_CASE("encode is thread-safe: threads sharing one tokenizer agree with one thread") {
  auto tok = Load(ByteLevelTokenizer());
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("hello world " + std::to_string(i * 7919) + " é<|eot|>hello");
  std::vector<std::vector<TokenId>> expected;
  for (const auto& t : texts) expected.push_back(Encode(*tok, t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          size_t k = (i + th * 13) % texts.size();
          auto ids = tok->Encode(texts[k]);
          if (!ids.ok() || *ids != expected[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches.load() == 0);
}

TEST_CASE("tokenizer.json regexes get the reference's rewrites: White_Space for \\s, ASCII-only (?i:)") {
  auto rewritten = Regex::RewriteOniguruma("(?i:'s|'t)|\\s+(?!\\S)|[^\\s\\p{L}]");
  REQUIRE(rewritten.ok());
  CHECK(*rewritten == "(?:'[sS]|'[tT])|\\p{White_Space}+(?!\\P{White_Space})|[^\\p{White_Space}\\p{L}]");
  auto regex = Regex::FromTokenizerJson("(?i:'s)");
  REQUIRE(regex.ok());
  int matches = 0;
  CHECK((*regex)->ForEachMatch("'S 's '\xC5\xBF", [&](size_t, size_t) { ++matches; }).ok());  // U+017F folds to s in full Unicode
  CHECK(matches == 2);
  CHECK_FALSE(Regex::FromTokenizerJson("(?x)a").ok());
}

TEST_CASE("config: eos ids from tokenizer_config and generation_config, bos, chat template errors") {
  json config = {{"bos_token", "<|eot|>"}, {"eos_token", {{"content", "<tool>"}}}};
  auto tok = Tokenizer::FromJson(ByteLevelTokenizer().dump(), config.dump(), R"({"eos_token_id": [300, 7]})");
  REQUIRE(tok.ok());
  CHECK((*tok)->bos_token_id() == std::optional<TokenId>(300));
  CHECK((*tok)->eos_token_ids() == std::vector<TokenId>{7, 300, 301});
  auto no_template = (*tok)->ApplyChatTemplate(json::array(), true);
  CHECK(no_template.status().code() == StatusCode::kFailedPrecondition);

  config["chat_template"] = "{% include 'other.jinja' %}";
  auto bad = Tokenizer::FromJson(ByteLevelTokenizer().dump(), config.dump());
  REQUIRE(bad.ok());  // the tokenizer itself still works
  auto rendered = (*bad)->ApplyChatTemplate(json::array(), true);
  REQUIRE_FALSE(rendered.ok());
  CHECK(rendered.status().message().find("include") != std::string::npos);
}

// A model directory with the byte-level tokenizer and the given chat template files.
struct TemplateDir {
  explicit TemplateDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("kvfleet-tpl-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
    Write("tokenizer.json", ByteLevelTokenizer().dump());
    Write("tokenizer_config.json", json{{"chat_template", "config:{{ messages[0].content }}"}}.dump());
  }
  ~TemplateDir() { std::filesystem::remove_all(path); }
  void Write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::string Render(const LoadOptions& options = {}) const {
    auto tok = Tokenizer::Load(path.string(), options);
    REQUIRE_MESSAGE(tok.ok(), tok.status().ToString());
    auto text = (*tok)->ApplyChatTemplate(json::array({{{"role", "user"}, {"content", "hi"}}}), true);
    REQUIRE_MESSAGE(text.ok(), text.status().ToString());
    return *text + " from " + (*tok)->chat_template_source();
  }
  std::filesystem::path path;
};

TEST_CASE("chat template precedence: chat_template.jinja, then chat_template.json, then tokenizer_config.json") {
  TemplateDir dir("precedence");
  CHECK(dir.Render() == "config:hi from tokenizer_config.json");
  dir.Write("chat_template.json", json{{"chat_template", "json:{{ messages[0].content }}"}}.dump());
  CHECK(dir.Render() == "json:hi from chat_template.json");
  dir.Write("chat_template.jinja", "jinja:{{ messages[0].content }}");
  CHECK(dir.Render() == "jinja:hi from chat_template.jinja");
  // The override (the router's --chat-template) beats all three.
  CHECK(dir.Render({.chat_template = "override:{{ messages[0].content }}"}) == "override:hi from override");
}

// Regression: ApplyChatTemplate took nlohmann::json, whose objects are sorted by key, so a
// template's tojson of a message differed from transformers'.
TEST_CASE("ApplyChatTemplate keeps each message's keys in the order given") {
  TemplateDir dir("order");
  dir.Write("chat_template.jinja", "{% for m in messages %}{{ m | tojson }}{% endfor %}");
  auto tok = Tokenizer::Load(dir.path.string());
  REQUIRE(tok.ok());
  auto text = (*tok)->ApplyChatTemplate(
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi", "name": "ann"}])"), false,
      nlohmann::ordered_json::parse(R"({"tools": [{"type": "function", "function": {"name": "f"}}]})"));
  REQUIRE_MESSAGE(text.ok(), text.status().ToString());
  CHECK(*text == R"({"role": "user", "content": "hi", "name": "ann"})");
}

TEST_CASE("a template file is found without any in tokenizer_config.json") {
  TemplateDir dir("jinja-only");
  dir.Write("tokenizer_config.json", "{}");
  auto none = Tokenizer::Load(dir.path.string());
  REQUIRE(none.ok());
  CHECK_FALSE((*none)->has_chat_template());
  auto missing = (*none)->ApplyChatTemplate(json::array(), true);
  CHECK(missing.status().code() == StatusCode::kFailedPrecondition);
  CHECK(missing.status().message().find("chat_template.jinja") != std::string::npos);
  dir.Write("chat_template.jinja", "<{{ messages[0].content }}>");
  CHECK(dir.Render() == "<hi> from chat_template.jinja");
}

TEST_CASE("a malformed chat_template.json fails the load naming the file; a bad override fails it too") {
  TemplateDir dir("bad");
  for (const char* text : {"{oops", R"({"template": "x"})", R"({"chat_template": 5})"}) {
    dir.Write("chat_template.json", text);
    auto tok = Tokenizer::Load(dir.path.string());
    REQUIRE_FALSE(tok.ok());
    CHECK_MESSAGE(tok.status().message().find("chat_template.json") != std::string::npos, tok.status().message());
  }
  std::filesystem::remove(dir.path / "chat_template.json");
  auto bad_override = Tokenizer::Load(dir.path.string(), {.chat_template = "{% if %}"});
  REQUIRE_FALSE(bad_override.ok());
  CHECK(bad_override.status().message().find("chat template") != std::string::npos);
  // A directory's unparsable chat_template.jinja leaves completions working; chats report it.
  dir.Write("chat_template.jinja", "{% if %}");
  auto lazy = Tokenizer::Load(dir.path.string());
  REQUIRE(lazy.ok());
  auto rendered = (*lazy)->ApplyChatTemplate(json::array(), true);
  CHECK(rendered.status().code() == StatusCode::kUnimplemented);
  CHECK(rendered.status().message().find("chat_template.jinja") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::tok
