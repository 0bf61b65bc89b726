#include "worker/backend/kv_setup.h"

#include <algorithm>
#include <string>

namespace kvfleet::backend {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// config.json's window of a layer, 0 for full attention (a window as long as the context is).
int64_t ModelWindow(const model::ModelConfig& model, int64_t layer, uint32_t max_context) {
  if (layer >= static_cast<int64_t>(model.layer_window.size())) return 0;
  const int64_t w = model.layer_window[layer];
  return w >= max_context ? 0 : w;
}

}  // namespace

Status CheckAttentionOptions(const model::ModelConfig& model, const AttentionOptions& a, uint32_t block_size,
                             uint32_t max_context) {
  const auto& list = a.max_attention_window;
  if (list.size() > static_cast<size_t>(model.num_layers)) {
    return InvalidArgument("--max-attention-window has " + Str(static_cast<int64_t>(list.size())) +
                           " windows for a model of " + Str(model.num_layers) + " layers");
  }
  for (int32_t w : list) {
    if (w <= 0) return InvalidArgument("--max-attention-window: window " + Str(w) + " is not a positive token count");
  }
  if (a.sink_tokens < 0) return InvalidArgument("--sink-tokens must be >= 0, got " + Str(a.sink_tokens));
  if (a.attention_chunk_size < 0) {
    return InvalidArgument("--attention-chunk-size must be >= 0, got " + Str(a.attention_chunk_size));
  }
  // Per layer: the window in effect, and whether the model's config is where it comes from.
  int64_t windowed = 0;
  for (int64_t l = 0; l < model.num_layers; ++l) {
    const int64_t from_model = ModelWindow(model, l, max_context);
    int64_t w = from_model;
    if (!list.empty()) {
      const int64_t asked = list[static_cast<size_t>(l) % list.size()];
      w = asked >= max_context ? 0 : asked;
      if (from_model != 0 && (w == 0 || w > from_model)) {
        return InvalidArgument("--max-attention-window: layer " + Str(l) + "'s window of " + Str(asked) +
                               " tokens exceeds the model's sliding window of " + Str(from_model) +
                               " (config.json): the model never attends that far");
      }
    }
    if (w == 0) continue;
    ++windowed;
    if (w < a.sink_tokens) {
      return InvalidArgument((list.empty() ? "the model's sliding window of " + Str(w) + " tokens (config.json)"
                                           : "--max-attention-window " + Str(w)) +
                             " is shorter than --sink-tokens " + Str(a.sink_tokens) + " (layer " + Str(l) + ")");
    }
  }
  if (a.sink_tokens > 0 && windowed == 0) {
    return InvalidArgument("--sink-tokens needs a sliding window shorter than the context (" + Str(max_context) +
                           " tokens): set --max-attention-window");
  }
  if (a.streaming_llm) {
    if (windowed == 0) {
      return InvalidArgument("--streaming-llm needs a sliding window shorter than the context (" + Str(max_context) +
                             " tokens): set --max-attention-window");
    }
    if (a.sink_tokens == 0) {
      return InvalidArgument("--streaming-llm needs --sink-tokens > 0 (StreamingLLM keeps the first tokens as "
                             "attention sinks; --max-attention-window alone is a plain sliding window)");
    }
    if (kernels::RopeDependsOnLength(model.rope())) {
      return InvalidArgument("--streaming-llm cannot be combined with the model's rope_scaling.rope_type dynamic "
                             "(config.json): its position shift rotates cached keys with one set of frequencies, "
                             "dynamic NTK changes them with the sequence's length");
    }
  }
  const int64_t model_chunk = model.attention_chunk_size;
  if (a.attention_chunk_size > 0 && model_chunk > 0 && a.attention_chunk_size != model_chunk) {
    return InvalidArgument("--attention-chunk-size " + Str(a.attention_chunk_size) +
                           " contradicts the model's attention_chunk_size of " + Str(model_chunk) + " (config.json)");
  }
  const int64_t chunk = a.attention_chunk_size > 0 ? a.attention_chunk_size : model_chunk;
  if (chunk > 0 && chunk % block_size != 0) {
    return InvalidArgument((a.attention_chunk_size > 0 ? "--attention-chunk-size " + Str(chunk)
                                                        : "the model's attention_chunk_size of " + Str(chunk) +
                                                              " (config.json)") +
                           " is not a multiple of --block-size " + Str(block_size));
  }
  if (chunk > 0 && (a.sink_tokens > 0 || a.streaming_llm)) {
    return InvalidArgument(std::string(a.sink_tokens > 0 ? "--sink-tokens" : "--streaming-llm") + " and " +
                           (a.attention_chunk_size > 0 ? "--attention-chunk-size" : "the model's attention_chunk_size") +
                           " contradict each other: a chunked query sees only its own chunk, never the sinks");
  }
  return Status::Ok();
}

kv::KvCacheConfig KvCacheConfigFor(const model::ModelConfig& model, const KvMemorySettings& memory,
                                   const AttentionOptions& attention) {
  kv::KvCacheConfig c;
  c.num_layers = static_cast<uint32_t>(model.num_layers);
  c.num_kv_heads = {static_cast<uint32_t>(model.num_kv_heads)};
  c.head_dim = static_cast<uint32_t>(model.head_dim);
  c.dtype_bytes = memory.dtype_bytes;
  c.attention_windows.clear();
  if (!attention.max_attention_window.empty()) {
    for (int64_t l = 0; l < model.num_layers; ++l) {  // repeated to the number of layers
      const size_t i = static_cast<size_t>(l) % attention.max_attention_window.size();
      c.attention_windows.push_back(static_cast<uint32_t>(attention.max_attention_window[i]));
    }
  } else {
    for (int64_t w : model.layer_window) c.attention_windows.push_back(static_cast<uint32_t>(w));
  }
  if (c.attention_windows.empty()) c.attention_windows = {0};
  c.max_seq_len = memory.max_context;
  c.sink_tokens = static_cast<uint32_t>(attention.sink_tokens);
  c.dense_context = attention.streaming_llm;
  c.attention_chunk_size = static_cast<uint32_t>(attention.attention_chunk_size > 0 ? attention.attention_chunk_size
                                                                                   : model.attention_chunk_size);
  c.chunked_layers = model.layer_chunked;  // Llama 4: the chunk bounds its RoPE layers only
  c.vocab_size = static_cast<uint32_t>(model.vocab_size);  // cached tokens are stored in just the bits it needs
  c.block_size = memory.block_size;
  c.device_bytes = memory.device_bytes;
  c.host_bytes = memory.host_bytes;
  c.offload_min_priority = memory.offload_min_priority;
  c.enable_offload = memory.host_bytes > 0;
  c.events_include_tokens = memory.events_include_tokens;
  c.routing_block_size = memory.routing_block_size;
  return c;
}

KvMemorySettings KvMemoryOf(const ModelBackend& backend) {
  KvMemorySettings m;
  m.block_size = static_cast<uint32_t>(backend.block_size());
  m.max_context = static_cast<uint32_t>(backend.max_context());
  const auto pools = backend.pools();
  if (!pools.empty()) {
    const KvPoolInfo& p = pools[0];
    const uint64_t elements = static_cast<uint64_t>(p.layers.size()) * 2 * static_cast<uint64_t>(p.num_kv_heads) *
                              static_cast<uint64_t>(p.head_dim) * m.block_size;
    if (elements > 0) m.dtype_bytes = static_cast<uint32_t>(p.bytes_per_block / elements);
  }
  for (const KvPoolInfo& p : pools) {
    m.device_bytes += static_cast<uint64_t>(p.device_blocks) * p.bytes_per_block;
    m.host_bytes += static_cast<uint64_t>(p.host_blocks) * p.bytes_per_block;
  }
  return m;
}

Status CheckPoolsAgree(std::span<const kv::PoolLayout> kv_pools, std::span<const KvPoolInfo> backend_pools) {
  if (kv_pools.size() != backend_pools.size()) {
    return Internal("the KV manager has " + std::to_string(kv_pools.size()) + " pools, the backend " +
                    std::to_string(backend_pools.size()));
  }
  auto describe = [](int64_t window, int64_t sinks, bool dense, int64_t chunk, int64_t heads, size_t layers,
                     int64_t device, int64_t host) {
    return "window " + Str(window) + ", " + Str(sinks) + " sinks" + (dense ? ", dense context" : "") + ", chunk " +
           Str(chunk) + ", " + Str(heads) + " kv heads, " + Str(static_cast<int64_t>(layers)) + " layers, " +
           Str(device) + "+" + Str(host) + " blocks";
  };
  for (size_t i = 0; i < kv_pools.size(); ++i) {
    const kv::PoolLayout& k = kv_pools[i];
    const KvPoolInfo& b = backend_pools[i];
    const bool same_layers =
        k.layers.size() == b.layers.size() && std::equal(k.layers.begin(), k.layers.end(), b.layers.begin(),
                                                         [](uint32_t x, int32_t y) { return static_cast<int64_t>(x) == y; });
    if (static_cast<int64_t>(k.window) != b.window || static_cast<int64_t>(k.sink_tokens) != b.sink_tokens ||
        k.dense_context != b.dense_context || static_cast<int64_t>(k.attention_chunk) != b.attention_chunk ||
        static_cast<int64_t>(k.num_kv_heads) != b.num_kv_heads || !same_layers ||
        static_cast<int64_t>(k.device_blocks) != b.device_blocks || static_cast<int64_t>(k.host_blocks) != b.host_blocks) {
      return Internal("KV pool " + std::to_string(i) + ": the manager has " +
                      describe(k.window, k.sink_tokens, k.dense_context, k.attention_chunk, k.num_kv_heads,
                               k.layers.size(), k.device_blocks, k.host_blocks) +
                      "; the backend " +
                      describe(b.window, b.sink_tokens, b.dense_context, b.attention_chunk, b.num_kv_heads,
                               b.layers.size(), b.device_blocks, b.host_blocks));
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::backend
