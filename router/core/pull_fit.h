// PullFit: what one worker's KV pulls from one holder took, as the worker's load reports say
// (Contract 2's Load.pulls), fitted to the line a pull's time follows:
//
//   seconds = setup + bytes / bandwidth
//
// `setup` is what a pull costs whatever its size: the holder's engine step in progress, the
// round trips, an NCCL or IPC hand-off. Routing prices a pull between that pair with it
// (router/routing/README.md, "Pulling a prefix") instead of the flags' guess for every pair
// of its kind.
//
// The fit: exponentially weighted least squares over the reports' increments (each holds the
// pulls of one batch: n pulls, B bytes, T seconds, fitted as T = n·setup + B/bandwidth), each
// increment weighing config::kPullFitForgetting of the one after it, so the last ~20 count.
// Solve() regularizes toward a prior (the flags' setup and bandwidth for the pair's kind,
// weighing config::kPullFitPriorPulls of a pull): a pair with no pulls is priced at the prior,
// and one whose pulls are all of one size (setup and bandwidth then cannot be told apart) at
// what they took at that size, split between the two terms as the prior splits it. A tenth
// of a pull against the last ~20 keeps a prior 10x off to within ~10% of what was measured.
//
// Apart from the fit, the pair's failed pulls (Load.pulls' `failed`: no block came, the request
// computed its whole prefix): the share of its pulls that fail and what a failure took, both
// forgetting by time (config::kPullFailureHalfLifeSeconds), so that a pair no longer pulled from
// (because its pulls failed) is tried again once its failures are old. Routing weighs a pull
// option by them (router/routing/README.md, "Pulling a prefix").
//
// Thread safety: a value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/clock.h"

namespace kvfleet::router {

namespace config {
inline constexpr double kPullFitForgetting = 0.95;
inline constexpr double kPullFitPriorPulls = 0.1;
// The failures' memory: their weight halves every this many seconds. Long beside a pull (tens
// of ms) and a load report (~0.1 s), so a pair whose pulls all fail stays priced so; short
// beside an outage, so a pair that recovered is tried again as its failures age (a lone one
// weighs a third of its pulls after 10 s; fifty in a row, a twentieth after 100 s).
inline constexpr double kPullFailureHalfLifeSeconds = 10;
// The pulls that count toward a pair's failed share before it has any: one good pull, so a
// lone failure makes half the pair's pulls failed, and a share fades as its failures age.
inline constexpr double kPullFailurePriorPulls = 1;
// Ten half-lives: a failure then weighs a thousandth, and routing stops reading the pairs'.
inline constexpr TimeNs kPullFailuresForgottenNs =
    static_cast<TimeNs>(10 * kPullFailureHalfLifeSeconds * static_cast<double>(kNsPerSec));
}  // namespace config

struct PullCost {
  double setup_s = 0;
  double s_per_byte = 0;
  double Seconds(double bytes) const { return setup_s + bytes * s_per_byte; }
};

class PullFit {
 public:
  // Adds an increment: `pulls` pulls that moved `bytes` in `seconds` together.
  void Add(double pulls, double bytes, double seconds) {
    if (!(pulls > 0) || bytes < 0 || !(seconds >= 0)) return;
    totals_.pulls += pulls;
    totals_.bytes += bytes;
    totals_.seconds += seconds;
    const double g = bytes / kBytesPerUnit;
    Decay();
    nn_ += pulls * pulls;
    ng_ += pulls * g;
    gg_ += g * g;
    nt_ += pulls * seconds;
    gt_ += g * seconds;
    pulls_ += pulls;
  }

  // The fitted cost, pulled toward `prior` by config::kPullFitPriorPulls pulls of the size
  // `typical_bytes` (the prior's weight on each coefficient at that size).
  PullCost Solve(const PullCost& prior, double typical_bytes) const {
    const double g0 = std::max(typical_bytes / kBytesPerUnit, 1e-6);
    const double w = config::kPullFitPriorPulls;
    // Ridge: minimise Σ (t − n·s − g·v)² + w·(s − s0)² + w·g0²·(v − v0)², v in seconds per unit.
    const double v0 = prior.s_per_byte * kBytesPerUnit;
    const double a = nn_ + w, b = ng_, d = gg_ + w * g0 * g0;
    const double r1 = nt_ + w * prior.setup_s, r2 = gt_ + w * g0 * g0 * v0;
    const double det = a * d - b * b;
    PullCost out = prior;
    if (!(det > 0)) return out;
    double s = (r1 * d - b * r2) / det;
    double v = (a * r2 - b * r1) / det;
    // Neither term goes negative: refit the other alone.
    if (s < 0) {
      s = 0;
      v = r2 / d;
    } else if (v < 0) {
      v = 0;
      s = r1 / a;
    }
    out.setup_s = s;
    out.s_per_byte = v / kBytesPerUnit;
    return out;
  }

  // Adds what the pair's pulls came to by `now`: `ok` pulls that brought blocks, `failed`
  // that brought none, taking `failed_seconds` together.
  void AddOutcomes(TimeNs now, double ok, double failed, double failed_seconds) {
    if (!(ok >= 0) || !(failed >= 0) || !(failed_seconds >= 0) || !std::isfinite(failed_seconds)) return;
    Age(now);
    ok_ += ok;
    failed_ += failed;
    failed_seconds_ += failed_seconds;
    totals_.failed += failed;
    totals_.failed_seconds += failed_seconds;
  }

  // The share of the pair's pulls that fail, as of `now`: 0 without failures.
  double FailedShare(TimeNs now) const {
    const double f = Weight(now);
    const double failed = failed_ * f;
    return failed > 0 ? failed / (failed + ok_ * f + config::kPullFailurePriorPulls) : 0;
  }

  // What a failed pull took, from its request to its fallback: 0 without failures.
  double FailedSeconds() const { return failed_ > 0 ? failed_seconds_ / failed_ : 0; }

  double pulls() const { return pulls_; }

  // Everything added, unweighed (/fleet shows it): the pulls that brought blocks, their bytes
  // and seconds, and the failed pulls and their seconds.
  struct Totals {
    double pulls = 0, bytes = 0, seconds = 0, failed = 0, failed_seconds = 0;
  };
  const Totals& totals() const { return totals_; }

 private:
  double Weight(TimeNs now) const {
    const double age_s = static_cast<double>(std::max<TimeNs>(0, now - outcomes_at_)) / kNsPerSec;
    return std::exp2(-age_s / config::kPullFailureHalfLifeSeconds);
  }
  void Age(TimeNs now) {
    const double f = Weight(now);
    ok_ *= f, failed_ *= f, failed_seconds_ *= f;
    outcomes_at_ = std::max(outcomes_at_, now);
  }

  static constexpr double kBytesPerUnit = 1e9;  // sums in GB: n and g of like magnitude
  void Decay() {
    const double f = config::kPullFitForgetting;
    nn_ *= f, ng_ *= f, gg_ *= f, nt_ *= f, gt_ *= f, pulls_ *= f;
  }

  double nn_ = 0, ng_ = 0, gg_ = 0, nt_ = 0, gt_ = 0, pulls_ = 0;
  double ok_ = 0, failed_ = 0, failed_seconds_ = 0;  // weighed by age, as of outcomes_at_
  TimeNs outcomes_at_ = 0;
  Totals totals_;
};

}  // namespace kvfleet::router
