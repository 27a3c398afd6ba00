// The Scheduler under a fake clock: every decision, no sleeping. The
// invariant checker runs after every step.
#include "scheduler/core/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// --- The round trip. ---

TEST_F(SchedulerTest, SubmitDispatchAcceptResultSucceeds) {
  SubmitOk(Spec("t1"));
  EXPECT_EQ(State("t1"), v1::TASK_STATE_PENDING);
  Effects fx = Take();
  ASSERT_EQ(fx.batch.tasks.size(), 1u);
  EXPECT_TRUE(fx.batch.tasks[0].insert);
  ASSERT_EQ(fx.batch.events.size(), 1u);
  EXPECT_EQ(fx.batch.events[0].to_state, v1::TASK_STATE_PENDING);

  const uint64_t conn = Connect("a1", 2);
  fx = Take();
  ASSERT_GE(fx.messages.size(), 2u);
  EXPECT_TRUE(fx.messages[0].msg.has_welcome()) << "Welcome comes before any Assign";
  EXPECT_THAT(Assigned(fx, conn), ElementsAre("t1"));
  EXPECT_EQ(State("t1"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("t1").attempt, 1);
  EXPECT_EQ(Task("t1").agent_id, "a1");

  Accept(conn, "t1", 1);
  EXPECT_EQ(State("t1"), v1::TASK_STATE_RUNNING);
  Result(conn, "t1", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t1"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("t1").result().stdout_tail(), "t1\n");
  ASSERT_EQ(Task("t1").attempts.size(), 1u);
  EXPECT_EQ(Task("t1").attempts[0].agent_id(), "a1");
  EXPECT_TRUE(Task("t1").agent_id.empty());
  fx = Take();
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_TRUE(Acks(fx)[0].accepted());
  EXPECT_EQ(fx.batch.attempts.size(), 1u);
  EXPECT_EQ(sched_.FindAgent("a1")->used, 0);
}

TEST_F(SchedulerTest, EveryTransitionWritesTheRowAndAnEvent) {
  SubmitOk(Spec("t1"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t1", 1);
  Result(conn, "t1", 1, v1::OUTCOME_SUCCEEDED);
  Effects fx = Take();
  std::vector<int> to;
  for (const EventRow& e : fx.batch.events) to.push_back(e.to_state);
  EXPECT_THAT(to, ElementsAre(v1::TASK_STATE_PENDING, v1::TASK_STATE_DISPATCHED,
                              v1::TASK_STATE_RUNNING, v1::TASK_STATE_SUCCEEDED));
  ASSERT_EQ(fx.batch.tasks.size(), fx.batch.events.size());
  for (size_t i = 0; i < fx.batch.tasks.size(); ++i) {
    EXPECT_EQ(fx.batch.tasks[i].state, fx.batch.events[i].to_state);
  }
}

TEST_F(SchedulerTest, SlotsLimitConcurrentDispatch) {
  for (int i = 0; i < 5; ++i) SubmitOk(Spec("t" + std::to_string(i)));
  const uint64_t conn = Connect("a1", 2);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("t0", "t1"));
  Accept(conn, "t0", 1);
  Result(conn, "t0", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("t2"));
}

TEST_F(SchedulerTest, HigherPriorityFirstThenFifo) {
  SubmitOk(Spec("low1", 0));
  SubmitOk(Spec("high1", 5));
  SubmitOk(Spec("low2", 0));
  SubmitOk(Spec("high2", 5));
  SubmitOk(Spec("neg", -3));
  const uint64_t conn = Connect("a1", 10);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("high1", "high2", "low1", "low2", "neg"));
}

TEST_F(SchedulerTest, NotBeforeWaitsInScheduled) {
  v1::TaskSpec s = Spec("later");
  SetTimestamp(clock_.Now() + absl::Seconds(30), s.mutable_not_before());
  SubmitOk(s);
  EXPECT_EQ(State("later"), v1::TASK_STATE_SCHEDULED);
  Advance(absl::Seconds(29));
  const uint64_t conn = Connect("a1", 1);
  EXPECT_THAT(Assigned(Take(), conn), IsEmpty());
  EXPECT_EQ(State("later"), v1::TASK_STATE_SCHEDULED);
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("later"), v1::TASK_STATE_DISPATCHED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("later"));
}

TEST_F(SchedulerTest, PlacementNeedsLabelsAndRoom) {
  v1::TaskSpec gpu = Spec("gpu");
  (*gpu.mutable_placement()->mutable_required_labels())["gpu"] = "1";
  SubmitOk(gpu);
  SubmitOk(Spec("any"));
  const uint64_t cpu = Connect("cpu", 4, {{"gpu", "0"}});
  EXPECT_THAT(Assigned(Take(), cpu), ElementsAre("any"));
  EXPECT_EQ(State("gpu"), v1::TASK_STATE_PENDING);
  const uint64_t g = Connect("g1", 1, {{"gpu", "1"}});
  EXPECT_THAT(Assigned(Take(), g), ElementsAre("gpu"));
}

TEST_F(SchedulerTest, UnplaceableHeadDoesNotBlockOthers) {
  v1::TaskSpec big = Spec("big", 10);
  big.mutable_placement()->set_slots(4);
  SubmitOk(big);
  SubmitOk(Spec("small"));
  const uint64_t conn = Connect("a1", 2);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("small"));
  EXPECT_EQ(State("big"), v1::TASK_STATE_PENDING);
}

TEST_F(SchedulerTest, SpecificAgentIds) {
  v1::TaskSpec s = Spec("pinned");
  s.mutable_placement()->add_agent_ids("a2");
  SubmitOk(s);
  const uint64_t a1 = Connect("a1", 4);
  EXPECT_THAT(Assigned(Take(), a1), IsEmpty());
  const uint64_t a2 = Connect("a2", 1);
  EXPECT_THAT(Assigned(Take(), a2), ElementsAre("pinned"));
}

// --- Failure and retry. ---

TEST_F(SchedulerTest, FailedAttemptsRetryWithBackoffUntilMaxAttempts) {
  v1::TaskSpec s = Spec("flaky");
  s.set_max_attempts(3);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  absl::Duration want_backoff = absl::Seconds(1);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_EQ(State("flaky"), v1::TASK_STATE_DISPATCHED) << "attempt " << attempt;
    EXPECT_EQ(Task("flaky").attempt, attempt);
    Accept(conn, "flaky", attempt);
    Result(conn, "flaky", attempt, v1::OUTCOME_FAILED, 3);
    if (attempt == 3) break;
    EXPECT_EQ(State("flaky"), v1::TASK_STATE_SCHEDULED);
    Advance(want_backoff - absl::Milliseconds(1));
    EXPECT_EQ(State("flaky"), v1::TASK_STATE_SCHEDULED);
    Advance(absl::Milliseconds(1));
    want_backoff *= 2;
  }
  EXPECT_EQ(State("flaky"), v1::TASK_STATE_FAILED);
  EXPECT_THAT(Task("flaky").reason, HasSubstr("all 3 attempts used"));
  EXPECT_EQ(Task("flaky").attempts.size(), 3u);
  EXPECT_EQ(Task("flaky").result().exit_code(), 3);
}

TEST_F(SchedulerTest, BackoffIsCappedAtMax) {
  v1::TaskSpec s = Spec("capped");
  s.set_max_attempts(10);
  s.mutable_retry()->mutable_initial_backoff()->set_seconds(4);
  s.mutable_retry()->mutable_max_backoff()->set_seconds(6);
  s.mutable_retry()->set_multiplier(3);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "capped", 1, v1::OUTCOME_FAILED, 1);
  EXPECT_EQ(Task("capped").next_run_time, clock_.Now() + absl::Seconds(4));
  Advance(absl::Seconds(4));
  Result(conn, "capped", 2, v1::OUTCOME_FAILED, 1);
  EXPECT_EQ(Task("capped").next_run_time, clock_.Now() + absl::Seconds(6));
}

TEST_F(SchedulerTest, NonRetryableExitCodeFailsAtOnce) {
  v1::TaskSpec s = Spec("fatal");
  s.set_max_attempts(5);
  s.mutable_retry()->add_non_retryable_exit_codes(42);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "fatal", 1);
  Result(conn, "fatal", 1, v1::OUTCOME_FAILED, 42);
  EXPECT_EQ(State("fatal"), v1::TASK_STATE_FAILED);
  EXPECT_THAT(Task("fatal").reason, HasSubstr("not retryable"));
}

TEST_F(SchedulerTest, ZeroBackoffRetriesAtOnce) {
  v1::TaskSpec s = Spec("quick");
  s.mutable_retry()->mutable_initial_backoff();  // set, zero
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "quick", 1, v1::OUTCOME_FAILED, 1);
  EXPECT_EQ(State("quick"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("quick").attempt, 2);
}

// --- Fencing. ---

TEST_F(SchedulerTest, StaleAttemptResultIsRefusedAndNotCommitted) {
  v1::TaskSpec s = Spec("t");
  s.mutable_retry()->mutable_initial_backoff();
  s.mutable_ack_timeout()->set_seconds(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Advance(absl::Seconds(1));  // attempt 1 expires unaccepted; attempt 2 is live
  ASSERT_EQ(Task("t").attempt, 2);
  Take();
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);  // attempt 1 finishes late
  Effects fx = Take();
  EXPECT_TRUE(fx.batch.tasks.empty());
  EXPECT_TRUE(fx.batch.events.empty());
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_FALSE(Acks(fx)[0].accepted());
  EXPECT_EQ(sched_.stale_messages(), 1);
}

TEST_F(SchedulerTest, ResultFromAnotherAgentIsStale) {
  SubmitOk(Spec("t"));
  const uint64_t a1 = Connect("a1", 1);
  const uint64_t a2 = Connect("a2", 1);
  Accept(a1, "t", 1);
  Take();
  Result(a2, "t", 1, v1::OUTCOME_SUCCEEDED);
  Effects fx = Take();
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  EXPECT_TRUE(fx.batch.empty());
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_FALSE(Acks(fx)[0].accepted());
}

TEST_F(SchedulerTest, RepeatedResultAfterCommitIsAckedButNotCommittedAgain) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  Take();
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);  // its ack was lost; the agent resends
  Effects fx = Take();
  EXPECT_TRUE(fx.batch.empty());
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_TRUE(Acks(fx)[0].accepted());
  EXPECT_EQ(Task("t").attempts.size(), 1u);
  EXPECT_EQ(sched_.stale_messages(), 0);
}

TEST_F(SchedulerTest, StaleAcceptGetsACancel) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Take();
  Accept(conn, "t", 7);
  Effects fx = Take();
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  EXPECT_THAT(Cancels(fx, conn), ElementsAre("t"));
}

// --- Deadlines and lost agents. ---

TEST_F(SchedulerTest, AckTimeoutCountsAsAFailedAttempt) {
  v1::TaskSpec s = Spec("t");
  s.mutable_ack_timeout()->set_seconds(3);
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Advance(absl::Seconds(2));
  Heartbeat(conn);
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  Take();
  Advance(absl::Seconds(1));
  // Attempt 1 lost; attempt 2 dispatched again (the agent is the only one).
  EXPECT_EQ(Task("t").attempt, 2);
  ASSERT_EQ(Task("t").attempts.size(), 1u);
  EXPECT_EQ(Task("t").attempts[0].result().outcome(), v1::OUTCOME_LOST);
  EXPECT_THAT(Task("t").attempts[0].result().error(), HasSubstr("did not accept"));
  Effects fx = Take();
  EXPECT_THAT(Cancels(fx, conn), ElementsAre("t"));
}

TEST_F(SchedulerTest, ReconnectWithinGraceKeepsRunningTasks) {
  SubmitOk(Spec("t"));
  uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  sched_.Disconnect(conn);
  Check();
  Advance(absl::Seconds(4));
  conn = Connect("a1", 1, {}, {{"t", 1}});
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Task("t").attempt, 1);
  for (int i = 0; i < 10; ++i) {
    Advance(absl::Seconds(1));
    Heartbeat(conn);
  }
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("t").attempts.size(), 1u);
}

TEST_F(SchedulerTest, AfterGraceTasksAreRequeuedAndTheAttemptCounts) {
  v1::TaskSpec s = Spec("t");
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  sched_.Disconnect(conn);
  Advance(absl::Seconds(4));
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Task("t").attempt, 1);
  ASSERT_NE(sched_.FindAgent("a1"), nullptr);
  EXPECT_TRUE(sched_.FindAgent("a1")->lost) << "listed as lost for a while";
  const uint64_t other = Connect("a2", 1);
  EXPECT_THAT(Assigned(Take(), other), ElementsAre("t"));
  EXPECT_EQ(Task("t").attempt, 2);
}

TEST_F(SchedulerTest, ReconnectWithoutTheTaskLosesTheAttempt) {
  v1::TaskSpec s = Spec("t");
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  sched_.Disconnect(conn);
  conn = Connect("a1", 1);  // restarted: runs nothing
  EXPECT_THAT(Task("t").attempts[0].result().error(), HasSubstr("came back without it"));
  EXPECT_EQ(Task("t").attempt, 2);  // and dispatched to it again
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(SchedulerTest, ASecondLiveAgentWithTheSameIdIsRefused) {
  const uint64_t first = Connect("twin", 1);
  v1::Hello h;
  h.set_agent_id("twin");
  h.set_slots(1);
  absl::Status s = sched_.Connect(99, h);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("own --id"));
  EXPECT_EQ(sched_.FindAgent("twin")->conn, first) << "the live stream keeps it";
  // Silent for a while: a reconnect that beat the old stream's end wins.
  clock_.Advance(absl::Seconds(3));
  EXPECT_TRUE(sched_.Connect(100, h).ok());
  EXPECT_EQ(sched_.FindAgent("twin")->conn, 100u);
  Check();
}

TEST_F(SchedulerTest, ReconnectListingAStaleAttemptGetsACancel) {
  SubmitOk(Spec("t"));
  Take();
  const uint64_t conn = Connect("a1", 1, {}, {{"ghost", 3}});
  EXPECT_THAT(Cancels(Take(), conn), ElementsAre("ghost"));
}

TEST_F(SchedulerTest, SilentAgentIsClosedThenLost) {
  v1::TaskSpec s = Spec("t");
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Take();
  Advance(absl::Seconds(5));
  Effects fx = Take();
  EXPECT_THAT(fx.close_conns, ElementsAre(conn));
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  Advance(absl::Seconds(5));
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
}

TEST_F(SchedulerTest, HeartbeatsKeepAnAgentAlive) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  for (int i = 0; i < 20; ++i) {
    Advance(absl::Seconds(1));
    Heartbeat(conn);
  }
  EXPECT_TRUE(Take().close_conns.empty());
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
}

TEST_F(SchedulerTest, ABatchIsHandledInOrderAndFilledByOneAssign) {
  for (const char* id : {"a", "b", "c", "d"}) SubmitOk(Spec(id));
  const uint64_t conn = Connect("a1", 2);
  Effects fx = Take();
  ASSERT_TRUE(fx.messages[0].msg.welcome().batches()) << "Welcome says batches are read";
  EXPECT_EQ(Assigned(fx, conn), (std::vector<std::string>{"a", "b"}));
  // Accept and Result of both, in one batch: in order (an Accept after its
  // Result would be stale), and the two freed slots get one Assign.
  v1::AgentMessage batch;
  for (const char* id : {"a", "b"}) {
    v1::AgentMessage* accept = batch.mutable_batch()->add_msgs();
    accept->mutable_accept()->set_task_id(id);
    accept->mutable_accept()->set_attempt(1);
    v1::AgentMessage* result = batch.mutable_batch()->add_msgs();
    result->mutable_result()->set_task_id(id);
    result->mutable_result()->set_attempt(1);
    result->mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  }
  sched_.OnAgentMessage(conn, batch);
  Check();
  EXPECT_EQ(State("a"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_SUCCEEDED);
  fx = Take();
  EXPECT_EQ(Acks(fx).size(), 2u);
  int assigns = 0;
  for (const Outgoing& o : fx.messages) assigns += o.msg.has_assign() ? 1 : 0;
  EXPECT_EQ(assigns, 1);
  EXPECT_EQ(Assigned(fx, conn), (std::vector<std::string>{"c", "d"}));
  // Each attempt went through RUNNING: its history has a start.
  for (const char* id : {"a", "b"}) {
    ASSERT_EQ(sched_.Find(id)->attempts.size(), 1u) << id;
    EXPECT_TRUE(sched_.Find(id)->attempts[0].has_start_time()) << id;
  }
}

TEST_F(SchedulerTest, AttemptTimeoutExpiresWithoutAResult) {
  v1::TaskSpec s = Spec("t");
  s.mutable_attempt_timeout()->set_seconds(10);
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  for (int i = 0; i < 14; ++i) {
    Advance(absl::Seconds(1));
    Heartbeat(conn);
  }
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);  // timeout + slack not reached
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED);
  EXPECT_EQ(Task("t").result().outcome(), v1::OUTCOME_TIMED_OUT);
}

TEST_F(SchedulerTest, RejectCountsAsAFailedAttempt) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  v1::AgentMessage m;
  m.mutable_reject()->set_task_id("t");
  m.mutable_reject()->set_attempt(1);
  m.mutable_reject()->set_reason("no room");
  sched_.OnAgentMessage(conn, m);
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED);
  EXPECT_THAT(Task("t").result().error(), HasSubstr("no room"));
}

// --- Client operations. ---

TEST_F(SchedulerTest, CancelPendingTask) {
  SubmitOk(Spec("t"));
  auto r = sched_.Cancel("t");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLED);
  Check();
  const uint64_t conn = Connect("a1", 1);
  EXPECT_THAT(Assigned(Take(), conn), IsEmpty());
  EXPECT_TRUE(sched_.Cancel("t").ok()) << "cancel is idempotent";
}

TEST_F(SchedulerTest, CancelRunningTaskWaitsForTheAgent) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Take();
  ASSERT_TRUE(sched_.Cancel("t").ok());
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLING);
  EXPECT_THAT(Cancels(Take(), conn), ElementsAre("t"));
  Result(conn, "t", 1, v1::OUTCOME_CANCELLED, -1);
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(sched_.FindAgent("a1")->used, 0);
}

TEST_F(SchedulerTest, CancelledTaskWhoseAgentIsLostEndsCancelledNotRequeued) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  ASSERT_TRUE(sched_.Cancel("t").ok());
  sched_.Disconnect(conn);
  Advance(absl::Seconds(6));
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLED);
}

TEST_F(SchedulerTest, CancelOfFinishedTaskIsRefused) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  auto r = sched_.Cancel("t");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("SUCCEEDED"));
}

TEST_F(SchedulerTest, PauseAndResume) {
  SubmitOk(Spec("t"));
  ASSERT_TRUE(sched_.Pause("t").ok());
  EXPECT_EQ(State("t"), v1::TASK_STATE_PAUSED);
  const uint64_t conn = Connect("a1", 1);
  EXPECT_THAT(Assigned(Take(), conn), IsEmpty());
  ASSERT_TRUE(sched_.Resume("t").ok());
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(sched_.Resume("t").status().code(), absl::StatusCode::kFailedPrecondition);
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(sched_.Pause("t").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, PausedScheduledTaskResumesIntoScheduled) {
  v1::TaskSpec s = Spec("t");
  SetTimestamp(clock_.Now() + absl::Seconds(60), s.mutable_not_before());
  SubmitOk(s);
  ASSERT_TRUE(sched_.Pause("t").ok());
  Advance(absl::Seconds(10));
  ASSERT_TRUE(sched_.Resume("t").ok());
  EXPECT_EQ(State("t"), v1::TASK_STATE_SCHEDULED);
  Advance(absl::Seconds(50));
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
}

TEST_F(SchedulerTest, RetryKeepsTheCounterAndResetGivesAFreshBudget) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(2);
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  ASSERT_TRUE(sched_.Cancel("t").ok());
  ASSERT_TRUE(sched_.Retry("t").ok());  // cancelled before any attempt
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "t", 1, v1::OUTCOME_FAILED, 1);
  Result(conn, "t", 2, v1::OUTCOME_FAILED, 1);
  ASSERT_EQ(State("t"), v1::TASK_STATE_FAILED);
  auto r = sched_.Retry("t");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("reset"));
  Take();
  ASSERT_TRUE(sched_.Reset("t").ok());
  Check();
  Effects fx = Take();
  EXPECT_THAT(fx.batch.clear_attempts, ElementsAre("t"));
  // Dispatched again with a fresh budget and no history; its number goes
  // on from the last one (attempt numbers fence agent messages).
  EXPECT_EQ(Task("t").attempt, 3);
  EXPECT_EQ(Task("t").attempt_base, 2);
  EXPECT_TRUE(Task("t").attempts.empty());
  EXPECT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(SchedulerTest, RetryOfAFailedTaskWithAttemptsLeft) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(5);
  s.mutable_retry()->add_non_retryable_exit_codes(9);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Result(conn, "t", 1, v1::OUTCOME_FAILED, 9);
  ASSERT_EQ(State("t"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(sched_.Retry("t").ok());
  Check();
  EXPECT_EQ(Task("t").attempt, 2);
  EXPECT_EQ(sched_.Retry("t").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sched_.Reset("t").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, UnknownIdsAreNotFound) {
  EXPECT_EQ(sched_.Cancel("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Retry("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Reset("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Pause("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Resume("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Cancel("").status().code(), absl::StatusCode::kInvalidArgument);
}

// --- Submit: idempotency and bad input change nothing. ---

TEST_F(SchedulerTest, IdenticalResubmitReturnsTheExistingTask) {
  SubmitOk(Spec("t"));
  Take();
  auto again = Submit({Spec("t")});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0], sched_.Find("t"));
  EXPECT_TRUE(Take().batch.empty());
  EXPECT_EQ(sched_.task_count(), 1u);
}

TEST_F(SchedulerTest, ConflictingResubmitIsAlreadyExists) {
  SubmitOk(Spec("t"));
  Take();
  v1::TaskSpec other = Spec("t");
  other.set_priority(9);
  auto r = Submit({Spec("new"), other});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"t\""));
  EXPECT_TRUE(Take().batch.empty());
  EXPECT_EQ(sched_.Find("new"), nullptr) << "a batch is all or nothing";
}

TEST_F(SchedulerTest, DuplicateIdInOneBatchIsRefused) {
  auto r = Submit({Spec("a"), Spec("b"), Spec("a")});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tasks[2].id"));
  EXPECT_EQ(sched_.task_count(), 0u);
  EXPECT_TRUE(Take().batch.empty());
}

TEST_F(SchedulerTest, FullQueueRefusesTheWholeBatch) {
  v1::TaskSpec a = Spec("a");
  a.set_queue("small");
  SubmitOk(a);
  v1::TaskSpec b = Spec("b"), c = Spec("c");
  b.set_queue("small");
  c.set_queue("small");
  Take();
  auto r = Submit({b, c});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("queue \"small\" is full"));
  EXPECT_EQ(sched_.task_count(), 1u);
  EXPECT_TRUE(Take().batch.empty());
  SubmitOk(b);  // one more fits
  ASSERT_TRUE(sched_.Cancel("a").ok());
  SubmitOk(c);  // a terminal task no longer counts
}

TEST_F(SchedulerTest, InvalidSpecNamesTheField) {
  v1::TaskSpec bad = Spec("ok");
  bad.mutable_steps(0)->mutable_exec()->clear_argv();
  auto r = Submit({Spec("fine"), bad});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tasks[1].steps[0].exec.argv"));
  EXPECT_EQ(sched_.task_count(), 0u);
  EXPECT_EQ(Submit({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, GeneratedIdsAreUniqueAndTimeOrdered) {
  v1::TaskSpec s = Spec("");
  auto r = Submit({s, s, s});
  ASSERT_TRUE(r.ok());
  EXPECT_LT((*r)[0]->id(), (*r)[1]->id());
  EXPECT_LT((*r)[1]->id(), (*r)[2]->id());
  clock_.Advance(absl::Seconds(1));
  auto later = Submit({s});
  ASSERT_TRUE(later.ok());
  EXPECT_LT((*r)[2]->id(), (*later)[0]->id());
}

// --- List and stats. ---

TEST_F(SchedulerTest, ListFiltersAndPages) {
  for (int i = 0; i < 5; ++i) {
    v1::TaskSpec s = Spec("q" + std::to_string(i));
    s.set_queue(i % 2 == 0 ? "even" : "odd");
    SubmitOk(s);
  }
  ASSERT_TRUE(sched_.Pause("q2").ok());
  ListFilter f;
  f.queue = "even";
  f.page_size = 2;
  ListPage p = sched_.List(f);
  ASSERT_EQ(p.tasks.size(), 2u);
  EXPECT_EQ(p.tasks[0]->id(), "q0");
  EXPECT_EQ(p.tasks[1]->id(), "q2");
  ASSERT_NE(p.next_after_seq, 0);
  f.after_seq = p.next_after_seq;
  p = sched_.List(f);
  ASSERT_EQ(p.tasks.size(), 1u);
  EXPECT_EQ(p.tasks[0]->id(), "q4");
  EXPECT_EQ(p.next_after_seq, 0);

  ListFilter paused;
  paused.states = {v1::TASK_STATE_PAUSED};
  p = sched_.List(paused);
  ASSERT_EQ(p.tasks.size(), 1u);
  EXPECT_EQ(p.tasks[0]->id(), "q2");
}

TEST_F(SchedulerTest, StatsCountByState) {
  for (int i = 0; i < 3; ++i) SubmitOk(Spec("s" + std::to_string(i)));
  ASSERT_TRUE(sched_.Cancel("s0").ok());
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "s1", 1);
  auto stats = sched_.Stats("default");
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].length(), 2);
  EXPECT_EQ(stats[0].counts().at("CANCELLED"), 1);
  EXPECT_EQ(stats[0].counts().at("RUNNING"), 1);
  EXPECT_EQ(stats[0].counts().at("PENDING"), 1);
  auto all = sched_.Stats("");
  ASSERT_EQ(all.size(), 2u);  // default, and "small" which has a limit
  EXPECT_EQ(all[1].queue(), "small");
  EXPECT_EQ(all[1].max_length(), 2);
}

// --- Recovery. ---

TEST_F(SchedulerTest, RestoreRebuildsQueuesAndGivesAgentsAGraceWindow) {
  // Run one scheduler to produce records, then restore them into another.
  SubmitOk(Spec("pending"));
  SubmitOk(Spec("running"));
  v1::TaskSpec later = Spec("later");
  SetTimestamp(clock_.Now() + absl::Seconds(30), later.mutable_not_before());
  SubmitOk(later);
  ASSERT_TRUE(sched_.Pause("pending").ok());
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "running", 1);
  ASSERT_TRUE(sched_.Resume("pending").ok());
  Check();

  std::vector<TaskRecord> records;
  for (const char* id : {"pending", "running", "later"}) records.push_back(Task(id));
  Scheduler restored(&clock_, Options());
  ASSERT_TRUE(restored.Restore(records).ok());
  ASSERT_TRUE(restored.CheckInvariants().ok()) << restored.CheckInvariants();
  ASSERT_NE(restored.FindAgent("a1"), nullptr);
  EXPECT_FALSE(restored.FindAgent("a1")->connected());

  // The agent comes back within the grace and claims its attempt.
  clock_.Advance(absl::Seconds(3));
  restored.Tick();
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(2);
  v1::AttemptRef* r = h.add_running();
  r->set_task_id("running");
  r->set_attempt(1);
  ASSERT_TRUE(restored.Connect(99, h).ok());
  ASSERT_TRUE(restored.CheckInvariants().ok()) << restored.CheckInvariants();
  EXPECT_EQ(restored.Find("running")->state, v1::TASK_STATE_RUNNING);
  EXPECT_EQ(restored.Find("pending")->state, v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(restored.Find("later")->state, v1::TASK_STATE_SCHEDULED);
  clock_.Advance(absl::Seconds(30));
  restored.Tick();
  EXPECT_NE(restored.Find("later")->state, v1::TASK_STATE_SCHEDULED);
  ASSERT_TRUE(restored.CheckInvariants().ok()) << restored.CheckInvariants();
}

TEST_F(SchedulerTest, RestoredInFlightTaskIsRequeuedWhenItsAgentNeverReturns) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Scheduler restored(&clock_, Options());
  ASSERT_TRUE(restored.Restore({Task("t")}).ok());
  // Its agent may be running it still, held through the restart: it has
  // the restart grace to come back.
  clock_.Advance(Options().restart_grace - absl::Seconds(1));
  restored.Tick();
  EXPECT_EQ(restored.Find("t")->state, v1::TASK_STATE_RUNNING);
  clock_.Advance(absl::Seconds(1));
  restored.Tick();
  EXPECT_NE(restored.Find("t")->state, v1::TASK_STATE_RUNNING);
  ASSERT_EQ(restored.Find("t")->attempts.size(), 1u);
  EXPECT_TRUE(restored.Find("t")->attempts[0].interrupted()) << "not counted";
  ASSERT_TRUE(restored.CheckInvariants().ok()) << restored.CheckInvariants();
}

// --- Leases, drain and the elastic pool. ---

TEST_F(SchedulerTest, BackoffHasJitterBelowTheExponentialValue) {
  SchedulerOptions o = Options();
  o.random = [] { return 1.0; };
  o.backoff_jitter = 0.5;
  Scheduler sched(&clock_, o);
  v1::TaskSpec s = Spec("j");
  s.mutable_retry()->mutable_initial_backoff()->set_seconds(4);
  ASSERT_TRUE(sched.Submit({s}).ok());
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  ASSERT_TRUE(sched.Connect(1, h).ok());
  v1::AgentMessage m;
  m.mutable_result()->set_task_id("j");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_FAILED);
  sched.OnAgentMessage(1, m);
  EXPECT_EQ(sched.Find("j")->next_run_time, clock_.Now() + absl::Seconds(2));
  ASSERT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
}

TEST_F(SchedulerTest, ScheduleTimeoutFailsATaskNotStartedInTime) {
  v1::TaskSpec s = Spec("late");
  s.mutable_schedule_timeout()->set_seconds(30);
  SubmitOk(s);
  Advance(absl::Seconds(29));
  EXPECT_EQ(State("late"), v1::TASK_STATE_PENDING);
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("late"), v1::TASK_STATE_FAILED);
  EXPECT_THAT(Task("late").reason, HasSubstr("expired before start"));
  EXPECT_EQ(Task("late").attempt, 0);
}

TEST_F(SchedulerTest, ScheduleTimeoutDoesNotStopAStartedTask) {
  v1::TaskSpec s = Spec("started");
  s.mutable_schedule_timeout()->set_seconds(3);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "started", 1);
  for (int i = 0; i < 5; ++i) {
    Advance(absl::Seconds(1));
    Heartbeat(conn);
  }
  EXPECT_EQ(State("started"), v1::TASK_STATE_RUNNING);
}

TEST_F(SchedulerTest, PausingARunningTaskInterruptsItWithoutCountingTheAttempt) {
  v1::TaskSpec s = Spec("p");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "p", 1);
  Take();
  ASSERT_TRUE(sched_.Pause("p").ok());
  Check();
  EXPECT_EQ(State("p"), v1::TASK_STATE_RUNNING);
  EXPECT_TRUE(Task("p").pause_requested);
  Effects fx = Take();
  EXPECT_THAT(Cancels(fx, conn), ElementsAre("p"));
  ASSERT_EQ(fx.batch.tasks.size(), 1u) << "the pause request is durable";
  EXPECT_TRUE(fx.batch.tasks[0].pause_requested);
  Result(conn, "p", 1, v1::OUTCOME_CANCELLED, -1);
  EXPECT_EQ(State("p"), v1::TASK_STATE_PAUSED);
  ASSERT_EQ(Task("p").attempts.size(), 1u);
  EXPECT_TRUE(Task("p").attempts[0].interrupted());
  ASSERT_TRUE(sched_.Resume("p").ok());
  Check();
  EXPECT_EQ(State("p"), v1::TASK_STATE_DISPATCHED) << "max_attempts 1, but attempt 1 did not count";
  EXPECT_EQ(Task("p").attempt, 2);
  Result(conn, "p", 2, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("p"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, PauseIsResentWhenTheAgentReconnects) {
  SubmitOk(Spec("p"));
  uint64_t conn = Connect("a1", 1);
  Accept(conn, "p", 1);
  ASSERT_TRUE(sched_.Pause("p").ok());
  sched_.Disconnect(conn);
  Take();
  conn = Connect("a1", 1, {}, {{"p", 1}});
  EXPECT_THAT(Cancels(Take(), conn), ElementsAre("p"));
}

TEST_F(SchedulerTest, CancelWinsOverAPauseUnderWay) {
  SubmitOk(Spec("p"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "p", 1);
  ASSERT_TRUE(sched_.Pause("p").ok());
  ASSERT_TRUE(sched_.Cancel("p").ok());
  Check();
  Result(conn, "p", 1, v1::OUTCOME_CANCELLED, -1);
  EXPECT_EQ(State("p"), v1::TASK_STATE_CANCELLED);
}

TEST_F(SchedulerTest, DrainedAgentGetsNoNewWork) {
  const uint64_t a1 = Connect("a1", 4);
  Take();
  auto drained = sched_.Drain("a1");
  ASSERT_TRUE(drained.ok());
  Effects fx = Take();
  ASSERT_EQ(fx.messages.size(), 1u);
  EXPECT_TRUE(fx.messages[0].msg.has_drain());
  EXPECT_EQ(fx.messages[0].conn, a1);
  SubmitOk(Spec("t"));
  EXPECT_THAT(Assigned(Take(), a1), IsEmpty());
  const uint64_t a2 = Connect("a2", 1);
  EXPECT_THAT(Assigned(Take(), a2), ElementsAre("t"));
  EXPECT_EQ(sched_.Drain("nobody").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, AgentThatSaysDrainingGetsNoNewWork) {
  const uint64_t a1 = Connect("a1", 4);
  v1::AgentMessage m;
  m.mutable_draining();
  sched_.OnAgentMessage(a1, m);
  SubmitOk(Spec("t"));
  EXPECT_THAT(Assigned(Take(), a1), IsEmpty());
  EXPECT_EQ(sched_.ClusterStats().agents_draining(), 1);
}

TEST_F(SchedulerTest, ReleasedAttemptIsRequeuedAtOnceWithoutCounting) {
  v1::TaskSpec s = Spec("r");
  s.set_max_attempts(1);
  SubmitOk(s);
  const uint64_t a1 = Connect("a1", 1);
  Accept(a1, "r", 1);
  Take();
  v1::AgentMessage draining;  // a releasing agent is draining first
  draining.mutable_draining();
  sched_.OnAgentMessage(a1, draining);
  v1::AgentMessage m;
  m.mutable_release()->set_task_id("r");
  m.mutable_release()->set_attempt(1);
  m.mutable_release()->set_reason("drain_timeout passed");
  sched_.OnAgentMessage(a1, m);
  Check();
  Effects fx = Take();
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_TRUE(Acks(fx)[0].accepted());
  EXPECT_EQ(State("r"), v1::TASK_STATE_PENDING) << "no backoff for a release";
  EXPECT_TRUE(Task("r").attempts[0].interrupted());
  const uint64_t a2 = Connect("a2", 1);
  EXPECT_THAT(Assigned(Take(), a2), ElementsAre("r"));
  EXPECT_EQ(Task("r").attempt, 2);
  sched_.OnAgentMessage(a1, m);  // the same release again: stale now
  EXPECT_FALSE(Acks(Take())[0].accepted());
  EXPECT_EQ(sched_.stale_messages(), 1);
}

TEST_F(SchedulerTest, HeartbeatsAreAcknowledged) {
  const uint64_t conn = Connect("a1", 1);
  Take();
  Heartbeat(conn);
  Effects fx = Take();
  ASSERT_EQ(fx.messages.size(), 1u);
  EXPECT_TRUE(fx.messages[0].msg.has_heartbeat_ack());
  EXPECT_TRUE(fx.batch.empty()) << "liveness is never written";
}

TEST_F(SchedulerTest, WelcomeTellsTheAgentToStopBeforeTheGraceEnds) {
  const uint64_t conn = Connect("a1", 1);
  Effects fx = Take();
  ASSERT_TRUE(fx.messages[0].msg.has_welcome());
  const absl::Duration stop = FromProto(fx.messages[0].msg.welcome().stop_on_lost_after());
  EXPECT_GT(stop, absl::ZeroDuration());
  EXPECT_LT(stop, Options().reconnect_grace);
  // And for how long a restarted scheduler waits for it: what it may run
  // its tasks for while a restart refuses it.
  EXPECT_EQ(FromProto(fx.messages[0].msg.welcome().restart_grace()), Options().restart_grace);
  (void)conn;
}

TEST_F(SchedulerTest, AnAgentLostWhileTheSchedulerRunsIsCountedAsAnAttempt) {
  // Only a restart's grace running out is the scheduler's outage; an agent
  // that vanished while the scheduler ran costs an attempt, as before.
  SubmitOk(Spec("t1"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t1", 1);
  sched_.Disconnect(conn);
  Advance(Options().reconnect_grace + absl::Seconds(1));
  ASSERT_FALSE(Task("t1").attempts.empty());
  EXPECT_FALSE(Task("t1").attempts.back().interrupted());
  EXPECT_EQ(Task("t1").attempts.back().result().outcome(), v1::OUTCOME_LOST);
  EXPECT_FALSE(sched_.FindAgent("a1")->restored);
}

// An agent restarting keeping its steps (taskgrid-agent --keep_steps) asks
// for a hold; what it is granted, from the end of its stream, is how long
// its attempts stay its own.
absl::Duration AskRestartHold(Scheduler& sched, uint64_t conn, absl::Duration hold) {
  v1::AgentMessage m;
  *m.mutable_restarting()->mutable_hold() = ToProto(hold);
  sched.OnAgentMessage(conn, m);
  absl::Duration granted = -absl::InfiniteDuration();
  for (const Outgoing& o : sched.TakeEffects().messages) {
    if (o.conn == conn && o.msg.has_restart_hold())
      granted = FromProto(o.msg.restart_hold().hold());
  }
  return granted;
}

TEST_F(SchedulerTest, AnAgentRestartingKeepsItsTasksForTheHoldItWasGranted) {
  SubmitOk(Spec("t"));
  uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Take();
  EXPECT_EQ(AskRestartHold(sched_, conn, absl::Minutes(2)), absl::Minutes(2));
  Check();
  EXPECT_TRUE(sched_.FindAgent("a1")->draining) << "it takes no more work meanwhile";
  sched_.Disconnect(conn);
  // Well past the reconnect grace: still its own.
  Advance(absl::Minutes(2));
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  // The agent that comes back with the same id has the step still running.
  conn = Connect("a1", 1, {}, {{"t", 1}});
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  EXPECT_FALSE(sched_.FindAgent("a1")->draining) << "the new agent takes work";
  EXPECT_EQ(sched_.FindAgent("a1")->restart_hold, absl::ZeroDuration());
  Result(conn, "t", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("t").attempts.size(), 1u);
  EXPECT_EQ(Task("t").attempt, 1);
}

TEST_F(SchedulerTest, ARestartHoldIsAtMostTheRestartGraceAndNeverNegative) {
  const uint64_t conn = Connect("a1", 1);
  Take();
  EXPECT_EQ(AskRestartHold(sched_, conn, absl::Hours(1000)), Options().RestartGrace());
  EXPECT_EQ(AskRestartHold(sched_, conn, -absl::Seconds(5)), absl::ZeroDuration());
  Check();
  // Granted nothing (the last ask): its stream's end is an ordinary one.
  sched_.Disconnect(conn);
  Advance(Options().reconnect_grace);
  ASSERT_NE(sched_.FindAgent("a1"), nullptr);
  EXPECT_TRUE(sched_.FindAgent("a1")->lost);
}

TEST_F(SchedulerTest, AnAgentNotBackFromARestartLosesItsTasksUncounted) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  s.mutable_retry()->mutable_initial_backoff();
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Take();
  ASSERT_EQ(AskRestartHold(sched_, conn, absl::Seconds(30)), absl::Seconds(30));
  sched_.Disconnect(conn);
  // The agent's supervisors kill the steps when the hold ends, counted from
  // before the stream ended; the reconnect grace on top is the margin.
  Advance(absl::Seconds(30) + Options().reconnect_grace - absl::Seconds(1));
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  Advance(absl::Seconds(2));
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING) << "one attempt allowed, and it was not counted";
  ASSERT_FALSE(Task("t").attempts.empty());
  EXPECT_TRUE(Task("t").attempts.back().interrupted());
  EXPECT_THAT(Task("t").attempts.back().result().error(),
              HasSubstr("restarted keeping its steps and did not come back"));
  const uint64_t other = Connect("a2", 1);
  EXPECT_THAT(Assigned(Take(), other), ElementsAre("t"));
  EXPECT_EQ(Task("t").attempt, 2);
}

TEST_F(SchedulerTest, LostAgentIsListedThenForgotten) {
  const uint64_t conn = Connect("a1", 1);
  sched_.Disconnect(conn);
  Advance(absl::Seconds(5));
  ASSERT_NE(sched_.FindAgent("a1"), nullptr);
  v1::Agent view;
  sched_.DescribeAgent(*sched_.FindAgent("a1"), &view);
  EXPECT_EQ(view.state(), v1::AGENT_STATE_LOST);
  EXPECT_EQ(sched_.ClusterStats().agents_lost(), 1);
  Advance(Options().lost_agent_retention);
  EXPECT_EQ(sched_.FindAgent("a1"), nullptr);
}

TEST_F(SchedulerTest, AnAgentAwayIsListedWithWhyAndWhenItsTasksMove) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  Take();
  auto view = [&] {
    v1::Agent v;
    sched_.DescribeAgent(*sched_.FindAgent("a1"), &v);
    return v;
  };
  EXPECT_EQ(view().note(), "");
  EXPECT_FALSE(view().has_grace_end_time());

  // Asked to restart keeping its steps: said while its stream is up.
  ASSERT_EQ(AskRestartHold(sched_, conn, absl::Seconds(30)), absl::Seconds(30));
  EXPECT_THAT(view().note(), HasSubstr("restarting, keeping its steps"));
  sched_.Disconnect(conn);
  const absl::Time moves = clock_.Now() + absl::Seconds(30) + Options().reconnect_grace;
  EXPECT_EQ(view().state(), v1::AGENT_STATE_LOST);
  EXPECT_THAT(view().note(), HasSubstr("restarting"));
  EXPECT_EQ(FromProto(view().grace_end_time()), moves);
  Advance(absl::Seconds(10));
  EXPECT_EQ(FromProto(view().grace_end_time()), moves) << "the same end, later";
  Advance(absl::Seconds(21) + Options().reconnect_grace);
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  EXPECT_THAT(view().note(), HasSubstr("its tasks moved to other agents"));
  EXPECT_FALSE(view().has_grace_end_time());

  // Back, then gone without a restart: the reconnect grace.
  const uint64_t again = Connect("a1", 1);
  Accept(again, "t", 2);
  Take();
  EXPECT_EQ(view().note(), "");
  sched_.Disconnect(again);
  EXPECT_EQ(view().note(), "disconnected");
  EXPECT_EQ(FromProto(view().grace_end_time()), clock_.Now() + Options().reconnect_grace);
}

TEST_F(SchedulerTest, PendingTaskSaysWhyNoAgentTakesIt) {
  v1::TaskSpec gpu = Spec("gpu");
  (*gpu.mutable_placement()->mutable_required_labels())["gpu"] = "1";
  SubmitOk(gpu);
  v1::Task view;
  sched_.Describe(Task("gpu"), &view);
  EXPECT_THAT(view.reason(), HasSubstr("no agent is connected"));
  Connect("cpu", 4, {{"gpu", "0"}});
  sched_.Describe(Task("gpu"), &view);
  EXPECT_THAT(view.reason(), HasSubstr("no agent has label gpu=1"));
  v1::TaskSpec big = Spec("big");
  big.mutable_placement()->set_slots(8);
  SubmitOk(big);
  sched_.Describe(Task("big"), &view);
  EXPECT_THAT(view.reason(), HasSubstr("needs 8 slots"));
  v1::TaskSpec pinned = Spec("pinned");
  pinned.mutable_placement()->add_agent_ids("elsewhere");
  SubmitOk(pinned);
  sched_.Describe(Task("pinned"), &view);
  EXPECT_THAT(view.reason(), HasSubstr("elsewhere"));
}

TEST_F(SchedulerTest, ClusterStatsCountAgentsSlotsAndTasks) {
  SubmitOk(Spec("a"));
  SubmitOk(Spec("b"));
  Connect("x", 3);
  Connect("y", 2);
  v1::ClusterStats st = sched_.ClusterStats();
  EXPECT_EQ(st.agents_active(), 2);
  EXPECT_EQ(st.slots_total(), 5);
  EXPECT_EQ(st.slots_used(), 2);
  EXPECT_EQ(st.tasks().at("DISPATCHED"), 2);
}

TEST_F(SchedulerTest, LostAttemptCountsButIsRequeuedWithoutBackoff) {
  v1::TaskSpec s = Spec("t");
  s.mutable_retry()->mutable_initial_backoff()->set_seconds(60);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  sched_.Disconnect(conn);
  Advance(Options().reconnect_grace);
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING) << "not SCHEDULED for 60 s";
  EXPECT_EQ(Task("t").attempts[0].result().outcome(), v1::OUTCOME_LOST);
  EXPECT_FALSE(Task("t").attempts[0].interrupted()) << "a lost attempt counts";
}

TEST(SchedulerOptions, AgentsStopInsideTheGraceButAfterSeveralHeartbeats) {
  SchedulerOptions o;
  EXPECT_EQ(o.StopOnLostAfter(), absl::Seconds(4));  // the defaults: 5 s grace, 1 s beats
  for (absl::Duration grace : {absl::Seconds(2), absl::Seconds(4), absl::Seconds(30)}) {
    o.reconnect_grace = grace;
    o.heartbeat_interval = grace / 4;  // the shortest grace main() accepts
    EXPECT_LT(o.StopOnLostAfter(), grace);
    EXPECT_GE(o.StopOnLostAfter(), 3 * o.heartbeat_interval);
  }
}

TEST(PlacementClass, IsTheSameForTheSameRequirementsInAnyOrder) {
  v1::Placement none;
  EXPECT_EQ(PlacementClass(none), "1||");
  v1::Placement one;
  one.set_slots(1);
  EXPECT_EQ(PlacementClass(one), PlacementClass(none));  // 0 slots means 1
  v1::Placement two;
  two.set_slots(2);
  EXPECT_NE(PlacementClass(two), PlacementClass(none));
  v1::Placement a, b;
  (*a.mutable_required_labels())["x"] = "1";
  (*a.mutable_required_labels())["y"] = "2";
  a.add_agent_ids("w2");
  a.add_agent_ids("w1");
  (*b.mutable_required_labels())["y"] = "2";
  (*b.mutable_required_labels())["x"] = "1";
  b.add_agent_ids("w1");
  b.add_agent_ids("w2");
  EXPECT_EQ(PlacementClass(a), PlacementClass(b));
  EXPECT_EQ(PlacementClass(a), "1|x=1,y=2|w1,w2");
  EXPECT_NE(PlacementClass(a), PlacementClass(none));
}

}  // namespace
}  // namespace taskgrid::core

namespace taskgrid::core {
namespace {

// Start latency counts the wait the scheduler and the fleet are
// answerable for: from when the task became ready (past its not_before,
// or back from a retry's backoff) to its attempt's start, for every
// attempt. Submit to first start, delays asked for included, is its own.
TEST_F(SchedulerTest, StartLatencyCountsFromWhenTheTaskBecameReady) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(2);
  s.mutable_retry()->mutable_initial_backoff()->set_seconds(4);
  SetTimestamp(clock_.Now() + absl::Seconds(30), s.mutable_not_before());
  SubmitOk(s);
  Advance(absl::Seconds(30));
  ASSERT_EQ(State("t"), v1::TASK_STATE_PENDING);
  Advance(absl::Seconds(2));
  const uint64_t conn = Connect("a1", 1);
  Advance(absl::Seconds(1));
  Accept(conn, "t", 1);  // 3 s after it became ready, 33 s after its submit
  TaskCounters c = sched_.Metrics().counters;
  EXPECT_EQ(c.start_latency.count(), 1);
  EXPECT_DOUBLE_EQ(c.start_latency.sum(), 3);
  EXPECT_EQ(c.submit_to_start.count(), 1);
  EXPECT_DOUBLE_EQ(c.submit_to_start.sum(), 33);

  Result(conn, "t", 1, v1::OUTCOME_FAILED, 1);
  ASSERT_EQ(State("t"), v1::TASK_STATE_SCHEDULED);  // its backoff
  Advance(absl::Seconds(4));
  ASSERT_EQ(State("t"), v1::TASK_STATE_DISPATCHED);
  Heartbeat(conn);  // within the heartbeat timeout (5 s)
  Advance(absl::Seconds(2));
  Accept(conn, "t", 2);  // 2 s after its backoff ended
  ASSERT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  c = sched_.Metrics().counters;
  EXPECT_EQ(c.start_latency.count(), 2);
  EXPECT_DOUBLE_EQ(c.start_latency.sum(), 5);
  EXPECT_EQ(c.submit_to_start.count(), 1);  // first attempts only
}

// After a restart a PENDING task's wait counts from its last change (the
// stored update time), not from the restart.
TEST_F(SchedulerTest, StartLatencyOfATaskWaitingAcrossARestartCountsItsWholeWait) {
  SubmitOk(Spec("t"));
  Advance(absl::Seconds(5));
  std::unique_ptr<Scheduler> restarted = Restarted();
  clock_.Advance(absl::Seconds(2));
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  ASSERT_TRUE(restarted->Connect(1, h).ok());
  v1::AgentMessage m;
  m.mutable_accept()->set_task_id("t");
  m.mutable_accept()->set_attempt(1);
  restarted->OnAgentMessage(1, m);
  ASSERT_TRUE(restarted->CheckInvariants().ok()) << restarted->CheckInvariants();
  const TaskCounters c = restarted->Metrics().counters;
  EXPECT_EQ(c.start_latency.count(), 1);
  EXPECT_DOUBLE_EQ(c.start_latency.sum(), 7);
}

}  // namespace
}  // namespace taskgrid::core
