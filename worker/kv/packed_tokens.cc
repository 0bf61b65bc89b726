#include "worker/kv/packed_tokens.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>
#include <cstring>

namespace kvfleet::kv {

namespace {
// 32 tokens of W bits are exactly W 32-bit words. With W a constant and the loop unrolled,
// every shift and flush is fixed at compile time: this is the hot path of Match and Store.
// Returns the OR of the tokens, for the caller's range check.
template <uint32_t W>
TokenId PackGroup32(const TokenId* t, uint8_t* out) {
  uint64_t acc = 0;
  uint32_t have = 0;
  TokenId any = 0;
#pragma GCC unroll 32
  for (int i = 0; i < 32; ++i) {
    any |= t[i];
    acc |= uint64_t{t[i]} << have;
    have += W;
    if (have >= 32) {
      const uint32_t word = static_cast<uint32_t>(acc);
      std::memcpy(out, &word, 4);
      out += 4;
      acc >>= 32;
      have -= 32;
    }
  }
  return any;
}
using PackGroupFn = TokenId (*)(const TokenId*, uint8_t*);
template <size_t... I>
constexpr std::array<PackGroupFn, 33> MakePackGroups(std::index_sequence<I...>) {
  return {nullptr, &PackGroup32<static_cast<uint32_t>(I + 1)>...};
}
constexpr std::array<PackGroupFn, 33> kPackGroup32 = MakePackGroups(std::make_index_sequence<32>{});
}  // namespace

uint32_t PackedTokens::BitsForVocab(uint32_t vocab_size) {
  if (vocab_size == 0) return 32;
  return std::max<uint32_t>(1, static_cast<uint32_t>(std::bit_width(vocab_size - 1)));
}

PackedTokens::PackedTokens(uint32_t num_entries, uint32_t block_size, uint32_t vocab_size)
    : block_size_(block_size),
      bits_(BitsForVocab(vocab_size)),
      stride_((size_t{block_size} * bits_ + 7) / 8),
      limit_(uint64_t{1} << bits_),
      bytes_(size_t{num_entries} * stride_ + kSlack, 0) {}

bool PackedTokens::Pack(std::span<const TokenId> tokens, uint8_t* out) const {
  if (tokens.size() != block_size_) return false;
  if (block_size_ % 32 == 0) {
    // A token too wide spills into its neighbours' bits: the output is garbage, and refused.
    TokenId any = 0;
    for (size_t g = 0; g < block_size_; g += 32) any |= kPackGroup32[bits_](&tokens[g], out + g / 8 * bits_);
    return any < limit_;
  }
  uint64_t acc = 0;
  uint32_t have = 0;  // bits in acc
  for (const TokenId t : tokens) {
    if (t >= limit_) return false;
    acc |= uint64_t{t} << have;
    have += bits_;
    if (have >= 32) {
      const uint32_t word = static_cast<uint32_t>(acc);
      std::memcpy(out, &word, 4);
      out += 4;
      acc >>= 32;
      have -= 32;
    }
  }
  if (have > 0) {
    const uint32_t word = static_cast<uint32_t>(acc);
    std::memcpy(out, &word, 4);  // within buffer_bytes(); bytes past stride() are ignored
  }
  return true;
}

namespace {
// Reads `bits`-wide fields back from what Pack wrote: 32-bit little-endian words, low bits
// first. Reads whole words, so it may touch up to 3 bytes past the last field's end (within
// buffer_bytes()).
class FieldReader {
 public:
  FieldReader(const uint8_t* in, uint32_t bits) : in_(in), bits_(bits), mask_((uint64_t{1} << bits) - 1) {}

  TokenId Next() {
    if (have_ < bits_) {
      uint32_t word;
      std::memcpy(&word, in_, 4);
      in_ += 4;
      acc_ |= uint64_t{word} << have_;
      have_ += 32;
    }
    const auto v = static_cast<TokenId>(acc_ & mask_);
    acc_ >>= bits_;
    have_ -= bits_;
    return v;
  }

 private:
  const uint8_t* in_;
  const uint32_t bits_;
  const uint64_t mask_;
  uint64_t acc_ = 0;
  uint32_t have_ = 0;
};
}  // namespace

void PackedTokens::UnpackFrom(const uint8_t* in, TokenId* out) const {
  FieldReader reader(in, bits_);
  for (uint32_t i = 0; i < block_size_; ++i) out[i] = reader.Next();
}

uint32_t PackedTokens::CommonPrefix(uint32_t e, std::span<const TokenId> want) const {
  // UnpackFrom with an early exit: partial reuse scans many children that differ at once.
  FieldReader reader(data(e), bits_);
  const uint32_t n = std::min<uint32_t>(block_size_, static_cast<uint32_t>(want.size()));
  for (uint32_t i = 0; i < n; ++i) {
    if (reader.Next() != want[i]) return i;
  }
  return n;
}

void PackedTokens::Unpack(uint32_t e, TokenId* out) const { UnpackFrom(data(e), out); }

void PackedTokens::Unpack(uint32_t e, std::vector<TokenId>* out) const {
  out->resize(block_size_);
  UnpackFrom(data(e), out->data());
}

bool PackedTokens::Equals(uint32_t e, const uint8_t* packed) const {
  return std::memcmp(data(e), packed, stride_) == 0;
}

void PackedTokens::Set(uint32_t e, const uint8_t* packed) { std::memcpy(&bytes_[size_t{e} * stride_], packed, stride_); }

void PackedTokens::Copy(uint32_t from, uint32_t to) {
  std::memcpy(&bytes_[size_t{to} * stride_], &bytes_[size_t{from} * stride_], stride_);
}

}  // namespace kvfleet::kv
