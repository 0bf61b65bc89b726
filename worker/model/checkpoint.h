// Checkpoint: a Hugging Face model directory opened and checked, ready to copy weights
// out of. It holds the parsed config.json and every safetensors file memory-mapped
// (one `model.safetensors`, or the shards named by `model.safetensors.index.json`).
//
// Open() validates everything a backend needs before any weight is copied: the config,
// each file's header and size, and every tensor the architecture needs, by name, shape
// and dtype. So a missing tensor, a wrong shape or a truncated shard fails at Open()
// with a message naming it, and a backend that copies weights afterwards cannot end up
// with half a model. Tensors the model does not use (e.g. lm_head.weight next to tied
// embeddings, rotary inv_freq buffers) are ignored.
//
// Thread safety: immutable after Open(); tensors may be read from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/model/model_config.h"
#include "worker/model/safetensors.h"

namespace kvfleet::model {

struct TensorSpec {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for projections, as HF stores them
};

// The tensors a model of this config reads, in load order: embeddings, then per layer
// norms, attention and MLP, then the final norm and (untied) lm_head.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Tensor names, per layer.
std::string LayerTensorName(int64_t layer, std::string_view suffix);

// The tensors of a layer's MoE block as HF checkpoints name them: the router ([experts][hidden];
// Mixtral: block_sparse_moe.gate, Qwen3-MoE: mlp.gate) and each expert's projections
// (Mixtral: block_sparse_moe.experts.E.w1/w3/w2, Qwen3-MoE: mlp.experts.E.gate_proj/up_proj/
// down_proj). REQUIRES: config.is_moe().
// Llama 4 names its router feed_forward.router and fuses its experts (llama4_config.h):
// MlpTensorName(c, l, "experts.gate_up_proj"), ..."experts.down_proj"; ExpertTensorName is
// not for it.
enum class ExpertProj : uint8_t { kGate, kUp, kDown };
// A layer's MLP tensor: Llama 4's are under feed_forward., the others' under mlp.
std::string MlpTensorName(const ModelConfig& config, int64_t layer, std::string_view suffix);
std::string RouterTensorName(const ModelConfig& config, int64_t layer);
std::string ExpertTensorName(const ModelConfig& config, int64_t layer, int64_t expert, ExpertProj proj);

class Checkpoint {
 public:
  // Reads `<dir>/config.json` and the safetensors, validates as described above.
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // REQUIRES: `name` is one of specs().
  const TensorView& tensor(std::string_view name) const;
  // Any tensor of the files by name (optional ones, e.g. fp8 KV scales), or null.
  const TensorView* Find(std::string_view name) const;
  // Bytes of the tensors in specs(), as stored.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Seconds Open() spent mapping files and checking headers.
  double open_seconds() const { return open_seconds_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  ModelConfig config_;
  std::vector<TensorSpec> specs_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
  uint64_t weight_bytes_ = 0;
  double open_seconds_ = 0;
};

// Shows weight-copy progress (tensors and bytes) on stderr when it is a terminal, at most
// every 100 ms, and clears the line at the end. Thread-compatible.
class LoadProgress {
 public:
  LoadProgress(size_t total_tensors, uint64_t total_bytes);
  ~LoadProgress();
  void Add(size_t tensors, uint64_t bytes);

 private:
  void Draw(bool force);
  size_t total_tensors_, done_tensors_ = 0;
  uint64_t total_bytes_, done_bytes_ = 0;
  bool tty_;
  int64_t last_draw_ns_ = 0;
};

}  // namespace kvfleet::model
