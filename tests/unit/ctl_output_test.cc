// taskgridctl's text for people: the state a task is shown in and its
// attempt counts, which differ from the table's raw fields on purpose; a
// task's replicas; and the flag values it parses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "tools/ctl/help.h"
#include "tools/ctl/log_printer.h"
#include "tools/ctl/output.h"
#include "tools/ctl/parse.h"

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

TEST(CtlOutput, AStepThatDidNotExitShowsNoExitCode) {
  // A timed-out step was killed: the result's -1 is "no exit code", not an
  // exit code a program could return.
  v1::Task t = RunningTask();
  t.set_state(v1::TASK_STATE_FAILED);
  t.mutable_result()->set_outcome(v1::OUTCOME_TIMED_OUT);
  t.mutable_result()->set_exit_code(-1);
  v1::Attempt* a = t.add_attempts();
  a->set_attempt(4);
  a->set_agent_id("a1");
  *a->mutable_result() = t.result();
  EXPECT_THAT(FormatTaskDetail(t), ContainsRegex("\n  Exit code: -\n"));
  EXPECT_THAT(FormatTaskDetail(t), ContainsRegex("\n4 +a1 +TIMED_OUT +- "));
  t.mutable_result()->set_outcome(v1::OUTCOME_FAILED);
  t.mutable_result()->set_exit_code(2);
  EXPECT_THAT(FormatTaskDetail(t), ContainsRegex("\n  Exit code: 2\n"));
}

TEST(CtlOutput, AWaitLineSaysWhyATaskDidNotSucceed) {
  v1::Task t = RunningTask();
  t.set_reason("attempt 4 on agent a1 failed: step 0 exited with code 2;\nits only attempt used");
  EXPECT_EQ(FormatWaitLine(t, /*done=*/false), "t1 RUNNING");
  t.set_state(v1::TASK_STATE_FAILED);
  EXPECT_EQ(FormatWaitLine(t, /*done=*/true),
            "t1 FAILED  attempt 4 on agent a1 failed: step 0 exited with code 2; its only attempt "
            "used");
  t.set_state(v1::TASK_STATE_SUCCEEDED);
  t.set_reason("attempt 4 on agent a1 succeeded");
  EXPECT_EQ(FormatWaitLine(t, /*done=*/true), "t1 SUCCEEDED");
}

TEST(CtlOutput, StatsShowEachQueuesShareAndADashForAQueueOwedNone) {
  v1::GetQueueStatsResponse resp;
  v1::QueueStats* a = resp.add_queues();
  a->set_queue("batch");
  a->set_share(0.25);
  a->set_fair_share(0.5);
  v1::QueueStats* b = resp.add_queues();
  b->set_queue("idle");
  const std::string out = FormatStats(resp);
  EXPECT_THAT(out, ContainsRegex("\nbatch +0 +- +25% of 50%\n"));
  EXPECT_THAT(out, ContainsRegex("\nidle +0 +- +-\n"));
  // No queue is owed a share: no SHARE column at all.
  a->set_fair_share(0);
  a->set_share(0);
  EXPECT_THAT(FormatStats(resp), Not(HasSubstr("SHARE")));
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

v1::ReplicaStatus* AddReplica(v1::Task* t, const std::string& id, v1::TaskState state,
                              int32_t attempt, const std::string& agent, v1::Outcome outcome,
                              const std::string& reason) {
  v1::ReplicaStatus* r = t->add_replicas();
  r->set_task_id(id);
  r->set_state(state);
  r->set_attempt(attempt);
  r->set_agent_id(agent);
  r->set_outcome(outcome);
  r->set_reason(reason);
  return r;
}

TEST(CtlOutput, DetailShowsTheReplicasPolicyAndEachReplica) {
  v1::Task t;
  t.mutable_spec()->set_id("verify-42");
  t.mutable_spec()->set_queue("default");
  t.mutable_spec()->mutable_replicas()->set_count(3);
  t.mutable_spec()->mutable_replicas()->set_success(v1::SUCCESS_POLICY_QUORUM);
  t.mutable_spec()->mutable_replicas()->set_quorum(2);
  t.set_state(v1::TASK_STATE_BLOCKED);
  AddReplica(&t, "verify-42:r1", v1::TASK_STATE_SUCCEEDED, 1, "w1", v1::OUTCOME_SUCCEEDED, "");
  AddReplica(&t, "verify-42:r2", v1::TASK_STATE_RUNNING, 2, "w3", v1::OUTCOME_UNSPECIFIED,
             "agent w2 lost\nre-placed");
  AddReplica(&t, "verify-42:r3", v1::TASK_STATE_PENDING, 0, "", v1::OUTCOME_UNSPECIFIED, "");
  const std::string out = FormatTaskDetail(t);
  EXPECT_THAT(out, HasSubstr("\nReplicas:       3, success: quorum 2\n"
                             "  TASK          STATE      ATTEMPT  AGENT  OUTCOME    REASON\n"
                             "  verify-42:r1  SUCCEEDED  1        w1     SUCCEEDED  -\n"
                             "  verify-42:r2  RUNNING    2        w3     -          agent w2 lost "
                             "re-placed\n"
                             "  verify-42:r3  PENDING    -        -      -          -\n"));
  EXPECT_THAT(out, ContainsRegex("\nState: +BLOCKED\n"));
  EXPECT_THAT(out, Not(HasSubstr("Replica of")));
}

TEST(CtlOutput, DetailNamesEverySuccessPolicyAndPinnedAgents) {
  v1::Task t;
  t.mutable_spec()->set_id("v");
  v1::Replicas* r = t.mutable_spec()->mutable_replicas();
  r->set_count(2);
  // Unset reads as the scheduler treats it: all.
  EXPECT_THAT(FormatTaskDetail(t), HasSubstr("\nReplicas:       2, success: all\n"));
  r->set_success(v1::SUCCESS_POLICY_ALL);
  EXPECT_THAT(FormatTaskDetail(t), HasSubstr("\nReplicas:       2, success: all\n"));
  r->set_success(v1::SUCCESS_POLICY_ANY);
  EXPECT_THAT(FormatTaskDetail(t), HasSubstr("\nReplicas:       2, success: any\n"));
  // Pinned: the count may be left 0, the agents say how many.
  r->set_count(0);
  r->add_agent_ids("a1");
  r->add_agent_ids("a2");
  r->add_agent_ids("a3");
  r->set_success(v1::SUCCESS_POLICY_QUORUM);
  r->set_quorum(2);
  EXPECT_THAT(FormatTaskDetail(t),
              HasSubstr("\nReplicas:       3 (on a1, a2, a3), success: quorum 2\n"));
  r->set_gang(true);
  EXPECT_THAT(FormatTaskDetail(t),
              HasSubstr("\nReplicas:       3 (on a1, a2, a3), success: quorum 2, gang\n"));
  // No replica statuses yet: the line alone, no table.
  EXPECT_THAT(FormatTaskDetail(t), Not(HasSubstr("TASK ")));
}

TEST(CtlOutput, DetailOfAReplicaNamesItsTask) {
  v1::Task t = RunningTask();
  t.mutable_spec()->set_id("verify-42:r2");
  t.mutable_spec()->set_replica_of("verify-42");
  const std::string out = FormatTaskDetail(t);
  EXPECT_THAT(out, HasSubstr("ID:             verify-42:r2\nReplica of:     verify-42\n"));
  EXPECT_THAT(out, Not(HasSubstr("Replicas:")));

  // A task without replicas shows neither line.
  EXPECT_THAT(FormatTaskDetail(RunningTask()), Not(HasSubstr("Replica")));
}

// A task gathering a merge key says when it fires and which submit's mode
// decided that: the first's, or a later one of merge_update always that
// moved it.
TEST(CtlOutput, DetailOfAMergedTaskSaysWhichSubmitDecidedItsFireTime) {
  v1::Task t;
  t.mutable_spec()->set_id("m1");
  t.mutable_spec()->set_merge_key("user-7");
  t.mutable_spec()->set_merge_update(v1::MERGE_UPDATE_ONCE);
  t.set_state(v1::TASK_STATE_SCHEDULED);
  const absl::Time created = absl::FromUnixSeconds(1'800'000'000);
  SetTimestamp(created, t.mutable_create_time());
  *t.mutable_merged()->add_payloads() = "ab";
  *t.mutable_merged()->add_payloads() = "c";
  SetTimestamp(created, t.mutable_merged()->mutable_fire_time());
  EXPECT_THAT(FormatTaskDetail(t),
              HasSubstr(absl::StrCat("user-7: 2 payloads (3 bytes), fires at ",
                                     FormatTime(ToProto(created)),
                                     " (set by the first submit, merge_update once)")));
  SetTimestamp(created + absl::Seconds(30), t.mutable_spec()->mutable_not_before());
  SetTimestamp(created + absl::Seconds(30), t.mutable_merged()->mutable_fire_time());
  t.mutable_spec()->set_merge_update(v1::MERGE_UPDATE_ALWAYS);
  EXPECT_THAT(FormatTaskDetail(t), HasSubstr("(set by the first submit, merge_update always)"));
  SetTimestamp(created + absl::Seconds(45), t.mutable_merged()->mutable_fire_time());
  EXPECT_THAT(FormatTaskDetail(t),
              HasSubstr(absl::StrCat("fires at ", FormatTime(ToProto(created + absl::Seconds(45))),
                                     " (moved by a later submit, merge_update always)")));
}

TEST(CtlOutput, AnAgentAwaySaysWhyAndWhenItsTasksMove) {
  const absl::Time now = absl::FromUnixSeconds(1'000'000);
  v1::ListAgentsResponse resp;
  v1::Agent* away = resp.add_agents();
  away->set_id("a1");
  away->set_state(v1::AGENT_STATE_LOST);
  away->add_running("t1");
  away->set_note("restarting, its steps running on");
  SetTimestamp(now + absl::Seconds(298), away->mutable_grace_end_time());
  v1::Agent* up = resp.add_agents();
  up->set_id("a2");
  up->set_state(v1::AGENT_STATE_ACTIVE);
  const std::string out = FormatAgents(resp, now);
  EXPECT_THAT(out, ContainsRegex("VERSION +NOTE\n"));
  EXPECT_THAT(out, HasSubstr("restarting, its steps running on; its tasks move "
                             "in 4m58s unless it is back\n"));
  EXPECT_THAT(out, ContainsRegex("\na2 +ACTIVE .* -\n"));
  // Past the grace's end (a clock ahead of the scheduler's): no negative span.
  EXPECT_THAT(AgentNoteText(*away, now + absl::Hours(1)), HasSubstr("move in 0.0s"));
  away->clear_note();
  EXPECT_EQ(AgentNoteText(*away, now), "its tasks move in 4m58s unless it is back");
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
    // A command of a group ("job submit") is listed by its group's help,
    // and by no other group's.
    const absl::string_view name = c.name;
    const size_t space = name.find(' ');
    for (const char* group : {"job", "board", "queue", "schedule"}) {
      EXPECT_EQ(space != absl::string_view::npos && name.substr(0, space) == group,
                absl::StrContains(GroupUsageText(group), absl::StrCat("\n  ", c.synopsis, "\n")))
          << group;
    }
  }
  EXPECT_EQ(FindCommand("frobnicate"), nullptr);
  EXPECT_EQ(GroupUsageText("submit"), "");
}

TEST(CtlHelp, SubmitTakesAndExplainsTheReplicaFlags) {
  const Command* submit = FindCommand("submit");
  ASSERT_NE(submit, nullptr);
  const std::string help = CommandHelp(*submit);
  for (const char* flag : {"replicas", "replica_agents", "success"}) {
    SCOPED_TRACE(flag);
    EXPECT_THAT(submit->flags, ::testing::Contains(flag));
    EXPECT_THAT(help, ::testing::HasSubstr(absl::StrCat("--", flag, "=")));
  }
  EXPECT_THAT(help, ::testing::HasSubstr("taskgridctl submit --replicas=3 --success=quorum:2 -- "
                                         "/usr/bin/verify-block 42"));
}

TEST(CtlOutput, SchedulesShowTheirTriggerStateAndFires) {
  v1::Schedule s;
  s.set_id("nightly");
  s.set_cron("0 3 * * *");
  s.set_time_zone("Europe/Berlin");
  s.set_misfire_policy(v1::MISFIRE_POLICY_RUN_ONCE);
  s.set_last_task_id("nightly:20261125T020000Z");
  s.set_fire_count(7);
  s.set_last_error("fire at 2026-11-24T02:00:00Z refused: RESOURCE_EXHAUSTED: queue\nfull");
  s.mutable_task_template()->add_steps()->mutable_exec()->add_argv("./backup.sh");
  EXPECT_EQ(FormatTrigger(s), "0 3 * * * (Europe/Berlin)");
  s.set_paused(true);
  EXPECT_EQ(FormatScheduleSummary(s), "nightly PAUSED  next fire -");
  const std::string detail = FormatScheduleDetail(s);
  EXPECT_THAT(detail, ContainsRegex("Trigger: +0 3 \\* \\* \\* \\(Europe/Berlin\\)\n"));
  EXPECT_THAT(detail, ContainsRegex("Misfire: +RUN_ONCE\n"));
  EXPECT_THAT(detail, ContainsRegex("Fires: +7\n"));
  EXPECT_THAT(detail, ContainsRegex("Last task: +nightly:20261125T020000Z\n"));
  EXPECT_THAT(detail, ContainsRegex("Last error: +fire at .* queue full\n"));
  EXPECT_THAT(detail, ContainsRegex("Queue: +default\n"));
  EXPECT_THAT(detail, Not(HasSubstr("Skipped"))) << "nothing skipped: no line";
  s.set_skipped_fires(3);
  SetTimestamp(absl::FromUnixSeconds(1'700'000'000), s.mutable_last_skipped_time());
  s.set_misfire_policy(v1::MISFIRE_POLICY_UNSPECIFIED);
  const std::string skipped = FormatScheduleDetail(s);
  EXPECT_THAT(skipped, ContainsRegex("Skipped: +3 fire\\(s\\), the last at 2023-11-1"));
  EXPECT_THAT(skipped, ContainsRegex("Misfire: +CATCH_UP\n"));
  v1::Schedule every;
  every.set_id("beat");
  *every.mutable_interval() = ToProto(absl::Seconds(90));
  EXPECT_EQ(FormatTrigger(every), "every 1m30s");
  const std::string table = FormatScheduleList({s, every});
  EXPECT_THAT(table,
              ContainsRegex("^ID +STATE +TRIGGER +NEXT FIRE +LAST TASK +FIRES +LAST ERROR\n"));
  EXPECT_THAT(table, ContainsRegex("\nnightly +PAUSED +0 3 \\* \\* \\* \\(Europe/Berlin\\) +- +"
                                   "nightly:20261125T020000Z +7 +fire at"));
  EXPECT_THAT(table, ContainsRegex("\nbeat +ACTIVE +every 1m30s +- +- +0 +-\n"));
  // `taskgridctl help schedule` lists exactly the schedule commands.
  for (const Command& c : Commands()) {
    EXPECT_EQ(absl::StartsWith(c.name, "schedule "),
              GroupUsageText("schedule").find(absl::StrCat("\n  ", c.synopsis, "\n")) !=
                  std::string::npos)
        << c.name;
  }
}

TEST(CtlParse, SuccessPolicies) {
  v1::Replicas r;
  ASSERT_TRUE(ParseSuccess("all", &r).ok());
  EXPECT_EQ(r.success(), v1::SUCCESS_POLICY_ALL);
  ASSERT_TRUE(ParseSuccess("any", &r).ok());
  EXPECT_EQ(r.success(), v1::SUCCESS_POLICY_ANY);
  EXPECT_EQ(r.quorum(), 0);
  ASSERT_TRUE(ParseSuccess("quorum:2", &r).ok());
  EXPECT_EQ(r.success(), v1::SUCCESS_POLICY_QUORUM);
  EXPECT_EQ(r.quorum(), 2);
  // Back to any: no quorum left behind (the scheduler refuses one without
  // SUCCESS_POLICY_QUORUM).
  ASSERT_TRUE(ParseSuccess("any", &r).ok());
  EXPECT_EQ(r.quorum(), 0);
}

TEST(CtlParse, BadSuccessPoliciesNameTheFlag) {
  for (const char* bad : {"", "ALL", "majority", "quorum", "quorum:", "quorum:0", "quorum:-1",
                          "quorum:two", "quorum:2x", "quorum:99999999999", "any:2"}) {
    SCOPED_TRACE(bad);
    v1::Replicas r;
    const absl::Status s = ParseSuccess(bad, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("--success"));
    EXPECT_EQ(r.success(), v1::SUCCESS_POLICY_UNSPECIFIED);
  }
  v1::Replicas r;
  EXPECT_THAT(std::string(ParseSuccess("quorum", &r).message()), ::testing::HasSubstr("quorum:K"));
  EXPECT_THAT(std::string(ParseSuccess("most", &r).message()),
              ::testing::HasSubstr("all, any or quorum:K, not \"most\""));
}

// --- logs ---

using Chunk = v1::StreamTaskOutputResponse;

Chunk Started(int32_t attempt, const std::string& agent, const std::string& note = "") {
  Chunk c;
  c.set_kind(Chunk::KIND_ATTEMPT_STARTED);
  c.set_attempt(attempt);
  c.set_agent_id(agent);
  c.set_note(note);
  return c;
}
Chunk Data(int32_t attempt, v1::OutputStream s, int64_t offset, const std::string& data) {
  Chunk c;
  c.set_kind(Chunk::KIND_OUTPUT);
  c.set_attempt(attempt);
  c.set_stream(s);
  c.set_offset(offset);
  c.set_data(data);
  return c;
}
Chunk Ended(int32_t attempt, const std::string& agent, v1::Outcome outcome) {
  Chunk c;
  c.set_kind(Chunk::KIND_ATTEMPT_ENDED);
  c.set_attempt(attempt);
  c.set_agent_id(agent);
  c.set_outcome(outcome);
  return c;
}
Chunk End(v1::TaskState state, const std::string& note = "") {
  Chunk c;
  c.set_kind(Chunk::KIND_END);
  c.set_state(state);
  c.set_note(note);
  return c;
}

TEST(CtlLogs, EachStreamGoesToItsOwnAndGapsAreMarkedOnTheirLine) {
  std::ostringstream out, err;
  LogPrinter p(out, err, "t", /*follow=*/false);
  p.Print(Started(1, "a1"));
  p.Print(Data(1, v1::OUTPUT_STREAM_STDOUT, 0, "one\n"));
  p.Print(Data(1, v1::OUTPUT_STREAM_STDERR, 0, "warn\n"));
  p.Print(Data(1, v1::OUTPUT_STREAM_STDOUT, 4, "two, no newline"));
  // 100 bytes went missing in the middle of a line.
  p.Print(Data(1, v1::OUTPUT_STREAM_STDOUT, 119, "three\n"));
  p.Print(End(v1::TASK_STATE_RUNNING));
  EXPECT_EQ(out.str(), "one\ntwo, no newline\n[... 100 bytes not shown ...]\nthree\n");
  EXPECT_EQ(err.str(), "warn\n") << "the first attempt needs no header; RUNNING is no news";
  EXPECT_TRUE(p.ended());
  EXPECT_EQ(p.final_state(), v1::TASK_STATE_RUNNING);

  // A finished task's tail that does not start at 0 says what it left out.
  std::ostringstream out2, err2;
  LogPrinter tail(out2, err2, "t", false);
  tail.Print(Data(3, v1::OUTPUT_STREAM_STDOUT, 5000, "end\n"));
  EXPECT_EQ(out2.str(), "[... 5000 bytes not shown ...]\nend\n");
}

TEST(CtlLogs, AttemptsAndTheEndAreSaidOnStderr) {
  std::ostringstream out, err;
  LogPrinter p(out, err, "job-7", /*follow=*/true);
  p.Print(Started(1, "a1"));
  p.Print(Data(1, v1::OUTPUT_STREAM_STDERR, 0, "half a line"));
  p.Print(Ended(1, "a1", v1::OUTCOME_LOST));
  p.Print(Started(2, "a2"));
  // A new attempt starts at offset 0 again: no gap.
  p.Print(Data(2, v1::OUTPUT_STREAM_STDOUT, 0, "again\n"));
  p.Print(Ended(2, "a2", v1::OUTCOME_FAILED));
  p.Print(Started(3, "py", "agent py does not send live output"));
  p.Print(Ended(3, "py", v1::OUTCOME_SUCCEEDED));
  p.Print(End(v1::TASK_STATE_SUCCEEDED));
  EXPECT_EQ(out.str(), "again\n");
  EXPECT_EQ(err.str(),
            "half a line\n"
            "--- attempt 1 on agent a1 ended: LOST ---\n"
            "--- attempt 2 on agent a2 ---\n"
            "--- attempt 2 on agent a2 ended: FAILED ---\n"
            "--- attempt 3 on agent py: agent py does not send live output ---\n");

  std::ostringstream out2, err2;
  LogPrinter failed(out2, err2, "job-7", /*follow=*/true);
  failed.Print(End(v1::TASK_STATE_CANCELLED));
  EXPECT_EQ(err2.str(), "--- job-7 CANCELLED ---\n");
  std::ostringstream out3, err3;
  LogPrinter waiting(out3, err3, "later", /*follow=*/false);
  waiting.Print(End(v1::TASK_STATE_PENDING, "not started yet: no output"));
  EXPECT_EQ(err3.str(), "--- later is PENDING: not started yet: no output ---\n");
}

TEST(CtlParse, OutputStreams) {
  EXPECT_EQ(*ParseOutputStream(""), v1::OUTPUT_STREAM_UNSPECIFIED);
  EXPECT_EQ(*ParseOutputStream("stdout"), v1::OUTPUT_STREAM_STDOUT);
  EXPECT_EQ(*ParseOutputStream("stderr"), v1::OUTPUT_STREAM_STDERR);
  EXPECT_THAT(std::string(ParseOutputStream("both").status().message()),
              ::testing::HasSubstr("--stream must be stdout or stderr"));
}

}  // namespace
}  // namespace taskgrid::ctl
