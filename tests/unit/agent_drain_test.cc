// The agent's drain rules (agent/drain.h) on their own: times are plain
// monotonic durations the test picks.
#include <gtest/gtest.h>

#include "agent/drain.h"

namespace taskgrid::agent {
namespace {

absl::Duration S(double s) { return absl::Seconds(s); }

TEST(DrainPlan, StopTakingWorkIsOnceAndDoesNotExit) {
  DrainPlan d(S(2), S(3));
  EXPECT_TRUE(d.StopTakingWork());
  EXPECT_FALSE(d.StopTakingWork());
  EXPECT_TRUE(d.draining());
  EXPECT_FALSE(d.exiting());
  EXPECT_FALSE(d.Complete(S(1000), true));
  EXPECT_EQ(d.NextDeadline(), absl::InfiniteDuration());
}

TEST(DrainPlan, ReleasesAtTheDeadlineAndExitsAfterGraceAndFlush) {
  DrainPlan d(S(2), S(3));
  EXPECT_FALSE(d.Begin(S(10), S(30), /*no_tasks=*/false));
  EXPECT_EQ(d.NextDeadline(), S(40));
  EXPECT_FALSE(d.ReleaseDue(S(39.999)));
  EXPECT_TRUE(d.ReleaseDue(S(40)));
  EXPECT_FALSE(d.ReleaseDue(S(41))) << "once";
  EXPECT_EQ(d.ReleaseNote(), "agent drained: 30s passed");
  EXPECT_EQ(d.NextDeadline(), S(45));  // + kill_grace + stop_flush
  EXPECT_FALSE(d.Complete(S(44.9), false));
  EXPECT_TRUE(d.Complete(S(45), false));
  EXPECT_TRUE(d.Complete(S(11), true)) << "handed over: at once";
}

TEST(DrainPlan, ALaterBeginOnlyShortens) {
  DrainPlan d(S(2), S(3));
  d.Begin(S(0), S(30), false);
  d.Begin(S(5), S(60), false);
  EXPECT_EQ(d.NextDeadline(), S(30));
  EXPECT_TRUE(d.Begin(S(6), absl::ZeroDuration(), false)) << "zero: release now";
  EXPECT_EQ(d.ReleaseNote(), "agent drained: 0s passed");
  EXPECT_EQ(d.NextDeadline(), S(11));
}

TEST(DrainPlan, TheLastTaskEndingLeavesStopFlushForTheAcks) {
  DrainPlan d(S(2), S(3));
  d.Begin(S(0), S(30), false);
  d.TasksEnded(S(4));
  EXPECT_EQ(d.NextDeadline(), S(7));
  DrainPlan idle(S(2), S(3));
  idle.Begin(S(0), S(30), /*no_tasks=*/true);
  EXPECT_TRUE(idle.Complete(S(3), false));
}

TEST(DrainPlan, GoodbyeOnlyWhenHandedOverAndOnce) {
  DrainPlan d(S(2), S(3));
  d.Begin(S(0), S(0), true);
  EXPECT_FALSE(d.GoodbyeDue(S(1), false));
  EXPECT_TRUE(d.GoodbyeDue(S(1), true));
  EXPECT_FALSE(d.GoodbyeDue(S(1.5), true));
  EXPECT_TRUE(d.AwaitingClose(S(1) + kGoodbyeWait - S(0.001)));
  EXPECT_FALSE(d.AwaitingClose(S(1) + kGoodbyeWait));
}

}  // namespace
}  // namespace taskgrid::agent
