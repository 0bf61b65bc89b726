#include "worker/backend/backend.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "worker/backend/sampler.h"

#include "common/check.h"

namespace kvfleet::backend {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory, std::less<>> factories;
};

// Function-local so registrars running before main() find it constructed.
Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

bool RegisterBackend(std::string name, BackendFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  bool inserted = r.factories.emplace(std::move(name), std::move(factory)).second;
  KVF_CHECK(inserted) << "a backend registered twice under one name";
  return true;
}

Result<KvCacheDtype> ParseKvCacheDtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "bf16" || name == "bfloat16") return KvCacheDtype::kBf16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::kFp8E4m3;
  return InvalidArgument("--kv-cache-dtype must be auto, bf16, fp8 or fp8_e4m3, got '" + std::string(name) + "'");
}

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto: return "auto";
    case KvCacheDtype::kBf16: return "bf16";
    case KvCacheDtype::kFp8E4m3: return "fp8_e4m3";
  }
  return "?";
}

Result<std::unique_ptr<ModelBackend>> CreateBackend(std::string_view name, const BackendOptions& options) {
  BackendFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : BackendNames()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("unknown backend '" + std::string(name) + "' (built in: " +
                    (known.empty() ? "none" : known) + ")");
  }
  return factory(options);
}

std::vector<std::string> BackendNames() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

namespace {
std::string Req(const SequenceStep& s) { return "request " + std::to_string(s.request_id); }
}  // namespace

KvPoolInfo PoolInfoOf(const kv::PoolLayout& layout, const model::ModelConfig& c, const BackendOptions& options,
                      int64_t max_context) {
  KvPoolInfo p;
  p.window = static_cast<int32_t>(layout.window);
  p.sink_tokens = static_cast<int32_t>(layout.sink_tokens);
  p.position_shift = layout.dense_context;  // --streaming-llm turns on both, on windowed pools
  p.dense_context = layout.dense_context;
  p.attention_chunk = static_cast<int32_t>(layout.attention_chunk);
  p.num_kv_heads = static_cast<int32_t>(layout.num_kv_heads);
  p.head_dim = static_cast<int32_t>(c.head_dim);
  p.layers.assign(layout.layers.begin(), layout.layers.end());
  p.bytes_per_block = layout.bytes_per_block;
  p.device_blocks = layout.device_blocks;
  p.host_blocks = layout.host_blocks;
  p.max_blocks_per_seq = (max_context + options.block_size - 1) / options.block_size;
  return p;
}

void MapLayersToPools(std::span<const KvPoolInfo> pools, int64_t num_layers, std::vector<int32_t>* pool_of,
                      std::vector<int32_t>* index_in_pool) {
  pool_of->assign(num_layers, -1);
  index_in_pool->assign(num_layers, -1);
  for (size_t pi = 0; pi < pools.size(); ++pi) {
    for (size_t li = 0; li < pools[pi].layers.size(); ++li) {
      (*pool_of)[pools[pi].layers[li]] = static_cast<int32_t>(pi);
      (*index_in_pool)[pools[pi].layers[li]] = static_cast<int32_t>(li);
    }
  }
}

VisibleRange VisibleOf(const KvPoolInfo& p, int64_t q, int64_t context_end) {
  if (DenseQuery(p, q, context_end)) return VisibleRange{0, 0, 0};
  const int64_t chunk_lo = p.attention_chunk > 0 ? q / p.attention_chunk * p.attention_chunk : 0;
  int64_t lo = chunk_lo;
  if (p.window > 0) lo = std::max(lo, q - p.window + 1);
  VisibleRange v{lo, 0, 0};
  if (p.window > 0 && p.sink_tokens > 0) {
    v.sink_lo = chunk_lo;
    v.sink_hi = std::min<int64_t>(p.sink_tokens, lo);
    if (v.sink_hi < v.sink_lo) v.sink_hi = v.sink_lo;
  }
  return v;
}

Status ModelBackend::LoadLora(int32_t /*slot*/, const model::LoraAdapter& adapter) {
  return FailedPrecondition("the " + std::string(name()) + " backend serves no LoRA adapters (adapter '" + adapter.name +
                            "')");
}

Status ModelBackendBase::CheckKvTransfer(uint32_t pool, size_t blocks, size_t bytes) const {
  const KvTransferFormat f = kv_transfer_format();
  if (f.dtype.empty()) return FailedPrecondition(f.unsupported);
  if (pool >= pools_.size()) return InvalidArgument("KV transfer: no pool " + std::to_string(pool));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  if (bytes != blocks * bpb) {
    return InvalidArgument("KV transfer: " + std::to_string(bytes) + " bytes for " + std::to_string(blocks) +
                           " blocks of " + std::to_string(bpb));
  }
  return Status::Ok();
}

KvTransferFormat ModelBackend::kv_transfer_format() const {
  return KvTransferFormat{"", "the " + std::string(name()) + " backend cannot move KV blocks between workers", {}};
}

Status ModelBackend::ReadKvBlocks(uint32_t /*pool*/, std::span<const kv::BlockLocation> /*blocks*/,
                                  std::span<std::byte> /*out*/) {
  return FailedPrecondition(kv_transfer_format().unsupported);
}

Status ModelBackend::WriteKvBlocks(uint32_t /*pool*/, std::span<const BlockId> /*blocks*/,
                                   std::span<const std::byte> /*in*/) {
  return FailedPrecondition(kv_transfer_format().unsupported);
}

Status ModelBackend::WriteKvBlocksFrom(uint32_t pool, std::span<const BlockId> blocks,
                                       std::span<const std::span<const std::byte>> in) {
  if (blocks.size() != in.size()) return InvalidArgument("KV transfer: block and buffer counts differ");
  for (size_t i = 0; i < blocks.size(); ++i) KVF_RETURN_IF_ERROR(WriteKvBlocks(pool, blocks.subspan(i, 1), in[i]));
  return Status::Ok();
}

std::vector<std::string> ModelBackend::ExportKvDevice() { return {}; }

Result<std::unique_ptr<KvNccl>> ModelBackend::MakeKvNccl(std::function<void()> /*on_done*/) {
  return FailedPrecondition("the " + std::string(name()) + " backend moves no device blocks by NCCL (cuda workers do)");
}

Status ModelBackend::CopyKvBlocksFromPeer(uint32_t /*pool*/, const std::string& /*handle*/,
                                          std::span<const BlockId> /*src*/, std::span<const BlockId> /*dst*/) {
  return FailedPrecondition("the " + std::string(name()) + " backend copies no device blocks from another process");
}

PromptLogprobRows PromptLogprobRowsOf(const SequenceStep& step) {
  if (!step.prompt_logprobs) return {};
  const int64_t first = step.start_position;
  const int64_t end = std::min<int64_t>(first + static_cast<int64_t>(step.tokens.size()), step.prompt_len - 1);
  return {first, std::max(first, end)};
}

Status FillStepTokenBitmask(const StepBatch& batch, size_t i, std::span<uint32_t> mask) {
  const SequenceStep& s = batch.seqs[i];
  if (!s.token_bitmask.empty()) {
    KVF_CHECK(s.token_bitmask.size() == mask.size()) << "a token bitmask of " << s.token_bitmask.size() << " words";
    std::copy(s.token_bitmask.begin(), s.token_bitmask.end(), mask.begin());
    return Status::Ok();
  }
  batch.fill_token_bitmask(i, mask);
  for (uint32_t w : mask) {
    if (w != 0) return Status::Ok();
  }
  return InvalidArgument(Req(s) + ": its late token bitmask allows no token");
}

Status ValidateStepBatch(const StepBatch& batch, const BackendOptions& options, const std::vector<KvPoolInfo>& pools,
                         int64_t vocab_size, int64_t max_context) {
  if (batch.seqs.size() > static_cast<size_t>(options.max_batch_size)) {
    return InvalidArgument("a step of " + std::to_string(batch.seqs.size()) + " sequences; the limit is " +
                           std::to_string(options.max_batch_size));
  }
  const int64_t B = options.block_size;
  int64_t total = 0;
  std::set<std::pair<size_t, kv::BlockId>> written;
  for (const SequenceStep& s : batch.seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return InvalidArgument(Req(s) + ": no tokens");
    if (s.lora_slot < -1 || s.lora_slot >= options.max_loras) {
      return InvalidArgument(Req(s) + ": LoRA slot " + std::to_string(s.lora_slot) + " is outside the backend's " +
                             std::to_string(options.max_loras) + " slots");
    }
    total += n;
    const int64_t end = s.start_position + n;
    if (s.start_position < 0 || end > max_context) {
      return InvalidArgument(Req(s) + ": positions [" + std::to_string(s.start_position) + ", " + std::to_string(end) +
                             ") are outside the context of " + std::to_string(max_context));
    }
    for (TokenId t : s.tokens) {
      if (static_cast<int64_t>(t) >= vocab_size) {
        return InvalidArgument(Req(s) + ": token " + std::to_string(t) + " is outside the vocabulary of " +
                               std::to_string(vocab_size));
      }
    }
    if (s.sampling == nullptr) return InvalidArgument(Req(s) + ": no sampling parameters");
    const SamplingParams& sampling = *s.sampling;
    if (s.sample || s.prompt_logprobs) KVF_RETURN_IF_ERROR(ValidateSampling(sampling).WithContext(Req(s)));
    if (s.prompt_logprobs && sampling.logprobs < 0) {
      return InvalidArgument(Req(s) + ": prompt logprobs need the sampling parameters' logprobs >= 0");
    }
    if ((sampling.penalized() || s.prompt_logprobs) && static_cast<int64_t>(s.history.size()) < s.start_position + n) {
      return InvalidArgument(Req(s) + ": its history does not reach the step's tokens");
    }
    for (const auto& [token, bias] : sampling.logit_bias) {
      if (static_cast<int64_t>(token) >= vocab_size) {
        return InvalidArgument(Req(s) + ": logit_bias token " + std::to_string(token) + " is outside the vocabulary");
      }
    }
    if (!s.token_bitmask.empty()) {
      if (s.token_bitmask.size() != grammar::BitmaskWords(static_cast<size_t>(vocab_size))) {
        return InvalidArgument(Req(s) + ": a token bitmask of " + std::to_string(s.token_bitmask.size()) +
                               " words for a vocabulary of " + std::to_string(vocab_size));
      }
      bool any = false;
      for (uint32_t w : s.token_bitmask) any |= w != 0;
      if (!any) return InvalidArgument(Req(s) + ": its token bitmask allows no token");
    }
    if (s.late_token_bitmask) {
      if (!s.sample || !s.token_bitmask.empty()) {
        return InvalidArgument(Req(s) + ": a late token bitmask needs a sampled row without a token_bitmask");
      }
      if (!batch.fill_token_bitmask) return InvalidArgument(Req(s) + ": a late token bitmask but no filler in the batch");
    }
    if (s.block_tables.size() != pools.size()) {
      return InvalidArgument(Req(s) + ": " + std::to_string(s.block_tables.size()) + " block tables for " +
                             std::to_string(pools.size()) + " KV pools");
    }
    for (size_t p = 0; p < pools.size(); ++p) {
      const auto& table = s.block_tables[p];
      const std::string where = Req(s) + ", pool " + std::to_string(p);
      if (static_cast<int64_t>(table.size()) * B < end) {
        return InvalidArgument(where + ": the block table does not reach position " + std::to_string(end - 1));
      }
      if (static_cast<int64_t>(table.size()) > pools[p].max_blocks_per_seq) {
        return InvalidArgument(where + ": a block table of " + std::to_string(table.size()) + " entries; the limit is " +
                               std::to_string(pools[p].max_blocks_per_seq));
      }
      // Only the entries the step reads or writes: a streamed sequence's table is long, but a
      // step sees its window and sinks.
      auto need = [&](int64_t lo, int64_t hi, const char* what) -> Status {  // positions [lo, hi)
        for (int64_t t = lo; t < hi; t += B - t % B) {
          const kv::BlockId id = table[t / B];
          if (id == kNoBlock) {
            return InvalidArgument(where + ": no block for " + what + " position " + std::to_string(t));
          }
          if (static_cast<int64_t>(id) >= pools[p].device_blocks) {
            return InvalidArgument(where + ": block id " + std::to_string(id) + " out of range");
          }
        }
        return Status::Ok();
      };
      // Visible ranges only grow towards the end of the step, except where a dense prompt
      // query precedes windowed ones: then the first query's range is the widest.
      const VisibleRange first = VisibleOf(pools[p], s.start_position, s.context_end);
      const VisibleRange last = VisibleOf(pools[p], end - 1, s.context_end);
      KVF_RETURN_IF_ERROR(need(first.lo, end, "visible"));
      KVF_RETURN_IF_ERROR(need(first.sink_lo, std::max(first.sink_hi, last.sink_hi), "sink"));
      for (int64_t t = s.start_position; t < end; t += B - t % B) {
        if (!written.emplace(p, table[t / B]).second) {
          return InvalidArgument(where + ": block " + std::to_string(table[t / B]) +
                                 " is written by two sequences of the step");
        }
      }
    }
  }
  if (total > options.max_num_tokens) {
    return InvalidArgument("a step of " + std::to_string(total) + " tokens; the limit is " +
                           std::to_string(options.max_num_tokens));
  }
  return Status::Ok();
}

}  // namespace kvfleet::backend
