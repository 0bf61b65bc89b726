#include "worker/backend/mock/mock_backend.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/check.h"
#include "worker/backend/kv_setup.h"
#include "worker/backend/sampler.h"
#include "worker/backend/tensor_parallel.h"

namespace kvfleet::backend::mock {

// The shadow KV cache of verify_kv: per pool and tier, the (token, position) in each slot.
// Without verify_kv it only counts copies, and the modelled bytes of those between the tiers
// (which the next step pays for).
class MockBackend::ShadowCopier final : public kv::BlockCopier {
 public:
  struct Slot {
    TokenId token = 0;
    uint32_t position_plus_one = 0;  // 0: never written
  };
  ShadowCopier(const std::vector<KvPoolInfo>& pools, uint32_t block_size, bool enabled) : block_size_(block_size) {
    for (const KvPoolInfo& p : pools) bytes_per_block_.push_back(p.bytes_per_block);
    if (!enabled) return;
    for (const KvPoolInfo& p : pools) {
      tiers_.push_back({std::vector<Slot>(static_cast<size_t>(p.device_blocks) * block_size),
                        std::vector<Slot>(static_cast<size_t>(p.host_blocks) * block_size)});
    }
  }
  void Copy(std::span<const kv::BlockCopy> copies) override {
    copies_ += copies.size();
    for (const kv::BlockCopy& c : copies) {
      if (c.src_tier != c.dst_tier) tier_copy_bytes_ += bytes_per_block_[c.pool];
    }
    if (tiers_.empty()) return;
    for (const kv::BlockCopy& c : copies) {
      auto& src = tiers_[c.pool][static_cast<int>(c.src_tier)];
      auto& dst = tiers_[c.pool][static_cast<int>(c.dst_tier)];
      std::copy_n(src.begin() + static_cast<size_t>(c.src) * block_size_, block_size_,
                  dst.begin() + static_cast<size_t>(c.dst) * block_size_);
    }
  }
  bool enabled() const { return !tiers_.empty(); }
  std::vector<Slot>& device(uint32_t pool) { return tiers_[pool][0]; }
  uint64_t copies() const { return copies_; }
  // The bytes copied between the tiers since the last call.
  uint64_t TakeTierCopyBytes() { return std::exchange(tier_copy_bytes_, 0); }

 private:
  uint32_t block_size_;
  std::vector<uint64_t> bytes_per_block_;  // per pool
  uint64_t tier_copy_bytes_ = 0;
  std::vector<std::array<std::vector<Slot>, kv::kNumTiers>> tiers_;
  uint64_t copies_ = 0;
};

namespace {

// The end of a step of `duration` asked for at `start` on `device`, shared by the mocks of
// this process that name it: after every step reserved on it before.
TimeNs ReserveDevice(const std::string& device, TimeNs start, DurationNs duration) {
  static std::mutex mu;
  static std::map<std::string, TimeNs, std::less<>> busy_until;  // GUARDED_BY(mu)
  std::lock_guard<std::mutex> lock(mu);
  TimeNs& until = busy_until[device];
  until = std::max(until, start) + duration;
  return until;
}

}  // namespace

Status ParseMockSettings(const BackendOptions& options, MockOptions* mock) {
  for (const auto& [key, value] : options.extra) {
    if (!key.starts_with("mock.")) continue;
    try {
      if (key == "mock.step_base_us") {
        mock->cost.step_base_us = std::stod(value);
      } else if (key == "mock.prefill_token_us") {
        mock->cost.prefill_token_us = std::stod(value);
      } else if (key == "mock.decode_seq_us") {
        mock->cost.decode_seq_us = std::stod(value);
      } else if (key == "mock.kv_token_read_us") {
        mock->cost.kv_token_read_us = std::stod(value);
      } else if (key == "mock.tier_copy_us_per_mib") {
        mock->cost.tier_copy_us_per_mib = std::stod(value);
      } else if (key == "mock.verify_kv") {
        mock->verify_kv = value == "1" || value == "true";
      } else if (key == "mock.device") {
        mock->device = value;
      } else if (key == "mock.eos_after") {
        mock->eos_after = static_cast<uint32_t>(std::stoul(value));
      } else {
        return InvalidArgument("unknown mock backend setting '" + key + "'");
      }
    } catch (const std::exception&) {
      return InvalidArgument("mock backend setting " + key + ": '" + value + "' is not a number");
    }
  }
  return mock->cost.Validate();
}

model::ModelConfig DefaultMockModelConfig() {
  model::ModelConfig c;
  c.architecture = model::Architecture::kLlama;
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.layer_window.assign(32, 0);
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.torch_dtype = "bfloat16";
  return c;
}

MockBackend::MockBackend(const BackendOptions& options, MockOptions mock, model::ModelConfig config)
    : ModelBackendBase(options, std::move(config)), mock_(std::move(mock)) {}

MockBackend::~MockBackend() = default;

Result<std::unique_ptr<MockBackend>> MockBackend::Make(const BackendOptions& options, MockOptions mock) {
  KVF_RETURN_IF_ERROR(mock.cost.Validate());
  model::ModelConfig config = DefaultMockModelConfig();
  if (!options.model_dir.empty()) {
    KVF_ASSIGN_OR_RETURN(config, model::LoadModelConfig(options.model_dir));
  }
  if (config.layer_window.empty()) config.layer_window.assign(config.num_layers, 0);
  if (!IsValidBlockSize(options.block_size)) return InvalidArgument("block size must be a power of two");
  // No math to shard: N is checked against the model as a real backend would, and announced.
  KVF_RETURN_IF_ERROR(CheckTensorParallel(config, options.tensor_parallel));
  std::unique_ptr<MockBackend> b(new MockBackend(options, std::move(mock), std::move(config)));
  b->max_context_ = options.max_context > 0 ? options.max_context : b->config_.max_position_embeddings;
  KVF_RETURN_IF_ERROR(CheckAttentionOptions(b->config_, options.attention, static_cast<uint32_t>(options.block_size),
                                            static_cast<uint32_t>(b->max_context_)));

  KvMemorySettings memory;
  memory.block_size = static_cast<uint32_t>(options.block_size);
  memory.max_context = static_cast<uint32_t>(b->max_context_);
  // fp8 models the capacity only: one byte per element, so the same bytes hold twice the blocks.
  memory.dtype_bytes = options.kv_cache_dtype == KvCacheDtype::kFp8E4m3 ? 1 : config::kKvElementBytes;
  memory.device_bytes = options.kv_cache_bytes > 0 ? options.kv_cache_bytes : config::kDefaultKvBytes;
  memory.host_bytes = options.host_kv_bytes;
  kv::KvCacheConfig kv_config = KvCacheConfigFor(b->config_, memory, options.attention);
  if (options.num_blocks > 0) {
    // Exactly num_blocks per pool when there is one pool (tests): size the budget to it.
    KVF_RETURN_IF_ERROR(kv_config.Validate());
    KVF_ASSIGN_OR_RETURN(auto probe, kv::ComputePools(kv_config));
    uint64_t per_block = 0;
    for (const auto& p : probe) per_block += p.bytes_per_block;
    kv_config.device_bytes = static_cast<uint64_t>(options.num_blocks) * per_block;
  }
  KVF_RETURN_IF_ERROR(kv_config.Validate());
  KVF_ASSIGN_OR_RETURN(auto layouts, kv::ComputePools(kv_config));
  b->device_bytes_ = kv_config.device_bytes;
  b->host_bytes_ = kv_config.host_bytes;
  for (const kv::PoolLayout& l : layouts) b->pools_.push_back(PoolInfoOf(l, b->config_, options, b->max_context_));
  b->copier_ = std::make_unique<ShadowCopier>(b->pools_, options.block_size, b->mock_.verify_kv);
  if (!b->mock_.clock) b->mock_.clock = SystemClock::Default();
  if (options.max_loras < 0) return InvalidArgument("mock backend: max_loras must be >= 0");
  b->lora_slots_.assign(static_cast<size_t>(options.max_loras), 0);
  return b;
}

Status MockBackend::LoadLora(int32_t slot, const model::LoraAdapter& adapter) {
  if (slot < 0 || slot >= options_.max_loras) {
    return InvalidArgument("LoRA slot " + std::to_string(slot) + " is outside the mock backend's " +
                           std::to_string(options_.max_loras) + " slots");
  }
  if (adapter.rank > options_.max_lora_rank) {
    return InvalidArgument("LoRA adapter '" + adapter.name + "': rank " + std::to_string(adapter.rank) +
                           " is above --max-lora-rank " + std::to_string(options_.max_lora_rank));
  }
  lora_slots_[slot] = adapter.lora_id != 0 ? adapter.lora_id : 1;
  return Status::Ok();
}

kv::BlockCopier& MockBackend::block_copier() { return *copier_; }

Status MockBackend::Validate(const StepBatch& batch) const {
  if (batch.seqs.size() > static_cast<size_t>(options_.max_batch_size)) {
    return InvalidArgument("a step of " + std::to_string(batch.seqs.size()) + " sequences; the limit is " +
                           std::to_string(options_.max_batch_size));
  }
  int64_t tokens = 0;
  const int64_t block_size = options_.block_size;
  for (const SequenceStep& s : batch.seqs) {
    if (s.tokens.empty()) return InvalidArgument("request " + std::to_string(s.request_id) + ": no tokens");
    tokens += static_cast<int64_t>(s.tokens.size());
    if (s.block_tables.size() != pools_.size()) {
      return InvalidArgument("request " + std::to_string(s.request_id) + ": a block table per pool is required");
    }
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    for (size_t p = 0; p < pools_.size(); ++p) {
      const auto& table = s.block_tables[p];
      if (static_cast<int64_t>(table.size()) * block_size < end) {
        return InvalidArgument("request " + std::to_string(s.request_id) + ": the block table of pool " +
                               std::to_string(p) + " does not cover position " + std::to_string(end - 1));
      }
      for (int64_t pos = s.start_position; pos < end; pos += block_size - pos % block_size) {
        if (table[pos / block_size] == kNoBlock) {
          return InvalidArgument("request " + std::to_string(s.request_id) + ": no block for written position " +
                                 std::to_string(pos));
        }
      }
      // The entries the step reads: a streamed sequence's table is long, its window short.
      const VisibleRange vis = VisibleOf(pools_[p], s.start_position, s.context_end);
      const std::pair<int64_t, int64_t> ranges[] = {{vis.sink_lo, vis.sink_hi}, {vis.lo, end}};
      for (const auto& [lo, hi] : ranges) {
        for (int64_t t = lo; t < hi; t += block_size - t % block_size) {
          const BlockId b = table[t / block_size];
          if (b != kNoBlock && b >= static_cast<BlockId>(pools_[p].device_blocks)) {
            return InvalidArgument("request " + std::to_string(s.request_id) + ": block id " + std::to_string(b) +
                                   " out of range");
          }
        }
      }
    }
    if (s.sampling == nullptr) {
      return InvalidArgument("request " + std::to_string(s.request_id) + ": no sampling parameters");
    }
    if (s.sample) KVF_RETURN_IF_ERROR(ValidateSampling(*s.sampling));
    if (s.lora_slot < -1 || s.lora_slot >= options_.max_loras || (s.lora_slot >= 0 && lora_slots_[s.lora_slot] == 0)) {
      return InvalidArgument("request " + std::to_string(s.request_id) + ": LoRA slot " + std::to_string(s.lora_slot) +
                             " holds no adapter (the backend has " + std::to_string(options_.max_loras) + " slots)");
    }
  }
  if (tokens > options_.max_num_tokens) {
    return InvalidArgument("a step of " + std::to_string(tokens) + " tokens; the limit is " +
                           std::to_string(options_.max_num_tokens));
  }
  return Status::Ok();
}

Result<uint64_t> MockBackend::WriteAndRead(const SequenceStep& s) {
  const int64_t block_size = options_.block_size;
  const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
  uint64_t h = 0;
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    auto& shadow = copier_->device(p);
    const auto& table = s.block_tables[p];
    auto slot = [&](int64_t pos) -> ShadowCopier::Slot& {
      return shadow[static_cast<size_t>(table[pos / block_size]) * block_size + pos % block_size];
    };
    for (int64_t i = 0; i < static_cast<int64_t>(s.tokens.size()); ++i) {
      slot(s.start_position + i) = {s.tokens[i], static_cast<uint32_t>(s.start_position + i + 1)};
    }
    // What the last query sees (backend.h's visibility rule): sinks, then [lo, q].
    const int64_t q = end - 1;
    const VisibleRange vis = VisibleOf(pools_[p], q, s.context_end);
    auto read = [&](int64_t lo, int64_t hi) -> Status {  // positions [lo, hi)
      for (int64_t t = lo; t < hi; ++t) {
        if (table[t / block_size] == kNoBlock) {
          return Internal("request " + std::to_string(s.request_id) + ": position " + std::to_string(t) +
                          " is visible but has no block");
        }
        const ShadowCopier::Slot& got = slot(t);
        if (got.position_plus_one != static_cast<uint32_t>(t + 1)) {
          return Internal("request " + std::to_string(s.request_id) + ": the KV slot of position " +
                          std::to_string(t) +
                          (got.position_plus_one == 0 ? std::string(" was never written")
                                                      : " holds position " + std::to_string(got.position_plus_one - 1)));
        }
        h = SplitMix64(h ^ (static_cast<uint64_t>(got.token) << 32 | static_cast<uint64_t>(t)));
      }
      return Status::Ok();
    };
    KVF_RETURN_IF_ERROR(read(vis.sink_lo, vis.sink_hi));
    KVF_RETURN_IF_ERROR(read(vis.lo, q + 1));
  }
  return h;
}

void MockBackend::UseVocabulary(const grammar::Vocabulary& vocabulary) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  token_classes_.assign(4, std::vector<uint32_t>(grammar::BitmaskWords(vocab), 0));
  auto only = [](std::string_view t, std::string_view of) {
    return !t.empty() && t.find_first_not_of(of) == std::string_view::npos;
  };
  for (size_t id = 0; id < vocab && id < vocabulary.size(); ++id) {
    const std::string& t = vocabulary.token(static_cast<int32_t>(id));
    const int c = vocabulary.is_stop(static_cast<int32_t>(id)) || only(t, "\"}]") ? 0
                  : only(t, ",:")                                                  ? 1
                  : t.find_first_of(" \t\r\n") == std::string::npos              ? 2
                                                                                   : 3;
    token_classes_[c][id / 32] |= 1u << (id % 32);
  }
}

TokenId MockBackend::AllowedTokenFor(const SequenceStep& s, std::span<const uint32_t> allowed, uint64_t hash) const {
  if (token_classes_.empty()) {  // the first allowed id from the pseudo-random one on, wrapping
    const size_t vocab = static_cast<size_t>(config_.vocab_size);
    for (size_t k = 0; k < vocab; ++k) {
      const size_t id = (hash + k) % vocab;
      if (allowed[id / 32] >> (id % 32) & 1u) return static_cast<TokenId>(id);
    }
  }
  for (const std::vector<uint32_t>& cls : token_classes_) {
    uint64_t count = 0;
    for (size_t w = 0; w < allowed.size(); ++w) count += std::popcount(allowed[w] & cls[w]);
    if (count == 0) continue;
    uint64_t k = hash % count;  // the k-th allowed token of the class, in id order
    for (size_t w = 0; w < allowed.size(); ++w) {
      uint32_t bits = allowed[w] & cls[w];
      const uint64_t here = std::popcount(bits);
      if (k >= here) {
        k -= here;
        continue;
      }
      for (; k > 0; --k) bits &= bits - 1;
      return static_cast<TokenId>(w * 32 + std::countr_zero(bits));
    }
  }
  KVF_CHECK(false) << "request " << s.request_id << ": its token bitmask allows no token";
  return kNoToken;
}

TokenId MockBackend::TokenFor(const SequenceStep& s, std::span<const uint32_t> allowed, uint64_t context) const {
  const uint64_t vocab = static_cast<uint64_t>(config_.vocab_size);
  const uint64_t hash = SplitMix64(s.seed ^ SplitMix64(s.rng_counter + 1) ^ context);
  if (!allowed.empty()) return AllowedTokenFor(s, allowed, hash);
  if (mock_.eos_after > 0 && s.rng_counter + 1 == mock_.eos_after && !config_.eos_token_ids.empty()) {
    return static_cast<TokenId>(config_.eos_token_ids.front());
  }
  TokenId t = static_cast<TokenId>(hash % vocab);
  while (std::count(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), static_cast<int64_t>(t))) {
    t = static_cast<TokenId>((t + 1) % vocab);
  }
  return t;
}

// The mock has no logits: a token's logprob is -1 and its top entries are the token
// itself, then the ids after it at -2, -3, ... (shapes for router tests, not numbers).
TokenLogprobs MockBackend::MockLogprobs(TokenId token, int32_t top) const {
  TokenLogprobs lp{token, -1.0f, {}};
  for (int32_t k = 0; k < top; ++k) {
    lp.top.emplace_back(static_cast<TokenId>((token + k) % config_.vocab_size), -1.0f - static_cast<float>(k));
  }
  return lp;
}

Status MockBackend::Execute(const StepBatch& batch, StepOutput* out) {
  const TimeNs start = mock_.clock->Now();
  KVF_RETURN_IF_ERROR(Validate(batch));
  CostModel::Work work;
  out->tokens.assign(batch.seqs.size(), kNoToken);
  out->logits_offset.assign(batch.seqs.size(), -1);
  out->logits.clear();
  out->logprobs.assign(batch.seqs.size(), {});
  out->prompt_logprobs.assign(batch.seqs.size(), {});
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SequenceStep& s = batch.seqs[i];
    if (s.tokens.size() == 1) {
      ++work.decode_seqs;
    } else {
      work.prefill_tokens += s.tokens.size();
    }
    work.kv_tokens_read += static_cast<uint64_t>(s.start_position) + s.tokens.size();
    uint64_t context = s.tokens.back();
    if (copier_->enabled()) {
      KVF_ASSIGN_OR_RETURN(context, WriteAndRead(s));
    }
    if (s.lora_slot >= 0) context = SplitMix64(context ^ lora_slots_[s.lora_slot]);
    std::span<const uint32_t> allowed;
    if (HasTokenBitmask(s)) {
      mask_.resize(grammar::BitmaskWords(static_cast<size_t>(config_.vocab_size)));
      KVF_RETURN_IF_ERROR(FillStepTokenBitmask(batch, i, mask_));
      allowed = mask_;
    }
    if (s.sample) out->tokens[i] = TokenFor(s, allowed, context);
    if (s.sample && s.sampling->logprobs >= 0) out->logprobs[i] = MockLogprobs(out->tokens[i], s.sampling->logprobs);
    const PromptLogprobRows prompt_rows = PromptLogprobRowsOf(s);
    for (int64_t p = prompt_rows.first; p < prompt_rows.end; ++p) {
      out->prompt_logprobs[i].push_back(MockLogprobs(s.history[p + 1], s.sampling->logprobs));
    }
  }
  work.tier_copy_bytes = copier_->TakeTierCopyBytes();
  last_step_ = mock_.cost.StepDuration(work);
  const TimeNs deadline = mock_.device.empty() ? start + last_step_ : ReserveDevice(mock_.device, start, last_step_);
  if (mock_.wait) {
    mock_.wait(deadline);
  } else {
    std::this_thread::sleep_for(std::chrono::nanoseconds(deadline - mock_.clock->Now()));
  }
  return Status::Ok();
}

namespace {

Result<std::unique_ptr<ModelBackend>> MakeMock(const BackendOptions& options) {
  MockOptions mock;
  KVF_RETURN_IF_ERROR(ParseMockSettings(options, &mock));
  KVF_ASSIGN_OR_RETURN(auto backend, MockBackend::Make(options, std::move(mock)));
  return std::unique_ptr<ModelBackend>(std::move(backend));
}

}  // namespace

double MockBackend::ExpectedPrefillTokensPerSecond(uint32_t max_tokens, double max_step_ms) const {
  const CostModel& c = mock_.cost;
  uint64_t tokens = std::max<uint32_t>(max_tokens, 1);
  if (max_step_ms > 0 && c.prefill_token_us > 0) {
    const double fit = (max_step_ms * 1e3 - c.step_base_us) / c.prefill_token_us;
    tokens = std::clamp<uint64_t>(fit > 1 ? static_cast<uint64_t>(fit) : 1, 1, tokens);
  }
  const DurationNs d = c.StepDuration({tokens, 0, tokens, 0});
  return d > 0 ? static_cast<double>(tokens) * kNsPerSec / static_cast<double>(d) : 0;
}

}  // namespace kvfleet::backend::mock

KVF_REGISTER_BACKEND(mock, "mock", ::kvfleet::backend::mock::MakeMock)
