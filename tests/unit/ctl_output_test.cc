// taskgridctl's text for people: the state a task is shown in and its
// attempt counts, which differ from the table's raw fields on purpose.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tools/ctl/help.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

v1::Task RunningTask() {
  v1::Task t;
  t.mutable_spec()->set_id("t1");
  t.mutable_spec()->set_queue("q");
  t.set_state(v1::TASK_STATE_RUNNING);
  t.set_agent_id("a1");
  t.set_attempt(4);
  t.set_max_attempts(3);
  t.set_attempts_used(2);
  return t;
}

TEST(CtlOutput, APauseWaitingForTheAgentReadsPausing) {
  v1::Task t = RunningTask();
  EXPECT_EQ(TaskStateText(t), "RUNNING");
  t.set_pause_requested(true);
  EXPECT_EQ(TaskStateText(t), "PAUSING");
  t.set_state(v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(TaskStateText(t), "PAUSING");
  // Once the agent confirmed, the table says PAUSED and so does the CLI.
  t.set_state(v1::TASK_STATE_PAUSED);
  EXPECT_EQ(TaskStateText(t), "PAUSED");
  t.set_pause_requested(false);
  EXPECT_EQ(TaskStateText(t), "PAUSED");
}

TEST(CtlOutput, DetailShowsTheAttemptNumberApartFromTheBudgetUsed) {
  // Attempt 4 of a task allowed 3: two were interrupted by pauses, which do
  // not count. "Attempt: 4 / 3" would read as a broken limit.
  v1::Task t = RunningTask();
  t.set_pause_requested(true);
  const std::string out = FormatTaskDetail(t);
  EXPECT_THAT(out, ContainsRegex("\nAttempt: +4\n"));
  EXPECT_THAT(out, ContainsRegex("\nAttempts used: +2 / 3\n"));
  EXPECT_THAT(out, ContainsRegex("\nState: +PAUSING\n"));
  EXPECT_THAT(out, Not(ContainsRegex("4 / 3")));

  v1::Task pending;
  pending.mutable_spec()->set_id("p1");
  pending.set_state(v1::TASK_STATE_PENDING);
  pending.set_max_attempts(2);
  const std::string fresh = FormatTaskDetail(pending);
  EXPECT_THAT(fresh, ContainsRegex("\nAttempt: +-\n"));
  EXPECT_THAT(fresh, ContainsRegex("\nAttempts used: +0 / 2\n"));
}

TEST(CtlOutput, DetailSaysWhenOlderAttemptsWereNotKept) {
  v1::Task t = RunningTask();
  t.add_attempts()->set_attempt(3);
  EXPECT_THAT(FormatTaskDetail(t), ContainsRegex("\nAttempts:\n"));
  t.set_attempts_dropped(2);
  EXPECT_THAT(FormatTaskDetail(t),
              ContainsRegex("\nAttempts \\(the newest 1; 2 older not kept\\):\n"));
}

TEST(CtlOutput, DetailShowsAnHttpStepAsItsMethodAndUrl) {
  v1::Task t = RunningTask();
  v1::Step* post = t.mutable_spec()->add_steps();
  post->mutable_http()->set_url("http://host/path");
  (*post->mutable_http()->mutable_headers())["Authorization"] = "Bearer secret";
  v1::Step* get = t.mutable_spec()->add_steps();
  get->mutable_http()->set_method("GET");
  get->mutable_http()->set_url("https://host/status?full=1");
  get->mutable_http()->add_success_codes(200);
  get->mutable_http()->add_success_codes(404);
  get->mutable_timeout()->set_seconds(5);
  const std::string out = FormatTaskDetail(t);
  EXPECT_THAT(out, HasSubstr("\nSteps:          [0] http POST http://host/path\n"));
  EXPECT_THAT(out, HasSubstr("\n                [1] http GET https://host/status?full=1 "
                             "(success: 200, 404) [timeout 5s]\n"));
  EXPECT_THAT(out, Not(ContainsRegex("secret")));
}

TEST(CtlOutput, ListShowsAttemptsUsedOfAllowed) {
  v1::Task t = RunningTask();
  t.set_pause_requested(true);
  const std::string out = FormatTaskList({t});
  EXPECT_THAT(out, ContainsRegex("^ID +QUEUE +STATE +ATTEMPTS +AGENT"));
  EXPECT_THAT(out, ContainsRegex("\nt1 +q +PAUSING +2/3 +a1 "));
}

}  // namespace
}  // namespace taskgrid::ctl

namespace taskgrid::ctl {
namespace {

TEST(CtlHelp, EveryCommandIsListedFoundAndExplained) {
  const std::string usage = UsageText();
  for (const Command& c : Commands()) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(absl::StartsWith(c.synopsis, c.name));
    EXPECT_EQ(FindCommand(c.name), &c);
    EXPECT_THAT(usage, ::testing::HasSubstr(c.synopsis));
    EXPECT_THAT(CommandHelp(c), ::testing::HasSubstr(c.example));
    EXPECT_EQ(absl::StartsWith(c.name, "job "),
              JobUsageText().find(c.synopsis) != std::string::npos);
  }
  EXPECT_EQ(FindCommand("frobnicate"), nullptr);
}

}  // namespace
}  // namespace taskgrid::ctl
