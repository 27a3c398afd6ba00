// What an agent reports is bounded on the scheduler's side too: a Result
// with outputs far over the limit (a hostile or misconfigured agent) is
// cut, says what was cut, and never makes the task too big to read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::SizeIs;

class ResultBoundsTest : public SchedulerTest {
 protected:
  static SchedulerOptions Small() {
    SchedulerOptions o = Options();
    o.max_output_bytes = 1000;
    return o;
  }
  ResultBoundsTest() : SchedulerTest(Small()) {}

  // Runs "t" to a result carrying `r`.
  void Finish(const v1::TaskResult& r) {
    SubmitOk(Spec("t"));
    const uint64_t conn = Connect("a1", 1);
    Take();
    v1::AgentMessage m;
    m.mutable_result()->set_task_id("t");
    m.mutable_result()->set_attempt(1);
    *m.mutable_result()->mutable_result() = r;
    sched_.OnAgentMessage(conn, m);
    Check();
  }
};

TEST_F(ResultBoundsTest, TailsOverTheLimitKeepTheirLastBytesAndSayHowManyWereCut) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_SUCCEEDED);
  r.set_stdout_tail(std::string(30'000, 'o') + "the end");
  r.set_stderr_tail(std::string(5'000, 'e'));
  Finish(r);
  const v1::Task t = Describe("t");
  EXPECT_EQ(t.state(), v1::TASK_STATE_SUCCEEDED);
  EXPECT_THAT(t.result().stdout_tail(), SizeIs(1000));
  EXPECT_THAT(t.result().stdout_tail(), EndsWith("the end"));
  EXPECT_EQ(t.result().stdout_cut_bytes(), 30'007 - 1000);
  EXPECT_THAT(t.result().stderr_tail(), SizeIs(1000));
  EXPECT_EQ(t.result().stderr_cut_bytes(), 4000);
  // The history holds the same cut copy.
  ASSERT_THAT(t.attempts(), SizeIs(1));
  EXPECT_THAT(t.attempts(0).result().stdout_tail(), SizeIs(1000));
}

TEST_F(ResultBoundsTest, TheAgentsOwnCountOfCutBytesAddsUp) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_FAILED);
  r.set_exit_code(1);
  r.set_stdout_tail(std::string(1500, 'o'));
  r.set_stdout_cut_bytes(70);
  Finish(r);
  EXPECT_EQ(Describe("t").result().stdout_cut_bytes(), 70 + 500);
}

TEST_F(ResultBoundsTest, ALongErrorIsCutWithAMarker) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_FAILED);
  r.set_exit_code(1);
  r.set_error(std::string(100'000, 'x'));
  Finish(r);
  const std::string error = Describe("t").result().error();
  EXPECT_LE(error.size(), 1100u);
  EXPECT_THAT(error, HasSubstr("bytes cut"));
}

TEST_F(ResultBoundsTest, TailsWithinTheLimitAreKeptWhole) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_SUCCEEDED);
  r.set_stdout_tail(std::string(1000, 'o'));
  r.set_error("short");
  Finish(r);
  const v1::Task t = Describe("t");
  EXPECT_EQ(t.result().stdout_tail(), std::string(1000, 'o'));
  EXPECT_EQ(t.result().stdout_cut_bytes(), 0);
  EXPECT_EQ(t.result().error(), "short");
}

// The attempt history is bounded too: a task retried (or paused) many
// times keeps its newest attempts and counts the rest.
class HistoryBoundTest : public SchedulerTest {
 protected:
  static SchedulerOptions KeepThree() {
    SchedulerOptions o = Options();
    o.max_attempt_history = 3;
    return o;
  }
  HistoryBoundTest() : SchedulerTest(KeepThree()) {}
};

TEST_F(HistoryBoundTest, OldAttemptsAreDroppedAndCountedAndNumbersGoOn) {
  v1::TaskSpec s = Spec("t");
  s.set_max_attempts(10);
  SubmitOk(s);
  const uint64_t conn = Connect("a1", 1);
  std::vector<std::pair<std::string, int32_t>> trims;
  for (int i = 1; i <= 6; ++i) {
    ASSERT_EQ(Task("t").attempt, i);
    Accept(conn, "t", i);
    Result(conn, "t", i, v1::OUTCOME_FAILED, 1);
    for (auto& trim : Take().batch.trim_attempts) trims.push_back(trim);
    if (i == 6) break;
    for (int k = 0; k < 3; ++k) {  // past the backoff (at most 8 s): attempt i + 1
      Heartbeat(conn);
      Advance(absl::Seconds(4));
    }
  }
  const TaskRecord& t = Task("t");
  ASSERT_EQ(t.attempts.size(), 3u);
  EXPECT_EQ(t.attempts[0].attempt(), 4);
  EXPECT_EQ(t.attempts[2].attempt(), 6);
  EXPECT_EQ(t.attempts_dropped, 3);
  // The store is told to drop the same ones.
  EXPECT_EQ(trims, (std::vector<std::pair<std::string, int32_t>>{{"t", 2}, {"t", 3}, {"t", 4}}));
  const v1::Task view = Describe("t");
  EXPECT_EQ(view.attempts_size(), 3);
  EXPECT_EQ(view.attempts_dropped(), 3);
  EXPECT_EQ(view.attempts_used(), 6);  // the dropped ones still count
  // A restart reads the same counts back.
  auto restored = Restarted(KeepThree());
  EXPECT_EQ(restored->Find("t")->attempts_dropped, 3);
  v1::Task after;
  restored->Describe(*restored->Find("t"), &after);
  EXPECT_EQ(after.attempts_used(), 6);
}

TEST_F(HistoryBoundTest, DroppedInterruptionsStillDoNotCount) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  // Five pauses, each stopping a running attempt: none counts.
  for (int i = 1; i <= 5; ++i) {
    ASSERT_EQ(Task("t").attempt, i);
    Accept(conn, "t", i);
    ASSERT_TRUE(sched_.Pause("t").ok());
    Result(conn, "t", i, v1::OUTCOME_CANCELLED, -1);
    ASSERT_EQ(State("t"), v1::TASK_STATE_PAUSED);
    ASSERT_TRUE(sched_.Resume("t").ok());
    Check();
  }
  const TaskRecord& t = Task("t");
  EXPECT_EQ(t.attempts_dropped, 2);
  EXPECT_EQ(t.interrupted_dropped, 2);
  EXPECT_EQ(Describe("t").attempts_used(), 1);  // only the live sixth
  Accept(conn, "t", 6);
  Result(conn, "t", 6, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Describe("t").attempts_used(), 1);
  // A reset starts the history and its counts over.
  ASSERT_TRUE(sched_.Reset("t").ok());
  EXPECT_EQ(Task("t").attempts_dropped, 0);
  EXPECT_EQ(Task("t").interrupted_dropped, 0);
  EXPECT_TRUE(Task("t").attempts.empty());
}

TEST_F(HistoryBoundTest, TheHistoryKeepsNoOutputTheResultDoes) {
  SubmitOk(Spec("t"));
  const uint64_t conn = Connect("a1", 1);
  Accept(conn, "t", 1);
  v1::AgentMessage m;
  m.mutable_result()->set_task_id("t");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  m.mutable_result()->mutable_result()->set_output("handed downstream");
  sched_.OnAgentMessage(conn, m);
  Check();
  EXPECT_EQ(Task("t").result().output(), "handed downstream");
  ASSERT_EQ(Task("t").attempts.size(), 1u);
  EXPECT_FALSE(Task("t").attempts[0].result().has_output());
}

}  // namespace
}  // namespace taskgrid::core
