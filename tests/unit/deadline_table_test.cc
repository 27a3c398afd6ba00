#include "scheduler/core/deadline_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(DeadlineTable, ExpiresOldestFirst) {
  DeadlineTable t;
  t.Set("c", absl::Seconds(3));
  t.Set("a", absl::Seconds(1));
  t.Set("b", absl::Seconds(2));
  EXPECT_THAT(t.PopExpired(absl::Milliseconds(999)), IsEmpty());
  EXPECT_THAT(t.PopExpired(absl::Seconds(2)), ElementsAre("a", "b"));
  EXPECT_EQ(t.size(), 1u);
  EXPECT_THAT(t.PopExpired(absl::Seconds(10)), ElementsAre("c"));
  EXPECT_EQ(t.size(), 0u);
}

TEST(DeadlineTable, SettingAgainMovesTheDeadline) {
  DeadlineTable t;
  t.Set("agent", absl::Seconds(5));
  t.Set("agent", absl::Seconds(9));  // a heartbeat extends it
  EXPECT_EQ(t.size(), 1u);
  EXPECT_THAT(t.PopExpired(absl::Seconds(6)), IsEmpty());
  EXPECT_EQ(t.Get("agent"), absl::Seconds(9));
  EXPECT_THAT(t.PopExpired(absl::Seconds(9)), ElementsAre("agent"));
}

TEST(DeadlineTable, RemovedKeysNeverExpire) {
  DeadlineTable t;
  t.Set("x", absl::Seconds(1));
  t.Set("y", absl::Seconds(1));
  t.Remove("x");
  t.Remove("missing");
  EXPECT_FALSE(t.Contains("x"));
  EXPECT_EQ(t.Earliest(), absl::Seconds(1));
  EXPECT_THAT(t.PopExpired(absl::Seconds(100)), ElementsAre("y"));
  EXPECT_EQ(t.Earliest(), absl::InfiniteDuration());
}

TEST(DeadlineTable, TiesBreakByKey) {
  DeadlineTable t;
  t.Set("b", absl::Seconds(1));
  t.Set("a", absl::Seconds(1));
  EXPECT_THAT(t.PopExpired(absl::Seconds(1)), ElementsAre("a", "b"));
}

}  // namespace
}  // namespace taskgrid::core
