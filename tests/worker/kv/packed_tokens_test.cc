#include "worker/kv/packed_tokens.h"

#include <doctest/doctest.h>

#include <random>

namespace kvfleet::kv {
namespace {

TEST_CASE("a vocabulary of V tokens is stored in the fewest bits that hold V - 1") {
  CHECK(PackedTokens::BitsForVocab(128'256) == 17);  // Llama 3
  CHECK(PackedTokens::BitsForVocab(32'000) == 15);   // Llama 2
  CHECK(PackedTokens::BitsForVocab(131'072) == 17);
  CHECK(PackedTokens::BitsForVocab(131'073) == 18);
  CHECK(PackedTokens::BitsForVocab(2) == 1);
  CHECK(PackedTokens::BitsForVocab(0) == 32);  // unknown: full width
}

TEST_CASE("packed blocks unpack to the same tokens at every width") {
  std::mt19937_64 rng(3);
  for (uint32_t bits = 1; bits <= 32; ++bits) {
    for (uint32_t B : {2u, 3u, 32u, 64u}) {
      const uint32_t vocab = bits == 32 ? 0 : (1u << bits);
      PackedTokens p(4, B, vocab);
      REQUIRE(p.bits() == bits);
      CHECK(p.stride() == (size_t{B} * bits + 7) / 8);
      std::vector<std::vector<TokenId>> blocks(4, std::vector<TokenId>(B));
      std::vector<uint8_t> buf(p.buffer_bytes());
      for (uint32_t e = 0; e < 4; ++e) {
        for (auto& t : blocks[e]) t = static_cast<TokenId>(rng() & ((uint64_t{1} << bits) - 1));
        REQUIRE(p.Pack(blocks[e], buf.data()));
        p.Set(e, buf.data());
      }
      for (uint32_t e = 0; e < 4; ++e) {
        std::vector<TokenId> back;
        p.Unpack(e, &back);
        CHECK(back == blocks[e]);
        REQUIRE(p.Pack(blocks[e], buf.data()));
        CHECK(p.Equals(e, buf.data()));
        CHECK(p.CommonPrefix(e, blocks[e]) == B);
      }
    }
  }
}

TEST_CASE("a token wider than the vocabulary's bits cannot be packed") {
  PackedTokens p(1, 4, 16);  // 4 bits
  std::vector<uint8_t> buf(p.buffer_bytes());
  CHECK(p.Pack(std::vector<TokenId>{1, 2, 15, 0}, buf.data()));
  CHECK_FALSE(p.Pack(std::vector<TokenId>{1, 2, 16, 0}, buf.data()));
  CHECK_FALSE(p.Pack(std::vector<TokenId>{1, 2, 3}, buf.data()));  // not a whole block
}

TEST_CASE("the common prefix stops at the first differing token") {
  PackedTokens p(1, 8, 1000);
  std::vector<uint8_t> buf(p.buffer_bytes());
  const std::vector<TokenId> block{5, 6, 7, 8, 9, 10, 11, 12};
  REQUIRE(p.Pack(block, buf.data()));
  p.Set(0, buf.data());
  CHECK(p.CommonPrefix(0, std::vector<TokenId>{5, 6, 7, 99}) == 3);
  CHECK(p.CommonPrefix(0, std::vector<TokenId>{5, 6}) == 2);
  CHECK(p.CommonPrefix(0, std::vector<TokenId>{4}) == 0);
}

}  // namespace
}  // namespace kvfleet::kv
