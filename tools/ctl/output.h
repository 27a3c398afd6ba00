// What taskgridctl prints: padded tables, local times, and the detail view of
// one task. Pure formatting over proto values (no gRPC), so every function
// returns text and the caller decides where it goes.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/schedule_service.pb.h"
#include "taskgrid/v1/task.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::ctl {

// Columns padded to their widest cell (counted in UTF-8 code points), two
// spaces apart, header as given (callers pass capitals). Newlines and tabs in
// cells become spaces so one row stays one line.
class Table {
 public:
  explicit Table(std::vector<std::string> header);

  void AddRow(std::vector<std::string> row);
  bool empty() const { return rows_.empty(); }
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// proto3 JSON, snake_case names, every field printed (zeros too), ending in a
// newline.
std::string ToJson(const google::protobuf::Message& m);

// The same on one line (JSON lines): no whitespace, ending in a newline.
std::string ToJsonLine(const google::protobuf::Message& m);

// Local time in RFC 3339 without fractional seconds; "-" when unset.
std::string FormatTime(const google::protobuf::Timestamp& ts);

// "SUCCEEDED" for OUTCOME_SUCCEEDED; "-" for OUTCOME_UNSPECIFIED.
std::string OutcomeName(v1::Outcome o);

// "1/3": attempts that counted against max_attempts, of those allowed.
// The attempt number itself may be higher (paused or drained attempts).
std::string AttemptsText(const v1::Task& t);

// The state for people: PAUSING while a pause waits for the agent to stop
// the live attempt, else the state's name.
std::string TaskStateText(const v1::Task& t);

// `s` cut to at most `max` code points, ending in "..." when cut.
std::string Shorten(const std::string& s, size_t max);

// One line of `watch` (no newline):
//   REVISION  TIME  TASK  FROM -> TO  attempt N  agent A  reason
// FROM is "-" for a new task, A "-" when no agent holds the task; the reason
// (one line) only when there is one.
std::string FormatEvent(const v1::TaskEvent& ev);

// One line of `wait` (no newline): "ID STATE", and for a finished task that
// did not succeed its reason (one line) two spaces after, so that ID and
// STATE stay the first two words.
std::string FormatWaitLine(const v1::Task& t, bool done);

// The table of `submit`: ID, QUEUE, STATE.
std::string FormatSubmitted(const v1::SubmitTasksResponse& resp);

// The table of `list`.
std::string FormatTaskList(const std::vector<v1::Task>& tasks);

// The table of `stats`.
std::string FormatStats(const v1::GetQueueStatsResponse& resp);
// A queue's controls: "paused, 5 at once, 10/s burst 20"; "" for none.
std::string QueueControlsText(const v1::QueueSettings& s);
// "cancelled N tasks", and "skipped M: REASON" when some were.
std::string FormatBulk(absl::string_view verb, const v1::BulkTasksResponse& resp);

// The detail view of `get`: fields, result with output tails, attempts table
// (an interrupted attempt's outcome reads e.g. "CANCELLED (interrupted)").
std::string FormatTaskDetail(const v1::Task& t);

// `board claim`: ID, ATTEMPT (the fencing token later calls name), EXPIRES
// and the steps of each claimed task, or "no task to claim".
std::string FormatClaims(const v1::ClaimResponse& resp);

// How long before `now` `then` was: "0.4s ago", "12s ago", "3m05s ago",
// "2h10m ago"; "-" when `then` is unset (InfinitePast). A `then` after `now`
// (clocks apart) reads "0.0s ago".
std::string FormatAgo(absl::Time then, absl::Time now);

// An agent's note, and when its tasks move unless it is back (a LOST agent
// within its grace).
std::string AgentNoteText(const v1::Agent& a, absl::Time now);
// The table of `agents`: ID, STATE, SLOTS, RESOURCES, RUNNING, LABELS,
// LAST HEARTBEAT, VERSION, NOTE, ages counted from `now`.
std::string FormatAgents(const v1::ListAgentsResponse& resp, absl::Time now);

// The key/value view of `cluster`: agents by state, slots, stale messages,
// the non-zero task counts in TaskState order.
std::string FormatClusterStats(const v1::ClusterStats& stats);

// A job's task counts in TaskState order, e.g. "SUCCEEDED 3, RUNNING 1"
// (states with no task left out); "-" when there are none.
std::string FormatJobCounts(const v1::Job& job);

// One line (no newline) for job submit, cancel, retry and the end of
// job submit --wait: "ID STATE  N tasks: COUNTS".
std::string FormatJobSummary(const v1::Job& job);

// The header of `job get`: ID, state, tasks with their counts, times.
std::string FormatJobDetail(const v1::Job& job);

// The table of `job list`: ID, STATE, TASKS, COUNTS, CREATED, UPDATED.
std::string FormatJobList(const std::vector<v1::Job>& jobs);

// A schedule's trigger: "0 3 * * * (Europe/Berlin)" or "every 1m".
std::string FormatTrigger(const v1::Schedule& s);

// A misfire policy as `schedule get` shows it: CATCH_UP, SKIP, RUN_ONCE.
std::string MisfireText(v1::MisfirePolicy p);

// One line (no newline) for schedule create, pause and resume:
// "ID ACTIVE|PAUSED  next fire TIME" ("-" while paused).
std::string FormatScheduleSummary(const v1::Schedule& s);

// The key/value view of `schedule get`.
std::string FormatScheduleDetail(const v1::Schedule& s);

// The table of `schedule list`: ID, STATE, TRIGGER, NEXT FIRE, LAST TASK,
// FIRES, LAST ERROR.
std::string FormatScheduleList(const std::vector<v1::Schedule>& schedules);

}  // namespace taskgrid::ctl
