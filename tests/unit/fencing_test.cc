// Who may change a task, across everything that renumbers or rebuilds it:
// ids the scheduler makes next to ids clients give, attempt numbers across
// a reset, and the deadlines and chain links a restart brings back. Fake
// clock, no sleeping; the invariant checker runs after every step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FencingTest : public SchedulerTest {
 protected:
  static v1::AgentMessage ResultMsg(const std::string& id, int attempt, v1::Outcome outcome) {
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(outcome);
    return m;
  }
  static v1::AgentMessage AcceptMsg(const std::string& id, int attempt) {
    v1::AgentMessage m;
    m.mutable_accept()->set_task_id(id);
    m.mutable_accept()->set_attempt(attempt);
    return m;
  }
  static void CheckOf(const Scheduler& s) {
    ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
  }
};

// --- Ids. ---

TEST_F(FencingTest, AGeneratedIdNeverTakesAnIdGivenInTheSameBatch) {
  // The id the scheduler would generate next, given by the client beside a
  // task that asks for a generated one.
  const std::string next = absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(clock_.Now()), 1);
  v1::TaskSpec unnamed = Spec("");
  v1::TaskSpec named = Spec(next);
  auto r = Submit({unnamed, named});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_NE((*r)[0]->id(), next);
  EXPECT_EQ((*r)[1]->id(), next);
  EXPECT_EQ(sched_.task_count(), 2u);
  EXPECT_EQ(sched_.Find((*r)[0]->id()), (*r)[0]);
  EXPECT_EQ(sched_.Find(next), (*r)[1]);
  // Both are real tasks: they dispatch and finish.
  const uint64_t conn = Connect("a1", 2);
  EXPECT_EQ(Assigned(Take(), conn).size(), 2u);
}

TEST_F(FencingTest, AGeneratedIdNeverTakesAnIdGivenInAnEarlierBatch) {
  const std::string next = absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(clock_.Now()), 1);
  SubmitOk(Spec(next));
  auto r = Submit({Spec("")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE((*r)[0]->id(), next);
  EXPECT_EQ(sched_.task_count(), 2u);
}

// --- Attempt numbers across a reset. ---

TEST_F(FencingTest, AttemptNumbersNeverRepeatAcrossAReset) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Result(conn, "t", 1, v1::OUTCOME_FAILED, 1);
  ASSERT_EQ(State("t"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(sched_.Reset("t").ok());
  Check();
  // Dispatched again at once, as a fresh task would be, but as attempt 2.
  ASSERT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("t").attempt, 2);
  EXPECT_TRUE(Task("t").attempts.empty());
  v1::Task view;
  sched_.Describe(Task("t"), &view);
  EXPECT_EQ(view.attempts_used(), 1);  // the live one; the budget is fresh
  EXPECT_EQ(view.max_attempts(), 1);
}

TEST_F(FencingTest, AResultFromBeforeAResetIsStaleForTheRunAfterIt) {
  // An agent frozen past its lease: its attempt is lost, the task fails and
  // is reset, and runs again on the same agent id. Then the frozen process
  // wakes and sends the result it had for the attempt before the reset.
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t old_conn = Connect("a1", 1);
  Accept(old_conn, "t", 1);
  sched_.Disconnect(old_conn);
  Advance(absl::Seconds(6));  // past the grace: lost
  ASSERT_EQ(State("t"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(sched_.Reset("t").ok());
  const uint64_t conn = Connect("a1", 1);
  const int live = Task("t").attempt;
  ASSERT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  ASSERT_NE(live, 1);
  Accept(conn, "t", live);
  Take();
  Result(conn, "t", 1, v1::OUTCOME_CANCELLED, -1);
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING) << "the old attempt's result ended the new run";
  const std::vector<v1::ResultAck> acks = Acks(Take());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_FALSE(acks[0].accepted());
  // Its own result still counts.
  Result(conn, "t", live, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(FencingTest, AHelloListingTheAttemptFromBeforeAResetIsToldToStopIt) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t old_conn = Connect("a1", 1);
  Accept(old_conn, "t", 1);
  sched_.Disconnect(old_conn);
  Advance(absl::Seconds(6));
  ASSERT_TRUE(sched_.Reset("t").ok());
  Connect("a2", 1);  // the reset run goes elsewhere
  const int live = Task("t").attempt;
  ASSERT_EQ(Task("t").agent_id, "a2");
  Take();
  const uint64_t conn = Connect("a1", 1, {}, {{"t", 1}});
  EXPECT_THAT(Cancels(Take(), conn), ElementsAre("t"));
  EXPECT_EQ(Task("t").attempt, live);
  EXPECT_EQ(Task("t").agent_id, "a2");
}

TEST_F(FencingTest, RestoreKeepsAttemptNumbersRisingAfterAReset) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "t", 1, v1::OUTCOME_FAILED, 1);
  ASSERT_TRUE(sched_.Reset("t").ok());
  ASSERT_EQ(Task("t").attempt, 2);
  Result(conn, "t", 2, v1::OUTCOME_FAILED, 1);
  ASSERT_EQ(State("t"), v1::TASK_STATE_FAILED);
  std::unique_ptr<Scheduler> r = Restarted();
  ASSERT_TRUE(r->Reset("t").ok());
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  ASSERT_TRUE(r->Connect(100, h).ok());
  CheckOf(*r);
  EXPECT_EQ(r->Find("t")->attempt, 3);
  v1::Task view;
  r->Describe(*r->Find("t"), &view);
  EXPECT_EQ(view.attempts_used(), 1);
}

// --- What a restart brings back. ---

TEST_F(FencingTest, ARestartKeepsTheAttemptTimeoutOfARunningTask) {
  v1::TaskSpec s = Spec("t");
  s.mutable_attempt_timeout()->set_seconds(30);
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Advance(absl::Seconds(10));
  std::unique_ptr<Scheduler> r = Restarted();
  // The agent comes back and keeps the task, then stays connected and
  // heartbeating while its step never ends.
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  v1::AttemptRef* ref = h.add_running();
  ref->set_task_id("t");
  ref->set_attempt(1);
  ASSERT_TRUE(r->Connect(100, h).ok());
  v1::AgentMessage hb;
  hb.mutable_heartbeat();
  for (int i = 0; i < 120; ++i) {
    clock_.Advance(absl::Seconds(1));
    r->OnAgentMessage(100, hb);
    r->Tick();
    CheckOf(*r);
    if (r->Find("t")->state != v1::TASK_STATE_RUNNING) break;
  }
  ASSERT_EQ(r->Find("t")->state, v1::TASK_STATE_FAILED);
  EXPECT_EQ(r->Find("t")->result().outcome(), v1::OUTCOME_TIMED_OUT);
  // Not before the 30 s it was given (from its start, before the restart).
  EXPECT_GE(clock_.Now() - FromProto(r->Find("t")->attempts[0].start_time()), absl::Seconds(30));
}

TEST_F(FencingTest, AChainLinkThatStartedBeforeARestartIsNotFailedForItsLostAccept) {
  // c1 -> c2 went to the agent as one chain. c1 succeeded there and c2
  // started, but the scheduler died before c1's Result and c2's Accept
  // were committed: after the restart the agent lists c1 (its result not
  // yet acknowledged) and c2 as started, and resends c1's Result. c2's
  // Accept is not resent: the Hello listing it started is all there is.
  v1::TaskSpec c2 = Spec("c2");
  c2.add_depends_on("c1");
  ASSERT_TRUE(sched_.SubmitJob("chain", {Spec("c1"), c2}).ok());
  v1::Hello h;
  h.set_agent_id("w");
  h.set_slots(1);
  h.set_chains(true);
  const uint64_t conn = ConnectHello(h);
  ASSERT_EQ(Task("c2").chained_after, &Task("c1"));
  Accept(conn, "c1", 1);
  std::unique_ptr<Scheduler> r = Restarted();
  ASSERT_EQ(r->Find("c2")->chained_after, r->Find("c1"));
  v1::Hello again = h;
  for (const char* id : {"c1", "c2"}) {
    v1::AttemptRef* ref = again.add_running();
    ref->set_task_id(id);
    ref->set_attempt(1);
  }
  ASSERT_TRUE(r->Connect(100, again).ok());
  CheckOf(*r);
  r->OnAgentMessage(100, ResultMsg("c1", 1, v1::OUTCOME_SUCCEEDED));
  CheckOf(*r);
  ASSERT_EQ(r->Find("c1")->state, v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(r->Find("c2")->state, v1::TASK_STATE_RUNNING) << "the Hello said it started";
  // Well past the ack timeout, the agent heartbeating: still running, and
  // its attempt not spent.
  v1::AgentMessage hb;
  hb.mutable_heartbeat();
  for (int i = 0; i < 30; ++i) {
    clock_.Advance(absl::Seconds(1));
    r->OnAgentMessage(100, hb);
    r->Tick();
    CheckOf(*r);
  }
  EXPECT_EQ(r->Find("c2")->state, v1::TASK_STATE_RUNNING);
  r->OnAgentMessage(100, ResultMsg("c2", 1, v1::OUTCOME_SUCCEEDED));
  EXPECT_EQ(r->Find("c2")->state, v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(r->Find("c2")->attempts.size(), 1u);
}

TEST_F(FencingTest, ACancelledDispatchedTaskKeepsADeadlineAcrossARestart) {
  // Cancelled while its agent had not accepted it yet: CANCELLING until
  // the agent confirms. After a restart it must still end, even if the
  // agent comes back and never answers about it.
  SubmitOk(Spec("t"));
  Connect("a1", 1);
  ASSERT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  ASSERT_TRUE(sched_.Cancel("t").ok());
  ASSERT_EQ(State("t"), v1::TASK_STATE_CANCELLING);
  std::unique_ptr<Scheduler> r = Restarted();
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  v1::AttemptRef* ref = h.add_running();
  ref->set_task_id("t");
  ref->set_attempt(1);
  ASSERT_TRUE(r->Connect(100, h).ok());
  v1::AgentMessage hb;
  hb.mutable_heartbeat();
  for (int i = 0; i < 60 && r->Find("t")->state == v1::TASK_STATE_CANCELLING; ++i) {
    clock_.Advance(absl::Seconds(1));
    r->OnAgentMessage(100, hb);
    r->Tick();
    CheckOf(*r);
  }
  EXPECT_EQ(r->Find("t")->state, v1::TASK_STATE_CANCELLED);
}

}  // namespace
}  // namespace taskgrid::core
