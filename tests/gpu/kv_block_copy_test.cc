// Batched KV block copy: device -> pinned host (offload), pinned host -> device (onboard) and
// device -> device, many non-contiguous blocks in one launch; other blocks stay untouched.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

#include "kernels/kv_block_copy.h"
#include "kernels/paged_kv.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

TEST_CASE("offload, onboard and device copies move exactly the named blocks") {
  std::mt19937 rng(31);
  // {1, 1, 1, 64}: token-level KV, 256-byte blocks of one token; elem_bytes 1: fp8 e4m3
  // blocks (half the bytes) copy as bytes the same way.
  for (PagedKvLayout layout : {PagedKvLayout{2, 2, 16, 64}, PagedKvLayout{32, 8, 16, 128}, PagedKvLayout{1, 1, 2, 64},
                               PagedKvLayout{1, 1, 1, 64}, PagedKvLayout{32, 8, 16, 128, 1},
                               PagedKvLayout{1, 1, 1, 64, 1}}) {
    CAPTURE(layout.BlockBytes());
    const int blocks = 24;
    const size_t bytes = size_t(blocks) * layout.BlockBytes();
    std::vector<uint8_t> dev_init(bytes), host_init(bytes);
    for (auto& b : dev_init) b = static_cast<uint8_t>(rng());
    for (auto& b : host_init) b = static_cast<uint8_t>(rng());
    DeviceBuffer<uint8_t> dev(dev_init);
    uint8_t* host = nullptr;
    KVF_CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), bytes));
    std::memcpy(host, host_init.data(), bytes);
    // Offload device blocks {3, 17, 0, 9} into host blocks {20, 1, 7, 2}.
    std::vector<int32_t> off = {3, 20, 17, 1, 0, 7, 9, 2};
    DeviceBuffer<int32_t> doff(off);
    KVF_CUDA_OK(LaunchKvBlockCopy(dev.get(), host, doff.get(), 4, layout.BlockBytes(), nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> host_expect = host_init;
    for (int i = 0; i < 4; ++i)
      std::memcpy(host_expect.data() + off[2 * i + 1] * layout.BlockBytes(),
                  dev_init.data() + off[2 * i] * layout.BlockBytes(), layout.BlockBytes());
    CHECK(std::memcmp(host, host_expect.data(), bytes) == 0);
    // Onboard host blocks {20, 5} into device blocks {11, 23}; copy device 4 -> 6.
    std::vector<int32_t> on = {20, 11, 5, 23};
    DeviceBuffer<int32_t> don(on);
    KVF_CUDA_OK(LaunchKvBlockCopy(host, dev.get(), don.get(), 2, layout.BlockBytes(), nullptr));
    std::vector<int32_t> d2d = {4, 6};
    DeviceBuffer<int32_t> dd(d2d);
    KVF_CUDA_OK(LaunchKvBlockCopy(dev.get(), dev.get(), dd.get(), 1, layout.BlockBytes(), nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> dev_expect = dev_init;
    auto blk = [&](std::vector<uint8_t>& v, int b) { return v.data() + size_t(b) * layout.BlockBytes(); };
    std::memcpy(blk(dev_expect, 11), blk(host_expect, 20), layout.BlockBytes());
    std::memcpy(blk(dev_expect, 23), blk(host_expect, 5), layout.BlockBytes());
    std::memcpy(blk(dev_expect, 6), blk(dev_init, 4), layout.BlockBytes());
    CHECK(dev.Download() == dev_expect);
    KVF_CUDA_OK(cudaFreeHost(host));
  }
}

}  // namespace
}  // namespace kvfleet::kernels
