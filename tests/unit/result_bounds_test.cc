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

  v1::Task Describe(const std::string& id) {
    v1::Task view;
    sched_.Describe(*sched_.Find(id), &view);
    return view;
  }

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

}  // namespace
}  // namespace taskgrid::core
