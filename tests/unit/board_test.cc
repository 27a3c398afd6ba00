// Pull mode in the core (scheduler/core/board.cc): claims are attempts
// held by an owner, fenced by their attempt number, expiring on the fake
// clock; pushed agents and pulling workers share one table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/proto_time.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

class BoardTest : public SchedulerTest {
 protected:
  v1::ClaimRequest Req(const std::string& owner, int max = 1, const std::string& queue = "",
                       absl::Duration lease = absl::Seconds(30)) {
    v1::ClaimRequest r;
    r.set_owner(owner);
    r.set_max(max);
    r.set_queue(queue);
    *r.mutable_lease() = ToProto(lease);
    return r;
  }
  std::vector<std::string> ClaimIds(const v1::ClaimRequest& req) {
    auto claims = sched_.Claim(req);
    EXPECT_TRUE(claims.ok()) << claims.status();
    Check();
    std::vector<std::string> ids;
    if (claims.ok()) {
      for (const v1::ClaimedTask& c : *claims) ids.push_back(c.assignment().task_id());
    }
    return ids;
  }
  static v1::ClaimRef Ref(const std::string& id, int attempt, const std::string& owner) {
    v1::ClaimRef r;
    r.set_task_id(id);
    r.set_attempt(attempt);
    r.set_owner(owner);
    return r;
  }
  static v1::TaskResult Outcome(v1::Outcome o, const std::string& out = "") {
    v1::TaskResult r;
    r.set_outcome(o);
    r.set_stdout_tail(out);
    return r;
  }
  absl::StatusCode Complete(const std::string& id, int attempt, const std::string& owner,
                            v1::Outcome o = v1::OUTCOME_SUCCEEDED) {
    absl::StatusCode code =
        sched_.CompleteClaim(Ref(id, attempt, owner), Outcome(o)).status().code();
    Check();
    return code;
  }
};

using V = std::vector<std::string>;
using ::testing::HasSubstr;

TEST_F(BoardTest, AClaimTakesTheBestReadyTasksOfItsQueueAsRunningAttempts) {
  SubmitOk(Spec("low", 0));
  SubmitOk(Spec("high", 5));
  SubmitOk(Spec("low2", 0));
  v1::TaskSpec other = Spec("elsewhere");
  other.set_queue("other");
  SubmitOk(other);
  auto claims = sched_.Claim(Req("w1", 2));
  ASSERT_TRUE(claims.ok()) << claims.status();
  Check();
  ASSERT_EQ(claims->size(), 2u);
  EXPECT_EQ((*claims)[0].assignment().task_id(), "high");
  EXPECT_EQ((*claims)[1].assignment().task_id(), "low");
  EXPECT_EQ((*claims)[0].assignment().attempt(), 1);
  EXPECT_EQ((*claims)[0].assignment().steps(0).exec().argv(1), "high");
  EXPECT_EQ(FromProto((*claims)[0].expire_time()), clock_.Now() + absl::Seconds(30));
  EXPECT_EQ(State("high"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Task("high").agent_id, "w1");
  const v1::Task view = Describe("high");
  EXPECT_EQ(view.agent_id(), "w1");
  EXPECT_TRUE(view.has_claim_expire_time());
  EXPECT_EQ(State("low2"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(State("elsewhere"), v1::TASK_STATE_PENDING);
  const std::vector<v1::QueueStats> stats = sched_.Stats("default");
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].claimed(), 2);
  EXPECT_EQ(stats[0].counts().at("RUNNING"), 2);
  EXPECT_EQ(ClaimIds(Req("w2", 10, "other")), V{"elsewhere"});
  EXPECT_EQ(ClaimIds(Req("w3", 10, "empty-queue")), V{});
}

TEST_F(BoardTest, TwoClaimersNeverGetTheSameTask) {
  SubmitOk(Spec("only"));
  EXPECT_EQ(ClaimIds(Req("w1")), V{"only"});
  EXPECT_EQ(ClaimIds(Req("w2")), V{});
  EXPECT_EQ(Task("only").agent_id, "w1");
}

TEST_F(BoardTest, AgentsAndClaimsShareAQueueWithoutDoubleDelivery) {
  SubmitOk(Spec("a"));
  SubmitOk(Spec("b"));
  const uint64_t conn = Connect("agent", 1);
  const Effects fx = Take();
  EXPECT_EQ(Assigned(fx, conn), V{"a"});
  EXPECT_EQ(ClaimIds(Req("w1", 10)), V{"b"}) << "the dispatched task is not on the board";
  SubmitOk(Spec("c"));
  EXPECT_EQ(Assigned(Take(), conn), V{}) << "the agent is full";
  EXPECT_EQ(ClaimIds(Req("w1", 10)), V{"c"});
  // An agent named like the owner cannot report the claim's result.
  const uint64_t impostor = Connect("w1", 1);
  Result(impostor, "b", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("b"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Task("b").agent_id, "w1");
}

TEST_F(BoardTest, LabelsAndPinsDecideWhatAWorkerMayClaim) {
  v1::TaskSpec gpu = Spec("gpu");
  (*gpu.mutable_placement()->mutable_required_labels())["gpu"] = "1";
  SubmitOk(gpu);
  v1::TaskSpec pinned = Spec("pinned");
  pinned.mutable_placement()->add_agent_ids("some-agent");
  SubmitOk(pinned);
  EXPECT_EQ(sched_.ClaimableCount("default", {}), 0);
  EXPECT_EQ(ClaimIds(Req("plain", 10)), V{});
  v1::ClaimRequest with = Req("gpu-worker", 10);
  (*with.mutable_labels())["gpu"] = "1";
  EXPECT_EQ(sched_.ClaimableCount("default", with.labels()), 1);
  EXPECT_EQ(ClaimIds(with), V{"gpu"}) << "a task pinned to agents is never claimed";
}

TEST_F(BoardTest, AClaimByIdTakesThatTaskOrSaysWhyNot) {
  SubmitOk(Spec("best", 9));
  SubmitOk(Spec("mine", 0));
  v1::TaskSpec gpu = Spec("gpu");
  (*gpu.mutable_placement()->mutable_required_labels())["gpu"] = "1";
  SubmitOk(gpu);
  v1::TaskSpec pinned = Spec("pinned");
  pinned.mutable_placement()->add_agent_ids("some-agent");
  SubmitOk(pinned);
  std::vector<v1::TaskSpec> chain = {Spec("up"), Spec("down")};
  chain[1].add_depends_on("up");
  ASSERT_TRUE(Submit(chain).ok());
  v1::TaskSpec elsewhere = Spec("elsewhere");
  elsewhere.set_queue("other");
  SubmitOk(elsewhere);

  const auto by_id = [&](const std::string& id, const std::string& owner = "w1") {
    v1::ClaimRequest r = Req(owner, 0);
    r.set_task_id(id);
    return r;
  };
  // Refusals name the reason and change nothing.
  const auto refused = [&](const v1::ClaimRequest& r) {
    const size_t rows = sched_.pending_effects().batch.tasks.size();
    auto claims = sched_.Claim(r);
    Check();
    EXPECT_EQ(sched_.pending_effects().batch.tasks.size(), rows) << r.task_id();
    EXPECT_FALSE(claims.ok());
    return claims.ok() ? absl::OkStatus() : claims.status();
  };
  // Not the queue's best: the one named.
  EXPECT_EQ(ClaimIds(by_id("mine")), V{"mine"});
  EXPECT_EQ(State("best"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Task("mine").agent_id, "w1");

  absl::Status s = refused(by_id("mine", "w2"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("task \"mine\" cannot be claimed: it is attempt 1 claimed by w1"));
  s = refused(by_id("nope"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("task \"nope\" does not exist"));
  s = refused(by_id("down"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("it is BLOCKED"));
  s = refused(by_id("pinned"));
  EXPECT_THAT(s.message(), HasSubstr("it is pinned to agents some-agent"));
  s = refused(by_id("gpu"));
  EXPECT_THAT(s.message(), HasSubstr("it requires the label gpu=1"));
  v1::ClaimRequest wrong_queue = by_id("best");
  wrong_queue.set_queue("other");
  s = refused(wrong_queue);
  EXPECT_THAT(s.message(), HasSubstr("it is in queue \"default\", not \"other\""));
  v1::ClaimRequest two = by_id("best");
  two.set_max(2);
  s = refused(two);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max is 2; a claim of one task_id takes at most 1"));
  v1::ClaimRequest bad = by_id("bad id!");
  EXPECT_EQ(refused(bad).code(), absl::StatusCode::kInvalidArgument);

  // The task's own queue when none is named; a paused queue says so.
  ASSERT_TRUE(sched_.PauseQueue("other", true).ok());
  s = refused(by_id("elsewhere"));
  EXPECT_THAT(s.message(), HasSubstr("its queue \"other\" is paused"));
  ASSERT_TRUE(sched_.PauseQueue("other", false).ok());
  EXPECT_EQ(ClaimIds(by_id("elsewhere")), V{"elsewhere"});
  v1::ClaimRequest with = by_id("gpu", "gpu-worker");
  (*with.mutable_labels())["gpu"] = "1";
  EXPECT_EQ(ClaimIds(with), V{"gpu"});

  // A finished task says so.
  EXPECT_EQ(Complete("mine", 1, "w1"), absl::StatusCode::kOk);
  s = refused(by_id("mine", "w2"));
  EXPECT_THAT(s.message(), HasSubstr("it is SUCCEEDED"));
}

TEST_F(BoardTest, ACompletedClaimEndsLikeAnAgentsResult) {
  SubmitOk(Spec("ok"));
  SubmitOk(Spec("bad"));
  ClaimIds(Req("w1", 2));
  auto done = sched_.CompleteClaim(Ref("ok", 1, "w1"), Outcome(v1::OUTCOME_SUCCEEDED, "out\n"));
  ASSERT_TRUE(done.ok()) << done.status();
  Check();
  EXPECT_EQ(State("ok"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(Task("ok").result().stdout_tail(), "out\n");
  EXPECT_EQ(Task("ok").attempts.back().agent_id(), "w1");
  EXPECT_FALSE(Describe("ok").has_claim_expire_time());
  // A failed attempt is retried by the task's retry policy, and counted.
  EXPECT_EQ(Complete("bad", 1, "w1", v1::OUTCOME_FAILED), absl::StatusCode::kOk);
  EXPECT_EQ(State("bad"), v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(Describe("bad").attempts_used(), 1);
  EXPECT_EQ(sched_.Stats("default")[0].claimed(), 0);
  // The same completion again (its answer was lost): no error, no change.
  // Another result for the ended claim is refused.
  EXPECT_TRUE(
      sched_.CompleteClaim(Ref("ok", 1, "w1"), Outcome(v1::OUTCOME_SUCCEEDED, "out\n")).ok());
  EXPECT_EQ(Complete("ok", 1, "w1", v1::OUTCOME_FAILED), absl::StatusCode::kAborted);
  EXPECT_EQ(Task("ok").attempts.size(), 1u);
  EXPECT_EQ(State("ok"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(BoardTest, AStaleOrForeignClaimIsRefusedAndChangesNothing) {
  SubmitOk(Spec("t"));
  ClaimIds(Req("w1"));
  Take();
  const int64_t revision = sched_.last_revision();
  EXPECT_EQ(Complete("t", 2, "w1"), absl::StatusCode::kAborted) << "another attempt";
  EXPECT_EQ(Complete("t", 1, "w2"), absl::StatusCode::kAborted) << "another owner";
  EXPECT_EQ(Complete("nope", 1, "w1"), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.ExtendClaim(Ref("t", 1, "w2"), ToProto(absl::Seconds(5))).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(sched_.AbandonClaim(Ref("t", 0, "w1"), "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.TrashClaim(Ref("t", 1, "bad owner!"), "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.last_revision(), revision);
  EXPECT_TRUE(sched_.TakeEffects().batch.empty());
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
}

TEST_F(BoardTest, AClaimExpiresUnlessExtendedAndIsThenTakenAgain) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(3);
  SubmitOk(s);
  ClaimIds(Req("w1", 1, "", absl::Seconds(10)));
  Advance(absl::Seconds(8));
  auto until = sched_.ExtendClaim(Ref("t", 1, "w1"), ToProto(absl::Seconds(10)));
  ASSERT_TRUE(until.ok()) << until.status();
  EXPECT_EQ(*until, clock_.Now() + absl::Seconds(10));
  EXPECT_EQ(FromProto(Describe("t").claim_expire_time()), *until);
  Advance(absl::Seconds(9));
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING) << "extended";
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING) << "expired: lost, back on the board";
  EXPECT_EQ(Task("t").result().outcome(), v1::OUTCOME_LOST);
  EXPECT_NE(Task("t").result().error().find("the claim by w1 ran out"), std::string::npos);
  EXPECT_EQ(Describe("t").attempts_used(), 1) << "an expired claim counts, as a lost agent's does";
  EXPECT_EQ(ClaimIds(Req("w2")), V{"t"});
  EXPECT_EQ(Task("t").attempt, 2);
  EXPECT_EQ(Complete("t", 1, "w1"), absl::StatusCode::kAborted) << "the first claim is stale";
  EXPECT_EQ(Complete("t", 2, "w2"), absl::StatusCode::kOk);
  EXPECT_EQ(State("t"), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(BoardTest, LeasesAreBounded) {
  SubmitOk(Spec("t"));
  EXPECT_EQ(sched_.Claim(Req("w1", 1, "", absl::Hours(2))).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ClaimRequest negative = Req("w1");
  negative.mutable_lease()->set_seconds(-1);
  EXPECT_EQ(sched_.Claim(negative).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.Claim(Req("w1", 100'000)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.Claim(Req("", 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  // Zero: the default lease.
  auto claims = sched_.Claim(Req("w1", 1, "", absl::ZeroDuration()));
  ASSERT_TRUE(claims.ok());
  EXPECT_EQ(FromProto((*claims)[0].expire_time()), clock_.Now() + absl::Seconds(60));
}

TEST_F(BoardTest, AbandonIsNotCountedAndTrashIsKeptUntilRestored) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(1);
  SubmitOk(s);
  ClaimIds(Req("w1"));
  auto abandoned = sched_.AbandonClaim(Ref("t", 1, "w1"), "shutting down");
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Describe("t").attempts_used(), 0);
  EXPECT_TRUE(Task("t").attempts.back().interrupted());
  EXPECT_NE(Task("t").result().error().find("abandoned by w1: shutting down"), std::string::npos);

  ClaimIds(Req("w2"));
  auto trashed = sched_.TrashClaim(Ref("t", 2, "w2"), "input is corrupt");
  ASSERT_TRUE(trashed.ok()) << trashed.status();
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_TRASHED);
  EXPECT_EQ(Task("t").reason, "trashed by w2: input is corrupt");
  ListFilter f;
  f.states = {v1::TASK_STATE_TRASHED};
  ASSERT_EQ(sched_.List(f).tasks.size(), 1u);
  EXPECT_EQ(ClaimIds(Req("w3")), V{});
  EXPECT_EQ(sched_.Cancel("t").status().code(), absl::StatusCode::kOk) << "nothing to cancel";
  EXPECT_EQ(sched_.RestoreTask("nope").status().code(), absl::StatusCode::kNotFound);

  auto restored = sched_.RestoreTask("t");
  ASSERT_TRUE(restored.ok()) << restored.status();
  Check();
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(sched_.RestoreTask("t").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ClaimIds(Req("w3")), V{"t"});
}

TEST_F(BoardTest, DependentsOfATrashedTaskAreCancelledAndTheJobFails) {
  std::vector<v1::TaskSpec> specs = {Spec("up"), Spec("down")};
  specs[1].add_depends_on("up");
  ASSERT_TRUE(sched_.SubmitJob("j", specs).ok());
  Check();
  ClaimIds(Req("w1"));
  ASSERT_TRUE(sched_.TrashClaim(Ref("up", 1, "w1"), "").ok());
  Check();
  EXPECT_EQ(State("down"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("down").reason, "upstream task up was trashed");
  EXPECT_EQ(Scheduler::JobStateOf(*sched_.FindJob("j")), v1::JOB_STATE_FAILED);
}

TEST_F(BoardTest, CancelAndPauseEndAClaimAtOnce) {
  SubmitOk(Spec("c"));
  SubmitOk(Spec("p"));
  ClaimIds(Req("w1", 2));
  ASSERT_TRUE(sched_.Cancel("c").ok());
  Check();
  EXPECT_EQ(State("c"), v1::TASK_STATE_CANCELLED) << "no agent to wait for";
  ASSERT_TRUE(sched_.Pause("p").ok());
  Check();
  EXPECT_EQ(State("p"), v1::TASK_STATE_PAUSED);
  EXPECT_EQ(Describe("p").attempts_used(), 0) << "a pause interrupts, as on an agent";
  EXPECT_EQ(Complete("c", 1, "w1"), absl::StatusCode::kAborted);
  EXPECT_EQ(sched_.ExtendClaim(Ref("p", 1, "w1"), {}).status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(sched_.Resume("p").ok());
  EXPECT_EQ(ClaimIds(Req("w2")), V{"p"});
}

TEST_F(BoardTest, AClaimSurvivesARestartAndEndsWhereItWould) {
  SubmitOk(Spec("kept"));
  SubmitOk(Spec("late"));
  ClaimIds(Req("w1", 1, "", absl::Seconds(20)));
  clock_.Advance(absl::Seconds(5));
  ClaimIds(Req("w2", 1, "", absl::Seconds(20)));
  std::unique_ptr<Scheduler> after = Restarted();
  EXPECT_EQ(after->Stats("default")[0].claimed(), 2);
  // The first claim is completed over the restart; the second runs out at
  // its stored end, not a fresh lease from the restart.
  v1::TaskResult ok;
  ok.set_outcome(v1::OUTCOME_SUCCEEDED);
  ASSERT_TRUE(after->CompleteClaim(Ref("kept", 1, "w1"), ok).ok());
  clock_.Advance(absl::Seconds(19));
  after->Tick();
  EXPECT_EQ(after->Find("late")->state, v1::TASK_STATE_RUNNING);
  clock_.Advance(absl::Seconds(1));
  after->Tick();
  EXPECT_EQ(after->Find("late")->result().outcome(), v1::OUTCOME_LOST);
  EXPECT_TRUE(after->CheckInvariants().ok()) << after->CheckInvariants();
  EXPECT_EQ(after->Find("kept")->state, v1::TASK_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace taskgrid::core
