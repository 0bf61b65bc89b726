#include "worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "common/block_hash.h"
#include "common/check.h"
#include "common/log.h"
#include "kernels/gemv.h"
#include "kernels/launch.h"
#include "kernels/paged_attention_generic.h"
#include "kernels/paged_decode.h"
#include "kernels/paged_prefill.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/small_kernels.h"
#include "worker/backend/cuda/cuda_util.h"
#include "worker/model/checkpoint.h"

namespace kvfleet::backend::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using bf16 = __nv_bfloat16;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Alignment of every array in the staging buffer (16 bytes: vector loads in kernels).
constexpr size_t kStagingAlign = 16;

// Bump allocation of one step's metadata in the pinned staging buffer; each array's
// device address is the same offset in the device mirror.
class Packer {
 public:
  Packer(std::byte* host, std::byte* dev, size_t capacity) : host_(host), dev_(dev), capacity_(capacity) {}
  template <typename T>
  std::pair<T*, T*> Take(size_t n) {  // (host, device)
    used_ = (used_ + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
    KVF_CHECK(used_ + n * sizeof(T) <= capacity_) << "cuda backend: step metadata exceeds its staging buffer";
    std::pair<T*, T*> p{reinterpret_cast<T*>(host_ + used_), reinterpret_cast<T*>(dev_ + used_)};
    used_ += n * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  std::byte* host_;
  std::byte* dev_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace

// Device pointers into the uploaded staging buffer, for one step.
struct CudaBackend::StepMeta {
  int32_t num_tokens = 0, num_seqs = 0;
  bool all_decode = false;      // every sequence brings exactly one token
  int32_t max_q_len = 0;        // longest chunk of the step
  int32_t max_seq_len = 0;      // longest sequence end of the step
  int32_t table_stride = 0;     // block-table entries per sequence in this step
  const int32_t* ids = nullptr;        // [T]
  const int32_t* positions = nullptr;  // [T]
  const int32_t* row_lens = nullptr;   // [T] position + 1
  const int32_t* row_seq = nullptr;    // [T] sequence of each row
  std::vector<const int32_t*> slots;   // [pool] → [T]
  std::vector<const int32_t*> tables;  // [pool] → [S][table_stride]
  const int32_t* cu_q_lens = nullptr;  // [S + 1]
  const int32_t* seq_lens = nullptr;   // [S]
  std::vector<int32_t> row0;           // host: first row of each sequence, [S + 1]
  std::vector<int32_t> end_pos;        // host: [S] sequence end positions
};

CudaBackend::CudaBackend(const BackendOptions& options) : ModelBackendBase(options) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  copier_.reset();
  gemm_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (void* p : host_allocations_) cudaFreeHost(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

template <typename T>
Result<T*> CudaBackend::DeviceAlloc(size_t count) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T));
  if (e != cudaSuccess) {
    return ResourceExhausted("cuda backend: cannot allocate " + std::to_string(count * sizeof(T)) +
                             " bytes of device memory: " + cudaGetErrorString(e));
  }
  allocations_.push_back(p);
  return static_cast<T*>(p);
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Make(const BackendOptions& options) {
  const auto t0 = Clock::now();
  if (!IsValidBlockSize(static_cast<uint32_t>(options.block_size)) || options.block_size > 256) {
    return InvalidArgument("cuda backend: block_size " + std::to_string(options.block_size) +
                           " is not a power of two in [2, 256]");
  }
  if (options.max_num_tokens <= 0 || options.max_batch_size <= 0) {
    return InvalidArgument("cuda backend: max_num_tokens and max_batch_size must be > 0");
  }
  if (options.sink_tokens < 0 || (options.sink_tokens > 0 && options.streaming_window <= 0)) {
    return InvalidArgument("cuda backend: sink_tokens > 0 needs streaming_window > 0");
  }
  if (options.tensor_parallel != 1) {
    return Unimplemented("cuda backend: tensor_parallel " + std::to_string(options.tensor_parallel) +
                         " (one GPU per worker for now)");
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(options));
  auto graphs = options.extra.find("cuda_graphs");
  b->use_graphs_ = graphs == options.extra.end() || graphs->second != "0";
  if (auto gemv = options.extra.find("gemv_max_rows"); gemv != options.extra.end()) {
    char* end = nullptr;
    const long v = std::strtol(gemv->second.c_str(), &end, 10);
    if (end == gemv->second.c_str() || *end != '\0' || v < 0 || v > kernels::kGemvMaxRows) {
      return InvalidArgument("cuda backend: gemv_max_rows must be an integer in [0, " +
                             std::to_string(kernels::kGemvMaxRows) + "], got '" + gemv->second + "'");
    }
    b->gemv_max_rows_ = static_cast<int32_t>(v);
  }
  if (auto f = options.extra.find("gemv_fusion"); f != options.extra.end()) {
    if (f->second.size() != 1 || f->second[0] < '0' || f->second[0] > '4') {
      return InvalidArgument("cuda backend: gemv_fusion must be 0..4, got '" + f->second + "'");
    }
    b->gemv_fusion_ = f->second[0] - '0';
  }
  if (auto pdl = options.extra.find("pdl"); pdl != options.extra.end()) {
    if (pdl->second != "0" && pdl->second != "1") {
      return InvalidArgument("cuda backend: pdl must be 0 or 1, got '" + pdl->second + "'");
    }
    kernels::SetProgrammaticDependentLaunch(pdl->second == "1");  // (6)
  }
  KVF_CUDA_RETURN(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  KVF_CUDA_RETURN(cudaGetDeviceProperties(&prop, options.device));
  b->num_sms_ = prop.multiProcessorCount;
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));

  KVF_ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(options.model_dir));
  b->config_ = checkpoint->config();
  const model::ModelConfig& c = b->config_;
  if (c.head_dim % 16 != 0 || c.head_dim > 256) {
    return Unimplemented("cuda backend: head_dim " + std::to_string(c.head_dim) +
                         " (the kernels take multiples of 16 up to 256)");
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return Unimplemented("cuda backend: hidden_size and intermediate_size must be multiples of 8");
  }
  b->max_context_ = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  if (b->max_context_ > INT32_MAX / 2) return InvalidArgument("cuda backend: max_context too large");
  const auto t_open = Clock::now();
  KVF_ASSIGN_OR_RETURN(b->gemm_, LtGemm::Make());
  KVF_RETURN_IF_ERROR(b->LoadWeights(*checkpoint));
  const auto t_weights = Clock::now();
  KVF_RETURN_IF_ERROR(b->AllocateBuffers());
  size_t free_bytes = 0, total_bytes = 0;
  KVF_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
  KVF_RETURN_IF_ERROR(b->AllocateKv(free_bytes));
  KVF_CUDA_RETURN(cudaStreamSynchronize(b->stream_));
  const auto t_end = Clock::now();

  uint64_t kv_bytes = 0;
  std::string pools;  // "pool 0: N blocks (T tokens, H on the host tier); ..."
  for (size_t i = 0; i < b->pools_.size(); ++i) {
    const KvPoolInfo& p = b->pools_[i];
    kv_bytes += p.bytes_per_block * static_cast<uint64_t>(p.device_blocks);
    pools += (i > 0 ? "; pool " : "pool ") + std::to_string(i) + ": " + std::to_string(p.device_blocks) + " blocks (" +
             std::to_string(p.device_blocks * options.block_size) + " tokens, window " + std::to_string(p.window) +
             ", " + std::to_string(p.host_blocks) + " host blocks)";
  }
  const double load_s = Seconds(t_open, t_weights);
  Logger("model")->info(
      "cuda backend: {} ({}, {} layers) on {} ({} SMs) ready in {:.2f} s: {:.2f} GB of bf16 weights uploaded in "
      "{:.2f} s ({:.2f} GB/s); KV cache {:.2f} GiB of {}-token blocks: {}",
      options.model_dir, model::ArchitectureName(c.architecture), c.num_layers, prop.name, b->num_sms_,
      Seconds(t0, t_end), static_cast<double>(b->weight_bytes_) * 1e-9, load_s,
      load_s > 0 ? static_cast<double>(b->weight_bytes_) * 1e-9 / load_s : 0.0,
      static_cast<double>(kv_bytes) / (1ull << 30), options.block_size, pools);
  return b;
}

Status CudaBackend::LoadWeights(const model::Checkpoint& checkpoint) {
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t qkv_rows = c.q_size() + 2 * c.kv_size();
  std::vector<uint16_t> converted;  // host bf16 for fp32 / fp16 tensors
  // Copies tensor `name` to dst (bf16), converting on the host when it is not bf16.
  auto upload = [&](const std::string& name, bf16* dst) -> Status {
    const model::TensorView& t = checkpoint.tensor(name);
    const size_t n = static_cast<size_t>(t.numel());
    const void* src = t.bytes.data();
    if (t.dtype != model::DType::kBF16) {
      converted.resize(n);
      const std::byte* raw = t.bytes.data();
      for (size_t i = 0; i < n; ++i) {
        float f;
        if (t.dtype == model::DType::kF32) {
          std::memcpy(&f, raw + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, raw + 2 * i, 2);
          f = model::F16ToF32(h);
        }
        converted[i] = model::F32ToBF16(f);
      }
      src = converted.data();
    }
    KVF_CUDA_RETURN(cudaMemcpy(dst, src, n * sizeof(bf16), cudaMemcpyHostToDevice));
    weight_bytes_ += n * sizeof(bf16);
    return Status::Ok();
  };
  model::LoadProgress progress(checkpoint.specs().size(), checkpoint.weight_bytes());
  auto load = [&](const std::string& name, int64_t count, bf16** out) -> Status {
    KVF_ASSIGN_OR_RETURN(*out, DeviceAlloc<bf16>(static_cast<size_t>(count)));
    KVF_RETURN_IF_ERROR(upload(name, *out));
    progress.Add(1, checkpoint.tensor(name).bytes.size());
    return Status::Ok();
  };
  // Stacks several tensors into one allocation of `rows` rows of `cols`.
  auto stack = [&](std::initializer_list<std::string> names, int64_t rows, int64_t cols, bf16** out) -> Status {
    KVF_ASSIGN_OR_RETURN(*out, DeviceAlloc<bf16>(static_cast<size_t>(rows * cols)));
    bf16* at = *out;
    for (const std::string& n : names) {
      KVF_RETURN_IF_ERROR(upload(n, at));
      at += checkpoint.tensor(n).numel();
      progress.Add(1, checkpoint.tensor(n).bytes.size());
    }
    return Status::Ok();
  };

  KVF_RETURN_IF_ERROR(load("model.embed_tokens.weight", V * H, &embed_));
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[l];
    auto name = [l](std::string_view s) { return model::LayerTensorName(l, s); };
    KVF_RETURN_IF_ERROR(load(name("input_layernorm.weight"), H, &w.input_norm));
    KVF_RETURN_IF_ERROR(stack({name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
                               name("self_attn.v_proj.weight")},
                              qkv_rows, H, &w.qkv));
    if (c.attention_bias) {
      KVF_RETURN_IF_ERROR(stack(
          {name("self_attn.q_proj.bias"), name("self_attn.k_proj.bias"), name("self_attn.v_proj.bias")}, qkv_rows,
          1, &w.qkv_bias));
    }
    KVF_RETURN_IF_ERROR(load(name("self_attn.o_proj.weight"), H * c.q_size(), &w.o));
    if (c.attention_out_bias) KVF_RETURN_IF_ERROR(load(name("self_attn.o_proj.bias"), H, &w.o_bias));
    KVF_RETURN_IF_ERROR(load(name("post_attention_layernorm.weight"), H, &w.post_norm));
    KVF_RETURN_IF_ERROR(stack({name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")}, 2 * I, H, &w.gate_up));
    KVF_RETURN_IF_ERROR(load(name("mlp.down_proj.weight"), H * I, &w.down));
    if (c.mlp_bias) {
      KVF_RETURN_IF_ERROR(stack({name("mlp.gate_proj.bias"), name("mlp.up_proj.bias")}, 2 * I, 1, &w.gate_up_bias));
      KVF_RETURN_IF_ERROR(load(name("mlp.down_proj.bias"), H, &w.down_bias));
    }
  }
  KVF_RETURN_IF_ERROR(load("model.norm.weight", H, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    KVF_RETURN_IF_ERROR(load("lm_head.weight", V * H, &lm_head_));
  }

  // RoPE frequencies, as the cpu backend computes them (llama3 and linear scaling).
  kernels::RopeConfig rc;
  rc.head_dim = static_cast<int>(c.head_dim);
  rc.theta = c.rope_theta;
  const model::RopeScaling& rs = c.rope_scaling;
  if (rs.type == model::RopeScaling::Type::kLlama3) {
    rc.llama3_factor = rs.factor;
    rc.llama3_low_freq_factor = rs.low_freq_factor;
    rc.llama3_high_freq_factor = rs.high_freq_factor;
    rc.llama3_original_max_position = static_cast<int>(rs.original_max_position_embeddings);
  }
  std::vector<float> inv_freq = kernels::RopeInvFreq(rc);
  if (rs.type == model::RopeScaling::Type::kLinear) {
    for (float& f : inv_freq) f = static_cast<float>(f / rs.factor);
  }
  KVF_ASSIGN_OR_RETURN(inv_freq_, DeviceAlloc<float>(inv_freq.size()));
  KVF_CUDA_RETURN(cudaMemcpy(inv_freq_, inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaBackend::AllocateBuffers() {
  const model::ModelConfig& c = config_;
  const size_t T = static_cast<size_t>(options_.max_num_tokens);
  const size_t S = static_cast<size_t>(options_.max_batch_size);
  const size_t H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(c.intermediate_size);
  const size_t Q = static_cast<size_t>(c.q_size()), KV = static_cast<size_t>(c.kv_size());
  const size_t V = static_cast<size_t>(c.vocab_size);
  KVF_ASSIGN_OR_RETURN(resid_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(resid_alt_, DeviceAlloc<bf16>(std::min<size_t>(T, kernels::kGemvMaxRows) * H));
  KVF_ASSIGN_OR_RETURN(xn_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(tmp_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(qkv_, DeviceAlloc<bf16>(T * (Q + 2 * KV)));
  KVF_ASSIGN_OR_RETURN(q_, DeviceAlloc<bf16>(T * Q));
  KVF_ASSIGN_OR_RETURN(attn_, DeviceAlloc<bf16>(T * Q));
  KVF_ASSIGN_OR_RETURN(gate_up_, DeviceAlloc<bf16>(T * 2 * I));
  KVF_ASSIGN_OR_RETURN(act_, DeviceAlloc<bf16>(T * I));
  logits_rows_ = std::max<int64_t>(options_.max_batch_size, config::kMinLogitsRows);
  KVF_ASSIGN_OR_RETURN(head_in_, DeviceAlloc<bf16>(static_cast<size_t>(logits_rows_) * H));
  KVF_ASSIGN_OR_RETURN(logits_, DeviceAlloc<float>(static_cast<size_t>(logits_rows_) * V));

  // Decode split-K workspace: the largest any step may need (sequences up to
  // max_batch_size, lengths up to max_context); Attention() widens partitions if a step
  // ever needed more.
  const int32_t max_ctx = static_cast<int32_t>(max_context_);
  for (int32_t n = 1; n <= options_.max_batch_size; ++n) {
    for (int32_t len = 128;; len = std::min(len * 2, max_ctx)) {
      kernels::PagedDecodeParams p;
      p.layout.head_dim = static_cast<int32_t>(c.head_dim);
      p.layout.num_kv_heads = static_cast<int32_t>(c.num_kv_heads);
      p.num_seqs = n;
      p.num_q_heads = static_cast<int32_t>(c.num_heads);
      p.max_seq_len = len;
      p.partition_size = kernels::PagedDecodeChoosePartition(n, p.num_q_heads, p.layout.num_kv_heads, len, num_sms_);
      decode_workspace_bytes_ = std::max(decode_workspace_bytes_, kernels::PagedDecodeWorkspaceBytes(p));
      if (len >= max_ctx) break;
    }
  }
  KVF_ASSIGN_OR_RETURN(decode_workspace_, DeviceAlloc<float>(decode_workspace_bytes_ / sizeof(float) + 1));

  // Step metadata, worst case: ids, positions, row lengths, row sequences, head rows [T]; slots [pools][T];
  // tables [pools][S][max blocks]; cu_q_lens, seq_lens, sampling settings [S]. Pools are
  // at most one per distinct layer window.
  std::set<int64_t> windows(c.layer_window.begin(), c.layer_window.end());
  const size_t max_pools = windows.size() + 1;
  const size_t max_blocks = static_cast<size_t>((max_context_ + options_.block_size - 1) / options_.block_size);
  staging_bytes_ = (5 * T + max_pools * T + max_pools * S * max_blocks + 2 * S + 1) * sizeof(int32_t) +
                   S * (2 * sizeof(float) + sizeof(int32_t) + 2 * sizeof(uint64_t)) +
                   (16 + 4 * max_pools) * kStagingAlign;
  void* h = nullptr;
  KVF_CUDA_RETURN(cudaHostAlloc(&h, staging_bytes_, cudaHostAllocDefault));
  host_allocations_.push_back(h);
  staging_host_ = static_cast<std::byte*>(h);
  KVF_ASSIGN_OR_RETURN(staging_dev_, DeviceAlloc<std::byte>(staging_bytes_));
  KVF_CUDA_RETURN(cudaHostAlloc(&h, S * sizeof(int32_t), cudaHostAllocDefault));
  host_allocations_.push_back(h);
  tokens_host_ = static_cast<int32_t*>(h);
  KVF_ASSIGN_OR_RETURN(tokens_dev_, DeviceAlloc<int32_t>(S));
  KVF_CUDA_RETURN(cudaHostAlloc(&h, static_cast<size_t>(logits_rows_) * V * sizeof(float), cudaHostAllocDefault));
  host_allocations_.push_back(h);
  logits_host_ = static_cast<float*>(h);
  return Status::Ok();
}

Status CudaBackend::AllocateKv(uint64_t free_after_buffers) {
  const model::ModelConfig& c = config_;
  kv::KvCacheConfig& kc = kv_config_;
  kc.num_layers = static_cast<uint32_t>(c.num_layers);
  kc.num_kv_heads = {static_cast<uint32_t>(c.num_kv_heads)};
  kc.head_dim = static_cast<uint32_t>(c.head_dim);
  kc.dtype_bytes = sizeof(bf16);
  for (int64_t w : c.layer_window) {
    kc.attention_windows.push_back(
        static_cast<uint32_t>(w == 0 && options_.sink_tokens > 0 ? options_.streaming_window : w));
  }
  kc.max_seq_len = static_cast<uint32_t>(max_context_);
  kc.sink_tokens = static_cast<uint32_t>(options_.sink_tokens);
  kc.attention_chunk_size = static_cast<uint32_t>(c.attention_chunk_size);
  kc.block_size = static_cast<uint32_t>(options_.block_size);
  if (options_.kv_cache_bytes > 0) {
    kc.device_bytes = options_.kv_cache_bytes;
  } else {
    const uint64_t usable = free_after_buffers > config::kReserveBytes ? free_after_buffers - config::kReserveBytes : 0;
    kc.device_bytes = kv::DeviceBudgetFromFreeMemory(usable, options_.kv_memory_fraction);
  }
  kc.host_bytes = options_.host_kv_bytes;
  kc.enable_offload = options_.host_kv_bytes > 0;
  if (options_.num_blocks > 0) KVF_RETURN_IF_ERROR(kv::SizeForBlocksPerPool(&kc, options_.num_blocks));
  KVF_RETURN_IF_ERROR(kc.Validate());
  KVF_ASSIGN_OR_RETURN(std::vector<kv::PoolLayout> layouts, kv::ComputePools(kc));
  std::vector<CudaBlockCopier::Pool> copier_pools;
  for (const kv::PoolLayout& l : layouts) {
    KvPoolInfo p = PoolInfoOf(l, c, options_, max_context_);
    const size_t elems = static_cast<size_t>(l.device_blocks) * (l.bytes_per_block / sizeof(bf16));
    KVF_ASSIGN_OR_RETURN(bf16 * dev, DeviceAlloc<bf16>(elems));
    // Zeroed so a stale NaN pattern can never reach a masked-out lane's arithmetic.
    KVF_CUDA_RETURN(cudaMemsetAsync(dev, 0, elems * sizeof(bf16), stream_));
    std::byte* host = nullptr;
    if (l.host_blocks > 0) {
      void* h = nullptr;
      const cudaError_t e = cudaHostAlloc(&h, static_cast<size_t>(l.host_blocks) * l.bytes_per_block, cudaHostAllocDefault);
      if (e != cudaSuccess) {
        return ResourceExhausted("cuda backend: cannot pin " +
                                 std::to_string(static_cast<uint64_t>(l.host_blocks) * l.bytes_per_block) +
                                 " bytes for the host KV tier: " + cudaGetErrorString(e));
      }
      host_allocations_.push_back(h);
      host = static_cast<std::byte*>(h);
    }
    device_kv_.push_back(dev);
    copier_pools.push_back({reinterpret_cast<std::byte*>(dev), host, l.bytes_per_block});
    pools_.push_back(std::move(p));
  }
  MapLayersToPools(pools_, c.num_layers, &layer_pool_, &layer_index_);
  KVF_ASSIGN_OR_RETURN(copier_, CudaBlockCopier::Make(std::move(copier_pools), stream_, options_.device));
  return Status::Ok();
}

Status CudaBackend::Validate(const StepBatch& batch) const {
  if (batch.seqs.empty()) return InvalidArgument("an empty step");
  return ValidateStepBatch(batch, options_, pools_, config_.vocab_size, max_context_);
}

kernels::PagedKvLayout CudaBackend::PoolLayout(size_t pi) const {
  const KvPoolInfo& pool = pools_[pi];
  kernels::PagedKvLayout layout;
  layout.num_layers = static_cast<int32_t>(pool.layers.size());
  layout.num_kv_heads = pool.num_kv_heads;
  layout.block_size = options_.block_size;
  layout.head_dim = pool.head_dim;
  return layout;
}

Status CudaBackend::Attention(const StepBatch& batch, const StepMeta& m, int64_t layer, bool rope_done) {
  const model::ModelConfig& c = config_;
  const size_t pi = static_cast<size_t>(layer_pool_[layer]);
  const KvPoolInfo& pool = pools_[pi];
  const kernels::PagedKvLayout layout = PoolLayout(pi);
  const int32_t li = layer_index_[layer];
  const int32_t nh = static_cast<int32_t>(c.num_heads);
  const bool shift = pool.position_shift;
  if (!rope_done) {
    KVF_CUDA_RETURN(kernels::LaunchRopeKvStore(qkv_, m.positions, m.slots[pi], inv_freq_, q_, device_kv_[pi], layout,
                                               li, m.num_tokens, nh, /*rotate=*/!shift, stream_));
  }
  kernels::AttentionMask mask;
  mask.window = pool.window;
  mask.sinks = pool.sink_tokens;
  mask.chunk = pool.attention_chunk;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));

  // Decode-kernel launch over `n` query rows (one per "sequence" of the kernel).
  auto decode = [&](const bf16* q, bf16* out, const int32_t* tables, int32_t stride, const int32_t* lens, int32_t n,
                    int32_t max_len) -> Status {
    kernels::PagedDecodeParams p;
    p.q = q;
    p.kv_pool = device_kv_[pi];
    p.block_tables = tables;
    p.seq_lens = lens;
    p.out = out;
    p.workspace = decode_workspace_;
    p.rope_inv_freq = shift ? inv_freq_ : nullptr;
    p.layout = layout;
    p.layer = li;
    p.num_seqs = n;
    p.num_q_heads = nh;
    p.max_blocks_per_seq = stride;
    p.max_seq_len = max_len;
    p.partition_size = kernels::PagedDecodeChoosePartition(n, nh, layout.num_kv_heads, max_len, num_sms_);
    while (kernels::PagedDecodeWorkspaceBytes(p) > decode_workspace_bytes_) p.partition_size *= 2;
    p.scale = scale;
    p.mask = mask;
    KVF_CUDA_RETURN(kernels::LaunchPagedDecode(p, stream_));
    return Status::Ok();
  };

  // Shapes the tensor-core kernels do not take go through the generic kernel.
  const int32_t hd = pool.head_dim;
  const bool fast = m.all_decode ? (hd == 64 || hd == 128 || hd == 256) : (hd == 64 || hd == 128);
  if (!fast) {
    kernels::GenericAttentionParams g;
    g.q = q_;
    g.kv_pool = device_kv_[pi];
    g.block_tables = m.tables[pi];
    g.token_seq = m.row_seq;
    g.positions = m.positions;
    g.out = attn_;
    g.rope_inv_freq = shift ? inv_freq_ : nullptr;
    g.layout = layout;
    g.layer = li;
    g.num_tokens = m.num_tokens;
    g.num_q_heads = nh;
    g.max_blocks_per_seq = m.table_stride;
    g.scale = scale;
    g.mask = mask;
    KVF_CUDA_RETURN(kernels::LaunchGenericAttention(g, stream_));
    return Status::Ok();
  }
  if (m.all_decode) {
    return decode(q_, attn_, m.tables[pi], m.table_stride, m.seq_lens, m.num_seqs, m.max_seq_len);
  }
  if (shift) {
    // Shifted RoPE is decode-only: every query row of a chunk is its own decode query,
    // all reading the sequence's one table (stride 0), at most max_batch_size per launch.
    const size_t qs = static_cast<size_t>(c.q_size());
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      for (int32_t r = m.row0[s]; r < m.row0[s + 1]; r += options_.max_batch_size) {
        const int32_t n = std::min(options_.max_batch_size, m.row0[s + 1] - r);
        const int32_t max_len = m.end_pos[s] - (m.row0[s + 1] - (r + n));
        KVF_RETURN_IF_ERROR(decode(q_ + r * qs, attn_ + r * qs, m.tables[pi] + s * m.table_stride, 0, m.row_lens + r,
                                   n, max_len));
      }
    }
    return Status::Ok();
  }
  kernels::PagedPrefillParams p;
  p.q = q_;
  p.kv_pool = device_kv_[pi];
  p.block_tables = m.tables[pi];
  p.cu_q_lens = m.cu_q_lens;
  p.seq_lens = m.seq_lens;
  p.out = attn_;
  p.layout = layout;
  p.layer = li;
  p.num_seqs = m.num_seqs;
  p.num_q_heads = nh;
  p.max_blocks_per_seq = m.table_stride;
  p.max_q_len = m.max_q_len;
  p.scale = scale;
  p.mask = mask;
  KVF_CUDA_RETURN(kernels::LaunchPagedPrefill(p, stream_));
  return Status::Ok();
}

Status CudaBackend::Execute(const StepBatch& batch, StepOutput* out) {
  KVF_RETURN_IF_ERROR(Validate(batch));  // (1)
  // The CUDA device is per host thread; the engine thread may not be the one that built us.
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  const int32_t S_real = static_cast<int32_t>(batch.seqs.size());
  const int64_t B = options_.block_size;
  const size_t P = pools_.size();

  // A decode step that only samples runs as a CUDA graph of its shape bucket (4): the batch
  // padded to a power of two, lengths rounded up to a power of two.
  bool graph = use_graphs_;
  int32_t max_end = 0;
  for (const SequenceStep& st : batch.seqs) {
    graph = graph && st.tokens.size() == 1 && st.sample && st.logits == LogitsRequest::kNone;
    max_end = std::max(max_end, static_cast<int32_t>(st.start_position + static_cast<int64_t>(st.tokens.size())));
  }
  int32_t S = S_real, bucket_len = 0;
  if (graph) {
    S = 1;
    while (S < S_real) S *= 2;
    S = std::min({S, options_.max_batch_size, options_.max_num_tokens});
    bucket_len = config::kMinGraphLength;
    while (bucket_len < max_end) bucket_len *= 2;
    bucket_len = static_cast<int32_t>(std::min<int64_t>(bucket_len, max_context_));
    graph = S >= S_real;
  }
  if (!graph) S = S_real;

  // ---- Metadata, packed into the pinned staging buffer ----
  StepMeta m;
  m.num_seqs = S;
  m.row0.assign(S + 1, 0);
  m.end_pos.assign(S, 0);
  m.all_decode = true;
  size_t stride = 1;
  for (int32_t s = S_real; s < S; ++s) {  // padding rows: one token at position 0
    m.row0[s + 1] = s + 1;
    m.end_pos[s] = 1;
  }
  for (int32_t s = 0; s < S_real; ++s) {
    const SequenceStep& st = batch.seqs[s];
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    m.row0[s + 1] = m.row0[s] + n;
    m.end_pos[s] = static_cast<int32_t>(st.start_position + n);
    m.all_decode = m.all_decode && n == 1;
    m.max_q_len = std::max(m.max_q_len, n);
    m.max_seq_len = std::max(m.max_seq_len, m.end_pos[s]);
    for (const auto& t : st.block_tables) stride = std::max(stride, t.size());
  }
  if (graph) {
    m.row0[S] = S;
    m.max_seq_len = bucket_len;
    stride = static_cast<size_t>((bucket_len + B - 1) / B);  // entries past the bucket are never read
  }
  const int32_t T = m.row0[S];
  m.num_tokens = T;
  m.table_stride = static_cast<int32_t>(stride);

  // Rows that need logits: part A, the last row of each sequence that samples or asks for
  // logits (sampled together); part B, the other rows of kAll sequences (in chunks).
  std::vector<int32_t> part_a_seq;                  // sequences of part A rows
  std::vector<std::pair<int32_t, int32_t>> part_b;  // (sequence, row) of part B rows
  for (int32_t s = 0; s < S; ++s) {
    if (s >= S_real) {
      part_a_seq.push_back(s);  // padding: sampled greedily, ignored
      continue;
    }
    const SequenceStep& st = batch.seqs[s];
    if (st.sample || st.logits != LogitsRequest::kNone) part_a_seq.push_back(s);
    if (st.logits == LogitsRequest::kAll) {
      for (int32_t r = m.row0[s]; r < m.row0[s + 1] - 1; ++r) part_b.emplace_back(s, r);
    }
  }
  const int32_t na = static_cast<int32_t>(part_a_seq.size());
  const int32_t nb = static_cast<int32_t>(part_b.size());

  Packer pack(staging_host_, staging_dev_, staging_bytes_);
  auto [ids_h, ids_d] = pack.Take<int32_t>(T);
  auto [pos_h, pos_d] = pack.Take<int32_t>(T);
  auto [len_h, len_d] = pack.Take<int32_t>(T);
  auto [rseq_h, rseq_d] = pack.Take<int32_t>(T);
  auto [cu_h, cu_d] = pack.Take<int32_t>(S + 1);
  auto [sl_h, sl_d] = pack.Take<int32_t>(S);
  auto [rows_h, rows_d] = pack.Take<int32_t>(static_cast<size_t>(na + nb));
  auto [temp_h, temp_d] = pack.Take<float>(na);
  auto [topk_h, topk_d] = pack.Take<int32_t>(na);
  auto [topp_h, topp_d] = pack.Take<float>(na);
  auto [seed_h, seed_d] = pack.Take<uint64_t>(na);
  auto [ctr_h, ctr_d] = pack.Take<uint64_t>(na);
  m.ids = ids_d;
  m.positions = pos_d;
  m.row_lens = len_d;
  m.row_seq = rseq_d;
  m.cu_q_lens = cu_d;
  m.seq_lens = sl_d;
  for (int32_t s = 0; s < S; ++s) {
    cu_h[s] = m.row0[s];
    sl_h[s] = m.end_pos[s];
    if (s >= S_real) {
      ids_h[s] = 0;
      pos_h[s] = 0;
      len_h[s] = 1;
      rseq_h[s] = s;
      continue;
    }
    const SequenceStep& st = batch.seqs[s];
    for (int32_t i = 0; i < m.row0[s + 1] - m.row0[s]; ++i) {
      const int32_t r = m.row0[s] + i;
      ids_h[r] = static_cast<int32_t>(st.tokens[i]);
      pos_h[r] = static_cast<int32_t>(st.start_position + i);
      len_h[r] = pos_h[r] + 1;
      rseq_h[r] = s;
    }
  }
  cu_h[S] = T;
  for (size_t pi = 0; pi < P; ++pi) {
    auto [slot_h, slot_d] = pack.Take<int32_t>(T);
    auto [tab_h, tab_d] = pack.Take<int32_t>(static_cast<size_t>(S) * stride);
    m.slots.push_back(slot_d);
    m.tables.push_back(tab_d);
    for (int32_t s = 0; s < S; ++s) {
      int32_t* row = tab_h + static_cast<size_t>(s) * stride;
      if (s >= S_real) {  // padding reads position 0 of block 0 and writes nothing
        for (size_t j = 0; j < stride; ++j) row[j] = j == 0 ? 0 : -1;
        slot_h[s] = -1;
        continue;
      }
      const auto& table = batch.seqs[s].block_tables[pi];
      for (size_t j = 0; j < stride; ++j) {
        row[j] = j < table.size() && table[j] != kNoBlock ? static_cast<int32_t>(table[j]) : -1;
      }
      for (int32_t r = m.row0[s]; r < m.row0[s + 1]; ++r) {
        const int64_t pos = pos_h[r];
        slot_h[r] = static_cast<int32_t>(static_cast<int64_t>(table[pos / B]) * B + pos % B);
      }
    }
  }
  for (int32_t a = 0; a < na; ++a) {
    rows_h[a] = m.row0[part_a_seq[a] + 1] - 1;
    if (part_a_seq[a] >= S_real) {
      temp_h[a] = 0.0f;
      topk_h[a] = 0;
      topp_h[a] = 1.0f;
      seed_h[a] = 0;
      ctr_h[a] = 0;
      continue;
    }
    const SequenceStep& st = batch.seqs[part_a_seq[a]];
    const bool sample = st.sample;
    temp_h[a] = sample ? st.sampling.temperature : 0.0f;
    topk_h[a] = sample ? st.sampling.top_k : 0;
    topp_h[a] = sample ? st.sampling.top_p : 1.0f;
    seed_h[a] = st.sampling.seed;
    ctr_h[a] = st.rng_counter;
  }
  for (int32_t j = 0; j < nb; ++j) rows_h[na + j] = part_b[j].second;

  // Output rows of logits, per sequence.
  out->tokens.assign(S_real, kNoToken);
  out->logits_offset.assign(S_real, -1);
  int64_t out_rows = 0;
  for (int32_t s = 0; s < S_real; ++s) {
    const SequenceStep& st = batch.seqs[s];
    if (st.logits == LogitsRequest::kNone) continue;
    out->logits_offset[s] = out_rows;
    out_rows += st.logits == LogitsRequest::kAll ? m.row0[s + 1] - m.row0[s] : 1;
  }
  out->logits.resize(static_cast<size_t>(out_rows * V));
  const int32_t Hi = static_cast<int32_t>(H);
  auto head = [&](const int32_t* rows_dev, int32_t n) -> Status {  // logits_[0, n) for these rows
    KVF_CUDA_RETURN(kernels::LaunchEmbedding(rows_dev, xn_, head_in_, n, T, Hi, stream_));
    if (n <= gemv_max_rows_) {  // (5)
      return CudaStatus(kernels::LaunchGemv(lm_head_, head_in_, nullptr, logits_, /*out_f32=*/true,
                                            static_cast<int32_t>(V), n, Hi, stream_),
                        "LaunchGemv");
    }
    return gemm_->Run(lm_head_, head_in_, nullptr, logits_, LtGemm::Out::kF32, V, n, H, stream_);
  };

  // Everything from the metadata upload to the sampled tokens' copy back: one graph in
  // graph mode.
  auto enqueue = [&]() -> Status {
  KVF_CUDA_RETURN(cudaMemcpyAsync(staging_dev_, staging_host_, pack.used(), cudaMemcpyHostToDevice, stream_));

  // ---- Forward ----
  auto gemm = [&](const bf16* w, const bf16* x, const bf16* bias, bf16* y, int64_t rows_out, int64_t k) {
    if (T <= gemv_max_rows_) {  // (5)
      return CudaStatus(kernels::LaunchGemv(w, x, bias, y, /*out_f32=*/false, static_cast<int32_t>(rows_out), T,
                                            static_cast<int32_t>(k), stream_),
                        "LaunchGemv");
    }
    return gemm_->Run(w, x, bias, y, LtGemm::Out::kBf16, rows_out, T, k, stream_);
  };
  const float eps = static_cast<float>(c.rms_norm_eps);
  // (5) On the gemv, each RMSNorm is the next product's prologue; the residual stream
  // alternates between resid_ and resid_alt_ (a block of the product writes the sum while
  // the others still read the old one).
  const bool fused_silu = T <= gemv_max_rows_ && gemv_fusion_ >= 1;
  const bool fused_rope = fused_silu && gemv_fusion_ >= 2 && T <= kernels::kGemvRopeKvMaxRows;
  const bool norm_fits = int64_t{T} * H * 2 <= kernels::kGemvRmsNormMaxXBytes;
  const bool fused_post_norm = fused_silu && gemv_fusion_ >= 3 && norm_fits;  // before gate/up
  const bool fused_norm = fused_post_norm && fused_rope && gemv_fusion_ >= 4;  // before QKV
  bf16* resid = resid_;
  bf16* resid_next = resid_alt_;
  auto norm_gemv = [&](const bf16* x, bool add_residual, const bf16* norm_w, const bf16* w, const bf16* bias, bf16* y,
                       bool silu_mul, int64_t rows_out) -> Status {
    kernels::GemvRmsNorm nrm;
    nrm.x = x;
    nrm.residual_in = add_residual ? resid : nullptr;
    nrm.residual_out = add_residual ? resid_next : nullptr;
    nrm.weight = norm_w;
    nrm.eps = eps;
    KVF_CUDA_RETURN(kernels::LaunchRmsNormGemv(nrm, w, bias, y, silu_mul, static_cast<int32_t>(rows_out), T, Hi,
                                               stream_));
    if (add_residual) std::swap(resid, resid_next);
    return Status::Ok();
  };
  KVF_CUDA_RETURN(kernels::LaunchEmbedding(m.ids, embed_, resid_, T, static_cast<int32_t>(V), Hi, stream_));
  if (!fused_norm) {
    KVF_CUDA_RETURN(kernels::LaunchRmsNorm(resid_, nullptr, layers_[0].input_norm, xn_, T, Hi, eps, stream_));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    if (fused_rope) {  // (RMSNorm,) QKV, RoPE and the K/V store in one launch
      kernels::GemvRmsNorm nrm;
      nrm.x = l == 0 ? resid : tmp_;
      nrm.residual_in = l == 0 ? nullptr : resid;
      nrm.residual_out = l == 0 ? nullptr : resid_next;
      nrm.weight = w.input_norm;
      nrm.eps = eps;
      const size_t pi = static_cast<size_t>(layer_pool_[l]);
      kernels::GemvRopeKvStore rope;
      rope.positions = m.positions;
      rope.slots = m.slots[pi];
      rope.inv_freq = inv_freq_;
      rope.q_out = q_;
      rope.kv_pool = device_kv_[pi];
      rope.layout = PoolLayout(pi);
      rope.layer = layer_index_[l];
      rope.num_q_heads = static_cast<int32_t>(c.num_heads);
      rope.rotate = !pools_[pi].position_shift;
      if (fused_norm) {
        KVF_CUDA_RETURN(kernels::LaunchRmsNormGemvRopeKv(nrm, w.qkv, w.qkv_bias, rope, T, Hi, stream_));
        if (l > 0) std::swap(resid, resid_next);
      } else {
        KVF_CUDA_RETURN(kernels::LaunchGemvRopeKv(w.qkv, xn_, w.qkv_bias, rope, T, Hi, stream_));
      }
    } else {
      KVF_RETURN_IF_ERROR(gemm(w.qkv, xn_, w.qkv_bias, qkv_, qkv_width, H));
    }
    KVF_RETURN_IF_ERROR(Attention(batch, m, l, /*rope_done=*/fused_rope));
    KVF_RETURN_IF_ERROR(gemm(w.o, attn_, w.o_bias, tmp_, H, c.q_size()));
    if (fused_post_norm) {  // SiLU-mul in the gate/up gemv's epilogue too
      KVF_RETURN_IF_ERROR(norm_gemv(tmp_, true, w.post_norm, w.gate_up, w.gate_up_bias, act_, true, I));
    } else {
      KVF_CUDA_RETURN(kernels::LaunchRmsNorm(tmp_, resid, w.post_norm, xn_, T, Hi, eps, stream_));
      if (fused_silu) {
        KVF_CUDA_RETURN(kernels::LaunchGemvSiluMul(w.gate_up, xn_, w.gate_up_bias, act_, static_cast<int32_t>(I), T,
                                                   Hi, stream_));
      } else {
        KVF_RETURN_IF_ERROR(gemm(w.gate_up, xn_, w.gate_up_bias, gate_up_, 2 * I, H));
        KVF_CUDA_RETURN(kernels::LaunchSiluMul(gate_up_, act_, T, static_cast<int32_t>(I), stream_));
      }
    }
    KVF_RETURN_IF_ERROR(gemm(w.down, act_, w.down_bias, tmp_, H, I));
    if (!fused_norm || l + 1 == c.num_layers) {
      const bf16* next_norm = l + 1 < c.num_layers ? layers_[l + 1].input_norm : final_norm_;
      KVF_CUDA_RETURN(kernels::LaunchRmsNorm(tmp_, resid, next_norm, xn_, T, Hi, eps, stream_));
    }
  }

  // ---- LM head, sampling ----
  if (na > 0) {
    KVF_RETURN_IF_ERROR(head(rows_d, na));
    kernels::SamplingParams sp;
    sp.logits = logits_;
    sp.temperature = temp_d;
    sp.top_k = topk_d;
    sp.top_p = topp_d;
    sp.seed = seed_d;
    sp.step = ctr_d;
    sp.tokens = tokens_dev_;
    sp.num_seqs = na;
    sp.vocab = static_cast<int32_t>(V);
    KVF_CUDA_RETURN(kernels::LaunchSampling(sp, stream_));
    KVF_CUDA_RETURN(cudaMemcpyAsync(tokens_host_, tokens_dev_, na * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  }
  return Status::Ok();
  };  // enqueue

  if (graph) {
    const std::pair<int32_t, int32_t> key{S, bucket_len};
    auto it = graphs_.find(key);
    if (it == graphs_.end() && !graph_seen_.insert(key).second) {
      // Second step of this shape: capture it (the first ran eagerly, so every kernel
      // attribute and cuBLASLt plan is set up outside capture).
      cudaGraph_t g = nullptr;
      KVF_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const Status captured = enqueue();
      const cudaError_t end = cudaStreamEndCapture(stream_, &g);
      if (!captured.ok()) {
        if (g != nullptr) cudaGraphDestroy(g);
        return captured;
      }
      KVF_CUDA_RETURN(end);
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      KVF_CUDA_RETURN(inst);
      it = graphs_.emplace(key, exec).first;
    }
    if (it != graphs_.end()) {
      KVF_CUDA_RETURN(cudaGraphLaunch(it->second, stream_));
    } else {
      KVF_RETURN_IF_ERROR(enqueue());
    }
  } else {
    KVF_RETURN_IF_ERROR(enqueue());
  }
  if (na > 0 && out_rows > 0) {
    KVF_CUDA_RETURN(cudaMemcpyAsync(logits_host_, logits_, static_cast<size_t>(na) * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));  // (3)
  for (int32_t a = 0; a < na; ++a) {
    const int32_t s = part_a_seq[a];
    if (s >= S_real) continue;
    const SequenceStep& st = batch.seqs[s];
    if (st.sample) out->tokens[s] = static_cast<TokenId>(tokens_host_[a]);
    if (st.logits != LogitsRequest::kNone) {
      const int64_t dst = out->logits_offset[s] + (st.logits == LogitsRequest::kAll ? m.row0[s + 1] - m.row0[s] - 1 : 0);
      std::memcpy(&out->logits[dst * V], logits_host_ + static_cast<size_t>(a) * V, V * sizeof(float));
    }
  }
  for (int32_t j0 = 0; j0 < nb; j0 += static_cast<int32_t>(logits_rows_)) {
    const int32_t n = std::min<int32_t>(static_cast<int32_t>(logits_rows_), nb - j0);
    KVF_RETURN_IF_ERROR(head(rows_d + na + j0, n));
    KVF_CUDA_RETURN(cudaMemcpyAsync(logits_host_, logits_, static_cast<size_t>(n) * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
    KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
    for (int32_t j = j0; j < j0 + n; ++j) {
      const auto [s, r] = part_b[j];
      const int64_t dst = out->logits_offset[s] + (r - m.row0[s]);
      std::memcpy(&out->logits[dst * V], logits_host_ + static_cast<size_t>(j - j0) * V, V * sizeof(float));
    }
  }
  return Status::Ok();
}

namespace {
Result<std::unique_ptr<ModelBackend>> MakeCudaBackend(const BackendOptions& options) {
  KVF_ASSIGN_OR_RETURN(auto b, CudaBackend::Make(options));
  return std::unique_ptr<ModelBackend>(std::move(b));
}
}  // namespace

}  // namespace kvfleet::backend::cuda

KVF_REGISTER_BACKEND(cuda, "cuda", kvfleet::backend::cuda::MakeCudaBackend)
