// TtftCalibration: the kv cost model's time to first token, checked against the first tokens
// that came. Picker::EstimateTtft adds, for a worker, the prefill queued ahead at its rate,
// the request's own uncached prompt at that rate, and its measured step:
//
//   TTFT ≈ θq · queued / rate + θo · uncached / rate + θs · step + the rest
//
// with θ = 1 by construction. A worker's step is not so simple: its fixed part (the weights
// streamed, the decodes) is paid once per step however many prompt tokens ride in it, and its
// reported rate is measured over full steps, so a queue shorter than a few steps drains faster
// than queued / rate says. On a mock fleet's conversations the first tokens came as
// 0.65 · queued/rate + 0.76 · own/rate + 0.64 · step + 9.5 ms (least squares over 8,607
// decisions, router/routing/README.md, "Calibrating the estimate"): the holder of a prefix,
// whose queue is longest, looked ~30% slower than it was. Wrong by a constant, the model would
// still rank workers right; wrong by a factor of the queue, it does not.
//
// So the router fits θ to what it sees: for each request routed without a pull or a split
// and answered by the worker it was sent to (no retry), the chosen worker's three terms at
// the decision and the first token's time after the send. The fit is exponentially weighted
// least squares (config::kCalibrationForgetting per observation: the last ~500 count) with an
// intercept (the messages' and the engine's fixed delays, which shift every worker alike and
// are not applied), regularized toward θ = 1 with config::kCalibrationPriorWeight observations'
// weight, refitted every config::kCalibrationRefit observations, each θ clamped to
// [config::kMinCoefficient, config::kMaxCoefficient]. Until config::kCalibrationMinObservations
// have come, θ = 1.
//
// A pull's estimate is checked too, apart: its wait is max(queue, pull) by the model, where the
// worker starts the pull between two of its steps and admits the prompt between two more once
// the blocks are in. On a mock fleet's conversations at 2x (quiet host, 8,648 requests), pulled
// first tokens came 14.5 ms after their estimates on average, the others 9.8 ms: kv chose 229
// pulls on estimates 2.3 ms (median) under their holders', and they took 60 ms where the holder
// took 43 (preble's, the same requests). So each request routed without a split, answered by the
// worker it was sent to, reports how far its first token came after its estimate, and
// pull_bias_s() is the mean of that for pulls less the mean for the others (each over its own
// recent observations, config::kPullResidualForgetting and kCalibrationForgetting), 0 until
// both have config::kPullBiasMinObservations. The router gives it to each pull option it makes
// (Candidate::pull_bias_s; not a split's decode worker, whose pulls are not observed here), and
// Picker::EstimateTtft adds it.
// The residual is taken from the estimate without it, so it does not chase its own correction.
//
// A fleet with prefill workers keeps a second one for them (Router::ObservePrefillStage): a
// split's prefill stage, from its send to the prefill worker's one token, against that
// worker's terms. Their queues hold whole prompts and their steps no decodes, so the decode
// pool's θ does not fit them (router/routing/README.md, "Calibrating the estimate").
//
// Thread safety: thread-safe. Observe takes a mutex; coefficients() reads three atomics
// (routing threads, every candidate).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

namespace kvfleet::router {

namespace config {
inline constexpr double kCalibrationForgetting = 0.998;
inline constexpr double kCalibrationPriorWeight = 10;
inline constexpr uint64_t kCalibrationRefit = 16;
inline constexpr uint64_t kCalibrationMinObservations = 200;
inline constexpr double kMinCoefficient = 0.25;
inline constexpr double kMaxCoefficient = 2.0;
// Pulls are a few percent of the decisions: their mean residual forgets faster, over ~50.
inline constexpr double kPullResidualForgetting = 0.98;
inline constexpr uint64_t kPullBiasMinObservations = 20;
}  // namespace config

// The terms of one estimate (seconds).
struct TtftTerms {
  double queue_s = 0;  // the prefill queued ahead, at the worker's rate
  double own_s = 0;    // the request's own uncached prompt, at that rate
  double step_s = 0;   // the worker's step (Picker::DecodeSeconds)
  double rest_s = 0;   // the rest: other workers on its device, admission, host onboarding, adapter load
};

struct TtftCoefficients {
  double queue = 1, own = 1, step = 1;
};

class TtftCalibration {
 public:
  // A request routed with `terms` got its first token `actual_s` after it was sent.
  void Observe(const TtftTerms& terms, double actual_s);
  // A request routed with an estimate of `estimated_s`, less any pull bias applied to it, with
  // a pull (`pulled`) or without, got its first token `actual_s` after it was sent.
  void ObserveEstimate(bool pulled, double estimated_s, double actual_s);
  TtftCoefficients coefficients() const {
    return {queue_.load(std::memory_order_relaxed), own_.load(std::memory_order_relaxed),
            step_.load(std::memory_order_relaxed)};
  }
  double pull_bias_s() const { return pull_bias_.load(std::memory_order_relaxed); }
  uint64_t observations() const { return observations_.load(std::memory_order_relaxed); }
  // The fitted intercept (seconds): reported, not applied.
  double intercept() const { return intercept_.load(std::memory_order_relaxed); }

 private:
  void Refit();  // REQUIRES: mu_ held

  std::mutex mu_;
  std::array<std::array<double, 4>, 4> xx_{};  // GUARDED_BY(mu_): Σ w·x·xᵀ, x = (queue, own, step, 1)
  std::array<double, 4> xy_{};                 // GUARDED_BY(mu_): Σ w·x·y
  std::atomic<uint64_t> observations_{0};
  std::atomic<double> queue_{1}, own_{1}, step_{1}, intercept_{0};
  // GUARDED_BY(mu_): residuals (first token less estimate), each Σ f^age · r and Σ f^age.
  struct Residuals {
    double sum = 0, weight = 0;
    uint64_t count = 0;
  } pulled_, stayed_;
  std::atomic<double> pull_bias_{0};
};

}  // namespace kvfleet::router
