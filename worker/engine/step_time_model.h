// StepTimeModel: how long an engine step takes as a function of its shape, fitted online
// to the step times the engine measures. The scheduler sizes each step's prefill chunk
// with it, so that running decodes keep their inter-token latency (Sarathi-Serve, OSDI
// 2024: stall-free batching, a per-step token budget derived from the latency target;
// here the budget comes from this fitted model instead of an offline profile).
//
//   t = base + prefill_step·[P > 0] + prefill_token·P + decode_seq·D + kv_token·K + prefill_pair·Q
//
//   [P > 0]  the step computes prompt tokens: a fixed cost (the cuda backend runs a
//      decode-only step as a CUDA graph, any other eagerly)
//   P  prompt (or recompute) tokens computed: GEMM rows, compute bound
//   D  sequences decoding one token: GEMM rows of a memory-bound pass, sampling
//   K  KV tokens attention reads: Σ over sequences of the context after the step (a
//      decode's KV read, memory bound; the mock backend's d)
//   Q  prefill attention pairs: Σ over chunks of n·s + n(n+1)/2 for n tokens after s
//      cached ones (causal query-key pairs, compute bound; long prompts' later chunks)
//
// The fit: exponentially weighted least squares on durations relative to their prediction
// (a 10 ms step is fitted as closely as a 200 ms one; forgetting factor
// config::kForgetting), regularized toward the prior (ridge with the prior as its centre:
// pseudo-steps that fade down to a floor). A term the recent steps do not exercise (no
// prefill for a while) stays near the prior instead of winding up, and no term goes
// negative. A measurement is clipped to within config::kClip typical relative errors of
// the prediction before it enters the fit (Huber), so a lone slow step (CUDA warm-up, a
// graph capture) moves the model little; a run of them raises the typical error, which
// widens the clip and speeds up forgetting, and is learnt.
//
// Thread safety: thread-compatible; owned by the scheduler (the engine thread).
#pragma once

#include <array>
#include <cstdint>

#include "common/clock.h"

namespace kvfleet::engine {

// One step's work, in the model's terms.
struct StepShape {
  uint64_t prefill_tokens = 0;  // P
  uint64_t decode_seqs = 0;     // D
  uint64_t kv_tokens = 0;       // K
  uint64_t prefill_pairs = 0;   // Q

  // A sequence decoding its token at position `context - 1`.
  void AddDecode(uint32_t context);
  // A prefill chunk of `n` tokens after `start` computed ones.
  void AddPrefill(uint32_t start, uint32_t n);
  // This shape plus a prefill chunk (the scheduler's what-if).
  StepShape WithPrefill(uint32_t start, uint32_t n) const;
  bool empty() const { return prefill_tokens == 0 && decode_seqs == 0; }
};

// The model's coefficients, in µs per unit.
struct StepCoefficients {
  double base_us = 0;
  double prefill_step_us = 0;
  double prefill_token_us = 0;
  double decode_seq_us = 0;
  double kv_token_us = 0;
  double prefill_pair_us = 0;
};

namespace config {
// The prior: Llama-3.1-8B in bf16 on one H100, the mock backend's calibration
// (worker/backend/mock/cost_model.h: a, b, c, d), plus prefill attention at the ~300 TFLOP/s
// our prefill kernel reaches (tests/bench/results/README.md): 2 GEMMs × 2 flops × 128 dims ×
// 32 heads × 32 layers = 0.52 MFLOP per query-key pair. Another model or GPU starts from it
// and is fitted within a few hundred steps.
// A step with prefill costs nothing more than its parts until measured.
inline constexpr StepCoefficients kPriorCoefficients{7290.0, 0.0, 26.0, 11.5, 0.057, 0.0017};
// Weight of a step n steps old: 0.99^n, so about the last 100 steps count (a few seconds
// under load) and one step's noise is averaged over many.
inline constexpr double kForgetting = 0.99;
// While the typical relative error is above kSettledRelativeError the model is wrong, not
// noisy (a GPU or model unlike the prior's): steps are forgotten up to kMaxForgetSpeedup
// times faster, in proportion, since what was kept meanwhile was clipped toward the wrong
// predictions. A prior 3-10x off is then within ~10% after ~100 steps.
inline constexpr double kSettledRelativeError = 0.05;
inline constexpr double kMaxForgetSpeedup = 10;
// The prior counts as kPriorWeight typical steps taken before the first real one (in every
// term, "typical" being the recent steps' mean squared feature), and fades by
// kPriorForgetting a step down to kPriorFloor of a step: it steadies the first steps (one
// slow warm-up step cannot drag it far), does not bias the fit of a well-measured term, and
// keeps anchoring a term no recent step exercises (no prefill for a while) instead of
// letting it wind up.
inline constexpr double kPriorWeight = 8.0;
inline constexpr double kPriorForgetting = 0.95;
inline constexpr double kPriorFloor = 0.25;
// A term's typical squared feature never counts as less than this (normalized units), so
// the prior of a term no step has exercised in a long time still anchors it.
inline constexpr double kMinExcitation = 1e-6;
// A measurement is clipped to the prediction ± kClip typical relative errors.
inline constexpr double kClip = 3.0;
// The typical relative error: an average over ~10 steps, floored at 2% so a noiseless
// backend (the mock) still learns a genuine change. It starts at 10%: a 100x warm-up step
// then moves the prior's prediction by ~8%, while a run of large errors widens the clip by
// ~20% a step, so a wrong prior is not held back for long.
inline constexpr double kErrorSmoothing = 0.1;
inline constexpr double kMinRelativeError = 0.02;
inline constexpr double kInitialRelativeError = 0.1;
}  // namespace config

class StepTimeModel {
 public:
  explicit StepTimeModel(const StepCoefficients& prior = config::kPriorCoefficients);

  // Predicted duration in µs; 0 for an empty shape.
  double PredictUs(const StepShape& shape) const;
  // Feeds one measured step. An empty shape or a non-positive duration is ignored.
  void Observe(const StepShape& shape, DurationNs measured);

  const StepCoefficients& coefficients() const { return coefficients_; }
  // The typical |measured - predicted| / predicted of recent steps (clipped; see above).
  double relative_error() const { return relative_error_; }
  uint64_t observations() const { return observations_; }
  uint64_t outliers() const { return outliers_; }  // measurements that were clipped

 private:
  static constexpr int kTerms = 6;
  using Vec = std::array<double, kTerms>;
  using Mat = std::array<Vec, kTerms>;

  // Normalized features: [1, [P > 0], P/2^10, D/2^6, K/2^16, Q/2^20].
  static Vec Features(const StepShape& shape);
  // θ = (Λ + A)⁻¹ (Λ θ₀ + b) with no term negative, into theta_ and coefficients_.
  void Solve();
  // The unconstrained solution with the `fixed` terms held at zero; false when the
  // equations are too ill-conditioned to solve.
  bool SolveFree(const std::array<bool, kTerms>& fixed, Vec* theta) const;

  Vec prior_;  // θ₀: normalized coefficients (µs per normalized unit)
  Mat a_{};    // Σ γ^age w x xᵀ, w = (10 ms / predicted)²
  Vec b_{};    // Σ γ^age w x y
  Vec theta_{};
  double prior_weight_ = config::kPriorWeight;  // in typical steps: Λᵢ = prior_weight_·excitation_ᵢ
  Vec excitation_ = {1, 1, 1, 1, 1, 1};        // typical weighted xᵢ² of recent steps (as in a_)
  StepCoefficients coefficients_;
  double relative_error_ = config::kInitialRelativeError;
  uint64_t observations_ = 0;
  uint64_t outliers_ = 0;
};

}  // namespace kvfleet::engine
