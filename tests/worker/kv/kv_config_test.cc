#include "worker/kv/kv_config.h"

#include <doctest/doctest.h>

namespace kvfleet::kv {
namespace {

KvCacheConfig Model() {
  KvCacheConfig c;
  c.num_layers = 4;
  c.num_kv_heads = {8};
  c.head_dim = 128;
  c.dtype_bytes = 2;
  c.max_seq_len = 4096;
  c.block_size = 32;
  c.device_bytes = uint64_t{1} << 30;
  return c;
}

TEST_CASE("a full-attention model has one pool sized from the byte budget") {
  const auto pools = ComputePools(Model());
  REQUIRE(pools.ok());
  REQUIRE(pools->size() == 1);
  const uint64_t per_block = 4ull * 2 * 8 * 128 * 2 * 32;  // layers x K,V x heads x dim x bytes x B
  CHECK((*pools)[0].bytes_per_block == per_block);
  CHECK((*pools)[0].device_blocks == (uint64_t{1} << 30) / per_block);
  CHECK((*pools)[0].host_blocks == 0);
}

TEST_CASE("memory is split between pools by bytes per token x window x layers") {
  auto c = Model();
  c.attention_windows = {1024, 0};  // repeated: layers 0, 2 windowed; 1, 3 full
  const auto pools = ComputePools(c);
  REQUIRE(pools.ok());
  REQUIRE(pools->size() == 2);
  CHECK((*pools)[0].window == 0);
  CHECK((*pools)[0].layers == std::vector<uint32_t>{1, 3});
  CHECK((*pools)[1].window == 1024);
  // Same bytes per block; windows 4096 vs 1024: a 4:1 split.
  const double ratio = static_cast<double>((*pools)[0].device_blocks) / (*pools)[1].device_blocks;
  CHECK(ratio == doctest::Approx(4.0).epsilon(0.01));
}

TEST_CASE("layers with different kv head counts get different pools") {
  auto c = Model();
  c.num_kv_heads = {8, 4};
  const auto pools = ComputePools(c);
  REQUIRE(pools.ok());
  CHECK(pools->size() == 2);
}

TEST_CASE("a budget too small for one block is refused") {
  auto c = Model();
  c.device_bytes = 1000;
  CHECK(ComputePools(c).status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("the device budget can be a fraction of free memory") {
  CHECK(DeviceBudgetFromFreeMemory(1000, 0.9) == 900);
  CHECK(DeviceBudgetFromFreeMemory(1000, 1.5) == 1000);
}

TEST_CASE("block sizes must be powers of two, 1 (token-level KV) included") {
  auto c = Model();
  c.block_size = 2;
  CHECK(c.Validate().ok());
  c.block_size = 1;
  CHECK(c.Validate().ok());
  CHECK(c.EventBlockSize() == config::kTokenKvRoutingBlockSize);
  c.block_size = 24;
  CHECK(c.Validate().message().find("block_size 24 is not a power of two") != std::string::npos);
  c.block_size = 0;
  CHECK_FALSE(c.Validate().ok());
}

TEST_CASE("the routing block size is a power of two no smaller than the block size") {
  auto c = Model();
  c.block_size = 16;
  CHECK(c.EventBlockSize() == 16);
  c.routing_block_size = 64;
  CHECK(c.Validate().ok());
  CHECK(c.EventBlockSize() == 64);
  c.routing_block_size = 8;
  CHECK(c.Validate().message().find("routing_block_size 8") != std::string::npos);
  c.routing_block_size = 48;
  CHECK_FALSE(c.Validate().ok());
}

TEST_CASE("attention settings that cannot work are refused") {
  auto c = Model();
  c.attention_chunk_size = 48;  // not a multiple of B = 32
  CHECK(c.Validate().message().find("not a multiple of block_size") != std::string::npos);
  c.attention_chunk_size = 64;
  CHECK(c.Validate().ok());
  c.sink_tokens = 4;  // chunked queries never see sinks
  c.attention_windows = {1024};
  CHECK(c.Validate().message().find("do not combine with attention_chunk_size") != std::string::npos);
  c.attention_chunk_size = 0;
  CHECK(c.Validate().ok());
  c.sink_tokens = 2048;  // more sinks than the window holds
  CHECK(c.Validate().message().find("shorter than its 2048 sink tokens") != std::string::npos);
  c.sink_tokens = 4;
  c.attention_windows = {4096};  // as long as max_seq_len: full attention, so no window for the sinks
  CHECK(c.Validate().message().find("need a layer with a window") != std::string::npos);
  c.sink_tokens = 0;
  c.dense_context = true;
  CHECK_FALSE(c.Validate().ok());
}

TEST_CASE("windowed pools carry their sinks and dense context; full-attention pools neither") {
  auto c = Model();
  c.attention_windows = {1024, 0};
  c.sink_tokens = 4;
  c.dense_context = true;
  const auto pools = ComputePools(c);
  REQUIRE(pools.ok());
  REQUIRE(pools->size() == 2);
  CHECK((*pools)[0].window == 0);
  CHECK((*pools)[0].sink_tokens == 0);
  CHECK_FALSE((*pools)[0].dense_context);
  CHECK((*pools)[1].sink_tokens == 4);
  CHECK((*pools)[1].dense_context);
}

}  // namespace
}  // namespace kvfleet::kv
