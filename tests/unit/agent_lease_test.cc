// The agent's self-fencing rules on their own: times are plain monotonic
// durations the test picks, so nothing sleeps and no stream is needed.
#include <gtest/gtest.h>

#include "agent/lease.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::agent::lease_test {
namespace {

absl::Duration S(double s) { return absl::Seconds(s); }

TEST(Lease, TheWelcomeAnswersTheHelloFromItsSendTime) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(10));
  l.Heard(S(11));
  l.Welcomed(S(11), S(4), S(6));
  EXPECT_TRUE(l.ByLease());
  EXPECT_EQ(l.FenceAt(), S(16));  // the Hello's send time + the lease, not the arrival
}

TEST(Lease, EachAckExtendsFromTheHeartbeatItAnswersInOrder) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(6));
  l.HeartbeatSent(S(1));
  l.HeartbeatSent(S(2));
  l.HeartbeatAcked(absl::ZeroDuration());  // answers the one sent at 1
  EXPECT_EQ(l.FenceAt(), S(7));
  l.HeartbeatAcked(S(10));  // answers 2, with a longer lease from now on
  EXPECT_EQ(l.FenceAt(), S(12));
  l.HeartbeatAcked(absl::ZeroDuration());  // answers nothing: extends nothing
  EXPECT_EQ(l.FenceAt(), S(12));
}

TEST(Lease, AHeartbeatThatNeverLeftIsNotWaitedFor) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(6));
  l.HeartbeatSent(S(1));
  l.HeartbeatNotSent(S(1));
  l.HeartbeatSent(S(3));
  l.HeartbeatAcked(absl::ZeroDuration());
  EXPECT_EQ(l.FenceAt(), S(9));  // the ack answered the one sent at 3
}

TEST(Lease, AStreamThatEndsCutsTheLeaseToStopOnLostAfter) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(60));
  EXPECT_EQ(l.FenceAt(), S(60));
  l.StreamEnded(S(5), /*welcomed=*/true);
  EXPECT_EQ(l.FenceAt(), S(9));
  // An ack from the dead stream's era answers nothing now.
  l.HeartbeatAcked(absl::ZeroDuration());
  EXPECT_EQ(l.FenceAt(), S(9));
}

// --- Held through a restart of the scheduler ---

// A welcomed stream with a 4 s stop_on_lost_after, a 6 s lease and a 600 s
// restart grace, ended at 5.
Lease EndedAfterWelcome(absl::Duration restart_grace) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(6));
  l.SetRestartGrace(restart_grace);
  l.StreamEnded(S(5), /*welcomed=*/true);
  return l;
}

TEST(Lease, RefusalsHoldTheTasksUntilTheRestartGraceLessAMargin) {
  Lease l = EndedAfterWelcome(S(600));
  EXPECT_EQ(l.FenceAt(), S(6));  // the lease, cut no later than 5 + 4
  EXPECT_FALSE(l.HoldingForRestart()) << "nothing was refused yet";
  l.Refused();
  EXPECT_TRUE(l.HoldingForRestart());
  EXPECT_EQ(l.FenceAt(), S(5) + S(600) - kRestartMargin);
  l.Refused();  // more refusals change nothing
  EXPECT_EQ(l.FenceAt(), S(604));
}

TEST(Lease, AnythingButARefusalEndsTheHoldForTheRestOfTheOutage) {
  Lease l = EndedAfterWelcome(S(600));
  l.Refused();
  l.RestartRuledOut();  // e.g. no answer at all: the host may be down
  EXPECT_FALSE(l.HoldingForRestart());
  EXPECT_EQ(l.FenceAt(), S(6));  // the usual rule, from the stream's end
  l.Refused();                   // refusals after that do not bring it back
  EXPECT_FALSE(l.HoldingForRestart());
  EXPECT_EQ(l.FenceAt(), S(6));
}

TEST(Lease, ANewWelcomeEndsTheOutageAndTheNextOneStartsAfresh) {
  Lease l = EndedAfterWelcome(S(600));
  l.Refused();
  l.HelloSent(S(20));
  l.Welcomed(S(20), S(4), S(6));  // the restarted scheduler
  EXPECT_FALSE(l.HoldingForRestart());
  EXPECT_EQ(l.FenceAt(), S(26));
  l.StreamEnded(S(22), /*welcomed=*/true);
  EXPECT_FALSE(l.HoldingForRestart()) << "a refusal of the last outage does not count";
  l.Refused();
  EXPECT_EQ(l.FenceAt(), S(22) + S(600) - kRestartMargin);
}

TEST(Lease, NoHoldWithoutARestartGraceOrOutsideAnOutage) {
  Lease old = EndedAfterWelcome(absl::ZeroDuration());  // an older scheduler
  old.Refused();
  EXPECT_FALSE(old.HoldingForRestart());
  EXPECT_EQ(old.FenceAt(), S(6));

  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(6));
  l.SetRestartGrace(S(600));
  l.Refused();  // not in an outage: nothing to hold
  EXPECT_FALSE(l.HoldingForRestart());
  // A stream that never had its Welcome starts no outage.
  l.StreamEnded(S(3), /*welcomed=*/false);
  l.Refused();
  EXPECT_FALSE(l.HoldingForRestart());
}

TEST(Lease, WithoutALeaseSilenceDecides) {
  Lease l(absl::ZeroDuration());
  l.HelloSent(S(0));
  l.Welcomed(S(0), absl::ZeroDuration(), absl::ZeroDuration());  // an older scheduler
  EXPECT_FALSE(l.ByLease());
  l.Heard(S(3));
  EXPECT_EQ(l.FenceAt(), S(3) + kDefaultStopOnLostAfter);
  l.Welcomed(S(3), S(2), absl::ZeroDuration());
  EXPECT_EQ(l.FenceAt(), S(5));  // the scheduler's stop_on_lost_after
}

TEST(Lease, TheAgentsOwnStopOnLostAfterWinsOverTheLease) {
  Lease l(S(1.5));
  l.HelloSent(S(0));
  l.Welcomed(S(0), S(4), S(60));
  l.Heard(S(10));
  EXPECT_FALSE(l.ByLease());
  EXPECT_EQ(l.FenceAt(), S(11.5));
}

}  // namespace
}  // namespace taskgrid::agent::lease_test
