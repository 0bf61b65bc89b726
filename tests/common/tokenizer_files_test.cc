// common/tokenizer_files.h: the chat template's precedence and the tokenizer digest.
#include "common/tokenizer_files.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>

namespace kvfleet {
namespace {

struct ModelDir {
  ModelDir() : path(std::filesystem::temp_directory_path() / ("kvfleet_tokfiles_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ModelDir() { std::filesystem::remove_all(path); }
  void Write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::string dir() const { return path.string(); }
  std::filesystem::path path;
};

}  // namespace

TEST_CASE("the chat template is found in HF precedence: .jinja, .json, tokenizer_config.json") {
  ModelDir d;
  CHECK_FALSE(FindChatTemplate(d.dir())->has_value());
  d.Write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                         {"name": "default", "template": "C"}]})");
  CHECK((*FindChatTemplate(d.dir()))->text == "C");
  CHECK((*FindChatTemplate(d.dir()))->source == "tokenizer_config.json");
  CHECK_FALSE(FindChatTemplateFile(d.dir())->has_value());
  d.Write("chat_template.json", R"({"chat_template": "J"})");
  CHECK((*FindChatTemplate(d.dir()))->text == "J");
  d.Write("chat_template.jinja", "K");
  CHECK((*FindChatTemplate(d.dir()))->text == "K");
  CHECK((*FindChatTemplate(d.dir()))->source == "chat_template.jinja");
  std::filesystem::remove(d.path / "chat_template.jinja");
  d.Write("chat_template.json", R"(["not an object"])");
  CHECK_FALSE(FindChatTemplate(d.dir()).ok());
}

TEST_CASE("the tokenizer digest covers tokenizer.json and the template, and is 0 without tokenizer.json") {
  ModelDir d;
  CHECK(*TokenizerDigest(d.dir()) == 0);
  CHECK(*TokenizerDigest("") == 0);
  d.Write("tokenizer.json", R"({"model": {"type": "BPE"}})");
  const uint64_t bare = *TokenizerDigest(d.dir());
  CHECK(bare != 0);
  CHECK(bare == TokenizerDigestOf(R"({"model": {"type": "BPE"}})", ""));
  d.Write("tokenizer_config.json", R"({"chat_template": "C"})");
  const uint64_t with_config = *TokenizerDigest(d.dir());
  CHECK(with_config != bare);
  CHECK(with_config == TokenizerDigestOf(R"({"model": {"type": "BPE"}})", "C"));
  d.Write("chat_template.jinja", "C");  // the same text from another file: the same digest
  CHECK(*TokenizerDigest(d.dir()) == with_config);
  d.Write("chat_template.jinja", "D");
  CHECK(*TokenizerDigest(d.dir()) != with_config);
  // The separator keeps a byte moved between the files from colliding.
  CHECK(TokenizerDigestOf("ab", "c") != TokenizerDigestOf("a", "bc"));
  CHECK(DigestHex(0xabcULL) == "0x0000000000000abc");
}

}  // namespace kvfleet
