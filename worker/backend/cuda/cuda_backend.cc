// CudaBackend: construction (options, activation buffers, KV pools), the step driver
// Execute, and the backend's registration under "cuda". Beside it: cuda_weights.cc (the
// checkpoint's weights on the device), and a step's parts: cuda_batch.cc (metadata),
// cuda_forward.cc (layers), cuda_sampling.cc (LM head, sampling, outputs). Thread-compatible (cuda_backend.h): the engine
// thread calls it.
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
#include "common/log.h"
#include "grammar/grammar.h"
#include "kernels/gemv.h"
#include "kernels/kernel_image.h"
#include "kernels/launch.h"
#include "kernels/moe.h"
#include "kernels/paged_decode.h"
#include "kernels/paged_prefill.h"
#include "kernels/rope.h"
#include "worker/backend/cuda/cuda_util.h"
#include "worker/backend/backend_choice.h"
#include "worker/backend/kv_setup.h"
#include "worker/model/checkpoint.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend::cuda {
namespace {

using Clock = std::chrono::steady_clock;
using bf16 = __nv_bfloat16;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A GPU's UUID as nvidia-smi prints it (GPU-8-4-4-4-12 hex digits): the Hello's deviceId.
std::string GpuUuid(const cudaUUID_t& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto byte = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options) : ModelBackendBase(options) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaSetDevice(options_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (lora_stream_ != nullptr) cudaStreamSynchronize(lora_stream_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : lora_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : lora_pinned_free_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : transfer_done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (lora_side_ != nullptr) cudaStreamSynchronize(lora_side_);
  if (mask_stream_ != nullptr) cudaStreamSynchronize(mask_stream_);
  if (masks_uploaded_ != nullptr) cudaEventDestroy(masks_uploaded_);
  if (mask_stream_ != nullptr) cudaStreamDestroy(mask_stream_);
  if (lora_ready_ != nullptr) cudaEventDestroy(lora_ready_);
  if (lora_fork_ != nullptr) cudaEventDestroy(lora_fork_);
  if (lora_join_ != nullptr) cudaEventDestroy(lora_join_);
  if (lora_side_ != nullptr) cudaStreamDestroy(lora_side_);
  if (lora_stream_ != nullptr) cudaStreamDestroy(lora_stream_);
  copier_.reset();
  gemm_.reset();
  for (auto& [handle, mapped] : peer_kv_) cudaIpcCloseMemHandle(mapped);
  for (void* p : allocations_) cudaFree(p);
  for (void* p : host_allocations_) cudaFreeHost(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<void*> CudaBackend::DeviceAllocBytes(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess) {
    return ResourceExhausted("cuda backend: cannot allocate " + std::to_string(bytes) +
                             " bytes of device memory: " + cudaGetErrorString(e));
  }
  allocations_.push_back(p);
  return p;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Make(const BackendOptions& options) {
  const auto t0 = Clock::now();
  if (!IsValidBlockSize(static_cast<uint32_t>(options.block_size)) || options.block_size > 256) {
    return InvalidArgument("cuda backend: block_size " + std::to_string(options.block_size) +
                           " is not a power of two in [1, 256]");
  }
  if (options.max_num_tokens <= 0 || options.max_batch_size <= 0) {
    return InvalidArgument("cuda backend: max_num_tokens and max_batch_size must be > 0");
  }
  // (8) What runs on one GPU only, then the ranks' devices; rank 0 (this backend) takes the first.
  const int32_t tp = options.tensor_parallel;
  if (tp > 1 && options.max_loras > 0) {
    return Unimplemented("--tensor-parallel " + std::to_string(tp) +
                         ": the cuda backend serves LoRA adapters on one GPU only; drop --max-loras or run "
                         "--tensor-parallel 1");
  }
  if (tp > 1 && options.kv_cache_dtype == KvCacheDtype::kFp8E4m3) {
    return Unimplemented("--tensor-parallel " + std::to_string(tp) +
                         ": the cuda backend's fp8 KV cache runs on one GPU only; use --kv-cache-dtype bf16");
  }
  {  // what the model asks of the kernels, whatever the machine
    KVF_ASSIGN_OR_RETURN(const model::ModelConfig model_config, model::LoadModelConfig(options.model_dir));
    if (model_config.architecture == model::Architecture::kLlama4) {  // (11)
      const std::string what = tp > 1 ? "--tensor-parallel " + std::to_string(tp)
                               : options.kv_cache_dtype == KvCacheDtype::kFp8E4m3 ? "--kv-cache-dtype fp8_e4m3"
                               : options.attention.streaming_llm ? "--streaming-llm" : "";
      if (!what.empty()) {
        return Unimplemented(what + ": the cuda backend serves Llama 4 (" + options.model_dir + ") on one GPU, with a "
                             "bf16 KV cache and without --streaming-llm; drop " + what + " or use --backend cpu");
      }
    }
    if (tp > 1) KVF_RETURN_IF_ERROR(CheckTensorParallel(model_config, tp));  // heads that do not split
  }
  std::vector<int> devices = {options.device};
  auto tp_devices = options.extra.find("tp_devices");
  if (tp > 1) {
    KVF_ASSIGN_OR_RETURN(devices, TensorParallelDevices(
                                      tp, options.device, tp_devices != options.extra.end() ? &tp_devices->second : nullptr));
  } else if (tp_devices != options.extra.end()) {
    return InvalidArgument("cuda backend: tp_devices places tensor-parallel ranks; it needs --tensor-parallel > 1");
  }
  BackendOptions rank0 = options;
  rank0.device = devices[0];
  std::unique_ptr<CudaBackend> b(new CudaBackend(rank0));
  KVF_ASSIGN_OR_RETURN(b->tuning_, ParseCudaTuning(options.extra));
  if (b->tuning_.pdl) kernels::SetProgrammaticDependentLaunch(*b->tuning_.pdl);  // (6)
  KVF_CUDA_RETURN(cudaSetDevice(rank0.device));
  cudaDeviceProp prop{};
  KVF_CUDA_RETURN(cudaGetDeviceProperties(&prop, rank0.device));
  b->device_uuid_ = GpuUuid(prop.uuid);
  b->kv_fp8_ = options.kv_cache_dtype == KvCacheDtype::kFp8E4m3;
  if (b->kv_fp8_ && prop.major * 10 + prop.minor < 89) {
    return InvalidArgument("--kv-cache-dtype fp8_e4m3 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); " +
                           std::string(prop.name) + " is " + std::to_string(prop.major) + "." +
                           std::to_string(prop.minor) + ": use --kv-cache-dtype bf16");
  }

  KVF_ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(options.model_dir));
  b->config_ = checkpoint->config();
  const model::ModelConfig& c = b->config_;
  if (c.is_moe()) {  // (9)
    const int64_t ei = c.moe.expert_intermediate / tp;
    const int64_t routes = static_cast<int64_t>(options.max_num_tokens) * c.moe.experts_per_token;
    if (c.moe.num_experts > kernels::kMoeMaxExperts || c.moe.experts_per_token > kernels::kMoeMaxTopK) {
      return Unimplemented("cuda backend: " + std::to_string(c.moe.num_experts) + " experts, top-" +
                           std::to_string(c.moe.experts_per_token) + " (the MoE kernels take up to " +
                           std::to_string(kernels::kMoeMaxExperts) + " experts and top-" +
                           std::to_string(kernels::kMoeMaxTopK) + ")");
    }
    if (c.moe.expert_intermediate % tp != 0 || ei % 8 != 0 || c.moe.shared_expert_intermediate % 8 != 0) {
      return Unimplemented("cuda backend: each rank's " + std::to_string(ei) + " columns of an expert's intermediate "
                           "size (and the shared expert's " + std::to_string(c.moe.shared_expert_intermediate) +
                           ") must be a multiple of 8");
    }
    if (kernels::MoeMaxTiles(static_cast<int32_t>(std::min<int64_t>(routes, INT32_MAX)), static_cast<int32_t>(c.moe.num_experts)) > 65535) {
      return InvalidArgument("cuda backend: max_num_tokens " + std::to_string(options.max_num_tokens) + " times " +
                             std::to_string(c.moe.experts_per_token) + " experts a token is more routes than a step "
                             "of the MoE kernels takes; lower --max-num-tokens");
    }
    if (options.max_loras > 0) {
      return Unimplemented("cuda backend: LoRA adapters on a mixture of experts (" +
                           std::string(model::ArchitectureName(c.architecture)) + ") are not supported; drop --max-loras");
    }
  }
  if (c.head_dim % 16 != 0 || c.head_dim > 256) {
    return Unimplemented("cuda backend: head_dim " + std::to_string(c.head_dim) +
                         " (the kernels take multiples of 16 up to 256)");
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return Unimplemented("cuda backend: hidden_size and intermediate_size must be multiples of 8");
  }
  KVF_RETURN_IF_ERROR(CheckTensorParallel(c, tp));
  if ((c.intermediate_size / tp) % 8 != 0) {
    return Unimplemented("--tensor-parallel " + std::to_string(tp) + ": each rank's " +
                         std::to_string(c.intermediate_size / tp) +
                         " columns of intermediate_size must be a multiple of 8 on the cuda backend");
  }
  b->shard_ = ShardOf(c, tp, 0);
  b->max_context_ = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  if (b->max_context_ > INT32_MAX / 2) return InvalidArgument("cuda backend: max_context too large");
  b->rope_ = c.rope();
  KVF_RETURN_IF_ERROR(CheckAttentionOptions(c, options.attention, static_cast<uint32_t>(options.block_size),
                                            static_cast<uint32_t>(b->max_context_)));
  const auto t_open = Clock::now();
  KVF_RETURN_IF_ERROR(b->InitRank(*checkpoint));
  if (tp > 1) KVF_RETURN_IF_ERROR(b->MakePeers(*checkpoint, devices));
  const auto t_weights = Clock::now();
  KVF_RETURN_IF_ERROR(b->AllocateLora());
  KVF_ASSIGN_OR_RETURN(const uint64_t free_bytes, b->FreeForKv());
  KVF_RETURN_IF_ERROR(b->AllocateKv(free_bytes));
  if (tp > 1) KVF_RETURN_IF_ERROR(b->StartRanks());
  if (b->kv_fp8_) KVF_RETURN_IF_ERROR(b->SetUpKvScales(*checkpoint));
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
  uint64_t weight_bytes = b->weight_bytes_;  // (8) every rank's shard
  for (const auto& p : b->peers_) weight_bytes += p->weight_bytes_;
  Logger("model")->info(
      "cuda backend: {} ({}, {} layers{}) on {} ({} SMs) ready in {:.2f} s: {:.2f} GB of bf16 weights uploaded in "
      "{:.2f} s ({:.2f} GB/s); KV cache {:.2f} GiB ({}{}) of {}-token blocks: {}",
      options.model_dir, model::ArchitectureName(c.architecture), c.num_layers,
      tp > 1 ? ", tensor parallel " + std::to_string(tp) + " over " + b->comm_kind() + ", weights of all ranks" : std::string(),
      prop.name, b->num_sms_,
      Seconds(t0, t_end), static_cast<double>(weight_bytes) * 1e-9, load_s,
      load_s > 0 ? static_cast<double>(weight_bytes) * 1e-9 / load_s : 0.0,
      static_cast<double>(kv_bytes) / (1ull << 30), b->kv_fp8_ ? "fp8 e4m3, scales " : "bf16",
      b->kv_fp8_ ? b->kv_scales_source_ : "", options.block_size, pools);
  return b;
}

Status CudaBackend::AllocateBuffers() {
  const model::ModelConfig& c = config_;
  const size_t T = static_cast<size_t>(options_.max_num_tokens);
  const size_t S = static_cast<size_t>(options_.max_batch_size);
  // (8) This rank's heads and intermediate columns; logits over the whole vocabulary.
  const size_t H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(shard_.inter);
  const size_t Q = static_cast<size_t>(shard_.heads * c.head_dim), KV = static_cast<size_t>(shard_.kv_heads * c.head_dim);
  const size_t V = static_cast<size_t>(c.vocab_size);
  KVF_ASSIGN_OR_RETURN(resid_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(resid_alt_, DeviceAlloc<bf16>(std::min<size_t>(T, kernels::kGemvMaxRows) * H));
  KVF_ASSIGN_OR_RETURN(xn_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(tmp_, DeviceAlloc<bf16>(T * H));
  KVF_ASSIGN_OR_RETURN(qkv_, DeviceAlloc<bf16>(T * (Q + 2 * KV)));
  KVF_ASSIGN_OR_RETURN(q_, DeviceAlloc<bf16>(T * Q));
  KVF_ASSIGN_OR_RETURN(attn_, DeviceAlloc<bf16>(T * Q));
  // Llama 4's shared expert (9) runs through gate_up_ and act_ too.
  const size_t I_mlp = std::max(I, static_cast<size_t>(c.moe.shared_expert_intermediate));
  KVF_ASSIGN_OR_RETURN(gate_up_, DeviceAlloc<bf16>(T * 2 * I_mlp));
  KVF_ASSIGN_OR_RETURN(act_, DeviceAlloc<bf16>(T * I_mlp));
  if (c.is_moe()) {  // (9)
    const size_t E = static_cast<size_t>(c.moe.num_experts), routes = T * static_cast<size_t>(c.moe.experts_per_token);
    const size_t EI = static_cast<size_t>(shard_.expert_inter);
    KVF_ASSIGN_OR_RETURN(moe_logits_, DeviceAlloc<float>(T * static_cast<size_t>(moe_router_rows_)));
    KVF_ASSIGN_OR_RETURN(moe_experts_, DeviceAlloc<int32_t>(routes));
    KVF_ASSIGN_OR_RETURN(moe_sorted_, DeviceAlloc<int32_t>(routes));
    KVF_ASSIGN_OR_RETURN(moe_position_, DeviceAlloc<int32_t>(routes));
    KVF_ASSIGN_OR_RETURN(moe_offsets_, DeviceAlloc<int32_t>(E + 1));
    KVF_ASSIGN_OR_RETURN(moe_tile_offsets_, DeviceAlloc<int32_t>(E + 1));
    KVF_ASSIGN_OR_RETURN(moe_active_, DeviceAlloc<int32_t>(E + 1));
    KVF_ASSIGN_OR_RETURN(moe_weights_, DeviceAlloc<float>(routes));
    KVF_ASSIGN_OR_RETURN(moe_gate_up_, DeviceAlloc<bf16>(routes * 2 * EI));
    KVF_ASSIGN_OR_RETURN(moe_act_, DeviceAlloc<bf16>(routes * EI));
    KVF_ASSIGN_OR_RETURN(moe_out_, DeviceAlloc<bf16>(routes * H));
    // Llama 4's scaled rows, or the grouped rows cuBLAS's products read (moe_blas.h).
    if (c.moe.sigmoid_routing || tuning_.moe_blas) {
      KVF_ASSIGN_OR_RETURN(moe_scaled_, DeviceAlloc<bf16>(routes * H));
    }
    if (c.moe.sigmoid_routing) {  // Llama 4
      KVF_ASSIGN_OR_RETURN(moe_shared_, DeviceAlloc<bf16>(T * H));
    }
    if (tuning_.moe_blas) {
      KVF_ASSIGN_OR_RETURN(moe_blas_, MoeBlas::Make(static_cast<int32_t>(E)));
    }
  }
  logits_rows_ = std::max<int64_t>(options_.max_batch_size, config::kMinLogitsRows);
  KVF_ASSIGN_OR_RETURN(head_in_, DeviceAlloc<bf16>(static_cast<size_t>(logits_rows_) * H));
  KVF_ASSIGN_OR_RETURN(logits_, DeviceAlloc<float>(static_cast<size_t>(logits_rows_) * V));
  if (shard_.ranks > 1) {
    const size_t slice = static_cast<size_t>(logits_rows_ * vocab_rows_);
    KVF_ASSIGN_OR_RETURN(vocab_local_, DeviceAlloc<float>(slice));
    KVF_ASSIGN_OR_RETURN(vocab_gathered_, DeviceAlloc<float>(slice * static_cast<size_t>(shard_.ranks)));
  }

  // Decode split-K workspace: the largest any step may need (sequences up to
  // max_batch_size, lengths up to max_context); Attention() widens partitions if a step
  // ever needed more.
  const int32_t max_ctx = static_cast<int32_t>(max_context_);
  for (int32_t n = 1; n <= options_.max_batch_size; ++n) {
    for (int32_t len = 128;; len = std::min(len * 2, max_ctx)) {
      kernels::PagedDecodeParams p;
      p.layout.head_dim = static_cast<int32_t>(c.head_dim);
      p.layout.num_kv_heads = static_cast<int32_t>(shard_.kv_heads);
      p.num_seqs = n;
      p.num_q_heads = static_cast<int32_t>(shard_.heads);
      p.max_seq_len = len;
      p.partition_size = kernels::PagedDecodeChoosePartition(n, p.num_q_heads, p.layout.num_kv_heads, len, num_sms_);
      decode_workspace_bytes_ = std::max(decode_workspace_bytes_, kernels::PagedDecodeWorkspaceBytes(p));
      if (len >= max_ctx) break;
    }
  }
  KVF_ASSIGN_OR_RETURN(decode_workspace_, DeviceAlloc<float>(decode_workspace_bytes_ / sizeof(float) + 1));
  // Prefill split-KV partials (kernels/paged_prefill.h): a fixed bound, whatever the step.
  prefill_workspace_bytes_ = kernels::PagedPrefillWorkspaceBytes(static_cast<int32_t>(c.head_dim), num_sms_);
  KVF_ASSIGN_OR_RETURN(prefill_workspace_, DeviceAlloc<float>(prefill_workspace_bytes_ / sizeof(float)));

  // Step metadata, worst case: ids, positions, row lengths, row sequences, head rows [T]; slots [pools][T];
  // tables [pools][S][max blocks]; cu_q_lens, seq_lens, sampling settings [S]. Pools are
  // at most one per distinct layer window.
  std::set<int64_t> windows(c.layer_window.begin(), c.layer_window.end());
  windows.insert(options_.attention.max_attention_window.begin(), options_.attention.max_attention_window.end());
  const size_t max_pools = windows.size() + 1;
  const size_t max_blocks = static_cast<size_t>((max_context_ + options_.block_size - 1) / options_.block_size);
  // Dynamic NTK adds each sequence's RoPE frequencies, [S][head_dim / 2].
  const size_t rope_rows = kernels::RopeDependsOnLength(rope_) ? S * static_cast<size_t>(c.head_dim / 2) : 0;
  staging_bytes_ = (5 * T + max_pools * T + max_pools * S * max_blocks + 2 * S + 1) * sizeof(int32_t) +
                   S * (2 * sizeof(float) + sizeof(int32_t) + 2 * sizeof(uint64_t)) + rope_rows * sizeof(float) +
                   // min_p, logprobs, allowed_rows [S]; adjust_begin [S + 1]; prompt-logprob
                   // targets [T]; head rows past T (a non-final chunk's last row in parts A and B) [S]
                   (3 * S + S + 1 + T + S) * sizeof(int32_t) + (18 + 4 * max_pools + 4) * config::kStagingAlign +
                   // LoRA row groups: rows, tile_begin and tile_slot, [T] each at most (+ 1)
                   (options_.max_loras > 0 ? (3 * T + 1) * sizeof(int32_t) + 3 * config::kStagingAlign : 0);
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
  const size_t lp_rows = static_cast<size_t>(logits_rows_), lp_top = lp_rows * kernels::kMaxTopLogprobs;
  KVF_ASSIGN_OR_RETURN(lp_token_dev_, DeviceAlloc<float>(lp_rows));
  KVF_ASSIGN_OR_RETURN(lp_top_tok_dev_, DeviceAlloc<int32_t>(lp_top));
  KVF_ASSIGN_OR_RETURN(lp_top_val_dev_, DeviceAlloc<float>(lp_top));
  KVF_CUDA_RETURN(cudaHostAlloc(&h, (lp_rows + 2 * lp_top) * sizeof(float), cudaHostAllocDefault));
  host_allocations_.push_back(h);
  lp_token_host_ = static_cast<float*>(h);
  lp_top_tok_host_ = reinterpret_cast<int32_t*>(lp_token_host_ + lp_rows);
  lp_top_val_host_ = lp_token_host_ + lp_rows + lp_top;
  // Constrained decoding's bitmasks, a row per part A row (at most max_batch_size).
  allowed_words_ = static_cast<int32_t>(grammar::BitmaskWords(V));
  const size_t allowed = S * static_cast<size_t>(allowed_words_);
  KVF_ASSIGN_OR_RETURN(allowed_dev_, DeviceAlloc<uint32_t>(allowed));
  KVF_CUDA_RETURN(cudaHostAlloc(&h, allowed * sizeof(uint32_t), cudaHostAllocDefault));
  host_allocations_.push_back(h);
  allowed_host_ = static_cast<uint32_t*>(h);
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&mask_stream_, cudaStreamNonBlocking));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&masks_uploaded_, cudaEventDisableTiming));
  return Status::Ok();
}

Status CudaBackend::ReserveAdjust(size_t n) {
  if (n <= adjust_capacity_) return Status::Ok();
  // The previous step has completed (CollectOutput waited), so nothing reads the old buffers.
  size_t cap = std::max<size_t>(adjust_capacity_ * 2, config::kMinAdjustEntries);
  while (cap < n) cap *= 2;
  void* h = nullptr;
  KVF_CUDA_RETURN(cudaHostAlloc(&h, cap * sizeof(kernels::LogitAdjust), cudaHostAllocDefault));
  host_allocations_.push_back(h);
  adjust_host_ = static_cast<kernels::LogitAdjust*>(h);
  KVF_ASSIGN_OR_RETURN(adjust_dev_, DeviceAlloc<kernels::LogitAdjust>(cap));
  KVF_ASSIGN_OR_RETURN(adjust_raw_dev_, DeviceAlloc<float>(cap));
  adjust_capacity_ = cap;
  return Status::Ok();
}

Status CudaBackend::AllocateKv(uint64_t free_after_buffers) {
  const model::ModelConfig& c = config_;
  KvMemorySettings memory;
  memory.block_size = static_cast<uint32_t>(options_.block_size);
  memory.max_context = static_cast<uint32_t>(max_context_);
  memory.dtype_bytes = kv_fp8_ ? 1 : sizeof(bf16);
  if (options_.kv_cache_bytes > 0) {
    memory.device_bytes = options_.kv_cache_bytes;
  } else {
    const uint64_t usable = free_after_buffers > config::kReserveBytes ? free_after_buffers - config::kReserveBytes : 0;
    memory.device_bytes = kv::DeviceBudgetFromFreeMemory(usable, options_.kv_memory_fraction);
  }
  memory.host_bytes = options_.host_kv_bytes;
  // (8) The device budget is per GPU and a rank holds kv_heads of the model's KV heads: the
  // pools (whole blocks, as the KV manager counts them) take num_kv_heads / kv_heads times as
  // much. The host tier's budget is the worker's (its ranks' parts together, with split heads).
  if (shard_.ranks > 1) memory.device_bytes = memory.device_bytes / static_cast<uint64_t>(shard_.kv_heads) * c.num_kv_heads;
  kv::KvCacheConfig& kc = kv_config_;
  kc = KvCacheConfigFor(c, memory, options_.attention);
  if (options_.num_blocks > 0) KVF_RETURN_IF_ERROR(kv::SizeForBlocksPerPool(&kc, options_.num_blocks));
  KVF_RETURN_IF_ERROR(kc.Validate());
  KVF_ASSIGN_OR_RETURN(std::vector<kv::PoolLayout> layouts, kv::ComputePools(kc));
  KVF_RETURN_IF_ERROR(AllocateKvPools(layouts));
  for (auto& peer : peers_) KVF_RETURN_IF_ERROR(peer->AllocateKvPools(layouts));
  return Status::Ok();
}

Status CudaBackend::AllocateKvPools(const std::vector<kv::PoolLayout>& layouts) {
  const model::ModelConfig& c = config_;
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  std::vector<CudaBlockCopier::Pool> copier_pools;
  for (kv::PoolLayout l : layouts) {
    KvPoolInfo p = PoolInfoOf(l, c, options_, max_context_);
    l.bytes_per_block = l.bytes_per_block / static_cast<uint64_t>(c.num_kv_heads) * shard_.kv_heads;  // (8)
    const size_t bytes = static_cast<size_t>(l.device_blocks) * l.bytes_per_block;
    KVF_ASSIGN_OR_RETURN(std::byte * dev, DeviceAlloc<std::byte>(bytes));
    // Zeroed so a stale NaN pattern can never reach a masked-out lane's arithmetic.
    KVF_CUDA_RETURN(cudaMemsetAsync(dev, 0, bytes, stream_));
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
    host_kv_.push_back(host);
    copier_pools.push_back({dev, host, l.bytes_per_block});
    pools_.push_back(std::move(p));
  }
  MapLayersToPools(pools_, c.num_layers, &layer_pool_, &layer_index_);
  if (shard_.ranks == 1) {  // KV transfer's staging (cuda_kv_transfer.cc); none where blocks do not move
    for (size_t i = 0; i < 2; ++i) {
      void* h = nullptr;
      KVF_CUDA_RETURN(cudaHostAlloc(&h, config::kTransferStagingBytes, cudaHostAllocDefault));
      host_allocations_.push_back(h);
      transfer_staging_[i] = static_cast<std::byte*>(h);
      KVF_CUDA_RETURN(cudaEventCreateWithFlags(&transfer_done_[i], cudaEventDisableTiming));
    }
  }
  KVF_ASSIGN_OR_RETURN(copier_, CudaBlockCopier::Make(std::move(copier_pools), stream_, options_.device));
  return Status::Ok();
}

Status CudaBackend::Validate(const StepBatch& batch) const {
  if (batch.seqs.empty()) return InvalidArgument("an empty step");
  KVF_RETURN_IF_ERROR(ValidateStepBatch(batch, options_, pools_, config_.vocab_size, max_context_));
  for (const SequenceStep& st : batch.seqs) {
    if (st.lora_slot >= 0 && lora_slot_rank_[static_cast<size_t>(st.lora_slot)] == 0) {
      return InvalidArgument("request " + std::to_string(st.request_id) + ": LoRA slot " +
                             std::to_string(st.lora_slot) + " holds no adapter");
    }
  }
  return Status::Ok();
}

kernels::PagedKvLayout CudaBackend::PoolLayout(size_t pi) const {
  const KvPoolInfo& pool = pools_[pi];
  kernels::PagedKvLayout layout;
  layout.num_layers = static_cast<int32_t>(pool.layers.size());
  layout.num_kv_heads = RankKvHeads(pool);  // (8)
  layout.block_size = options_.block_size;
  layout.head_dim = pool.head_dim;
  layout.elem_bytes = KvFp8Now() ? 1 : 2;
  return layout;
}

Status CudaBackend::Execute(const StepBatch& batch, StepOutput* out) {
  KVF_RETURN_IF_ERROR(Validate(batch));  // (1)
  if (!peers_.empty()) return RunRanks(batch, out);  // (8)
  return RunStep(batch, out);
}

Status CudaBackend::RunStep(const StepBatch& batch, StepOutput* out) {
  // The CUDA device is per host thread; the engine thread may not be the one that built us.
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  if (lora_pending_) {  // (7) adapters loaded since the last step
    KVF_CUDA_RETURN(cudaStreamWaitEvent(stream_, lora_ready_, 0));
    lora_pending_ = false;
  }
  StepMeta m;
  PackStep(batch, &m);
  const int64_t out_rows = ShapeOutput(batch, m, out);
  KVF_RETURN_IF_ERROR(m.graph ? EnqueueGraphed(batch, m) : EnqueueStep(batch, m));
  return CollectOutput(batch, m, out_rows, out);
}

Status CudaBackend::EnqueueStep(const StepBatch& batch, const StepMeta& m) {
  KVF_RETURN_IF_ERROR(EnqueueLogits(batch, m));
  KVF_RETURN_IF_ERROR(FillAndUploadMasks(batch, m));  // (10) none: nothing queued
  return Sample(m);
}

Status CudaBackend::EnqueueLogits(const StepBatch& batch, const StepMeta& m) {
  KVF_RETURN_IF_ERROR(UploadMeta(m));
  KVF_RETURN_IF_ERROR(Forward(batch, m));
  const int32_t na = static_cast<int32_t>(m.part_a_seq.size());
  return na > 0 ? LmHead(m, m.head_rows, na) : Status::Ok();
}

Status CudaBackend::EnqueueGraphed(const StepBatch& batch, const StepMeta& m) {
  // (7) Whether the step has LoRA rows (its unfused path and staged row groups), and the
  // groups whose shrink/expand launches the graph holds.
  int32_t lora_mask = m.lora.num_tiles > 0 ? 1 << kNumLoraGroups : 0;
  for (int g = 0; g < kNumLoraGroups; ++g) lora_mask |= m.lora.num_tiles > 0 && m.lora_groups[g] && lora_debug_.launch_kernels ? 1 << g : 0;
  if (lora_mask != 0) lora_mask |= (lora_debug_.launch_expand ? 0 : 1 << (kNumLoraGroups + 1)) | (lora_debug_.launch_shrink ? 0 : 1 << (kNumLoraGroups + 2));
  // (10) A step with a masked row: its graph ends at the logits (the masks are filled while
  // it runs); sampling follows outside it. Keyed apart from the whole-step graph.
  const bool split = !m.masked_rows.empty();
  const GraphKey key{m.num_seqs, m.bucket_len, lora_mask | (split ? 1 << (kNumLoraGroups + 3) : 0)};
  auto it = graphs_.find(key);
  if (it == graphs_.end() && !graph_seen_.insert(key).second) {
    // Second step of this shape: capture it (the first ran eagerly, so every kernel
    // attribute and cuBLASLt plan is set up outside capture).
    auto capture = [&]() -> Status {
      cudaGraph_t g = nullptr;
      KVF_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const Status captured = split ? EnqueueLogits(batch, m) : EnqueueStep(batch, m);
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
      return Status::Ok();
    };
    const Status captured = capture();
    // (8) Every rank's graph is instantiated (its kernels loaded) before any rank's runs and
    // waits at a collective; a rank that failed still arrives, so none waits for ever.
    if (comm_ != nullptr) comm_->HostBarrier();
    KVF_RETURN_IF_ERROR(captured);
  }
  if (it != graphs_.end()) {
    KVF_CUDA_RETURN(cudaGraphLaunch(it->second, stream_));
    if (!split) return Status::Ok();
    KVF_RETURN_IF_ERROR(FillAndUploadMasks(batch, m));
    return Sample(m);
  }
  return EnqueueStep(batch, m);
}

namespace {
Result<std::unique_ptr<ModelBackend>> MakeCudaBackend(const BackendOptions& options) {
  KVF_ASSIGN_OR_RETURN(auto b, CudaBackend::Make(options));
  return std::unique_ptr<ModelBackend>(std::move(b));
}

// --backend auto's question (ChooseBackend): a GPU, and kernels built for it.
Result<std::string> ProbeCuda() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return Unavailable(std::string("no usable NVIDIA GPU (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") +
                       ")");
  }
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, 0);
  if (e != cudaSuccess) return Unavailable(std::string("GPU 0 cannot be queried: ") + cudaGetErrorString(e));
  const std::string gpu =
      std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor);
  e = kernels::CheckKernelImage(0);
  if (e != cudaSuccess) {
    return FailedPrecondition(gpu + ": the build's kernels do not run on it (" + cudaGetErrorString(e) +
                              "; KVFLEET_CUDA_GENCODE names the targets)");
  }
  return gpu;
}
}  // namespace

}  // namespace kvfleet::backend::cuda

KVF_REGISTER_BACKEND(cuda, "cuda", kvfleet::backend::cuda::MakeCudaBackend)
extern "C" {
extern const bool kvfleet_backend_cuda_probe_registered;
const bool kvfleet_backend_cuda_probe_registered =
    ::kvfleet::backend::RegisterBackendProbe("cuda", kvfleet::backend::cuda::ProbeCuda);
}
