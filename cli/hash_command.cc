// kvfleet hash: prints the Contract 1 sequence hash of every full block of a token list,
// so an operator can compare what the router and a worker compute for the same prompt.
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/block_hash.h"

namespace kvfleet::cli {

namespace {
struct HashArgs {
  std::string model;
  std::string lora;
  std::string salt;
  uint32_t block_size = 32;
  std::vector<uint32_t> tokens;
};
}  // namespace

Action AddHashCommand(CLI::App& parent) {
  auto args = std::make_shared<HashArgs>();
  CLI::App* cmd = parent.add_subcommand("hash", "print the sequence hash of each full block of TOKEN...");
  cmd->add_option("--model", args->model, "model name, as the workers announce it")->required();
  cmd->add_option("--lora", args->lora, "LoRA adapter name (empty: none)");
  cmd->add_option("--salt", args->salt, "cache salt (empty: none)");
  cmd->add_option("--block-size", args->block_size, "tokens per block (a power of two)")->required();
  cmd->add_option("tokens", args->tokens, "token ids")->required();
  return [args]() {
    HashNamespace ns{args->model, args->lora, args->salt};
    auto hasher = BlockHasher::Make(args->block_size, ns);
    if (!hasher.ok()) {
      std::cerr << "error: " << hasher.status().message() << "\n";
      return 2;
    }
    auto hashes = hasher->HashAll(args->tokens);
    if (hashes.empty()) {
      std::cerr << "note: " << args->tokens.size() << " tokens make no full block of " << args->block_size << "\n";
    }
    for (size_t i = 0; i < hashes.size(); ++i) std::printf("%zu %016" PRIx64 "\n", i, hashes[i]);
    return 0;
  };
}

}  // namespace kvfleet::cli
