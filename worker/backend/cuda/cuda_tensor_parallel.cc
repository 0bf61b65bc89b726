// CudaBackend, tensor parallelism (cuda_backend.h invariant 8): each rank's start-up, the
// peers and their threads, the collectives of a step, and a block copier over every rank's
// pools. Rank 0 is the engine's backend; its peers are CudaBackends that hold their shards.
// Thread-compatible, as CudaBackend: the engine thread calls rank 0, which runs each peer on
// that peer's thread.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <utility>

#include "common/log.h"
#include "kernels/tensor_parallel.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {
namespace {

// Copies each block on every rank: a block id names the same tokens in every rank's pools.
class RankCopier final : public kv::BlockCopier {
 public:
  explicit RankCopier(std::vector<kv::BlockCopier*> ranks) : ranks_(std::move(ranks)) {}
  void Copy(std::span<const kv::BlockCopy> copies) override {
    for (kv::BlockCopier* r : ranks_) r->Copy(copies);
  }

 private:
  std::vector<kv::BlockCopier*> ranks_;  // each rank's CudaBlockCopier (owned by the rank)
};

}  // namespace

Status CudaBackend::InitRank(const model::Checkpoint& checkpoint) {
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  cudaDeviceProp prop{};
  KVF_CUDA_RETURN(cudaGetDeviceProperties(&prop, options_.device));
  num_sms_ = prop.multiProcessorCount;
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVF_ASSIGN_OR_RETURN(gemm_, LtGemm::Make());
  KVF_RETURN_IF_ERROR(LoadWeights(checkpoint));
  return AllocateBuffers();
}

Status CudaBackend::MakePeers(const model::Checkpoint& checkpoint, std::span<const int> devices) {
  for (int32_t r = 1; r < shard_.ranks; ++r) {
    BackendOptions o = options_;
    o.device = devices[static_cast<size_t>(r)];
    std::unique_ptr<CudaBackend> p(new CudaBackend(o));
    p->config_ = config_;
    p->max_context_ = max_context_;
    p->rope_ = rope_;
    p->tuning_ = tuning_;
    p->shard_ = ShardOf(config_, shard_.ranks, r);
    const Status st = p->InitRank(checkpoint);
    if (!st.ok()) return st.WithContext("tensor-parallel rank " + std::to_string(r) + " on device " + std::to_string(o.device));
    peers_.push_back(std::move(p));
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  // The communicator before the KV budget is taken from free memory: NCCL's buffers count.
  const int64_t reduce = static_cast<int64_t>(options_.max_num_tokens) * config_.hidden_size;
  const int64_t gather = logits_rows_ * vocab_rows_;
  KVF_ASSIGN_OR_RETURN(owned_comm_, CudaComm::Make(devices, reduce, gather));
  comm_ = owned_comm_.get();
  for (auto& p : peers_) p->comm_ = comm_;
  return CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice");
}

Result<uint64_t> CudaBackend::FreeForKv() const {
  // Ranks per device: ranks sharing a GPU (tp_devices "0,0") split its free memory.
  std::map<int, int> on_device;
  on_device[options_.device]++;
  for (const auto& p : peers_) on_device[p->options_.device]++;
  uint64_t least = UINT64_MAX;
  for (const auto& [device, ranks] : on_device) {
    size_t free_bytes = 0, total_bytes = 0;
    KVF_CUDA_RETURN(cudaSetDevice(device));
    KVF_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
    least = std::min<uint64_t>(least, free_bytes / static_cast<uint64_t>(ranks));
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  return least;
}

Status CudaBackend::StartRanks() {
  std::vector<kv::BlockCopier*> copiers = {copier_.get()};
  for (auto& p : peers_) {
    copiers.push_back(p->copier_.get());
    KVF_CUDA_RETURN(cudaSetDevice(p->options_.device));
    KVF_CUDA_RETURN(cudaStreamSynchronize(p->stream_));
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  rank_copier_ = std::make_unique<RankCopier>(std::move(copiers));
  rank_threads_ = std::make_unique<RankThreads>(shard_.ranks);
  return Status::Ok();
}

Status CudaBackend::TimedCollective(bool gather, const std::function<Status()>& collective) {
  if (!comm_debug_.time_collectives || shard_.rank != 0) return collective();
  const size_t first = comm_timed_.size() * 2;
  while (comm_events_.size() < first + 2) {
    cudaEvent_t e = nullptr;
    KVF_CUDA_RETURN(cudaEventCreate(&e));
    comm_events_.push_back(e);
  }
  KVF_CUDA_RETURN(cudaEventRecord(comm_events_[first], stream_));
  KVF_RETURN_IF_ERROR(collective());
  KVF_CUDA_RETURN(cudaEventRecord(comm_events_[first + 1], stream_));
  comm_timed_.emplace_back(gather, first);
  return Status::Ok();
}

Status CudaBackend::AllReduce(__nv_bfloat16* buf, int64_t count) {
  if (comm_ == nullptr || !comm_debug_.run_collectives) return Status::Ok();
  return TimedCollective(false, [&] { return comm_->AllReduceSum(shard_.rank, buf, count, stream_); });
}

Status CudaBackend::GatherLogits(int32_t n) {
  if (!comm_debug_.run_collectives) return Status::Ok();
  KVF_RETURN_IF_ERROR(TimedCollective(true, [&] {
    return comm_->AllGather(shard_.rank, vocab_local_, vocab_gathered_, n * vocab_rows_, stream_);
  }));
  KVF_CUDA_RETURN(kernels::LaunchGatherVocabSlices(vocab_gathered_, logits_, shard_.ranks, n,
                                                   static_cast<int32_t>(vocab_rows_),
                                                   static_cast<int32_t>(config_.vocab_size), stream_));
  return Status::Ok();
}

void CudaBackend::set_comm_debug(const CommDebug& d) {
  comm_debug_ = d;
  for (auto& p : peers_) p->comm_debug_ = d;
}

Result<CudaBackend::CommTimes> CudaBackend::TakeCommTimes() {
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
  CommTimes t;
  for (const auto& [gather, first] : comm_timed_) {
    float ms = 0;
    KVF_CUDA_RETURN(cudaEventElapsedTime(&ms, comm_events_[first], comm_events_[first + 1]));
    (gather ? t.gather_ms : t.all_reduce_ms) += ms;
    ++(gather ? t.gathers : t.all_reduces);
  }
  comm_timed_.clear();
  return t;
}

Status CudaBackend::RunRanks(const StepBatch& batch, StepOutput* out) {
  // Every rank runs the step on its own thread; rank 0's tokens go out.
  // (10) Every rank samples with the same masks: late ones are filled once, here, and the
  // ranks copy them as token_bitmasks (no overlap with the forward pass at N > 1).
  std::optional<StepBatch> filled;
  if (std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SequenceStep& s) { return s.late_token_bitmask; })) {
    const size_t words = static_cast<size_t>(allowed_words_);
    tp_masks_.resize(batch.seqs.size() * words);
    filled.emplace();
    filled->seqs = batch.seqs;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      if (!batch.seqs[i].late_token_bitmask) continue;
      const std::span<uint32_t> mask(tp_masks_.data() + i * words, words);
      KVF_RETURN_IF_ERROR(FillStepTokenBitmask(batch, i, mask));
      filled->seqs[i].late_token_bitmask = false;
      filled->seqs[i].token_bitmask = mask;
    }
  }
  const StepBatch& step = filled ? *filled : batch;
  std::vector<StepOutput> discard(peers_.size());
  return rank_threads_->Run([&](int r) {
    return r == 0 ? RunStep(step, out) : peers_[r - 1]->RunStep(step, &discard[r - 1]);
  });
}

}  // namespace kvfleet::backend::cuda
