// The grammar vocabulary of the worker's model (constrained decoding, grammar/): each token
// id's bytes, from the model directory's tokenizer.json through the tokenizer library
// (byte-level BPE symbols mapped back to bytes, SentencePiece byte-fallback <0xXX> tokens as
// their byte and "▁" as a space). Stop ids are the model's eos ids (config.json and
// generation_config.json, as the engine stops on them); special tokens are never allowed.
// A directory without tokenizer.json (a mock fleet, served through the router's byte codec)
// gets the byte vocabulary (engine::ByteVocabulary). Built once at start-up.
//
// Thread safety: a pure function (it reads files).
#pragma once

#include <string>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "grammar/grammar.h"

namespace kvfleet::server {

// `vocab_size` is the model's (its logits' width): ids the tokenizer has past it are left
// out, and ids the tokenizer lacks (padding) are never allowed.
Result<grammar::Vocabulary> LoadGrammarVocabulary(const std::string& model_dir, size_t vocab_size,
                                                  const std::vector<TokenId>& eos_token_ids);

}  // namespace kvfleet::server
