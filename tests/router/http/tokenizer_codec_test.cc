// The tokenizer-backed codec (LoadTokenizerCodec) on a tiny byte-level tokenizer.json whose
// added tokens are Mistral's tool-call markers: its decoder hides special tokens, and the
// decoder a mistral parser asks for shows the markers, so calls come out of the text.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/http/codec.h"
#include "router/http/tool_parsers.h"

namespace kvfleet::router {
namespace {

using nlohmann::json;

json Special(TokenId id, const std::string& content) {
  return {{"id", id},        {"content", content},   {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// Printable ASCII is its own symbol in the byte-level alphabet: ids 0..93 are '!' .. '~'.
std::string MistralLikeTokenizerDir() {
  json vocab = json::object();
  for (char c = '!'; c <= '~'; ++c) vocab[std::string(1, c)] = static_cast<TokenId>(c - '!');
  json t;
  t["added_tokens"] = json::array({Special(100, "</s>"), Special(101, "[TOOL_CALLS]"), Special(102, "[ARGS]"),
                                   Special(103, "[CALL_ID]")});
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvfleet-codec-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << t.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  return dir.string();
}

std::vector<TokenId> Ids(std::string_view text) {
  std::vector<TokenId> ids;
  for (char c : text) ids.push_back(static_cast<TokenId>(c - '!'));
  return ids;
}

std::string DecodeAll(StreamDecoder& d, const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) out += d.Push(id);
  return out + d.Finish();
}

}  // namespace

TEST_CASE("the decoder of a mistral parser shows [TOOL_CALLS], [ARGS] and [CALL_ID], which others hide") {
  const std::string dir = MistralLikeTokenizerDir();
  auto codec = LoadTokenizerCodec(dir, std::nullopt);
  std::filesystem::remove_all(dir);
  if (!codec.ok() && codec.status().code() == StatusCode::kUnimplemented) return;  // a build without tokenizer/
  REQUIRE_MESSAGE(codec.ok(), codec.status().ToString());
  // [TOOL_CALLS]get[CALL_ID]a1[ARGS]{"x":1}
  std::vector<TokenId> ids = {101};
  for (TokenId id : Ids("get")) ids.push_back(id);
  ids.push_back(103);
  for (TokenId id : Ids("a1")) ids.push_back(id);
  ids.push_back(102);
  for (TokenId id : Ids("{\"x\":1}")) ids.push_back(id);

  CHECK(DecodeAll(*(*codec)->NewDecoder(), ids) == "geta1{\"x\":1}");
  const auto showing = (*codec)->NewDecoderShowing(ToolParserSpecialTokens(ToolParserKind::kMistral));
  const std::string shown = DecodeAll(*showing, ids);
  CHECK(shown == "[TOOL_CALLS]get[CALL_ID]a1[ARGS]{\"x\":1}");
  ParsedToolCalls calls = ParseToolCalls(ToolParserKind::kMistral, shown);
  REQUIRE(calls.calls.size() == 1);
  CHECK(calls.calls[0].name == "get");
  CHECK(calls.calls[0].arguments == "{\"x\":1}");
  // A marker this tokenizer lacks is skipped; the others still show.
  CHECK(DecodeAll(*(*codec)->NewDecoderShowing({"[TOOL_CALLS]", "[THINK]"}), ids) == "[TOOL_CALLS]geta1{\"x\":1}");
}

}  // namespace kvfleet::router
