// Model layouts: `kvfleet make-model --layout NAME` writes a directory laid out like a real
// Hugging Face repository at tiny dimensions: the repository's own file set (config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json with the chat template,
// special_tokens_map.json, vocab.json + merges.txt, params.json, ...) with its field set and
// values (eos and bos ids, rope_scaling, sliding_window, ...), and random weights sharded with
// an index as the repository's are. Only the sizes (hidden, intermediate, layers, heads) are
// tiny; vocab_size stays the repository's.
//
// The tokenizer and the chat template come from --tokenizer DIR (tokenizer.json, and the
// template from DIR's chat_template.jinja / chat_template.json / tokenizer_config.json, or
// --chat-template FILE). The layout checks that DIR's tokenizer is the repository's family (its
// special tokens at the repository's ids) and keeps only the added tokens the repository
// has (Qwen2.5 from Qwen3's tokenizer: ids up to <|file_sep|> 151664). Reserved tokens that
// the repository's release named get their names (Llama 3.1 from Llama 3's tokenizer:
// <|eom_id|> 128008, <|python_tag|> 128010, ...).
//
// Files the layout does not write: weights in the repository's other formats
// (consolidated.safetensors, original/consolidated.00.pth) and SentencePiece/tiktoken
// tokenizer.model files; transformers and kvfleet read neither.
//
// Thread safety: functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/safetensors.h"

namespace kvfleet::cli {

// The layout names: llama-3.1-8b-instruct, qwen2.5-7b-instruct, qwen3-8b, qwen3-30b-a3b,
// mistral-7b-instruct-v0.3, llama-4-scout (Llama4ForConditionalGeneration: the text model's
// weights under language_model., no vision tower).
std::vector<std::string> ModelLayoutNames();

struct ModelLayoutOptions {
  std::string layout;              // one of ModelLayoutNames()
  std::string tokenizer_dir;       // the repository's tokenizer (see above)
  std::string chat_template_file;  // empty: the tokenizer directory's template
  std::string out_dir;             // must not exist, or be empty
  uint64_t seed = 0;
  model::DType dtype = model::DType::kBF16;
  // The lm_head row of the layout's end-of-turn token is multiplied by this (1: untouched).
  // Random weights almost never pick one token of a 150K vocabulary; a row a few times
  // longer than the others makes a greedy answer end at the end-of-turn token within a few
  // steps, as a trained model's does, so tests can check the stop ids.
  double end_of_turn_scale = 1.0;
};

// Writes the layout. InvalidArgument names the option at fault (--layout, --tokenizer,
// --chat-template, --out).
Status WriteModelLayout(const ModelLayoutOptions& options);

// The layout's end-of-turn token id (what its chat template ends an assistant turn with).
Result<int64_t> EndOfTurnId(const std::string& layout);

}  // namespace kvfleet::cli
