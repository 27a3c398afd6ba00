// The rules for what follows a finished attempt, on their own: no
// scheduler, no agents, just a task record, a result and a time.
#include "scheduler/core/retry_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;
using Next = AfterAttempt::Next;

class RetryPolicyTest : public ::testing::Test {
 protected:
  RetryPolicyTest() {
    opts_.default_max_attempts = 3;
    opts_.default_initial_backoff = absl::Seconds(1);
    opts_.default_max_backoff = absl::Seconds(8);
    opts_.default_backoff_multiplier = 2;
    opts_.backoff_jitter = 0.5;
    t_.spec.set_id("t");
    t_.state = v1::TASK_STATE_RUNNING;
    t_.attempt = 1;
  }

  AfterAttempt Decide(v1::Outcome outcome, AttemptEnd end = {}, int32_t used = 1) {
    t_.mutable_result().set_outcome(outcome);
    return DecideAfterAttempt(t_, "attempt 1 on agent a", end, used, opts_, now_, [this] {
      ++draws_;
      return u_;
    });
  }

  SchedulerOptions opts_;
  TaskRecord t_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  double u_ = 0;
  int draws_ = 0;
};

TEST_F(RetryPolicyTest, SuccessEndsTheTask) {
  const AfterAttempt a = Decide(v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(a.next, Next::kSucceeded);
  EXPECT_EQ(a.reason, "attempt 1 on agent a succeeded");
}

TEST_F(RetryPolicyTest, ACancelThatArrivedTooLateLetsASuccessStand) {
  t_.state = v1::TASK_STATE_CANCELLING;
  EXPECT_EQ(Decide(v1::OUTCOME_SUCCEEDED).next, Next::kSucceeded);
  EXPECT_EQ(Decide(v1::OUTCOME_FAILED).next, Next::kCancelled);
}

TEST_F(RetryPolicyTest, APauseEndsPausedWhateverTheOutcome) {
  const AfterAttempt a = Decide(v1::OUTCOME_CANCELLED, {.interrupted = true, .pausing = true});
  EXPECT_EQ(a.next, Next::kPaused);
  EXPECT_THAT(a.reason, HasSubstr("paused by request"));
}

TEST_F(RetryPolicyTest, AnInterruptionRequeuesAfterItsDelayWithoutABackoff) {
  AfterAttempt a = Decide(v1::OUTCOME_LOST, {.interrupted = true});
  EXPECT_EQ(a.next, Next::kRequeue);
  EXPECT_EQ(a.next_run_time, absl::InfinitePast());
  a = Decide(v1::OUTCOME_LOST, {.interrupted = true, .requeue_after = absl::Seconds(3)});
  EXPECT_EQ(a.next_run_time, now_ + absl::Seconds(3));
  EXPECT_EQ(draws_, 0);
}

TEST_F(RetryPolicyTest, ANonRetryableExitCodeFailsAtOnce) {
  t_.spec.mutable_retry()->add_non_retryable_exit_codes(2);
  t_.mutable_result().set_exit_code(2);
  const AfterAttempt a = Decide(v1::OUTCOME_FAILED);
  EXPECT_EQ(a.next, Next::kFailed);
  EXPECT_THAT(a.reason, HasSubstr("exit code 2 is not retryable"));
}

TEST_F(RetryPolicyTest, APermanentFailureEndsTheTaskWhateverAttemptsAreLeft) {
  t_.spec.set_max_attempts(10);
  t_.mutable_result().set_permanent(true);
  t_.mutable_result().set_exit_code(404);
  t_.mutable_result().set_error("HTTP 404 from POST http://127.0.0.1:1234/hook");
  const AfterAttempt a = Decide(v1::OUTCOME_FAILED, {}, /*used=*/1);
  EXPECT_EQ(a.next, Next::kFailed);
  EXPECT_EQ(a.next_run_time, absl::InfinitePast());
  EXPECT_EQ(a.reason,
            "attempt 1 on agent a failed for good: HTTP 404 from POST http://127.0.0.1:1234/hook");
  EXPECT_EQ(draws_, 0);
}

TEST_F(RetryPolicyTest, APermanentFailureStillYieldsToACancelAndAPause) {
  t_.mutable_result().set_permanent(true);
  EXPECT_EQ(Decide(v1::OUTCOME_FAILED, {.interrupted = true, .pausing = true}).next, Next::kPaused);
  t_.state = v1::TASK_STATE_CANCELLING;
  EXPECT_EQ(Decide(v1::OUTCOME_FAILED).next, Next::kCancelled);
}

TEST_F(RetryPolicyTest, AFailureThatIsNotPermanentIsRetried) {
  t_.mutable_result().set_permanent(false);
  t_.mutable_result().set_exit_code(503);
  const AfterAttempt a = Decide(v1::OUTCOME_FAILED, {}, /*used=*/1);
  EXPECT_EQ(a.next, Next::kRetry);
  EXPECT_THAT(a.reason, HasSubstr("will retry"));
}

TEST_F(RetryPolicyTest, TheLastAllowedAttemptFails) {
  const AfterAttempt a = Decide(v1::OUTCOME_FAILED, {}, /*used=*/3);
  EXPECT_EQ(a.next, Next::kFailed);
  EXPECT_THAT(a.reason, HasSubstr("all 3 attempts used"));
}

TEST_F(RetryPolicyTest, ASingleAttemptFailsSayingItWasTheOnlyOne) {
  opts_.default_max_attempts = 1;
  const AfterAttempt a = Decide(v1::OUTCOME_FAILED, {}, /*used=*/1);
  EXPECT_EQ(a.next, Next::kFailed);
  EXPECT_THAT(a.reason, HasSubstr("; its only attempt used"));
}

TEST_F(RetryPolicyTest, AFailureBacksOffGrowingToTheMaxLessTheJitter) {
  t_.attempt = 3;  // the third failed: 1 s * 2^2
  AfterAttempt a = Decide(v1::OUTCOME_FAILED, {}, /*used=*/1);
  EXPECT_EQ(a.next, Next::kRetry);
  EXPECT_EQ(a.next_run_time, now_ + absl::Seconds(4));
  EXPECT_THAT(a.reason, HasSubstr("will retry"));
  u_ = 1.0;  // the whole jitter: half of it
  a = Decide(v1::OUTCOME_FAILED, {}, 1);
  EXPECT_EQ(a.next_run_time, now_ + absl::Seconds(2));
  t_.attempt = 10;
  u_ = 0;
  EXPECT_EQ(Decide(v1::OUTCOME_FAILED, {}, 1).next_run_time, now_ + absl::Seconds(8));
  // After a reset or a job retry the growth starts over.
  t_.attempt_base = 9;
  EXPECT_EQ(Decide(v1::OUTCOME_FAILED, {}, 1).next_run_time, now_ + absl::Seconds(1));
}

TEST_F(RetryPolicyTest, ALostAttemptCountsButRetriesAtOnce) {
  const AfterAttempt a = Decide(v1::OUTCOME_LOST, {}, 1);
  EXPECT_EQ(a.next, Next::kRetry);
  EXPECT_EQ(a.next_run_time, absl::InfinitePast());
  EXPECT_EQ(draws_, 0);
}

}  // namespace
}  // namespace taskgrid::core
