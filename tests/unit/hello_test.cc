// A Hello is the first thing an agent says, and the scheduler trusts none
// of it: every count and size is bounded, and a refused Hello leaves no
// agent behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;

class HelloTest : public SchedulerTest {
 protected:
  static SchedulerOptions Capped() {
    SchedulerOptions o = Options();
    o.max_agent_slots = 64;
    return o;
  }
  HelloTest() : SchedulerTest(Capped()) {}

  static v1::Hello Good() {
    v1::Hello h;
    h.set_agent_id("a1");
    h.set_slots(4);
    return h;
  }
  // The Hello is refused with INVALID_ARGUMENT naming `what`, and nothing
  // of the agent is kept.
  void Refused(const v1::Hello& h, const std::string& what) {
    const absl::Status s = sched_.Connect(77, h);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(what));
    EXPECT_EQ(sched_.FindAgent(h.agent_id()), nullptr) << what;
    Check();
  }
};

TEST_F(HelloTest, SlotsOverTheCapAreRefused) {
  v1::Hello h = Good();
  h.set_slots(65);
  Refused(h, "hello.slots is 65; it must be in [1, 64]");
  h.set_slots(0);
  Refused(h, "hello.slots is 0");
  h.set_slots(64);
  EXPECT_TRUE(sched_.Connect(1, h).ok());
}

TEST_F(HelloTest, LabelsAreBoundedInNumberAndSize) {
  v1::Hello h = Good();
  (*h.mutable_labels())["zone"] = std::string(257, 'z');
  Refused(h, "hello.labels[zone] is 257 bytes");
  h = Good();
  for (int i = 0; i < 65; ++i) (*h.mutable_labels())["k" + std::to_string(i)] = "v";
  Refused(h, "hello.labels has 65 entries");
}

TEST_F(HelloTest, VersionAndRunningListAreBounded) {
  v1::Hello h = Good();
  h.set_version(std::string(200, 'v'));
  Refused(h, "hello.version");
  h = Good();
  // At most what an agent can hold: every slot with a full chain.
  for (int i = 0; i < 64 * 100 + 1; ++i) {
    v1::AttemptRef* r = h.add_running();
    r->set_task_id("t" + std::to_string(i));
    r->set_attempt(1);
  }
  Refused(h, "hello.running");
  h = Good();
  h.add_running()->set_task_id("bad id");
  Refused(h, "hello.running[0].task_id");
}

// Goodbye is the other end of Hello: an agent that stopped cleanly leaves
// the agent list at once instead of showing LOST.
class GoodbyeTest : public SchedulerTest {
 protected:
  void Goodbye(uint64_t conn) {
    v1::AgentMessage m;
    m.mutable_goodbye();
    sched_.OnAgentMessage(conn, m);
    Check();
  }
};

TEST_F(GoodbyeTest, AnAgentThatSaysGoodbyeIsForgottenAndItsStreamEnded) {
  const uint64_t conn = Connect("a1", 2);
  Take();
  Goodbye(conn);
  EXPECT_EQ(sched_.FindAgent("a1"), nullptr);
  EXPECT_THAT(Take().close_conns, ::testing::ElementsAre(conn));
  sched_.Disconnect(conn);  // the stream's end, after: nothing left to do
  Advance(absl::Minutes(1));
  EXPECT_EQ(sched_.FindAgent("a1"), nullptr);
  // The id may come back as a new agent.
  Connect("a1", 2);
  EXPECT_NE(sched_.FindAgent("a1"), nullptr);
}

TEST_F(GoodbyeTest, AnAgentThatVanishesIsStillLost) {
  const uint64_t conn = Connect("a1", 2);
  sched_.Disconnect(conn);
  Advance(absl::Seconds(6));  // past the reconnect grace
  ASSERT_NE(sched_.FindAgent("a1"), nullptr);
  EXPECT_TRUE(sched_.FindAgent("a1")->lost);
}

TEST_F(GoodbyeTest, AGoodbyeWhileHoldingATaskWaitsForItsResult) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Take();
  Accept(conn, "t", 1);
  Goodbye(conn);
  ASSERT_NE(sched_.FindAgent("a1"), nullptr) << "it still holds t";
  EXPECT_FALSE(sched_.FindAgent("a1")->takes_work());
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(sched_.FindAgent("a1"), nullptr);
}

}  // namespace
}  // namespace taskgrid::core
