// The repositories `kvfleet make-model --layout` reproduces (cli/model_layouts.h): each one's
// config.json at tiny sizes, generation_config.json, special tokens and file set. Internal
// to cli/model_layouts.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvfleet::cli::layouts {

using ojson = nlohmann::ordered_json;

// The tiny sizes every layout shares: GQA (2 query heads per KV head), head_dim 16.
constexpr int64_t kHidden = 64, kIntermediate = 128, kLayers = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 16;
// A mixture of experts' expert intermediate size (its expert count and top-k stay the repository's).
constexpr int64_t kExpertIntermediate = 32;

// One repository. Field order in the ojson objects is the repository files' own.
struct Layout {
  std::string name;
  std::string repo;
  ojson config;             // config.json at tiny sizes
  ojson generation_config;  // generation_config.json
  // Special tokens the repository's tokenizer has, at these ids.
  std::vector<std::pair<std::string, int64_t>> tokens;
  int64_t max_added_id = -1;  // added tokens above this id are not the repository's (-1: keep all)
  // The repository's name for the added token at `id` when an earlier release of the family
  // left it reserved, "" otherwise; null: the family renamed none.
  std::string (*renamed_reserved)(int64_t id) = nullptr;
  int64_t end_of_turn = 0;
  std::string end_of_turn_text;  // what its chat template writes at the end of a turn
  int shards = 1;                // model-0000i-of-0000N.safetensors in the repository
  // tokenizer_config.json fields set over the tokenizer directory's (the template aside).
  ojson tokenizer_config;
  bool vocab_and_merges = false;     // vocab.json + merges.txt (Qwen's slow-tokenizer files)
  bool special_tokens_map = false;   // special_tokens_map.json of bos/eos(/unk)
  std::string params_path;           // the reference implementation's params.json ("": none)
  ojson params;
};

// Every layout, in ModelLayoutNames() order.
std::vector<Layout> Layouts();

}  // namespace kvfleet::cli::layouts
