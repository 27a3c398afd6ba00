// Histogram: observations counted in fixed buckets, with their sum and
// count, the way Prometheus exposes a histogram. The buckets are chosen
// when it is made and never change, so Observe is a short search over a
// few bounds and no allocation: cheap enough for every task on the hot
// path.
//
// Not thread-safe: its owner guards it (the Scheduler runs under the
// Engine's mutex; the GroupCommitWriter under its own). Copy it to take a
// snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace taskgrid {

class Histogram {
 public:
  // `upper_bounds`: finite and increasing; the +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);

  // Counts `v` in the first bucket whose upper bound is >= v (Prometheus'
  // `le`). NaN is not counted.
  void Observe(double v);

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Observations <= upper_bounds()[i]; i == upper_bounds().size() is the
  // +Inf bucket, which holds count().
  int64_t CumulativeCount(size_t i) const;
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

  // `n` bounds: start, start * factor, start * factor^2, ...
  static std::vector<double> ExponentialBounds(double start, double factor, int n);

 private:
  std::vector<double> upper_bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace taskgrid
