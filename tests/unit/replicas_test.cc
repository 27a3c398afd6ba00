// One task on N workers (scheduler/core/replicas.cc): a task with replicas
// runs nothing itself; each replica is a task of its own, kept off the
// agents of its siblings, and the task ends by its success policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using V = std::vector<std::string>;

class ReplicasTest : public SchedulerTest {
 protected:
  static v1::TaskSpec Replicated(const std::string& id, int count,
                                 v1::SuccessPolicy policy = v1::SUCCESS_POLICY_ALL,
                                 int quorum = 0) {
    v1::TaskSpec s = Spec(id);
    s.mutable_replicas()->set_count(count);
    s.mutable_replicas()->set_success(policy);
    s.mutable_replicas()->set_quorum(quorum);
    s.set_max_attempts(1);
    return s;
  }
  // The code of submitting `spec`, checking that a refusal changed nothing.
  absl::StatusCode SubmitCode(v1::TaskSpec spec) {
    const size_t before = sched_.task_count();
    const int64_t revision = sched_.last_revision();
    auto r = Submit({std::move(spec)});
    if (!r.ok()) {
      EXPECT_EQ(sched_.task_count(), before) << r.status();
      EXPECT_EQ(sched_.last_revision(), revision) << r.status();
    }
    return r.status().code();
  }
  std::string Message(v1::TaskSpec spec) {
    return std::string(Submit({std::move(spec)}).status().message());
  }
  // The agent each replica of `id` was assigned to by `fx`.
  static std::vector<std::string> Holders(const Effects& fx, const std::vector<uint64_t>& conns,
                                          const std::vector<std::string>& names,
                                          const std::string& replica) {
    std::vector<std::string> out;
    for (size_t i = 0; i < conns.size(); ++i) {
      const V ids = Assigned(fx, conns[i]);
      if (std::find(ids.begin(), ids.end(), replica) != ids.end()) out.push_back(names[i]);
    }
    return out;
  }
};

TEST_F(ReplicasTest, EachReplicaIsATaskOfItsOwnOnAnAgentOfItsOwn) {
  auto r = Submit({Replicated("t", 3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), "t") << "the response names the task, not its replicas";
  EXPECT_EQ(sched_.task_count(), 4u);
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(Task("t").reason, "waiting for its 3 replicas (success: all)");
  for (const char* id : {"t:r1", "t:r2", "t:r3"}) {
    EXPECT_EQ(State(id), v1::TASK_STATE_PENDING) << id;
    EXPECT_EQ(Task(id).spec.replica_of(), "t");
    EXPECT_FALSE(Task(id).spec.has_replicas());
    EXPECT_EQ(Task(id).spec.steps(0).exec().argv(1), "t") << "the task's steps";
  }
  // One agent with room for all of them takes one only.
  const uint64_t a1 = Connect("a1", 10);
  EXPECT_EQ(Assigned(Take(), a1), V{"t:r1"});
  EXPECT_EQ(sched_.parked_classes(), 1u) << "the others wait for another agent";
  EXPECT_EQ(Describe("t:r2").reason(),
            "waiting: every agent that could take it holds another replica of t or ran one that "
            "succeeded");
  const uint64_t a2 = Connect("a2", 10);
  EXPECT_EQ(Assigned(Take(), a2), V{"t:r2"});
  const uint64_t a3 = Connect("a3", 10);
  EXPECT_EQ(Assigned(Take(), a3), V{"t:r3"});
  Result(a1, "t:r1", 1, v1::OUTCOME_SUCCEEDED);
  Result(a3, "t:r3", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED) << "all three must succeed";
  EXPECT_EQ(Describe("t").reason(),
            "waiting for its 3 replicas (success: all): 2 succeeded, 0 did not");
  Result(a2, "t:r2", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("t").reason, "3 of 3 replicas succeeded (success: all)");
  EXPECT_EQ(Task("t").result().stdout_tail(), "t:r2\n") << "the result of the deciding replica";
  const v1::Task view = Describe("t");
  ASSERT_EQ(view.replicas_size(), 3);
  EXPECT_EQ(view.replicas(0).task_id(), "t:r1");
  EXPECT_EQ(view.replicas(0).agent_id(), "a1");
  EXPECT_EQ(view.replicas(1).agent_id(), "a2");
  EXPECT_EQ(view.replicas(2).state(), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(view.replicas(2).outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(view.replicas(2).attempt(), 1);
}

TEST_F(ReplicasTest, AnyEndsWithTheFirstSuccessAndCancelsTheRest) {
  const uint64_t a1 = Connect("a1", 1), a2 = Connect("a2", 1), a3 = Connect("a3", 1);
  SubmitOk(Replicated("t", 3, v1::SUCCESS_POLICY_ANY));
  const Effects fx = Take();
  const std::vector<uint64_t> conns = {a1, a2, a3};
  const V names = {"a1", "a2", "a3"};
  ASSERT_EQ(Holders(fx, conns, names, "t:r1").size(), 1u);
  ASSERT_EQ(Holders(fx, conns, names, "t:r2").size(), 1u);
  ASSERT_EQ(Holders(fx, conns, names, "t:r3").size(), 1u);
  const std::string on = Task("t:r2").agent_id;
  const uint64_t conn = conns[std::find(names.begin(), names.end(), on) - names.begin()];
  Result(conn, "t:r2", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("t").reason, "1 of 3 replicas succeeded (success: any)");
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_CANCELLING);
  EXPECT_EQ(State("t:r3"), v1::TASK_STATE_CANCELLING);
  // Why, while its agent stops it, and once stopped.
  EXPECT_EQ(Task("t:r1").reason,
            "not needed: task t succeeded; waiting for agent " + Task("t:r1").agent_id);
  const Effects after = Take();
  EXPECT_EQ(
      Cancels(after,
              conns[std::find(names.begin(), names.end(), Task("t:r1").agent_id) - names.begin()]),
      V{"t:r1"});
  // The agents confirm; the task stays SUCCEEDED.
  for (const char* id : {"t:r1", "t:r3"}) {
    const std::string agent = Task(id).agent_id;
    Result(conns[std::find(names.begin(), names.end(), agent) - names.begin()], id, 1,
           v1::OUTCOME_CANCELLED);
    EXPECT_EQ(State(id), v1::TASK_STATE_CANCELLED);
    EXPECT_EQ(Task(id).reason, "not needed: task t succeeded");
  }
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(ReplicasTest, QuorumFailsAsSoonAsItCanNoLongerBeMet) {
  const uint64_t a1 = Connect("a1", 1), a2 = Connect("a2", 1), a3 = Connect("a3", 1);
  SubmitOk(Replicated("t", 3, v1::SUCCESS_POLICY_QUORUM, 2));
  Take();
  auto conn_of = [&](const std::string& id) {
    const std::string& a = Task(id).agent_id;
    return a == "a1" ? a1 : a == "a2" ? a2 : a3;
  };
  Result(conn_of("t:r1"), "t:r1", 1, v1::OUTCOME_FAILED, 1);
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_FAILED) << "max_attempts 1";
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED) << "2 of the other 2 may still succeed";
  Result(conn_of("t:r3"), "t:r3", 1, v1::OUTCOME_FAILED, 7);
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED);
  EXPECT_EQ(Task("t").reason,
            "replica t:r3 ended FAILED: 0 of 3 succeeded and 2 did not, so 2 can no longer "
            "succeed (success: quorum 2)");
  EXPECT_EQ(Task("t").result().exit_code(), 7);
  EXPECT_EQ(State("t:r2"), v1::TASK_STATE_CANCELLING);
}

TEST_F(ReplicasTest, ALostReplicaIsPlacedAgainOnAnAgentNoSiblingHolds) {
  const uint64_t a1 = Connect("a1", 4), a2 = Connect("a2", 4);
  v1::TaskSpec spec = Replicated("t", 2);
  spec.set_max_attempts(3);
  SubmitOk(spec);
  Take();
  const std::string lost = Task("t:r1").agent_id;
  const uint64_t lost_conn = lost == "a1" ? a1 : a2;
  const uint64_t kept_conn = lost == "a1" ? a2 : a1;
  Accept(lost_conn, "t:r1", 1);
  Accept(kept_conn, "t:r2", 1);
  sched_.Disconnect(lost_conn);
  Advance(absl::Seconds(3));
  Heartbeat(kept_conn);
  Advance(absl::Seconds(3));
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_PENDING)
      << "lost with its agent, and not sent to the agent of t:r2";
  EXPECT_EQ(Task("t:r1").attempts.back().result().outcome(), v1::OUTCOME_LOST);
  const uint64_t a3 = Connect("a3", 4);
  EXPECT_EQ(Assigned(Take(), a3), V{"t:r1"});
  EXPECT_EQ(Task("t:r1").attempt, 2);
  Result(a3, "t:r1", 2, v1::OUTCOME_SUCCEEDED);
  Result(kept_conn, "t:r2", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Describe("t").replicas(0).agent_id(), "a3");
}

TEST_F(ReplicasTest, NamedAgentsEachRunTheirReplica) {
  v1::TaskSpec s = Spec("t");
  s.mutable_replicas()->add_agent_ids("b");
  s.mutable_replicas()->add_agent_ids("a");
  SubmitOk(s);
  EXPECT_EQ(sched_.task_count(), 3u);
  const uint64_t c = Connect("c", 4);
  EXPECT_EQ(Assigned(Take(), c), V{}) << "neither replica may run on c";
  const uint64_t a = Connect("a", 4);
  EXPECT_EQ(Assigned(Take(), a), V{"t:r2"});
  const uint64_t b = Connect("b", 4);
  EXPECT_EQ(Assigned(Take(), b), V{"t:r1"});
  v1::ClaimRequest claim;
  claim.set_owner("b");
  claim.set_max(10);
  auto claims = sched_.Claim(claim);
  ASSERT_TRUE(claims.ok());
  EXPECT_TRUE(claims->empty());
}

TEST_F(ReplicasTest, ReplicasAreNeverClaimedFromTheBoardNorChained) {
  SubmitOk(Replicated("t", 2));
  v1::ClaimRequest claim;
  claim.set_owner("w");
  claim.set_max(10);
  auto claims = sched_.Claim(claim);
  ASSERT_TRUE(claims.ok());
  EXPECT_TRUE(claims->empty()) << "a claim would not keep replicas on distinct workers";
  const google::protobuf::Map<std::string, std::string> no_labels;
  EXPECT_EQ(sched_.ClaimableCount("default", no_labels), 0);
  // A task with replicas below a dependency is not chained after it.
  SubmitOk(Spec("up"));
  v1::TaskSpec down = Replicated("down", 2);
  down.add_depends_on("up");
  SubmitOk(down);
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(10);
  h.set_chains(true);
  const uint64_t a1 = ConnectHello(h);
  const V got = Assigned(Take(), a1);
  EXPECT_EQ(
      std::count(got.begin(), got.end(), "down:r1") + std::count(got.begin(), got.end(), "down:r2"),
      0)
      << "BLOCKED on up; not sent along with it";
  EXPECT_EQ(State("down:r1"), v1::TASK_STATE_BLOCKED);
  Result(a1, "up", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("down"), v1::TASK_STATE_BLOCKED) << "it never runs itself";
  const V next = Assigned(Take(), a1);
  EXPECT_EQ(std::count(next.begin(), next.end(), "down:r1") +
                std::count(next.begin(), next.end(), "down:r2"),
            1)
      << "one replica per agent";
}

TEST_F(ReplicasTest, CancellingTheTaskCancelsEveryReplica) {
  const uint64_t a1 = Connect("a1", 1);
  SubmitOk(Replicated("t", 2));
  EXPECT_EQ(Assigned(Take(), a1), V{"t:r1"});
  auto c = sched_.Cancel("t");
  ASSERT_TRUE(c.ok()) << c.status();
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_CANCELLING);
  EXPECT_EQ(State("t:r2"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("t:r2").reason, "task t was cancelled");
  EXPECT_EQ(Cancels(Take(), a1), V{"t:r1"});
  Result(a1, "t:r1", 1, v1::OUTCOME_CANCELLED);
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_CANCELLED);
  auto pause = sched_.Pause("t");
  EXPECT_EQ(pause.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pause.status().message(), "task \"t\" is CANCELLED and cannot be paused");
}

TEST_F(ReplicasTest, PauseIsForTheReplicasNotTheTask) {
  SubmitOk(Replicated("t", 2));
  auto p = sched_.Pause("t");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("pause its replicas"), std::string::npos) << p.status();
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED);
  ASSERT_TRUE(sched_.Pause("t:r2").ok());
  Check();
  EXPECT_EQ(State("t:r2"), v1::TASK_STATE_PAUSED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED);
}

TEST_F(ReplicasTest, RetryRunsAgainOnlyTheReplicasThatDidNotSucceed) {
  const uint64_t a1 = Connect("a1", 4), a2 = Connect("a2", 4);
  SubmitOk(Replicated("t", 2));
  Take();
  const std::string r1_agent = Task("t:r1").agent_id;
  const uint64_t r1_conn = r1_agent == "a1" ? a1 : a2;
  const uint64_t r2_conn = r1_agent == "a1" ? a2 : a1;
  Result(r1_conn, "t:r1", 1, v1::OUTCOME_SUCCEEDED);
  Result(r2_conn, "t:r2", 1, v1::OUTCOME_FAILED, 3);
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED);
  auto r = sched_.Retry("t");
  ASSERT_TRUE(r.ok()) << r.status();
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_SUCCEEDED) << "kept";
  EXPECT_EQ(Task("t:r2").state, v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("t:r2").agent_id, Task("t:r1").attempts.back().agent_id() == "a1" ? "a2" : "a1")
      << "not where t:r1 succeeded";
  EXPECT_EQ(Task("t:r2").attempt, 2) << "attempt numbers never repeat";
  Result(r2_conn, "t:r2", 2, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  // A reset runs every replica again.
  ASSERT_TRUE(sched_.Reset("t").ok());
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_BLOCKED);
  EXPECT_TRUE(IsInFlight(State("t:r1")));
  EXPECT_TRUE(IsInFlight(State("t:r2")));
}

TEST_F(ReplicasTest, RetryWaitsForReplicasStillStopping) {
  const uint64_t a1 = Connect("a1", 1), a2 = Connect("a2", 1);
  SubmitOk(Replicated("t", 2));
  Take();
  const uint64_t r1_conn = Task("t:r1").agent_id == "a1" ? a1 : a2;
  Result(r1_conn, "t:r1", 1, v1::OUTCOME_FAILED, 1);
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED);
  EXPECT_EQ(State("t:r2"), v1::TASK_STATE_CANCELLING);
  auto r = sched_.Retry("t");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("t:r2"), std::string::npos) << r.status();
  EXPECT_EQ(State("t"), v1::TASK_STATE_FAILED) << "nothing changed";
  EXPECT_EQ(State("t:r1"), v1::TASK_STATE_FAILED);
}

TEST_F(ReplicasTest, AJobWaitsForItsTaskWithReplicas) {
  v1::TaskSpec t = Replicated("t", 2, v1::SUCCESS_POLICY_ANY);
  v1::TaskSpec after = Spec("after");
  after.add_depends_on("t");
  auto j = sched_.SubmitJob("j", {t, after});
  ASSERT_TRUE(j.ok()) << j.status();
  Check();
  EXPECT_EQ((*j)->tasks.size(), 2u) << "the replicas are the task's, not the job's";
  EXPECT_TRUE(Task("t:r1").spec.job_id().empty());
  const uint64_t a1 = Connect("a1", 4);
  EXPECT_EQ(Assigned(Take(), a1), V{"t:r1"});
  Result(a1, "t:r1", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("t:r2"), v1::TASK_STATE_CANCELLED) << "never dispatched: cancelled at once";
  EXPECT_EQ(Assigned(Take(), a1), V{"after"});
}

TEST_F(ReplicasTest, ARestartLinksReplicasToTheirTask) {
  const uint64_t a1 = Connect("a1", 4);
  SubmitOk(Replicated("t", 3, v1::SUCCESS_POLICY_QUORUM, 2));
  EXPECT_EQ(Assigned(Take(), a1), V{"t:r1"});
  Result(a1, "t:r1", 1, v1::OUTCOME_SUCCEEDED);
  std::unique_ptr<Scheduler> after = Restarted();
  v1::Task view;
  after->Describe(*after->Find("t"), &view);
  ASSERT_EQ(view.replicas_size(), 3);
  EXPECT_EQ(view.replicas(0).state(), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(view.replicas(0).agent_id(), "a1");
  // The restored scheduler keeps them apart and ends the task by quorum.
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(4);
  ASSERT_TRUE(after->Connect(7, h).ok());
  Effects fx = after->TakeEffects();
  EXPECT_EQ(Assigned(fx, 7), V{}) << "t:r1 succeeded on a1";
  h.set_agent_id("a2");
  ASSERT_TRUE(after->Connect(8, h).ok());
  fx = after->TakeEffects();
  EXPECT_EQ(Assigned(fx, 8), V{"t:r2"});
  v1::AgentMessage m;
  m.mutable_result()->set_task_id("t:r2");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  after->OnAgentMessage(8, m);
  EXPECT_EQ(after->Find("t")->state, v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(after->Find("t:r3")->state, v1::TASK_STATE_CANCELLED);
  EXPECT_TRUE(after->CheckInvariants().ok()) << after->CheckInvariants();
}

TEST_F(ReplicasTest, TheSameSubmitAgainReturnsTheTaskWithoutNewReplicas) {
  SubmitOk(Replicated("t", 2));
  auto again = Submit({Replicated("t", 2)});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0]->id(), "t");
  EXPECT_EQ(sched_.task_count(), 3u);
  EXPECT_EQ(SubmitCode(Replicated("t", 3)), absl::StatusCode::kAlreadyExists);
}

TEST_F(ReplicasTest, BadReplicaRequestsAreRefusedAndChangeNothing) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(SubmitCode(Replicated("t", 101)), kInvalid);
  EXPECT_EQ(Message(Replicated("t", 101)),
            "tasks[0].replicas.count is 101; it must be in [1, 100]");
  EXPECT_EQ(SubmitCode(Replicated("t", -1)), kInvalid);
  EXPECT_EQ(Message(Replicated("t", 0)),
            "tasks[0].replicas.count is 0: ask for at least one replica");
  EXPECT_EQ(Message(Replicated("t", 3, v1::SUCCESS_POLICY_QUORUM, 0)),
            "tasks[0].replicas.quorum is 0; with 3 replicas it must be in [1, 3]");
  EXPECT_EQ(SubmitCode(Replicated("t", 3, v1::SUCCESS_POLICY_QUORUM, 4)), kInvalid);
  EXPECT_EQ(Message(Replicated("t", 3, v1::SUCCESS_POLICY_ANY, 2)),
            "tasks[0].replicas.quorum needs success SUCCESS_POLICY_QUORUM");
  v1::TaskSpec unknown = Replicated("t", 2);
  unknown.mutable_replicas()->set_success(static_cast<v1::SuccessPolicy>(9));
  EXPECT_EQ(SubmitCode(unknown), kInvalid);
  v1::TaskSpec dup = Spec("t");
  dup.mutable_replicas()->add_agent_ids("a");
  dup.mutable_replicas()->add_agent_ids("a");
  EXPECT_EQ(Message(dup),
            "tasks[0].replicas.agent_ids[1] \"a\" repeats agent_ids[0]: each replica runs on an "
            "agent of its own");
  v1::TaskSpec mismatch = Replicated("t", 3);
  mismatch.mutable_replicas()->add_agent_ids("a");
  EXPECT_EQ(SubmitCode(mismatch), kInvalid);
  v1::TaskSpec bad_name = Spec("t");
  bad_name.mutable_replicas()->add_agent_ids("no/slash");
  EXPECT_EQ(SubmitCode(bad_name), kInvalid);
  v1::TaskSpec both = Spec("t");
  both.mutable_replicas()->add_agent_ids("a");
  both.mutable_placement()->add_agent_ids("b");
  EXPECT_EQ(SubmitCode(both), kInvalid);
  v1::TaskSpec merged = Replicated("t", 2);
  merged.set_merge_key("k");
  EXPECT_EQ(SubmitCode(merged), kInvalid);
  v1::TaskSpec forged = Spec("t");
  forged.set_replica_of("other");
  EXPECT_EQ(Message(forged),
            "tasks[0].replica_of is set by the scheduler on the replicas it makes; ask for "
            "replicas instead");
  EXPECT_EQ(SubmitCode(Replicated(std::string(125, 'x'), 10)), kInvalid);
  EXPECT_EQ(SubmitCode(Replicated(std::string(124, 'x'), 10)), absl::StatusCode::kOk);
  // An id a replica would take is in use: nothing is made.
  SubmitOk(Spec("u:r2"));
  const size_t before = sched_.task_count();
  EXPECT_EQ(Message(Replicated("u", 2)),
            "task \"u:r2\" already exists; tasks[0] needs that id for its replica 2");
  EXPECT_EQ(sched_.task_count(), before);
  EXPECT_EQ(State("u"), v1::TASK_STATE_UNSPECIFIED);
  // Room in the queue counts the replicas ("small" holds 2).
  v1::TaskSpec small = Replicated("s", 2);
  small.set_queue("small");
  EXPECT_EQ(SubmitCode(small), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace taskgrid::core
