#include "scheduler/core/state_machine.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace taskgrid::core {
namespace {

using namespace v1;  // NOLINT: state names read better bare here

// The states of docs/tasks.md's "What happens to a task", written out edge by edge, independently
// of the code.
const std::set<std::pair<TaskState, TaskState>>& Allowed() {
  static const auto* kAllowed = new std::set<std::pair<TaskState, TaskState>>{
      // submit
      {TASK_STATE_UNSPECIFIED, TASK_STATE_PENDING},
      {TASK_STATE_UNSPECIFIED, TASK_STATE_SCHEDULED},
      {TASK_STATE_UNSPECIFIED, TASK_STATE_BLOCKED},
      // waiting -> ready, cancel, pause
      {TASK_STATE_SCHEDULED, TASK_STATE_PENDING},
      {TASK_STATE_SCHEDULED, TASK_STATE_CANCELLED},
      {TASK_STATE_SCHEDULED, TASK_STATE_PAUSED},
      {TASK_STATE_BLOCKED, TASK_STATE_PENDING},
      {TASK_STATE_BLOCKED, TASK_STATE_CANCELLED},
      {TASK_STATE_BLOCKED, TASK_STATE_PAUSED},
      {TASK_STATE_PENDING, TASK_STATE_DISPATCHED},
      {TASK_STATE_PENDING, TASK_STATE_CANCELLED},
      {TASK_STATE_PENDING, TASK_STATE_PAUSED},
      // schedule_timeout: expired before start
      {TASK_STATE_SCHEDULED, TASK_STATE_FAILED},
      {TASK_STATE_BLOCKED, TASK_STATE_FAILED},
      // A task with replicas ends by its success policy while it waits.
      {TASK_STATE_BLOCKED, TASK_STATE_SUCCEEDED},
      {TASK_STATE_PENDING, TASK_STATE_FAILED},
      {TASK_STATE_PAUSED, TASK_STATE_FAILED},
      // a pause interrupts a task an agent holds
      {TASK_STATE_DISPATCHED, TASK_STATE_PAUSED},
      {TASK_STATE_RUNNING, TASK_STATE_PAUSED},
      // two-phase dispatch and its failures
      {TASK_STATE_DISPATCHED, TASK_STATE_RUNNING},
      {TASK_STATE_DISPATCHED, TASK_STATE_PENDING},
      {TASK_STATE_DISPATCHED, TASK_STATE_SCHEDULED},
      {TASK_STATE_DISPATCHED, TASK_STATE_FAILED},
      {TASK_STATE_DISPATCHED, TASK_STATE_CANCELLING},
      {TASK_STATE_RUNNING, TASK_STATE_SUCCEEDED},
      {TASK_STATE_RUNNING, TASK_STATE_FAILED},
      {TASK_STATE_RUNNING, TASK_STATE_PENDING},
      {TASK_STATE_RUNNING, TASK_STATE_SCHEDULED},
      {TASK_STATE_RUNNING, TASK_STATE_CANCELLING},
      {TASK_STATE_CANCELLING, TASK_STATE_CANCELLED},
      {TASK_STATE_CANCELLING, TASK_STATE_SUCCEEDED},
      // resume
      {TASK_STATE_PAUSED, TASK_STATE_PENDING},
      {TASK_STATE_PAUSED, TASK_STATE_SCHEDULED},
      {TASK_STATE_PAUSED, TASK_STATE_CANCELLED},
      // retry, reset
      {TASK_STATE_FAILED, TASK_STATE_PENDING},
      {TASK_STATE_CANCELLED, TASK_STATE_PENDING},
      {TASK_STATE_SUCCEEDED, TASK_STATE_PENDING},
      // ... not_before still ahead
      {TASK_STATE_FAILED, TASK_STATE_SCHEDULED},
      {TASK_STATE_CANCELLED, TASK_STATE_SCHEDULED},
      {TASK_STATE_SUCCEEDED, TASK_STATE_SCHEDULED},
      // dependencies (jobs): waiting for them again after retry, reset or
      // resume, or because one was reset before the task ran
      {TASK_STATE_FAILED, TASK_STATE_BLOCKED},
      {TASK_STATE_CANCELLED, TASK_STATE_BLOCKED},
      {TASK_STATE_SUCCEEDED, TASK_STATE_BLOCKED},
      {TASK_STATE_PAUSED, TASK_STATE_BLOCKED},
      {TASK_STATE_PENDING, TASK_STATE_BLOCKED},
      {TASK_STATE_SCHEDULED, TASK_STATE_BLOCKED},
      {TASK_STATE_DISPATCHED, TASK_STATE_BLOCKED},
      {TASK_STATE_RUNNING, TASK_STATE_BLOCKED},
      // met, with not_before ahead; a chain link goes with its predecessor
      {TASK_STATE_BLOCKED, TASK_STATE_SCHEDULED},
      {TASK_STATE_BLOCKED, TASK_STATE_DISPATCHED},
      // pull mode: a claim starts at once; its worker may trash it, and a
      // restore (or reset) puts it back
      {TASK_STATE_PENDING, TASK_STATE_RUNNING},
      {TASK_STATE_RUNNING, TASK_STATE_TRASHED},
      {TASK_STATE_TRASHED, TASK_STATE_PENDING},
      {TASK_STATE_TRASHED, TASK_STATE_SCHEDULED},
      {TASK_STATE_TRASHED, TASK_STATE_BLOCKED},
  };
  return *kAllowed;
}

TEST(StateMachine, EveryPairIsAllowedExactlyWhenTheDesignSaysSo) {
  int allowed = 0;
  for (int f = TaskState_MIN; f <= TaskState_MAX; ++f) {
    for (int t = TaskState_MIN; t <= TaskState_MAX; ++t) {
      const auto from = static_cast<TaskState>(f);
      const auto to = static_cast<TaskState>(t);
      const bool want = Allowed().count({from, to}) > 0;
      EXPECT_EQ(IsAllowedTransition(from, to), want) << StateName(from) << " -> " << StateName(to);
      allowed += want;
    }
  }
  EXPECT_EQ(allowed, static_cast<int>(Allowed().size()));
}

TEST(StateMachine, NothingLeadsBackToUnspecifiedOrStaysPut) {
  for (int f = TaskState_MIN; f <= TaskState_MAX; ++f) {
    const auto from = static_cast<TaskState>(f);
    EXPECT_FALSE(IsAllowedTransition(from, TASK_STATE_UNSPECIFIED)) << StateName(from);
    EXPECT_FALSE(IsAllowedTransition(from, from)) << StateName(from);
  }
}

TEST(StateMachine, TerminalAndInFlightStates) {
  EXPECT_TRUE(IsTerminal(TASK_STATE_SUCCEEDED));
  EXPECT_TRUE(IsTerminal(TASK_STATE_FAILED));
  EXPECT_TRUE(IsTerminal(TASK_STATE_CANCELLED));
  EXPECT_TRUE(IsTerminal(TASK_STATE_TRASHED));
  EXPECT_FALSE(IsTerminal(TASK_STATE_CANCELLING));
  EXPECT_FALSE(IsTerminal(TASK_STATE_PAUSED));
  EXPECT_TRUE(IsInFlight(TASK_STATE_DISPATCHED));
  EXPECT_TRUE(IsInFlight(TASK_STATE_RUNNING));
  EXPECT_TRUE(IsInFlight(TASK_STATE_CANCELLING));
  EXPECT_FALSE(IsInFlight(TASK_STATE_PENDING));
}

TEST(StateMachine, NamesRoundTrip) {
  for (int s = TaskState_MIN + 1; s <= TaskState_MAX; ++s) {
    const auto state = static_cast<TaskState>(s);
    TaskState parsed;
    ASSERT_TRUE(ParseStateName(StateName(state), &parsed)) << StateName(state);
    EXPECT_EQ(parsed, state);
  }
  TaskState parsed;
  EXPECT_TRUE(ParseStateName("running", &parsed));
  EXPECT_EQ(parsed, TASK_STATE_RUNNING);
  EXPECT_TRUE(ParseStateName("TASK_STATE_PAUSED", &parsed));
  EXPECT_EQ(parsed, TASK_STATE_PAUSED);
  EXPECT_FALSE(ParseStateName("sleeping", &parsed));
  EXPECT_FALSE(ParseStateName("UNSPECIFIED", &parsed));
}

}  // namespace
}  // namespace taskgrid::core

namespace taskgrid::core {
namespace {

TEST(StateNames, OneVocabularyForTasksJobsAndAgents) {
  EXPECT_EQ(AllStateNames(),
            "SCHEDULED BLOCKED PENDING DISPATCHED RUNNING SUCCEEDED FAILED CANCELLING CANCELLED "
            "PAUSED TRASHED");
  EXPECT_EQ(AllJobStateNames(), "RUNNING SUCCEEDED FAILED CANCELLED");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_FAILED), "FAILED");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_UNSPECIFIED), "-");
  EXPECT_EQ(AgentStateName(v1::AGENT_STATE_LOST), "LOST");
  v1::JobState j;
  EXPECT_TRUE(ParseJobStateName("running", &j));
  EXPECT_EQ(j, v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(ParseJobStateName("JOB_STATE_CANCELLED", &j));
  EXPECT_FALSE(ParseJobStateName("unspecified", &j));
  EXPECT_FALSE(ParseJobStateName("bogus", &j));
  // Every task state name parses back to its state.
  for (int s = v1::TaskState_MIN + 1; s <= v1::TaskState_MAX; ++s) {
    TaskState back;
    ASSERT_TRUE(ParseStateName(StateName(static_cast<TaskState>(s)), &back));
    EXPECT_EQ(back, s);
  }
}

}  // namespace
}  // namespace taskgrid::core
