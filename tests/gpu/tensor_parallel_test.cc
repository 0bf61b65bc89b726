// The tensor-parallel kernels (kernels/tensor_parallel.h) against plain C++: the rank-ordered
// sum rounds once, the vocab-slice gather and embedding place every element, and the
// barrier holds one stream until the others arrive (the same-device communicator's pieces).
#include <doctest/doctest.h>

#include <cuda_bf16.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>

#include "kernels/bf16.h"
#include "kernels/tensor_parallel.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

TEST_CASE("the rank sum adds in rank order in fp32 and rounds once to bf16") {
  std::mt19937 rng(5);
  for (int ranks : {1, 2, 3, 8}) {
    for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
      CAPTURE(ranks);
      CAPTURE(count);
      std::vector<std::unique_ptr<DeviceBuffer<bf16_bits>>> in;
      std::vector<std::vector<bf16_bits>> host;
      RankInputs ptrs;
      for (int k = 0; k < ranks; ++k) {
        host.push_back(gputest::RandomBf16(static_cast<size_t>(count), rng, -4.f, 4.f));
        in.push_back(std::make_unique<DeviceBuffer<bf16_bits>>(host.back()));
        ptrs.in[k] = in.back()->as<__nv_bfloat16>();
      }
      DeviceBuffer<bf16_bits> out(static_cast<size_t>(count));
      out.Poison();
      KVF_CUDA_OK(LaunchSumRanks(ptrs, ranks, out.as<__nv_bfloat16>(), count, nullptr));
      const std::vector<bf16_bits> got = out.Download();
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        float s = 0;
        for (int k = 0; k < ranks; ++k) s += Bf16ToFloat(host[k][i]);
        wrong += got[i] != FloatToBf16(s);
      }
      CHECK(wrong == 0);
    }
  }
  CHECK(LaunchSumRanks({}, kMaxTensorRanks + 1, nullptr, 4, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("gathered vocab slices land in their columns, the last rank's shorter slice included") {
  const int ranks = 4, rows = 3, vocab = 1001, slice = (vocab + ranks - 1) / ranks;  // last: 248 wide
  std::vector<float> gathered(static_cast<size_t>(ranks * rows * slice));
  for (size_t i = 0; i < gathered.size(); ++i) gathered[i] = static_cast<float>(i);
  DeviceBuffer<float> in(gathered), out(static_cast<size_t>(rows * vocab));
  out.Poison();
  KVF_CUDA_OK(LaunchGatherVocabSlices(in.get(), out.get(), ranks, rows, slice, vocab, nullptr));
  const std::vector<float> got = out.Download();
  int64_t wrong = 0;
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < vocab; ++v) {
      const int k = v / slice;
      wrong += got[static_cast<size_t>(r * vocab + v)] != gathered[static_cast<size_t>((k * rows + r) * slice + v - k * slice)];
    }
  }
  CHECK(wrong == 0);
  CHECK(LaunchGatherVocabSlices(in.get(), out.get(), ranks, rows, 10, vocab, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("a vocab slice's embedding copies the rows it holds and zeros the others") {
  const int hidden = 16, begin = 100, vocab = 50;
  std::mt19937 rng(9);
  const std::vector<bf16_bits> table = gputest::RandomBf16(static_cast<size_t>(vocab * hidden), rng);
  const std::vector<int32_t> ids = {100, 99, 149, 150, 120, -1};
  DeviceBuffer<bf16_bits> t(table), out(ids.size() * hidden);
  DeviceBuffer<int32_t> d_ids(ids);
  out.Poison();
  KVF_CUDA_OK(LaunchEmbeddingSlice(d_ids.get(), t.as<__nv_bfloat16>(), begin, vocab, out.as<__nv_bfloat16>(),
                                   static_cast<int32_t>(ids.size()), hidden, nullptr));
  const std::vector<bf16_bits> got = out.Download();
  for (size_t r = 0; r < ids.size(); ++r) {
    const bool held = ids[r] >= begin && ids[r] < begin + vocab;
    for (int i = 0; i < hidden; ++i) {
      const bf16_bits want = held ? table[static_cast<size_t>((ids[r] - begin) * hidden + i)] : bf16_bits{0};
      CHECK(got[r * hidden + i] == want);
    }
  }
}

TEST_CASE("the rank barrier holds a stream until every rank's stream has reached it") {
  // compute-sanitizer serialises kernels: two barrier kernels can never run at once there.
  if (const char* san = std::getenv("KVFLEET_UNDER_SANITIZER"); san != nullptr && *san != 0) {
    MESSAGE("SKIPPED under compute-sanitizer " << san << ": the barrier needs two kernels running at once");
    return;
  }
  // Rank 1's stream is held behind a host-side event; rank 0's copy after its barrier must
  // not run before rank 1 arrives, and both pass once it does, several times over.
  DeviceBuffer<unsigned long long> sync(4);
  KVF_CUDA_OK(cudaMemset(sync.get(), 0, 4 * sizeof(unsigned long long)));
  cudaStream_t s0 = nullptr, s1 = nullptr;
  KVF_CUDA_OK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  KVF_CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  DeviceBuffer<int32_t> flag(1);
  int32_t* pinned = nullptr;
  KVF_CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int32_t)));
  for (int round = 1; round <= 3; ++round) {
    *pinned = 0;
    KVF_CUDA_OK(cudaMemset(flag.get(), 0, sizeof(int32_t)));
    KVF_CUDA_OK(LaunchRankBarrier(sync.get(), sync.get() + 2, 0, 2, s0));
    KVF_CUDA_OK(cudaMemcpyAsync(pinned, flag.get(), sizeof(int32_t), cudaMemcpyDeviceToHost, s0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(cudaStreamQuery(s0) == cudaErrorNotReady);  // waiting for rank 1
    const int32_t v = round;
    KVF_CUDA_OK(cudaMemcpyAsync(flag.get(), &v, sizeof(int32_t), cudaMemcpyHostToDevice, s1));
    KVF_CUDA_OK(cudaStreamSynchronize(s1));
    KVF_CUDA_OK(LaunchRankBarrier(sync.get(), sync.get() + 2, 1, 2, s1));
    KVF_CUDA_OK(cudaStreamSynchronize(s0));
    KVF_CUDA_OK(cudaStreamSynchronize(s1));
    CHECK(*pinned == round);  // rank 0 read what rank 1 wrote before arriving
  }
  cudaFreeHost(pinned);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
}

}  // namespace
}  // namespace kvfleet::kernels
