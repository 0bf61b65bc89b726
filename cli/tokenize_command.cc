// kvfleet tokenize / detokenize: the router's tokenizer on the command line, so an
// operator can see exactly which ids a prompt becomes (and which text ids stand for).
//
//   kvfleet tokenize --model-dir DIR           one line of text in, one line of ids out
//   kvfleet tokenize --model-dir DIR --chat    one line of chat JSON in ([{"role", "content"}]
//                                              or {"messages": [...], ...}); the rendered
//                                              template is tokenized
//   kvfleet detokenize --model-dir DIR         one line of ids in, one line of text out
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace kvfleet::cli {

namespace {

struct TokenizeArgs {
  std::string model_dir;
  bool chat = false;
  bool no_special = false;       // tokenize: add no BOS etc.
  bool no_parse_special = false; // tokenize: special-token text is plain text
  bool generation_prompt = true; // tokenize --chat
  bool skip_special = false;     // detokenize
};

std::shared_ptr<const tok::Tokenizer> LoadOrReport(const std::string& dir) {
  auto tok = tok::Tokenizer::Load(dir);
  if (!tok.ok()) {
    std::cerr << "error: " << tok.status().ToString() << "\n";
    return nullptr;
  }
  return *tok;
}

}  // namespace

Action AddTokenizeCommand(CLI::App& parent) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = parent.add_subcommand("tokenize", "print the token ids of each line of stdin");
  cmd->add_option("--model-dir", args->model_dir, "HF model directory (tokenizer.json, tokenizer_config.json)")->required();
  cmd->add_flag("--chat", args->chat, "each line is chat JSON: messages are rendered with the chat template first");
  cmd->add_flag("--no-special-tokens", args->no_special, "do not add BOS etc.");
  cmd->add_flag("--no-parse-special", args->no_parse_special, "treat special-token text in the input as plain text");
  cmd->add_option("--add-generation-prompt", args->generation_prompt, "with --chat: end with the assistant's header");
  return [args]() {
    auto tok = LoadOrReport(args->model_dir);
    if (!tok) return 2;
    tok::EncodeOptions options;
    options.add_special_tokens = !args->no_special;
    options.parse_special = !args->no_parse_special;
    // A rendered template already holds its BOS; adding another would double it.
    if (args->chat) options.add_special_tokens = false;
    std::string line;
    int rc = 0;
    while (std::getline(std::cin, line)) {
      std::string text = line;
      if (args->chat) {
        // Ordered, so the template sees each object's keys as the line gives them.
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, false);
        nlohmann::ordered_json messages = j.is_object() && j.contains("messages") ? j["messages"] : j;
        nlohmann::ordered_json extra = nlohmann::ordered_json::object();
        if (j.is_object()) {
          for (auto it = j.begin(); it != j.end(); ++it) {
            if (it.key() != "messages") extra[it.key()] = it.value();
          }
        }
        if (j.is_discarded() || !messages.is_array()) {
          std::cerr << "error: --chat expects a JSON array of messages or {\"messages\": [...]} per line\n";
          rc = 1;
          continue;
        }
        auto rendered = tok->ApplyChatTemplate(messages, args->generation_prompt, extra);
        if (!rendered.ok()) {
          std::cerr << "error: " << rendered.status().ToString() << "\n";
          rc = 1;
          continue;
        }
        text = *rendered;
      }
      auto ids = tok->Encode(text, options);
      if (!ids.ok()) {
        std::cerr << "error: " << ids.status().ToString() << "\n";
        rc = 1;
        continue;
      }
      std::string out;
      for (size_t i = 0; i < ids->size(); ++i) out += (i ? " " : "") + std::to_string((*ids)[i]);
      std::cout << out << "\n";
    }
    return rc;
  };
}

Action AddDetokenizeCommand(CLI::App& parent) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = parent.add_subcommand("detokenize", "print the text of each line of token ids on stdin");
  cmd->add_option("--model-dir", args->model_dir, "HF model directory (tokenizer.json, tokenizer_config.json)")->required();
  cmd->add_flag("--skip-special-tokens", args->skip_special, "leave out special tokens");
  return [args]() {
    auto tok = LoadOrReport(args->model_dir);
    if (!tok) return 2;
    std::string line;
    int rc = 0;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::vector<TokenId> ids;
      std::string word;
      bool ok = true;
      while (in >> word) {
        char* end = nullptr;
        unsigned long v = std::strtoul(word.c_str(), &end, 10);
        if (*end != '\0' || word[0] == '-') {
          std::cerr << "error: '" << word << "' is not a token id\n";
          ok = false;
          break;
        }
        ids.push_back(static_cast<TokenId>(v));
      }
      if (!ok) {
        rc = 1;
        continue;
      }
      // Newlines inside the text would break one-line-per-input; they print as \n.
      std::string text = tok->Decode(ids, args->skip_special);
      std::string escaped;
      for (char c : text) {
        if (c == '\\') escaped += "\\\\";
        else if (c == '\n') escaped += "\\n";
        else escaped += c;
      }
      std::cout << escaped << "\n";
    }
    return rc;
  };
}

}  // namespace kvfleet::cli
