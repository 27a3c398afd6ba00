// Heartbeat intervals that grow with the fleet (max_heartbeats_per_second),
// under a fake clock: what agents are told, and when a silent one is lost.
// The rate here is 2 heartbeats/s, so 20 agents make a 10 s interval.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

SchedulerOptions SmallRate() {
  SchedulerOptions o;
  o.heartbeat_interval = absl::Seconds(1);
  o.heartbeat_timeout = absl::Seconds(5);
  o.reconnect_grace = absl::Seconds(5);
  o.max_heartbeats_per_second = 2;
  o.random = [] { return 0.0; };
  return o;
}

class HeartbeatTest : public SchedulerTest {
 protected:
  HeartbeatTest() : SchedulerTest(SmallRate()) {}

  uint64_t ConnectAdaptive(const std::string& id) {
    v1::Hello h;
    h.set_agent_id(id);
    h.set_slots(1);
    h.set_adaptive_heartbeat(true);
    return ConnectHello(h);
  }

  // Agents a0..a(n-1), adaptive.
  std::vector<uint64_t> ConnectMany(int n) {
    std::vector<uint64_t> conns;
    for (int i = 0; i < n; ++i) conns.push_back(ConnectAdaptive(absl::StrCat("a", i)));
    return conns;
  }

  // A heartbeat saying it beats every `using_interval`; returns its ack.
  v1::HeartbeatAck Beat(uint64_t conn, absl::Duration using_interval) {
    Take();
    v1::AgentMessage m;
    *m.mutable_heartbeat()->mutable_heartbeat_interval() = ToProto(using_interval);
    sched_.OnAgentMessage(conn, m);
    Effects fx = Take();
    for (const Outgoing& o : fx.messages) {
      if (o.conn == conn && o.msg.has_heartbeat_ack()) return o.msg.heartbeat_ack();
    }
    ADD_FAILURE() << "no HeartbeatAck";
    return {};
  }

  bool Connected(const std::string& id) {
    const AgentRecord* a = sched_.FindAgent(id);
    return a != nullptr && a->connected();
  }

  absl::Duration Told() { return FromProto(sched_.ClusterStats().heartbeat_interval()); }
};

TEST(HeartbeatOptions, FactorGrowsAtOnceAndShrinksWithRoom) {
  SchedulerOptions o = SmallRate();  // 2 agents per 1 s
  EXPECT_EQ(o.HeartbeatFactor(0, 1), 1);
  EXPECT_EQ(o.HeartbeatFactor(2, 1), 1);
  EXPECT_EQ(o.HeartbeatFactor(3, 1), 2);
  EXPECT_EQ(o.HeartbeatFactor(20, 2), 10);
  // Back from 3 (5 agents) to 4 agents: 2 would be exactly at the bound,
  // so it stays 3 until the agents are 10 % below it.
  EXPECT_EQ(o.HeartbeatFactor(5, 1), 3);
  EXPECT_EQ(o.HeartbeatFactor(4, 3), 3);
  EXPECT_EQ(o.HeartbeatFactor(3, 3), 2);
  EXPECT_EQ(o.HeartbeatFactor(1, 10), 1);
  o.max_heartbeats_per_second = 0;  // no bound
  EXPECT_EQ(o.HeartbeatFactor(1'000'000, 1), 1);
  // The default: 1,000 heartbeats/s, a 10 s interval for 10,000 agents.
  SchedulerOptions d;
  EXPECT_EQ(d.heartbeat_interval * d.HeartbeatFactor(10'000, 1), absl::Seconds(10));
  EXPECT_EQ(d.HeartbeatFactor(1'000, 1), 1);
}

TEST(HeartbeatOptions, LeaseEndsBeforeTheTasksMoveAndSpansSeveralIntervals) {
  SchedulerOptions o;
  EXPECT_EQ(o.HeartbeatLeaseFor(o.heartbeat_interval), o.StopOnLostAfter());
  for (int factor : {1, 2, 10, 100}) {
    const absl::Duration interval = o.heartbeat_interval * factor;
    const absl::Duration timeout = o.HeartbeatTimeoutFor(interval);
    EXPECT_EQ(timeout, o.heartbeat_timeout * factor);
    // Counted from a heartbeat's send time, the scheduler moves the tasks
    // no sooner than timeout + grace after it arrived.
    EXPECT_LT(o.HeartbeatLeaseFor(interval), timeout + o.reconnect_grace) << factor;
    EXPECT_GE(o.HeartbeatLeaseFor(interval), 4 * interval) << factor;
  }
}

TEST_F(HeartbeatTest, IntervalScalesWithConnectedAgents) {
  ConnectMany(2);
  EXPECT_EQ(Told(), absl::Seconds(1));
  ConnectAdaptive("a2");
  EXPECT_EQ(Told(), absl::Seconds(2));
  Take();
  for (int i = 3; i < 20; ++i) ConnectAdaptive(absl::StrCat("a", i));
  EXPECT_EQ(Told(), absl::Seconds(10));
  EXPECT_EQ(sched_.heartbeat_interval(), absl::Seconds(10));
  Take();
  // A newcomer hears it in Welcome, with the timeout-scaled lease.
  const uint64_t late = ConnectAdaptive("late");
  Effects fx = Take();
  ASSERT_FALSE(fx.messages.empty());
  ASSERT_TRUE(fx.messages[0].msg.has_welcome());
  EXPECT_EQ(fx.messages[0].conn, late);
  const v1::Welcome& w = fx.messages[0].msg.welcome();
  EXPECT_EQ(FromProto(w.heartbeat_interval()), absl::Seconds(11));  // 21 agents
  EXPECT_EQ(FromProto(w.heartbeat_lease()), SmallRate().HeartbeatLeaseFor(absl::Seconds(11)));
  EXPECT_EQ(FromProto(w.stop_on_lost_after()), SmallRate().StopOnLostAfter());
}

TEST_F(HeartbeatTest, AgentsThatCannotAdaptKeepTheBaseInterval) {
  ConnectMany(20);
  Take();
  const uint64_t old = Connect("old", 1);  // no adaptive_heartbeat in Hello
  Effects fx = Take();
  ASSERT_TRUE(fx.messages[0].msg.has_welcome());
  EXPECT_EQ(FromProto(fx.messages[0].msg.welcome().heartbeat_interval()), absl::Seconds(1));
  const v1::HeartbeatAck ack = Beat(old, absl::ZeroDuration());
  EXPECT_FALSE(ack.has_heartbeat_interval());
  // ... and are judged by it: lost after the unscaled timeout.
  Advance(absl::Seconds(5));
  EXPECT_FALSE(Connected("old"));
}

TEST_F(HeartbeatTest, AcksCarryTheInterval) {
  const uint64_t first = ConnectAdaptive("first");
  Take();
  v1::HeartbeatAck ack = Beat(first, absl::Seconds(1));
  EXPECT_EQ(FromProto(ack.heartbeat_interval()), absl::Seconds(1));
  EXPECT_EQ(FromProto(ack.heartbeat_lease()), SmallRate().StopOnLostAfter());
  for (int i = 1; i < 20; ++i) ConnectAdaptive(absl::StrCat("a", i));
  ack = Beat(first, absl::Seconds(1));
  EXPECT_EQ(FromProto(ack.heartbeat_interval()), absl::Seconds(10));
  EXPECT_EQ(FromProto(ack.heartbeat_lease()), SmallRate().HeartbeatLeaseFor(absl::Seconds(10)));
}

TEST_F(HeartbeatTest, AgentIsLostOnlyAfterItsScaledTimeout) {
  const std::vector<uint64_t> conns = ConnectMany(20);
  for (uint64_t c : conns)
    EXPECT_EQ(FromProto(Beat(c, absl::Seconds(1)).heartbeat_interval()), absl::Seconds(10));
  // Told 10 s: 5 x 10 s of silence is allowed, not the configured 5 s.
  Advance(absl::Seconds(49));
  EXPECT_TRUE(Connected("a0"));
  EXPECT_EQ(sched_.ClusterStats().agents_active(), 20);
  EXPECT_TRUE(Take().close_conns.empty());
  Advance(absl::Seconds(1));
  EXPECT_FALSE(Connected("a0"));
  EXPECT_EQ(Take().close_conns.size(), 20u);
  // And with them gone the interval is back to the configured one.
  EXPECT_EQ(Told(), absl::Seconds(1));
}

TEST_F(HeartbeatTest, ShorterIntervalCountsOnlyOnceTheAgentTookIt) {
  const std::vector<uint64_t> conns = ConnectMany(20);
  for (uint64_t c : conns) Beat(c, absl::Seconds(1));  // all told 10 s
  for (int i = 9; i < 20; ++i) sched_.Disconnect(conns[i]);
  Check();
  EXPECT_EQ(Told(), absl::Seconds(5));  // 9 agents: 4.5 s, rounded up
  // a0 still beats every 10 s when it hears of 5 s: judged by 10 s.
  EXPECT_EQ(FromProto(Beat(conns[0], absl::Seconds(10)).heartbeat_interval()), absl::Seconds(5));
  Advance(absl::Seconds(26));  // past 5 x 5 s
  EXPECT_TRUE(Connected("a0"));
  // Now it says it beats every 5 s: judged by 5 s.
  Beat(conns[0], absl::Seconds(5));
  Advance(absl::Seconds(24));
  EXPECT_TRUE(Connected("a0"));
  Advance(absl::Seconds(1));
  EXPECT_FALSE(Connected("a0"));
}

TEST_F(HeartbeatTest, ShorterIntervalNeverBringsAnEarlierDeadlineCloser) {
  const std::vector<uint64_t> conns = ConnectMany(20);
  for (uint64_t c : conns) Beat(c, absl::Seconds(1));  // all told 10 s
  for (int i = 9; i < 20; ++i) sched_.Disconnect(conns[i]);
  Check();
  ASSERT_EQ(Told(), absl::Seconds(5));
  // Judged by 10 s (it says so): lost 50 s from now at the earliest, and
  // its lease was granted on that.
  Beat(conns[0], absl::Seconds(10));
  Advance(absl::Seconds(10));
  Beat(conns[0], absl::Seconds(5));  // 10 + 25 s would be sooner
  Advance(absl::Seconds(39));
  EXPECT_TRUE(Connected("a0"));
  Advance(absl::Seconds(1));
  EXPECT_FALSE(Connected("a0"));
}

TEST_F(HeartbeatTest, IntervalShrinksBackAsAgentsLeave) {
  const std::vector<uint64_t> conns = ConnectMany(20);
  EXPECT_EQ(Told(), absl::Seconds(10));
  for (int i = 1; i < 20; ++i) sched_.Disconnect(conns[i]);
  Check();
  EXPECT_EQ(Told(), absl::Seconds(1));
  EXPECT_EQ(FromProto(Beat(conns[0], absl::Seconds(10)).heartbeat_interval()), absl::Seconds(1));
}

TEST_F(HeartbeatTest, AnAgentCannotStretchItsOwnTimeout) {
  const uint64_t conn = ConnectAdaptive("a");
  Beat(conn, absl::Hours(1));  // told 1 s; claims an hour
  Advance(absl::Seconds(5));
  EXPECT_FALSE(Connected("a"));
}

TEST_F(HeartbeatTest, SilentAgentAfterWelcomeIsJudgedByTheIntervalItWasTold) {
  ConnectMany(19);
  ConnectAdaptive("new");  // the 20th: Welcome says 10 s
  Advance(absl::Seconds(49));
  EXPECT_TRUE(Connected("new"));
  EXPECT_FALSE(Connected("a0")) << "told 1 s in its Welcome, silent since";
}

}  // namespace
}  // namespace taskgrid::core
