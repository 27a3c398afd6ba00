// One copy, one result: an attempt on an agent that reports its stops
// (Hello.reports_stops) is freed on the agent's word, or once the agent is
// lost, never on a timer: its attempt timeout, its ack timeout and a
// schedule_timeout that passes while it is dispatched each ask the agent
// to stop it and keep its slot and resources until it says its steps are
// gone. Heartbeats that leave an accepted attempt out twice in a row end
// it; a stale result whose content is not what was committed is refused.

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

class StopRequestTest : public SchedulerTest {
 protected:
  // An agent that reports its stops, as taskgrid-agent does.
  uint64_t ConnectReporting(const std::string& agent, int slots,
                            const std::vector<std::pair<std::string, int>>& running = {},
                            const std::string& resources = "") {
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(slots);
    h.set_reports_stops(true);
    for (const auto& [id, attempt] : running) {
      v1::AttemptRef* r = h.add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
    }
    if (!resources.empty()) {
      absl::StatusOr<Resources> r = ParseResourceList(resources);
      EXPECT_TRUE(r.ok()) << r.status();
      ToResourceMap(*r, h.mutable_resources());
    }
    return ConnectHello(h);
  }

  static v1::TaskSpec Timed(const std::string& id, absl::Duration timeout, int max_attempts) {
    v1::TaskSpec s = Spec(id);
    *s.mutable_attempt_timeout() = ToProto(timeout);
    s.set_max_attempts(max_attempts);
    return s;
  }

  void Release(uint64_t conn, const std::string& id, int attempt, bool not_held) {
    v1::AgentMessage m;
    m.mutable_release()->set_task_id(id);
    m.mutable_release()->set_attempt(attempt);
    m.mutable_release()->set_reason(not_held ? "this agent does not hold it" : "released");
    m.mutable_release()->set_not_held(not_held);
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  void Reject(uint64_t conn, const std::string& id, int attempt) {
    v1::AgentMessage m;
    m.mutable_reject()->set_task_id(id);
    m.mutable_reject()->set_attempt(attempt);
    m.mutable_reject()->set_code(v1::REJECT_CODE_BUSY);
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  // A Heartbeat listing `running` (and `finished`: sent, unacknowledged).
  void HeartbeatListing(uint64_t conn, const std::vector<std::pair<std::string, int>>& running,
                        const std::vector<std::pair<std::string, int>>& finished = {}) {
    v1::AgentMessage m;
    v1::Heartbeat* hb = m.mutable_heartbeat();
    for (const auto& [id, attempt] : running) {
      v1::AttemptRef* r = hb->add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
    }
    for (const auto& [id, attempt] : finished) {
      v1::AttemptRef* r = hb->add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
      r->set_finished(true);
    }
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  // Lets `d` pass a second at a time, the agent on `conn` heartbeating
  // what it holds (`held`) meanwhile, as a live one does.
  void AdvanceBeating(uint64_t conn, absl::Duration d,
                      const std::vector<std::pair<std::string, int>>& held) {
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Seconds(1));
      Advance(step);
      HeartbeatListing(conn, held);
      d -= step;
    }
  }

  const v1::Attempt& LastAttempt(const std::string& id) { return Task(id).attempts.back(); }
};

TEST_F(StopRequestTest, ATimedOutAttemptKeepsItsSlotUntilTheAgentSaysItsStepIsGone) {
  const uint64_t conn = ConnectReporting("a1", 1);
  SubmitOk(Timed("slow", absl::Seconds(4), 3));
  SubmitOk(Spec("next"));
  Take();
  Accept(conn, "slow", 1);
  Take();
  // Past attempt_timeout + slack (5 s): the agent is asked to stop it,
  // and nothing moves while its step may still be cleaning up.
  AdvanceBeating(conn, absl::Seconds(10), {{"slow", 1}});
  Effects fx = Take();
  EXPECT_EQ(Cancels(fx, conn), std::vector<std::string>{"slow"});
  EXPECT_EQ(State("slow"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Agent("a1").used, 1);
  EXPECT_TRUE(Assigned(fx, conn).empty()) << "the slot was handed on while the step may run";
  EXPECT_NE(Task("slow").reason.find("timed out"), std::string::npos) << Task("slow").reason;
  // Its kill grace may be long: still held.
  AdvanceBeating(conn, absl::Seconds(30), {{"slow", 1}});
  EXPECT_EQ(State("slow"), v1::TASK_STATE_RUNNING);
  EXPECT_TRUE(Assigned(Take(), conn).empty());

  // The agent's word: the stop it was asked for ended it. A timeout,
  // counted, and only now the slot goes on.
  Result(conn, "slow", 1, v1::OUTCOME_CANCELLED);
  fx = Take();
  const v1::Attempt& a = LastAttempt("slow");
  EXPECT_EQ(a.result().outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_FALSE(a.interrupted());
  EXPECT_EQ(State("slow"), v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(Assigned(fx, conn), std::vector<std::string>{"next"});
  ASSERT_EQ(Acks(fx).size(), 1u);
  EXPECT_TRUE(Acks(fx)[0].accepted());
}

TEST_F(StopRequestTest, ResourcesOfATimedOutAttemptAreNotHandedOnMeanwhile) {
  const uint64_t conn = ConnectReporting("gpu-box", 4, {}, "gpu=1");
  v1::TaskSpec first = Timed("train", absl::Seconds(2), 1);
  (*first.mutable_placement()->mutable_resources())["gpu"] = "1";
  SubmitOk(first);
  Take();
  Accept(conn, "train", 1);
  v1::TaskSpec second = Needs("eval", "gpu=1");
  SubmitOk(second);
  Take();
  AdvanceBeating(conn, absl::Seconds(8), {{"train", 1}});
  EXPECT_EQ(State("eval"), v1::TASK_STATE_PENDING);
  EXPECT_TRUE(Assigned(Take(), conn).empty());
  Result(conn, "train", 1, v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(State("train"), v1::TASK_STATE_FAILED);
  EXPECT_EQ(Assigned(Take(), conn), std::vector<std::string>{"eval"});
}

TEST_F(StopRequestTest, AResultThatSucceededStandsThoughTheDeadlinePassed) {
  const uint64_t conn = ConnectReporting("a1", 1);
  SubmitOk(Timed("edge", absl::Seconds(1), 2));
  Take();
  Accept(conn, "edge", 1);
  AdvanceBeating(conn, absl::Seconds(7), {{"edge", 1}});
  Take();
  Result(conn, "edge", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("edge"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(StopRequestTest, AnAgentWithoutReportsStopsIsStillFreedOnTheTimer) {
  const uint64_t conn = Connect("old", 1);
  SubmitOk(Timed("legacy", absl::Seconds(1), 2));
  Take();
  Accept(conn, "legacy", 1);
  Advance(absl::Seconds(7));
  EXPECT_EQ(State("legacy"), v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(LastAttempt("legacy").result().outcome(), v1::OUTCOME_TIMED_OUT);
}

TEST_F(StopRequestTest, ATimeoutWhileTheAgentIsAwayWaitsForItsComingBackOrItsLoss) {
  uint64_t conn = ConnectReporting("away", 1);
  SubmitOk(Timed("kept", absl::Seconds(2), 3));
  Take();
  Accept(conn, "kept", 1);
  sched_.Disconnect(conn);
  Take();
  Advance(absl::Seconds(4));  // reconnect grace is 5 s; the timeout (+5 s) not yet
  Advance(absl::Seconds(0.5));
  conn = ConnectReporting("away", 1, {{"kept", 1}});
  Take();
  Advance(absl::Seconds(3));
  // Timed out while connected again: the agent is told, the attempt held.
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"kept"});
  sched_.Disconnect(conn);
  Take();
  // Away again; back within the grace, still listing it: told again.
  Advance(absl::Seconds(1));
  conn = ConnectReporting("away", 1, {{"kept", 1}});
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"kept"});
  EXPECT_EQ(State("kept"), v1::TASK_STATE_RUNNING);
  // Lost for good: its steps are known dead; the attempt ends as the
  // timeout it was, counted.
  sched_.Disconnect(conn);
  Advance(absl::Seconds(6));
  const v1::Attempt& a = LastAttempt("kept");
  EXPECT_EQ(a.result().outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_FALSE(a.interrupted());
  EXPECT_EQ(State("kept"), v1::TASK_STATE_SCHEDULED);
}

TEST_F(StopRequestTest, ANotAcceptedAttemptThatTheAgentDoesNotHoldIsNotCounted) {
  const uint64_t conn = ConnectReporting("a1", 1);
  v1::TaskSpec s = Spec("unseen");
  s.set_max_attempts(1);
  SubmitOk(s);
  Take();
  AdvanceBeating(conn, absl::Seconds(11), {});  // ack timeout 10 s
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"unseen"});
  EXPECT_EQ(State("unseen"), v1::TASK_STATE_DISPATCHED);
  Release(conn, "unseen", 1, /*not_held=*/true);
  EXPECT_TRUE(LastAttempt("unseen").interrupted());
  // Back at once (its only attempt unused) and given to the agent again.
  EXPECT_EQ(Assigned(Take(), conn), std::vector<std::string>{"unseen"});
  EXPECT_EQ(Task("unseen").attempt, 2);
}

TEST_F(StopRequestTest, ANotAcceptedAttemptTheAgentDidRunIsCountedAsLost) {
  const uint64_t conn = ConnectReporting("a1", 1);
  SubmitOk(Spec("late"));
  Take();
  AdvanceBeating(conn, absl::Seconds(11), {});
  Take();
  // Its Accept was on the way; the Cancel stopped it.
  Accept(conn, "late", 1);
  Result(conn, "late", 1, v1::OUTCOME_CANCELLED);
  const v1::Attempt& a = LastAttempt("late");
  EXPECT_EQ(a.result().outcome(), v1::OUTCOME_LOST);
  EXPECT_FALSE(a.interrupted());
}

TEST_F(StopRequestTest, AScheduleTimeoutThatPassesWhileDispatchedFailsTheTask) {
  const uint64_t conn = ConnectReporting("frozen", 1);
  v1::TaskSpec s = Spec("soon");
  *s.mutable_schedule_timeout() = ToProto(absl::Seconds(3));
  SubmitOk(s);
  EXPECT_EQ(Assigned(Take(), conn), std::vector<std::string>{"soon"});
  Advance(absl::Seconds(4));
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"soon"});
  EXPECT_EQ(State("soon"), v1::TASK_STATE_DISPATCHED);
  // The agent is lost before it ever accepted: the task fails, it does not
  // wait for another agent.
  sched_.Disconnect(conn);
  Advance(absl::Seconds(6));
  EXPECT_EQ(State("soon"), v1::TASK_STATE_FAILED);
  EXPECT_NE(Task("soon").reason.find("expired before start"), std::string::npos)
      << Task("soon").reason;
}

TEST_F(StopRequestTest, AScheduleTimeoutAlsoFailsARejectedOrLateAcceptedAttempt) {
  const uint64_t conn = ConnectReporting("a1", 2);
  for (const char* id : {"rejected", "accepted-late"}) {
    v1::TaskSpec s = Spec(id);
    *s.mutable_schedule_timeout() = ToProto(absl::Seconds(3));
    SubmitOk(s);
  }
  Take();
  Advance(absl::Seconds(4));
  Take();
  Reject(conn, "rejected", 1);  // BUSY: would be re-queued, but its time is up
  EXPECT_EQ(State("rejected"), v1::TASK_STATE_FAILED);
  Accept(conn, "accepted-late", 1);
  Result(conn, "accepted-late", 1, v1::OUTCOME_CANCELLED);
  EXPECT_EQ(State("accepted-late"), v1::TASK_STATE_FAILED);
  EXPECT_NE(Task("accepted-late").reason.find("expired before start"), std::string::npos);
}

TEST_F(StopRequestTest, AScheduleTimeoutHoldsForATaskDispatchedAtARestart) {
  const uint64_t conn = ConnectReporting("frozen", 1);
  v1::TaskSpec s = Spec("across");
  *s.mutable_schedule_timeout() = ToProto(absl::Seconds(3));
  SubmitOk(s);
  EXPECT_EQ(Assigned(Take(), conn), std::vector<std::string>{"across"});
  SchedulerOptions o = Options();
  o.restart_grace = absl::Seconds(6);
  std::unique_ptr<Scheduler> r = Restarted(o);
  clock_.Advance(absl::Seconds(4));
  r->Tick();
  ASSERT_TRUE(r->CheckInvariants().ok()) << r->CheckInvariants();
  // The agent never comes back: past its restart grace the task fails
  // rather than starting 14 s late on another agent.
  clock_.Advance(absl::Seconds(10));
  r->Tick();
  ASSERT_TRUE(r->CheckInvariants().ok()) << r->CheckInvariants();
  EXPECT_EQ(r->Find("across")->state, v1::TASK_STATE_FAILED);
  EXPECT_NE(r->Find("across")->reason.find("expired before start"), std::string::npos)
      << r->Find("across")->reason;
}

TEST_F(StopRequestTest, AfterARestartATimeoutWaitsForTheAgentThatMayStillRunIt) {
  const uint64_t conn = ConnectReporting("a1", 1);
  SubmitOk(Timed("outlived", absl::Seconds(2), 3));
  Take();
  Accept(conn, "outlived", 1);
  SchedulerOptions o = Options();
  o.restart_grace = absl::Seconds(60);
  std::unique_ptr<Scheduler> r = Restarted(o);
  // Its attempt timeout and the slack pass long before the restart grace:
  // the agent, not back yet, holds its step through our restart until
  // then, so the attempt is held too.
  clock_.Advance(absl::Seconds(20));
  r->Tick();
  ASSERT_TRUE(r->CheckInvariants().ok()) << r->CheckInvariants();
  EXPECT_EQ(r->Find("outlived")->state, v1::TASK_STATE_RUNNING);
  EXPECT_EQ(r->Find("outlived")->stop_request, StopRequest::kTimedOut);
  // Not back within the grace: its steps are known dead; a timeout, counted.
  clock_.Advance(absl::Seconds(41));
  r->Tick();
  ASSERT_TRUE(r->CheckInvariants().ok()) << r->CheckInvariants();
  const TaskRecord* t = r->Find("outlived");
  ASSERT_FALSE(t->attempts.empty());
  EXPECT_EQ(t->attempts.back().result().outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_FALSE(t->attempts.back().interrupted());
}

TEST_F(StopRequestTest, TwoHeartbeatsInARowWithoutAnAcceptedAttemptEndIt) {
  const uint64_t conn = ConnectReporting("a1", 2);
  SubmitOk(Spec("vanished"));
  SubmitOk(Spec("finishing"));
  Take();
  Accept(conn, "vanished", 1);
  Accept(conn, "finishing", 1);
  Take();
  // One heartbeat may have been built before the Accept was written.
  HeartbeatListing(conn, {}, {{"finishing", 1}});
  EXPECT_EQ(State("vanished"), v1::TASK_STATE_RUNNING);
  // Listed as finished: its result is on the way, it stays.
  HeartbeatListing(conn, {}, {{"finishing", 1}});
  EXPECT_EQ(State("finishing"), v1::TASK_STATE_RUNNING);
  ASSERT_FALSE(Task("vanished").attempts.empty());
  EXPECT_EQ(LastAttempt("vanished").attempt(), 1);
  EXPECT_EQ(LastAttempt("vanished").result().outcome(), v1::OUTCOME_LOST);
  // Lost attempts go again at once: attempt 2 is on its way.
  EXPECT_EQ(Task("vanished").attempt, 2);
  EXPECT_EQ(State("vanished"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(StopRequestTest, AHeartbeatBackInBetweenKeepsTheAttempt) {
  const uint64_t conn = ConnectReporting("a1", 1);
  SubmitOk(Spec("flicker"));
  Take();
  Accept(conn, "flicker", 1);
  HeartbeatListing(conn, {});
  HeartbeatListing(conn, {{"flicker", 1}});
  HeartbeatListing(conn, {});
  EXPECT_EQ(State("flicker"), v1::TASK_STATE_RUNNING);
}

TEST_F(StopRequestTest, ANewAttemptIsNotEndedForItsPredecessorsAbsence) {
  const uint64_t conn = ConnectReporting("a1", 1);
  v1::TaskSpec s = Spec("again");
  s.set_max_attempts(3);
  *s.mutable_retry()->mutable_initial_backoff() = ToProto(absl::Milliseconds(1));
  SubmitOk(s);
  Take();
  Accept(conn, "again", 1);
  HeartbeatListing(conn, {});  // attempt 1 left out once
  Result(conn, "again", 1, v1::OUTCOME_FAILED, 1);
  Advance(absl::Milliseconds(10));
  Take();
  Accept(conn, "again", 2);
  HeartbeatListing(conn, {});  // built before attempt 2 was admitted
  EXPECT_EQ(State("again"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Task("again").attempt, 2);
}

TEST_F(StopRequestTest, AnAttemptListedRunningThatIsNotLiveIsCancelled) {
  const uint64_t conn = ConnectReporting("a1", 1);
  Take();
  HeartbeatListing(conn, {{"nobody-knows", 3}});
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"nobody-knows"});
}

TEST_F(StopRequestTest, AnAgentBackAfterARestartWithoutAnAttemptIsNotCharged) {
  const uint64_t conn = ConnectReporting("a1", 1);
  v1::TaskSpec s = Spec("outage");
  s.set_max_attempts(1);
  SubmitOk(s);
  Take();
  Accept(conn, "outage", 1);
  std::unique_ptr<Scheduler> r = Restarted();
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  h.set_reports_stops(true);
  ASSERT_TRUE(r->Connect(99, h).ok());  // its result was lost with its restart
  ASSERT_TRUE(r->CheckInvariants().ok()) << r->CheckInvariants();
  const TaskRecord* t = r->Find("outage");
  ASSERT_FALSE(t->attempts.empty());
  EXPECT_TRUE(t->attempts.back().interrupted());
  EXPECT_NE(t->state, v1::TASK_STATE_FAILED) << t->reason;
}

TEST_F(StopRequestTest, AStaleResultIsAcceptedOnlyWhenItIsWhatWasCommitted) {
  const uint64_t conn = Connect("old", 1);
  SubmitOk(Timed("stale", absl::Seconds(1), 1));
  SubmitOk(Spec("done"));
  Take();
  Accept(conn, "stale", 1);
  AdvanceBeating(conn, absl::Seconds(7), {});  // the scheduler ended it itself (an older agent)
  Take();
  Result(conn, "stale", 1, v1::OUTCOME_SUCCEEDED);
  std::vector<v1::ResultAck> acks = Acks(Take());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_FALSE(acks[0].accepted()) << "the committed end is the scheduler's, not this result";

  Accept(conn, "done", 1);
  Result(conn, "done", 1, v1::OUTCOME_SUCCEEDED);
  Take();
  Result(conn, "done", 1, v1::OUTCOME_SUCCEEDED);  // resent, its ack lost
  acks = Acks(Take());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_TRUE(acks[0].accepted());
  Result(conn, "done", 1, v1::OUTCOME_FAILED, 2);  // the same attempt, another result
  acks = Acks(Take());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_FALSE(acks[0].accepted());
}

TEST_F(StopRequestTest, ACancelledChainLinkWaitsForTheAgentThatMayHaveStartedIt) {
  v1::Hello h;
  h.set_agent_id("chainer");
  h.set_slots(1);
  h.set_chains(true);
  h.set_reports_stops(true);
  const uint64_t conn = ConnectHello(h);
  v1::TaskSpec link = Spec("link");
  link.add_depends_on("head");
  ASSERT_TRUE(Submit({Spec("head"), link}).ok());
  Take();
  Accept(conn, "head", 1);
  ASSERT_TRUE(sched_.Cancel("link").ok());
  Check();
  EXPECT_EQ(Cancels(Take(), conn), std::vector<std::string>{"link"});
  EXPECT_EQ(State("link"), v1::TASK_STATE_CANCELLING) << "ended before the agent said";
  Release(conn, "link", 1, /*not_held=*/false);
  EXPECT_EQ(State("link"), v1::TASK_STATE_CANCELLED);
}

}  // namespace
}  // namespace taskgrid::core
