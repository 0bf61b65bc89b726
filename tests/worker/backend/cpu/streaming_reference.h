// A naive fp32 forward pass of a Llama-family model, one token at a time, whose KV cache
// follows StreamingLLM as the paper (Xiao et al. 2023, "Efficient Streaming Language Models
// with Attention Sinks") and TensorRT-LLM's gpt-attention document describe it: K is cached
// before RoPE, and every step rotates the query and each kept key by its position within the
// cache (the sinks first, then the window). Prompt tokens attend densely, at their own
// positions, to the whole prompt (TensorRT-LLM's dense_context_fmha); every later token sees
// only the first S tokens and the last W. The test reference for the backends'
// --streaming-llm: it shares no attention code with them (only the weight loader, RoPE
// frequencies and the elementwise helpers of the cpu backend).
//
// Thread safety: test-only, single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "worker/model/model_config.h"

namespace kvfleet::testing {

class StreamingReference {
 public:
  struct Options {
    int32_t sinks = 0;        // S
    int32_t window = 0;       // W; 0: full attention everywhere (a plain dense model)
    int64_t prompt_len = 0;   // tokens before it attend densely
    bool position_shift = true;
  };
  // Aborts the test when the model cannot be loaded.
  StreamingReference(const std::string& model_dir, Options options);
  ~StreamingReference();

  // Feeds the token at the next position and returns the logits [vocab] that follow it.
  std::vector<float> Next(TokenId token);
  const model::ModelConfig& config() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// max |a[i] - b[i]|.
float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvfleet::testing
