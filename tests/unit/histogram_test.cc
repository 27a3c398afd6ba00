#include "common/histogram.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace taskgrid {
namespace {

TEST(Histogram, CountsEachObservationInTheFirstBucketAtOrAboveIt) {
  Histogram h({0.1, 1, 10});
  h.Observe(0.05);  // <= 0.1
  h.Observe(0.1);   // le is inclusive
  h.Observe(0.5);   // <= 1
  h.Observe(10);    // <= 10
  h.Observe(11);    // +Inf only
  EXPECT_EQ(h.CumulativeCount(0), 2);
  EXPECT_EQ(h.CumulativeCount(1), 3);
  EXPECT_EQ(h.CumulativeCount(2), 4);
  EXPECT_EQ(h.CumulativeCount(3), 5);  // +Inf
  EXPECT_EQ(h.count(), 5);
  EXPECT_DOUBLE_EQ(h.sum(), 0.05 + 0.1 + 0.5 + 10 + 11);
}

TEST(Histogram, IgnoresNaNAndKeepsInfinityInTheLastBucket) {
  Histogram h({1});
  h.Observe(std::nan(""));
  EXPECT_EQ(h.count(), 0);
  h.Observe(std::numeric_limits<double>::infinity());
  EXPECT_EQ(h.CumulativeCount(0), 0);
  EXPECT_EQ(h.CumulativeCount(1), 1);
}

TEST(Histogram, ACopyIsASnapshot) {
  Histogram h({1});
  h.Observe(0.5);
  const Histogram snap = h;
  h.Observe(0.5);
  EXPECT_EQ(snap.count(), 1);
  EXPECT_EQ(h.count(), 2);
}

TEST(Histogram, ExponentialBounds) {
  EXPECT_EQ(Histogram::ExponentialBounds(0.001, 10, 4), (std::vector<double>{0.001, 0.01, 0.1, 1}));
  EXPECT_TRUE(Histogram::ExponentialBounds(1, 2, 0).empty());
}

TEST(HistogramDeathTest, BoundsMustIncrease) {
  EXPECT_DEATH(Histogram({1, 1}), "increasing");
  EXPECT_DEATH(Histogram({2, 1}), "increasing");
}

}  // namespace
}  // namespace taskgrid
