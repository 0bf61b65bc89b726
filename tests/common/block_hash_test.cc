#include "common/block_hash.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <doctest/doctest.h>
#include <xxhash.h>

using namespace kvfleet;

namespace {

// The formula of Contract 1, written out with raw XXH3 calls and nothing shared with
// BlockHasher, so the two implementations check each other.
std::vector<uint64_t> ReferenceHashes(const std::string& model, const std::string& lora, const std::string& salt,
                                      uint32_t b, const std::vector<uint32_t>& tokens) {
  std::string ns = model + std::string(1, '\0') + lora + std::string(1, '\0') + salt;
  uint64_t seed = XXH3_64bits(ns.data(), ns.size());
  std::vector<uint64_t> out;
  uint64_t prev = seed;
  for (size_t i = 0; i + b <= tokens.size(); i += b) {
    unsigned char bytes[4 * 256];
    for (uint32_t j = 0; j < b; ++j) {
      uint32_t t = tokens[i + j];
      bytes[4 * j] = t & 0xff;
      bytes[4 * j + 1] = (t >> 8) & 0xff;
      bytes[4 * j + 2] = (t >> 16) & 0xff;
      bytes[4 * j + 3] = (t >> 24) & 0xff;
    }
    uint64_t local = XXH3_64bits_withSeed(bytes, 4 * b, seed);
    unsigned char pair[16];
    for (int k = 0; k < 8; ++k) pair[k] = (prev >> (8 * k)) & 0xff;
    for (int k = 0; k < 8; ++k) pair[8 + k] = (local >> (8 * k)) & 0xff;
    prev = XXH3_64bits(pair, 16);
    out.push_back(prev);
  }
  return out;
}

struct Vector {
  std::string name, model, lora, salt;
  uint32_t block_size = 0;
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> hashes;
};

// Parses schema/hash_vectors.txt (format documented in that file).
std::vector<Vector> LoadVectors() {
  std::ifstream in(std::string(KVFLEET_SOURCE_DIR) + "/schema/hash_vectors.txt");
  REQUIRE(in.good());
  std::vector<Vector> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    std::string rest;
    std::getline(ls, rest);
    if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
    if (key == "vector") {
      out.emplace_back();
      out.back().name = rest;
    } else if (key == "model") {
      out.back().model = rest;
    } else if (key == "lora") {
      out.back().lora = rest;
    } else if (key == "salt") {
      out.back().salt = rest;
    } else if (key == "block_size") {
      out.back().block_size = static_cast<uint32_t>(std::stoul(rest));
    } else if (key == "tokens") {
      std::istringstream ts(rest);
      uint32_t t;
      while (ts >> t) out.back().tokens.push_back(t);
    } else if (key == "hash") {
      std::istringstream hs(rest);
      size_t idx;
      std::string hex;
      hs >> idx >> hex;
      REQUIRE(idx == out.back().hashes.size());
      out.back().hashes.push_back(std::stoull(hex, nullptr, 16));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the published test vectors hold") {
  auto vectors = LoadVectors();
  REQUIRE(vectors.size() >= 5);
  int with_salt = 0, with_lora = 0;
  for (const auto& v : vectors) {
    CAPTURE(v.name);
    with_salt += !v.salt.empty();
    with_lora += !v.lora.empty();
    BlockHasher h(v.block_size, {v.model, v.lora, v.salt});
    CHECK(h.HashAll(v.tokens) == v.hashes);
    CHECK(ReferenceHashes(v.model, v.lora, v.salt, v.block_size, v.tokens) == v.hashes);
  }
  CHECK(with_salt >= 1);
  CHECK(with_lora >= 1);
}

TEST_CASE("BlockHasher agrees with the formula written out on random inputs") {
  uint64_t x = 12345;
  auto next = [&] { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; };
  for (uint32_t b : {2u, 4u, 16u, 32u, 64u, 256u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint32_t> tokens(next() % (5 * b + 3));
      for (auto& t : tokens) t = static_cast<uint32_t>(next());
      BlockHasher h(b, {"m", "l", "s"});
      CHECK(h.HashAll(tokens) == ReferenceHashes("m", "l", "s", b, tokens));
    }
  }
}

TEST_CASE("only full blocks are hashed") {
  BlockHasher h(4, {"llama", "", ""});
  std::vector<uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  CHECK(h.HashAll(tokens).size() == 1);
  tokens.push_back(8);
  CHECK(h.HashAll(tokens).size() == 2);
  CHECK(h.HashAll(std::vector<uint32_t>{1, 2, 3}).empty());
}

TEST_CASE("extending a sequence hashes only the new blocks and matches hashing it whole") {
  BlockHasher h(4, {"llama", "", ""});
  std::vector<uint32_t> tokens;
  std::vector<BlockHash> incremental;
  for (uint32_t i = 0; i < 41; ++i) {
    tokens.push_back(i * 7 + 1);
    h.Extend(tokens, &incremental);
    CHECK(incremental == h.HashAll(tokens));
  }
  CHECK(incremental.size() == 10);
}

TEST_CASE("a shared prefix gives shared hashes, and the first difference changes every later hash") {
  BlockHasher h(2, {"m", "", ""});
  std::vector<uint32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint32_t> b = {1, 2, 3, 4, 9, 6, 7, 8};
  auto ha = h.HashAll(a), hb = h.HashAll(b);
  CHECK(ha[0] == hb[0]);
  CHECK(ha[1] == hb[1]);
  CHECK(ha[2] != hb[2]);
  CHECK(ha[3] != hb[3]);  // same tokens, different parent
}

TEST_CASE("model, lora and salt each separate the cache namespace") {
  std::vector<uint32_t> t = {1, 2, 3, 4};
  auto base = BlockHasher(4, {"m", "", ""}).HashAll(t);
  CHECK(BlockHasher(4, {"m2", "", ""}).HashAll(t) != base);
  CHECK(BlockHasher(4, {"m", "l", ""}).HashAll(t) != base);
  CHECK(BlockHasher(4, {"m", "", "s"}).HashAll(t) != base);
  // The 0x00 separators keep "ab"+"" apart from "a"+"b".
  CHECK(HashSeed({"ab", "", ""}) != HashSeed({"a", "b", ""}));
  CHECK(HashSeed({"a", "b", ""}) != HashSeed({"a", "", "b"}));
}

TEST_CASE("block sizes must be powers of two, 1 included") {
  CHECK(IsValidBlockSize(2));
  CHECK(IsValidBlockSize(32));
  CHECK(IsValidBlockSize(256));
  CHECK_FALSE(IsValidBlockSize(0));
  CHECK(IsValidBlockSize(1));  // token-level KV
  CHECK_FALSE(IsValidBlockSize(24));
  auto r = BlockHasher::Make(24, {"m", "", ""});
  CHECK_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
}
