// The agent registry alone: streams bound and unbound, silence, the
// reconnect grace, and forgetting, driven by monotonic times the test
// chooses (no clock, no sleeping).
#include "scheduler/core/agent_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class AgentRegistryTest : public ::testing::Test {
 protected:
  AgentRegistryTest() {
    opts_.heartbeat_interval = absl::Seconds(1);
    opts_.heartbeat_timeout = absl::Seconds(5);
    opts_.reconnect_grace = absl::Seconds(5);
    opts_.max_heartbeats_per_second = 2;  // a third connected agent stretches the interval
  }

  // Connects `id` on `conn`, heard at `at`.
  AgentRecord& Connect(const std::string& id, uint64_t conn, absl::Duration at) {
    AgentRecord& a = reg_.FindOrAdd(id);
    EXPECT_EQ(reg_.Bind(a, conn), 0u);
    a.told_interval = a.agent_interval = opts_.heartbeat_interval;
    a.last_seen = at;
    a.silence_deadline = -absl::InfiniteDuration();
    reg_.Heard(a);
    return a;
  }

  SchedulerOptions opts_;
  AgentRegistry reg_{&opts_};
};

TEST_F(AgentRegistryTest, StreamsFindTheirAgentAndANewStreamReplacesTheOld) {
  AgentRecord& a = Connect("a", 7, absl::ZeroDuration());
  EXPECT_EQ(reg_.ByConn(7), &a);
  EXPECT_EQ(reg_.Find("a"), &a);
  EXPECT_EQ(reg_.Bind(a, 8), 7u);  // the caller ends stream 7
  EXPECT_EQ(reg_.ByConn(7), nullptr);
  EXPECT_EQ(reg_.ByConn(8), &a);
  EXPECT_TRUE(reg_.ConnIndexAgrees(a));
  EXPECT_EQ(reg_.connected(), 1u);
}

TEST_F(AgentRegistryTest, SilenceEndsTheStreamThenTheGraceRunsOutThenItIsForgotten) {
  AgentRecord& a = Connect("a", 7, absl::ZeroDuration());
  const absl::Duration timeout = opts_.HeartbeatTimeoutFor(a.judged_interval());
  EXPECT_THAT(reg_.Expire(timeout - absl::Milliseconds(1)).silent_conns, IsEmpty());
  AgentRegistry::Expired e = reg_.Expire(timeout);
  EXPECT_THAT(e.silent_conns, ElementsAre(7u));
  EXPECT_FALSE(a.connected());
  EXPECT_EQ(reg_.ByConn(7), nullptr);
  // The grace counts from when the silence was noticed.
  EXPECT_THAT(reg_.Expire(timeout + opts_.reconnect_grace - absl::Milliseconds(1)).grace_over,
              IsEmpty());
  e = reg_.Expire(timeout + opts_.reconnect_grace);
  EXPECT_THAT(e.grace_over, ElementsAre("a"));
  reg_.MarkLost(a, timeout + opts_.reconnect_grace + absl::Minutes(10));
  EXPECT_NE(reg_.Find("a"), nullptr);  // still listed, as lost
  reg_.Expire(timeout + opts_.reconnect_grace + absl::Minutes(10));
  EXPECT_EQ(reg_.Find("a"), nullptr);
}

TEST_F(AgentRegistryTest, HearingFromAnAgentPushesItsSilenceBackButNeverCloser) {
  AgentRecord& a = Connect("a", 7, absl::ZeroDuration());
  const absl::Duration timeout = opts_.HeartbeatTimeoutFor(a.judged_interval());
  a.last_seen = absl::Seconds(3);
  reg_.Heard(a);
  EXPECT_THAT(reg_.Expire(timeout).silent_conns, IsEmpty());
  // A shorter interval later does not bring the deadline closer.
  a.told_interval = a.agent_interval = absl::Milliseconds(100);
  a.last_seen = absl::Seconds(4);
  reg_.Heard(a);
  EXPECT_EQ(a.silence_deadline, absl::Seconds(3) + timeout);
  EXPECT_THAT(reg_.Expire(absl::Seconds(3) + timeout).silent_conns, ElementsAre(7u));
}

TEST_F(AgentRegistryTest, AStreamThatEndsStartsTheGraceAndAReconnectKeepsTheAgent) {
  AgentRecord& a = Connect("a", 7, absl::ZeroDuration());
  reg_.Unbind(a, absl::Seconds(5));
  EXPECT_EQ(reg_.connected(), 0u);
  EXPECT_EQ(reg_.Bind(a, 9), 0u);
  a.last_seen = absl::Seconds(1);
  reg_.Heard(a);
  // The grace deadline was replaced by the new stream's silence deadline.
  EXPECT_THAT(reg_.Expire(absl::Seconds(5)).grace_over, IsEmpty());
  EXPECT_TRUE(a.connected());
}

TEST_F(AgentRegistryTest, ForgettingReturnsTheStreamToEnd) {
  Connect("a", 7, absl::ZeroDuration());
  EXPECT_EQ(reg_.Forget("a"), 7u);
  EXPECT_EQ(reg_.Find("a"), nullptr);
  EXPECT_EQ(reg_.ByConn(7), nullptr);
  EXPECT_THAT(reg_.Expire(absl::Hours(1)).silent_conns, IsEmpty());
  EXPECT_EQ(reg_.Forget("a"), 0u);
}

TEST_F(AgentRegistryTest, TheHeartbeatFactorFollowsTheConnectedAgents) {
  Connect("a", 1, absl::ZeroDuration());
  Connect("b", 2, absl::ZeroDuration());
  EXPECT_EQ(reg_.heartbeat_factor(), 1);
  AgentRecord& c = Connect("c", 3, absl::ZeroDuration());
  EXPECT_GT(reg_.heartbeat_factor(), 1);
  reg_.Unbind(c, absl::Seconds(5));
  reg_.Unbind(*reg_.Find("b"), absl::Seconds(5));
  EXPECT_EQ(reg_.heartbeat_factor(), 1);
}

TEST_F(AgentRegistryTest, ARestoredAgentWaitsForItsGrace) {
  AgentRecord& a = reg_.Restored("a", absl::Seconds(10), absl::Seconds(15));
  EXPECT_FALSE(a.connected());
  EXPECT_EQ(a.last_seen, absl::Seconds(10));
  EXPECT_EQ(&reg_.Restored("a", absl::Seconds(11), absl::Seconds(99)), &a);
  EXPECT_THAT(reg_.Expire(absl::Seconds(15)).grace_over, ElementsAre("a"));
}

}  // namespace
}  // namespace taskgrid::core
