// Latency statistics of a run: percentiles and means over samples in seconds.
//
// Percentile(p) interpolates linearly between the closest ranks of the sorted samples
// (the "linear" method of NumPy and Hyndman-Fan type 7): p = 0 is the minimum, p = 100
// the maximum. An empty sample set reports zeros.
//
// Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <vector>

namespace kvfleet::bench {

class Samples {
 public:
  void Add(double value) { values_.push_back(value); sorted_ = false; }
  size_t count() const { return values_.size(); }
  double Mean() const;
  // REQUIRES: 0 <= p <= 100.
  double Percentile(double p);
  // The samples in ascending order.
  const std::vector<double>& Sorted();

 private:
  std::vector<double> values_;
  bool sorted_ = true;
};

}  // namespace kvfleet::bench
