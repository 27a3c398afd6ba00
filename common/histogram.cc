#include "common/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace taskgrid {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    if (!std::isfinite(upper_bounds_[i]) || (i > 0 && upper_bounds_[i - 1] >= upper_bounds_[i])) {
      // The bounds are constants in the code: a wrong one is a bug.
      std::fprintf(stderr, "histogram bounds must be finite and increasing\n");
      std::abort();
    }
  }
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t i = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v) - upper_bounds_.begin());
  ++counts_[i];
  ++count_;
  sum_ += v;
}

int64_t Histogram::CumulativeCount(size_t i) const {
  int64_t n = 0;
  for (size_t b = 0; b <= i && b < counts_.size(); ++b) n += counts_[b];
  return n;
}

std::vector<double> Histogram::ExponentialBounds(double start, double factor, int n) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  double b = start;
  for (int i = 0; i < n; ++i, b *= factor) out.push_back(b);
  return out;
}

}  // namespace taskgrid
