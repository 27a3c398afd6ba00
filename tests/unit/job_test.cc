// Jobs in the Scheduler: DAG validation, readiness and failure propagation,
// CancelJob / RetryJob, chains pushed to one agent, outputs handed
// downstream. Fake clock, no sleeping; the invariant checker (dependency
// counters, chain links, job counts) runs after every step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobTest : public SchedulerTest {
 protected:
  static v1::TaskSpec Dep(const std::string& id, const std::vector<std::string>& deps,
                          v1::UpstreamFailure policy = v1::UPSTREAM_FAILURE_UNSPECIFIED) {
    v1::TaskSpec s = Spec(id);
    for (const std::string& d : deps) s.add_depends_on(d);
    s.set_on_upstream_failure(policy);
    return s;
  }
  // Fails at its first failed attempt.
  static v1::TaskSpec Once(v1::TaskSpec s) {
    s.set_max_attempts(1);
    return s;
  }

  absl::StatusOr<const JobRecord*> SubmitJob(const std::string& id,
                                             std::vector<v1::TaskSpec> specs) {
    auto r = sched_.SubmitJob(id, std::move(specs));
    Check();
    return r;
  }

  // The diamond a -> {b, c} -> d.
  void Diamond(v1::TaskSpec b = Dep("b", {"a"}),
               v1::UpstreamFailure d_policy = v1::UPSTREAM_FAILURE_UNSPECIFIED) {
    ASSERT_TRUE(
        SubmitJob("dia", {Spec("a"), std::move(b), Dep("c", {"a"}), Dep("d", {"b", "c"}, d_policy)})
            .ok());
  }

  // Runs task `id` (dispatched to `conn`) to `outcome`.
  void Finish(uint64_t conn, const std::string& id, v1::Outcome outcome = v1::OUTCOME_SUCCEEDED) {
    const int attempt = Task(id).attempt;
    Accept(conn, id, attempt);
    Result(conn, id, attempt, outcome, outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
  }

  v1::JobState JobState(const std::string& id) {
    return Scheduler::JobStateOf(*sched_.FindJob(id));
  }

  static std::vector<v1::Assignment> Assignments(const Effects& fx, uint64_t conn) {
    std::vector<v1::Assignment> out;
    for (const Outgoing& o : fx.messages) {
      if (o.conn != conn || !o.msg.has_assign()) continue;
      for (const v1::Assignment& a : o.msg.assign().tasks()) out.push_back(a);
    }
    return out;
  }

  static int AssignMessages(const Effects& fx, uint64_t conn) {
    int n = 0;
    for (const Outgoing& o : fx.messages) n += o.conn == conn && o.msg.has_assign();
    return n;
  }

  uint64_t ConnectChains(const std::string& agent, int slots) {
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(slots);
    h.set_chains(true);
    return ConnectHello(h);
  }

  // A chain c1 -> c2 -> ... -> cN in one job.
  void Chain(int n, const std::string& job = "chain") {
    std::vector<v1::TaskSpec> specs;
    for (int i = 1; i <= n; ++i) {
      specs.push_back(i == 1 ? Spec("c1")
                             : Dep("c" + std::to_string(i), {"c" + std::to_string(i - 1)}));
    }
    ASSERT_TRUE(SubmitJob(job, std::move(specs)).ok());
  }
};

// --- Validation: a clear error, and nothing changed. ---

TEST_F(JobTest, ACycleIsRefusedNamingTheTasksOnIt) {
  auto r = SubmitJob(
      "j", {Spec("free"), Dep("x", {"z"}), Dep("y", {"x"}), Dep("z", {"y"}), Dep("tail", {"x"})});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("cycle of 3 tasks"));
  for (const char* id : {"x", "y", "z"}) EXPECT_THAT(msg, HasSubstr(id));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("free")));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("tail")));
  EXPECT_EQ(sched_.task_count(), 0u);
  EXPECT_EQ(sched_.FindJob("j"), nullptr);
  EXPECT_TRUE(Take().batch.empty());
}

TEST_F(JobTest, ASelfDependencyOrRepeatedDependencyIsRefused) {
  auto self = SubmitJob("j", {Dep("x", {"x"})});
  EXPECT_EQ(self.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(self.status().message()), HasSubstr("tasks[0].depends_on[0]"));
  auto twice = SubmitJob("j", {Spec("a"), Dep("x", {"a", "a"})});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("tasks[1].depends_on[1]"));
  EXPECT_EQ(sched_.task_count(), 0u);
}

TEST_F(JobTest, AnUnknownDependencyIsRefusedNamingIt) {
  auto r = SubmitJob("j", {Spec("a"), Dep("b", {"a", "ghost"})});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tasks[1].depends_on[1]"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"ghost\""));
  EXPECT_EQ(sched_.task_count(), 0u);
}

TEST_F(JobTest, ADuplicateTaskIdIsRefused) {
  auto r = SubmitJob("j", {Spec("a"), Spec("b"), Spec("a")});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tasks[2].id \"a\" repeats tasks[0]"));
  EXPECT_EQ(sched_.task_count(), 0u);
}

TEST_F(JobTest, MoreTasksThanTheLimitIsRefused) {
  SchedulerOptions o = Options();
  o.max_job_tasks = 3;
  Scheduler small(&clock_, o);
  auto r = small.SubmitJob("j", {Spec("a"), Spec("b"), Spec("c"), Spec("d")});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("limit per job is 3"));
  EXPECT_TRUE(small.SubmitJob("j", {Spec("a"), Spec("b"), Spec("c")}).ok());
}

TEST_F(JobTest, JobIdsAreCheckedAndSubmitTasksTakesNone) {
  v1::TaskSpec other = Spec("a");
  other.set_job_id("other");
  EXPECT_EQ(SubmitJob("j", {other}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitJob("bad id!", {Spec("a")}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitJob("j", {}).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TaskSpec with_job = Spec("a");
  with_job.set_job_id("j");
  auto r = Submit({with_job});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("SubmitJob"));
  EXPECT_EQ(sched_.task_count(), 0u);
}

TEST_F(JobTest, ResubmittingTheSameJobReturnsItAndAnotherOneIsAlreadyExists) {
  auto first = SubmitJob("j", {Spec("a"), Dep("b", {"a"})});
  ASSERT_TRUE(first.ok());
  Take();
  auto again = SubmitJob("j", {Spec("a"), Dep("b", {"a"})});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
  EXPECT_TRUE(Take().batch.empty());
  EXPECT_EQ(SubmitJob("j", {Spec("a")}).status().code(), absl::StatusCode::kAlreadyExists);
  // A task id used outside the job.
  EXPECT_EQ(SubmitJob("k", {Spec("b")}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(sched_.task_count(), 2u);
}

TEST_F(JobTest, DependenciesMayNameExistingTasksOutsideTheJob) {
  SubmitOk(Spec("before"));
  SubmitOk(Spec("running"));
  const uint64_t conn = Connect("w", 4);
  Finish(conn, "before");
  ASSERT_TRUE(SubmitJob("j", {Dep("x", {"before"}), Dep("y", {"running"})}).ok());
  EXPECT_EQ(State("x"), v1::TASK_STATE_DISPATCHED);  // "before" already succeeded
  EXPECT_EQ(State("y"), v1::TASK_STATE_BLOCKED);
  Finish(conn, "running");
  EXPECT_EQ(State("y"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(JobTest, ADependencyOnAFailedTaskCancelsAtOnce) {
  SubmitOk(Once(Spec("bad")));
  const uint64_t conn = Connect("w", 1);
  Finish(conn, "bad", v1::OUTCOME_FAILED);
  ASSERT_EQ(State("bad"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(
      SubmitJob("j", {Dep("x", {"bad"}), Dep("y", {"bad"}, v1::UPSTREAM_FAILURE_RUN)}).ok());
  EXPECT_EQ(State("x"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("x").reason, "upstream task bad failed");
  EXPECT_EQ(State("y"), v1::TASK_STATE_DISPATCHED);
}

// --- Readiness and propagation. ---

TEST_F(JobTest, DiamondRunsInDependencyOrder) {
  Diamond();
  EXPECT_EQ(State("a"), v1::TASK_STATE_PENDING);
  for (const char* id : {"b", "c", "d"}) EXPECT_EQ(State(id), v1::TASK_STATE_BLOCKED) << id;
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_RUNNING);
  const uint64_t conn = Connect("w", 4);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("a"));
  Finish(conn, "a");
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("b", "c"));
  Finish(conn, "b");
  EXPECT_EQ(State("d"), v1::TASK_STATE_BLOCKED);
  v1::Task d;
  sched_.Describe(Task("d"), &d);
  EXPECT_EQ(d.reason(), "waiting for c");
  Finish(conn, "c");
  EXPECT_EQ(State("d"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("d").attempts.size(), 0u);
  Finish(conn, "d");
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobTest, AFailedMiddleTaskCancelsItsDescendantsButNotTheOtherBranch) {
  Diamond(Once(Dep("b", {"a"})));
  const uint64_t conn = Connect("w", 4);
  Finish(conn, "a");
  Finish(conn, "b", v1::OUTCOME_FAILED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_FAILED);
  EXPECT_EQ(State("d"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("d").reason, "upstream task b failed");
  EXPECT_EQ(State("c"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_RUNNING);
  Finish(conn, "c");
  EXPECT_EQ(State("c"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_FAILED);
  v1::Job job;
  sched_.DescribeJob(*sched_.FindJob("dia"), &job);
  EXPECT_EQ(job.task_count(), 4);
  EXPECT_EQ(job.counts().at("SUCCEEDED"), 2);
  EXPECT_EQ(job.counts().at("FAILED"), 1);
  EXPECT_EQ(job.counts().at("CANCELLED"), 1);
}

TEST_F(JobTest, ARetriedFailureDoesNotCancelDownstream) {
  Diamond();  // b has 3 attempts
  const uint64_t conn = Connect("w", 4);
  Finish(conn, "a");
  Finish(conn, "b", v1::OUTCOME_FAILED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(State("d"), v1::TASK_STATE_BLOCKED);
}

TEST_F(JobTest, RunAnywayRunsOnceEveryDependencyIsTerminal) {
  Diamond(Once(Dep("b", {"a"})), v1::UPSTREAM_FAILURE_RUN);
  const uint64_t conn = Connect("w", 4);
  Finish(conn, "a");
  Finish(conn, "b", v1::OUTCOME_FAILED);
  EXPECT_EQ(State("d"), v1::TASK_STATE_BLOCKED);  // c is still running
  Take();
  Finish(conn, "c");
  EXPECT_EQ(State("d"), v1::TASK_STATE_DISPATCHED);
  // It sees what both produced, the failed one included.
  const auto as = Assignments(Take(), conn);
  ASSERT_EQ(as.size(), 1u);
  EXPECT_EQ(as[0].inputs().at("b"), "b\n");
  EXPECT_EQ(as[0].inputs().at("c"), "c\n");
}

TEST_F(JobTest, ACancelledUpstreamCancelsDownstreamSayingSo) {
  Diamond();
  ASSERT_TRUE(sched_.Cancel("a").ok());
  Check();
  EXPECT_EQ(State("b"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("b").reason, "upstream task a was cancelled");
  EXPECT_EQ(State("d"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobTest, WideFanInWaitsForEveryRootAndFailsOnAny) {
  constexpr int kRoots = 2000;
  std::vector<v1::TaskSpec> specs;
  std::vector<std::string> roots;
  for (int i = 0; i < kRoots; ++i) {
    roots.push_back("r" + std::to_string(i));
    specs.push_back(Once(Spec(roots.back())));
  }
  specs.push_back(Dep("sink", roots));
  specs.push_back(Dep("after", {"sink"}));
  ASSERT_TRUE(SubmitJob("fan", std::move(specs)).ok());
  const uint64_t conn = Connect("w", kRoots);
  for (int i = 0; i < kRoots - 1; ++i) {
    const std::string& id = roots[i];
    const int attempt = Task(id).attempt;
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
    sched_.OnAgentMessage(conn, m);  // no invariant check per step: O(n) each
  }
  Check();
  EXPECT_EQ(State("sink"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(Task("sink").deps_unsucceeded, 1);
  Finish(conn, roots.back(), v1::OUTCOME_FAILED);
  EXPECT_EQ(State("sink"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("sink").reason, "upstream task " + roots.back() + " failed");
  EXPECT_EQ(State("after"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("after").reason, "upstream task sink was cancelled");
}

TEST_F(JobTest, WideFanOutReleasesEveryDependentAtOnce) {
  std::vector<v1::TaskSpec> specs = {Spec("root")};
  for (int i = 0; i < 2000; ++i) specs.push_back(Dep("l" + std::to_string(i), {"root"}));
  ASSERT_TRUE(SubmitJob("fan", std::move(specs)).ok());
  const uint64_t conn = Connect("w", 10);
  Finish(conn, "root");
  EXPECT_EQ(sched_.FindJob("fan")->counts[v1::TASK_STATE_BLOCKED], 0);
  EXPECT_EQ(sched_.FindJob("fan")->counts[v1::TASK_STATE_DISPATCHED], 10);
  EXPECT_EQ(sched_.FindJob("fan")->counts[v1::TASK_STATE_PENDING], 1990);
}

TEST_F(JobTest, AChainOf100000IsValidatedAndCancelledWithoutRecursion) {
  SchedulerOptions o = Options();
  o.max_job_tasks = 100'000;
  Scheduler big(&clock_, o);
  std::vector<v1::TaskSpec> specs;
  specs.reserve(100'000);
  for (int i = 0; i < 100'000; ++i) {
    v1::TaskSpec s = Spec("n" + std::to_string(i));
    // Listed last-first: dependencies come later in the request.
    if (i > 0) s.add_depends_on("n" + std::to_string(i - 1));
    specs.push_back(std::move(s));
  }
  std::reverse(specs.begin(), specs.end());
  // Closing it into a cycle is refused (and named).
  std::vector<v1::TaskSpec> cyclic = specs;
  cyclic.back().add_depends_on("n99999");
  auto refused = big.SubmitJob("long", std::move(cyclic));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("cycle of 100000 tasks"));
  ASSERT_TRUE(big.SubmitJob("long", std::move(specs)).ok());
  ASSERT_TRUE(big.CheckInvariants().ok()) << big.CheckInvariants();
  EXPECT_EQ(big.FindJob("long")->counts[v1::TASK_STATE_BLOCKED], 99'999);
  ASSERT_TRUE(big.Cancel("n0").ok());
  EXPECT_EQ(big.FindJob("long")->counts[v1::TASK_STATE_CANCELLED], 100'000);
  EXPECT_EQ(big.Find("n99999")->reason, "upstream task n99998 was cancelled");
  EXPECT_EQ(Scheduler::JobStateOf(*big.FindJob("long")), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(big.CheckInvariants().ok()) << big.CheckInvariants();
}

TEST_F(JobTest, AResetUpstreamBlocksADependentThatHasNotStarted) {
  ASSERT_TRUE(SubmitJob("j", {Spec("a"), Dep("b", {"a"})}).ok());
  const uint64_t conn = Connect("w", 1);
  Finish(conn, "a");
  Finish(conn, "b");
  ASSERT_TRUE(sched_.Drain("w").ok());  // nothing runs from here on
  ASSERT_TRUE(sched_.Reset("b").ok());
  Check();
  ASSERT_EQ(State("b"), v1::TASK_STATE_PENDING);
  ASSERT_TRUE(sched_.Reset("a").ok());
  Check();
  EXPECT_EQ(State("b"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(Task("b").reason, "waiting for a");
  ASSERT_TRUE(sched_.Pause("b").ok());
  ASSERT_TRUE(sched_.Resume("b").ok());
  Check();
  EXPECT_EQ(State("b"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(Task("b").reason, "resumed by request; waiting for a");
}

// --- CancelJob, RetryJob. ---

TEST_F(JobTest, CancelJobCascadesToEveryNonTerminalTask) {
  Diamond();
  SubmitOk(Spec("outside"));
  const uint64_t conn = Connect("w", 3);
  Finish(conn, "a");
  Accept(conn, "b", 1);
  Take();
  auto j = sched_.CancelJob("dia");
  ASSERT_TRUE(j.ok());
  Check();
  EXPECT_EQ(State("a"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_CANCELLING);
  EXPECT_EQ(State("c"), v1::TASK_STATE_CANCELLING);
  EXPECT_EQ(State("d"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("d").reason, "job cancelled by request");
  EXPECT_EQ(State("outside"), v1::TASK_STATE_DISPATCHED);
  EXPECT_THAT(Cancels(Take(), conn), ::testing::UnorderedElementsAre("b", "c"));
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Task("b").reason, "job cancelled by request; waiting for agent w");
  Result(conn, "b", 1, v1::OUTCOME_CANCELLED);
  Result(conn, "c", 1, v1::OUTCOME_CANCELLED);
  // The running ones end with the reason the waiting ones got at once.
  EXPECT_EQ(Task("b").reason, "job cancelled by request");
  EXPECT_EQ(JobState("dia"), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(sched_.CancelJob("dia").ok());  // idempotent
  EXPECT_EQ(sched_.CancelJob("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobTest, RetryJobRequeuesOnlyTheFailedAndWhatTheyCancelled) {
  ASSERT_TRUE(SubmitJob("j", {Spec("a"), Once(Dep("b", {"a"})), Dep("c", {"b"}), Dep("d", {"c"}),
                              Dep("side", {"a"})})
                  .ok());
  const uint64_t conn = Connect("w", 4);
  Finish(conn, "a");
  Finish(conn, "side");
  Finish(conn, "b", v1::OUTCOME_FAILED);
  ASSERT_EQ(State("c"), v1::TASK_STATE_CANCELLED);
  ASSERT_EQ(State("d"), v1::TASK_STATE_CANCELLED);
  ASSERT_EQ(JobState("j"), v1::JOB_STATE_FAILED);
  // b used its one attempt: RetryTask refuses, RetryJob gives a fresh budget.
  EXPECT_EQ(sched_.Retry("b").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sched_.RetryJob("j").ok());
  Check();
  EXPECT_EQ(State("a"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("side"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("b").attempt, 2);  // the counter goes on
  EXPECT_EQ(State("c"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(State("d"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(JobState("j"), v1::JOB_STATE_RUNNING);
  Finish(conn, "b");
  Finish(conn, "c");
  Finish(conn, "d");
  EXPECT_EQ(JobState("j"), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Task("a").attempts.size(), 1u);  // not run again
  EXPECT_EQ(sched_.RetryJob("j").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobTest, RetryJobLeavesTasksCancelledByRequestAlone) {
  ASSERT_TRUE(SubmitJob("j", {Once(Spec("a")), Dep("b", {"a"}), Spec("x")}).ok());
  ASSERT_TRUE(sched_.Cancel("x").ok());
  const uint64_t conn = Connect("w", 1);
  Finish(conn, "a", v1::OUTCOME_FAILED);
  ASSERT_TRUE(sched_.RetryJob("j").ok());
  Check();
  EXPECT_EQ(State("b"), v1::TASK_STATE_BLOCKED);
  EXPECT_EQ(State("x"), v1::TASK_STATE_CANCELLED);
}

// --- Chains. ---

TEST_F(JobTest, AChainOfFiveGoesToOneAgentAsOneAssign) {
  Chain(5);
  const uint64_t conn = ConnectChains("w", 1);
  const Effects fx = Take();
  EXPECT_EQ(AssignMessages(fx, conn), 1);
  const auto as = Assignments(fx, conn);
  ASSERT_EQ(as.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(as[i].task_id(), "c" + std::to_string(i + 1));
    EXPECT_EQ(as[i].attempt(), 1);
    EXPECT_EQ(as[i].run_after(), i == 0 ? "" : "c" + std::to_string(i));
    EXPECT_EQ(State(as[i].task_id()), v1::TASK_STATE_DISPATCHED);
  }
  EXPECT_EQ(sched_.FindAgent("w")->used, 1);  // links wait without a slot
  // Each link starts after the one before it succeeded.
  for (int i = 1; i <= 5; ++i) Finish(conn, "c" + std::to_string(i));
  EXPECT_EQ(JobState("chain"), v1::JOB_STATE_SUCCEEDED);
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(Task("c" + std::to_string(i)).attempts.size(), 1u);
  EXPECT_EQ(sched_.FindAgent("w")->used, 0);
}

TEST_F(JobTest, AnAgentWithoutChainsGetsOneLinkAtATime) {
  Chain(3);
  const uint64_t conn = Connect("w", 1);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("c1"));
  EXPECT_EQ(State("c2"), v1::TASK_STATE_BLOCKED);
}

TEST_F(JobTest, AnAcceptFromAWaitingLinkIsStale) {
  Chain(2);
  const uint64_t conn = ConnectChains("w", 1);
  Take();
  Accept(conn, "c2", 1);
  EXPECT_EQ(State("c2"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(sched_.stale_messages(), 1);
}

TEST_F(JobTest, AFailedLinkEndsTheWaitingRestWithoutCountingThem) {
  Chain(5);
  const uint64_t conn = ConnectChains("w", 1);
  Take();
  Finish(conn, "c1");
  Accept(conn, "c2", 1);
  Result(conn, "c2", 1, v1::OUTCOME_FAILED, 3);
  // c2 retries after backoff; c3..c5 never started: back to BLOCKED, their
  // attempt not counted, the agent told to drop them.
  EXPECT_EQ(State("c2"), v1::TASK_STATE_SCHEDULED);
  const Effects fx = Take();
  EXPECT_THAT(Cancels(fx, conn), ElementsAre("c3", "c4", "c5"));
  for (const char* id : {"c3", "c4", "c5"}) {
    EXPECT_EQ(State(id), v1::TASK_STATE_BLOCKED) << id;
    ASSERT_EQ(Task(id).attempts.size(), 1u);
    EXPECT_TRUE(Task(id).attempts[0].interrupted());
  }
  EXPECT_EQ(sched_.FindAgent("w")->used, 0);
  // The retry takes the rest along again, with fresh attempts.
  Advance(absl::Seconds(2));
  const auto as = Assignments(Take(), conn);
  ASSERT_EQ(as.size(), 4u);
  EXPECT_EQ(as[0].task_id(), "c2");
  EXPECT_EQ(as[0].attempt(), 2);
  EXPECT_EQ(as[1].task_id(), "c3");
  EXPECT_EQ(as[1].attempt(), 2);
}

TEST_F(JobTest, AKilledAgentMidChainMovesOnlyTheUnfinishedRest) {
  Chain(5);
  const uint64_t conn = ConnectChains("w", 1);
  Take();
  Finish(conn, "c1");
  Finish(conn, "c2");
  Accept(conn, "c3", 1);
  sched_.Disconnect(conn);
  Advance(absl::Seconds(6));                       // past the grace
  EXPECT_EQ(State("c3"), v1::TASK_STATE_PENDING);  // lost: counted, re-queued at once
  EXPECT_EQ(Task("c3").attempts[0].result().outcome(), v1::OUTCOME_LOST);
  EXPECT_FALSE(Task("c3").attempts[0].interrupted());
  for (const char* id : {"c4", "c5"}) {
    EXPECT_EQ(State(id), v1::TASK_STATE_BLOCKED);
    EXPECT_TRUE(Task(id).attempts[0].interrupted());
  }
  const uint64_t other = ConnectChains("v", 1);
  const auto as = Assignments(Take(), other);
  ASSERT_EQ(as.size(), 3u);
  EXPECT_EQ(as[0].task_id(), "c3");
  EXPECT_EQ(as[2].task_id(), "c5");
  EXPECT_EQ(as[1].run_after(), "c3");
  for (const char* id : {"c3", "c4", "c5"}) Finish(other, id);
  EXPECT_EQ(JobState("chain"), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Task("c1").attempts.size(), 1u);
  EXPECT_EQ(Task("c2").attempts.size(), 1u);
}

TEST_F(JobTest, AReconnectListingWaitingLinksKeepsThem) {
  Chain(3);
  const uint64_t conn = ConnectChains("w", 1);
  Take();
  Accept(conn, "c1", 1);
  sched_.Disconnect(conn);
  v1::Hello h;
  h.set_agent_id("w");
  h.set_slots(1);
  h.set_chains(true);
  for (const char* id : {"c1", "c2", "c3"}) {
    v1::AttemptRef* r = h.add_running();
    r->set_task_id(id);
    r->set_attempt(1);
    r->set_waiting(std::string(id) != "c1");
  }
  const uint64_t again = ConnectHello(h);
  EXPECT_EQ(State("c1"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(State("c2"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(State("c3"), v1::TASK_STATE_DISPATCHED);
  for (const char* id : {"c1", "c2", "c3"}) Finish(again, id);
  EXPECT_EQ(JobState("chain"), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobTest, AHelloListingAStartedAttemptCountsAsItsAccept) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("w", 1);
  Take();
  sched_.Disconnect(conn);  // the Accept was lost with the stream
  Connect("w", 1, {}, {{"t", 1}});
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  Advance(absl::Seconds(11));  // past the ack timeout: still running
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
}

TEST_F(JobTest, CancellingAWaitingLinkEndsItAndTheLinksAfterIt) {
  Chain(4);
  const uint64_t conn = ConnectChains("w", 1);
  Take();
  ASSERT_TRUE(sched_.Cancel("c2").ok());
  Check();
  EXPECT_EQ(State("c2"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(State("c3"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("c3").reason, "upstream task c2 was cancelled");
  EXPECT_THAT(Cancels(Take(), conn), ElementsAre("c2", "c3", "c4"));
  Finish(conn, "c1");  // the head goes on
  EXPECT_EQ(State("c1"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(JobTest, ChainsStopAtTheLengthLimitAndAtBranches) {
  SchedulerOptions o = Options();
  o.max_chain_length = 3;
  Scheduler s(&clock_, o);
  std::vector<v1::TaskSpec> specs = {Spec("c1")};
  for (int i = 2; i <= 5; ++i) {
    specs.push_back(Dep("c" + std::to_string(i), {"c" + std::to_string(i - 1)}));
  }
  // c5 has two dependents: the chain cannot go past it.
  specs.push_back(Dep("x", {"c5"}));
  specs.push_back(Dep("y", {"c5"}));
  ASSERT_TRUE(s.SubmitJob("j", std::move(specs)).ok());
  v1::Hello h;
  h.set_agent_id("w");
  h.set_slots(1);
  h.set_chains(true);
  ASSERT_TRUE(s.Connect(1, h).ok());
  auto ids = [](const Effects& fx) {
    std::vector<std::string> out;
    for (const Outgoing& m : fx.messages) {
      for (const v1::Assignment& a : m.msg.assign().tasks()) out.push_back(a.task_id());
    }
    return out;
  };
  EXPECT_THAT(ids(s.TakeEffects()), ElementsAre("c1", "c2", "c3"));
  ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
}

TEST_F(JobTest, AChainStopsBeforeItsAssignWouldPass32MiB) {
  // 40 links of 1 MiB payload: one Assign may carry at most 32 MiB, so the
  // chain is cut there and the rest follows once the links before it ran.
  std::vector<v1::TaskSpec> specs;
  for (int i = 1; i <= 40; ++i) {
    v1::TaskSpec s =
        i == 1 ? Spec("c1") : Dep("c" + std::to_string(i), {"c" + std::to_string(i - 1)});
    s.set_payload(std::string(1 << 20, 'p'));
    specs.push_back(std::move(s));
  }
  ASSERT_TRUE(SubmitJob("big", std::move(specs)).ok());
  const uint64_t conn = ConnectChains("w", 1);
  const Effects fx = Take();
  size_t bytes = 0;
  for (const Outgoing& o : fx.messages) {
    if (o.conn == conn && o.msg.has_assign()) bytes += o.msg.assign().ByteSizeLong();
  }
  const auto as = Assignments(fx, conn);
  EXPECT_LE(bytes, size_t{32} << 20);
  EXPECT_GE(as.size(), 30u);
  ASSERT_LT(as.size(), 40u);
  const size_t first = as.size();
  EXPECT_EQ(State("c" + std::to_string(first + 1)), v1::TASK_STATE_BLOCKED);
  // Running the sent links releases the rest, which goes as a new chain.
  for (size_t i = 1; i <= first; ++i) Finish(conn, "c" + std::to_string(i));
  const auto rest = Assignments(Take(), conn);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest[0].task_id(), "c" + std::to_string(first + 1));
  EXPECT_EQ(rest[0].run_after(), "");
}

// --- Outputs flow downstream. ---

TEST_F(JobTest, OutputsReachDependentsPreferringTheResultFile) {
  ASSERT_TRUE(SubmitJob("j", {Spec("p"), Spec("q"), Dep("sink", {"p", "q"})}).ok());
  const uint64_t conn = Connect("w", 2);
  Take();
  Accept(conn, "p", 1);
  v1::AgentMessage m;
  m.mutable_result()->set_task_id("p");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  m.mutable_result()->mutable_result()->set_stdout_tail("log lines");
  m.mutable_result()->mutable_result()->set_output("{\"rows\": 3}");
  sched_.OnAgentMessage(conn, m);
  Finish(conn, "q");  // stdout "q\n", no result file
  const auto as = Assignments(Take(), conn);
  ASSERT_EQ(as.size(), 1u);
  EXPECT_EQ(as[0].task_id(), "sink");
  EXPECT_EQ(as[0].inputs().at("p"), "{\"rows\": 3}");
  EXPECT_EQ(as[0].inputs().at("q"), "q\n");
}

TEST_F(JobTest, AnOversizedOutputFailsTheAttempt) {
  SubmitOk(Once(Spec("big")));
  const uint64_t conn = Connect("w", 1);
  Accept(conn, "big", 1);
  v1::AgentMessage m;
  m.mutable_result()->set_task_id("big");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  m.mutable_result()->mutable_result()->set_output(std::string((1 << 20) + 1, 'x'));
  sched_.OnAgentMessage(conn, m);
  Check();
  EXPECT_EQ(State("big"), v1::TASK_STATE_FAILED);
  EXPECT_THAT(Task("big").result().error(), HasSubstr("limit is 1048576"));
  EXPECT_FALSE(Task("big").result().has_output());
}

// --- Recovery. ---

TEST_F(JobTest, RestoreRebuildsDependenciesJobsAndChains) {
  Chain(3);
  ASSERT_TRUE(SubmitJob("dia", {Spec("a"), Dep("b", {"a"})}).ok());
  const uint64_t conn = ConnectChains("w", 4);
  Take();
  Finish(conn, "a");
  Accept(conn, "c1", 1);
  // Everything as a restart would read it back.
  std::vector<TaskRecord> stored;
  for (const char* id : {"c1", "c2", "c3", "a", "b"}) {
    TaskRecord copy = Task(id);
    copy.deps.clear();
    copy.dependents.clear();
    copy.deps_unsucceeded = copy.deps_unfinished = 0;
    copy.chained_after = copy.chain_next = nullptr;
    copy.job = nullptr;
    stored.push_back(std::move(copy));
  }
  std::sort(stored.begin(), stored.end(),
            [](const TaskRecord& x, const TaskRecord& y) { return x.seq < y.seq; });
  Scheduler restored(&clock_, Options());
  ASSERT_TRUE(restored.Restore(std::move(stored)).ok());
  ASSERT_TRUE(restored.CheckInvariants().ok()) << restored.CheckInvariants();
  EXPECT_EQ(restored.Find("c2")->chained_after, restored.Find("c1"));
  EXPECT_EQ(restored.FindAgent("w")->used, 2);  // c1 and b, not the waiting links
  EXPECT_EQ(restored.FindJob("chain")->tasks.size(), 3u);
  EXPECT_EQ(Scheduler::JobStateOf(*restored.FindJob("dia")), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restored.Find("b")->deps_unsucceeded, 0);
}

}  // namespace
}  // namespace taskgrid::core
