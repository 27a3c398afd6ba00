// A queue's max length holds for every way a task comes back, not only
// for submits: retry, reset and a job's retry are refused when the queue
// is full, and change nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;

class QueueLimitTest : public SchedulerTest {
 protected:
  // Queue "small" holds at most 2 unfinished tasks (the fixture's options).
  static v1::TaskSpec Small(const std::string& id) {
    v1::TaskSpec s = Spec(id);
    s.set_queue("small");
    s.set_max_attempts(5);
    return s;
  }
  void Full(const absl::Status& s, int holds, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("queue \"small\" is full: it holds " + std::to_string(holds) +
                          " of at most 2 tasks and " + what));
    Check();
  }
};

TEST_F(QueueLimitTest, RetryAndResetOfAFinishedTaskNeedRoom) {
  SubmitOk(Small("done"));
  ASSERT_TRUE(sched_.Cancel("done").ok());
  SubmitOk(Small("b"));
  SubmitOk(Small("c"));
  const int64_t revision = sched_.last_revision();
  Full(sched_.Retry("done").status(), 2, "retrying \"done\" adds 1");
  Full(sched_.Reset("done").status(), 2, "resetting \"done\" adds 1");
  EXPECT_EQ(State("done"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(sched_.last_revision(), revision) << "a refused request changed something";
  // Room again: both work.
  ASSERT_TRUE(sched_.Cancel("c").ok());
  ASSERT_TRUE(sched_.Retry("done").ok());
  EXPECT_EQ(State("done"), v1::TASK_STATE_PENDING);
}

TEST_F(QueueLimitTest, RetryingAJobCountsEveryTaskItBringsBack) {
  v1::TaskSpec a = Small("a");
  a.set_max_attempts(1);
  v1::TaskSpec b = Small("b");
  b.add_depends_on("a");
  ASSERT_TRUE(sched_.SubmitJob("j", {a, b}).ok());
  const uint64_t conn = Connect("w", 1);
  Take();
  Result(conn, "a", 1, v1::OUTCOME_FAILED, 1);
  ASSERT_EQ(State("a"), v1::TASK_STATE_FAILED);
  ASSERT_EQ(State("b"), v1::TASK_STATE_CANCELLED);
  SubmitOk(Small("x"));
  Full(sched_.RetryJob("j").status(), 1, "retrying job \"j\" adds 2");
  EXPECT_EQ(State("a"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(sched_.Cancel("x").ok());  // it runs on w: the agent confirms
  Result(conn, "x", 1, v1::OUTCOME_CANCELLED);
  ASSERT_EQ(State("x"), v1::TASK_STATE_CANCELLED);
  const auto retried = sched_.RetryJob("j");
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_NE(State("b"), v1::TASK_STATE_CANCELLED);
}

}  // namespace
}  // namespace taskgrid::core
