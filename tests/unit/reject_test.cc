// An agent that rejects an Assign because of its own state (draining, an
// earlier attempt of the task still being stopped, no free slot) says
// nothing about the task: the attempt does not count, and the task comes
// back after a short delay rather than at once (no reject loop). A reject
// without a code, or for a malformed Assign, counts as before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RejectTest : public SchedulerTest {
 protected:
  void Reject(uint64_t conn, const std::string& id, int attempt, v1::RejectCode code) {
    v1::AgentMessage m;
    m.mutable_reject()->set_task_id(id);
    m.mutable_reject()->set_attempt(attempt);
    m.mutable_reject()->set_reason("not now");
    m.mutable_reject()->set_code(code);
    sched_.OnAgentMessage(conn, m);
    Check();
  }
  // Task `id` with a single attempt, dispatched as attempt 1 to an agent
  // of its own.
  uint64_t OneShotDispatched(const std::string& id) {
    v1::TaskSpec s = Spec(id);
    s.set_max_attempts(1);
    s.mutable_placement()->add_agent_ids("on-" + id);
    SubmitOk(s);
    const uint64_t conn = Connect("on-" + id, 1);
    EXPECT_THAT(Assigned(Take(), conn), ElementsAre(id));
    return conn;
  }
};

TEST_F(RejectTest, BusyDrainingAndNoSlotsDoNotCountAndComeBackAfterADelay) {
  for (v1::RejectCode code :
       {v1::REJECT_CODE_BUSY, v1::REJECT_CODE_DRAINING, v1::REJECT_CODE_NO_SLOTS}) {
    const std::string t = v1::RejectCode_Name(code);
    SCOPED_TRACE(t);
    const uint64_t conn = OneShotDispatched(t);
    Reject(conn, t, 1, code);
    EXPECT_EQ(State(t), v1::TASK_STATE_SCHEDULED);
    EXPECT_THAT(Assigned(Take(), conn), ElementsAre()) << "sent back at once";
    Advance(absl::Seconds(1));  // the initial backoff
    EXPECT_THAT(Assigned(Take(), conn), ElementsAre(t));
    Accept(conn, t, 2);
    Result(conn, t, 2, v1::OUTCOME_SUCCEEDED);
    EXPECT_EQ(State(t), v1::TASK_STATE_SUCCEEDED) << "the one attempt was still there";
  }
}

TEST_F(RejectTest, AnUncodedOrInvalidRejectCounts) {
  for (v1::RejectCode code : {v1::REJECT_CODE_UNSPECIFIED, v1::REJECT_CODE_INVALID}) {
    const std::string t = v1::RejectCode_Name(code);
    SCOPED_TRACE(t);
    const uint64_t conn = OneShotDispatched(t);
    Reject(conn, t, 1, code);
    EXPECT_EQ(State(t), v1::TASK_STATE_FAILED);
    EXPECT_THAT(sched_.Find(t)->reason, HasSubstr("rejected by the agent: not now"));
  }
}

}  // namespace
}  // namespace taskgrid::core
