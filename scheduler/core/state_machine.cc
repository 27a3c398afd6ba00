#include "scheduler/core/state_machine.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace taskgrid::core {

using v1::TaskState;

bool IsTerminal(TaskState s) {
  return s == v1::TASK_STATE_SUCCEEDED || s == v1::TASK_STATE_FAILED ||
         s == v1::TASK_STATE_CANCELLED || s == v1::TASK_STATE_TRASHED;
}

bool IsInFlight(TaskState s) {
  return s == v1::TASK_STATE_DISPATCHED || s == v1::TASK_STATE_RUNNING ||
         s == v1::TASK_STATE_CANCELLING;
}

bool IsAllowedTransition(TaskState from, TaskState to) {
  using namespace v1;  // NOLINT: the table reads better with bare names
  switch (from) {
    case TASK_STATE_UNSPECIFIED:  // submit
      return to == TASK_STATE_PENDING || to == TASK_STATE_SCHEDULED || to == TASK_STATE_BLOCKED;
    // Waiting states may also expire before start (schedule_timeout): FAILED.
    case TASK_STATE_BLOCKED:
      // Dependencies met: ready (or not_before ahead). A chain link goes
      // to its agent together with its predecessor. An upstream task
      // failed: CANCELLED. A task with replicas ends as they do:
      // SUCCEEDED or FAILED.
      return to == TASK_STATE_PENDING || to == TASK_STATE_SCHEDULED ||
             to == TASK_STATE_DISPATCHED || to == TASK_STATE_CANCELLED || to == TASK_STATE_PAUSED ||
             to == TASK_STATE_FAILED || to == TASK_STATE_SUCCEEDED;
    case TASK_STATE_SCHEDULED:
    case TASK_STATE_PENDING:
      // BLOCKED again when a dependency is reset or retried before it ran.
      // A pull worker's claim starts an attempt at once: PENDING -> RUNNING.
      return to == TASK_STATE_CANCELLED || to == TASK_STATE_PAUSED || to == TASK_STATE_FAILED ||
             to == TASK_STATE_BLOCKED ||
             (from == TASK_STATE_PENDING ? to == TASK_STATE_DISPATCHED || to == TASK_STATE_RUNNING
                                         : to == TASK_STATE_PENDING);
    case TASK_STATE_DISPATCHED:
      // Accepted; or the hand-over failed (ack timeout, agent lost, rejected):
      // retry now, retry after backoff, or attempts used up; or cancel; or a
      // pause interrupted it. BLOCKED: a chain link whose predecessor did
      // not succeed, or a task whose dependency was reset meanwhile.
      return to == TASK_STATE_RUNNING || to == TASK_STATE_PENDING || to == TASK_STATE_SCHEDULED ||
             to == TASK_STATE_FAILED || to == TASK_STATE_CANCELLING || to == TASK_STATE_PAUSED ||
             to == TASK_STATE_BLOCKED;
    case TASK_STATE_RUNNING:
      // TRASHED: the pull worker holding it put it aside.
      return to == TASK_STATE_SUCCEEDED || to == TASK_STATE_FAILED || to == TASK_STATE_PENDING ||
             to == TASK_STATE_SCHEDULED || to == TASK_STATE_CANCELLING || to == TASK_STATE_PAUSED ||
             to == TASK_STATE_BLOCKED || to == TASK_STATE_TRASHED;
    case TASK_STATE_CANCELLING:
      // The agent confirms (or its lease ends); a result that beat the cancel
      // to the agent still counts as a success.
      return to == TASK_STATE_CANCELLED || to == TASK_STATE_SUCCEEDED;
    case TASK_STATE_PAUSED:
      return to == TASK_STATE_PENDING || to == TASK_STATE_SCHEDULED || to == TASK_STATE_CANCELLED ||
             to == TASK_STATE_FAILED || to == TASK_STATE_BLOCKED;
    // Reset (any terminal state), retry (FAILED, CANCELLED) and restore
    // (TRASHED): ready, or waiting for dependencies, or for not_before.
    case TASK_STATE_SUCCEEDED:
    case TASK_STATE_FAILED:
    case TASK_STATE_CANCELLED:
    case TASK_STATE_TRASHED:
      return to == TASK_STATE_PENDING || to == TASK_STATE_BLOCKED || to == TASK_STATE_SCHEDULED;
    default:
      return false;
  }
}

std::string StateName(TaskState s) {
  const std::string& full = v1::TaskState_Name(s);
  constexpr absl::string_view kPrefix = "TASK_STATE_";
  if (absl::StartsWith(full, kPrefix)) return full.substr(kPrefix.size());
  return full.empty() ? "UNKNOWN" : full;
}

bool ParseStateName(const std::string& name, TaskState* out) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (!absl::StartsWith(upper, "TASK_STATE_")) upper = "TASK_STATE_" + upper;
  TaskState s;
  if (!v1::TaskState_Parse(upper, &s) || s == v1::TASK_STATE_UNSPECIFIED) return false;
  *out = s;
  return true;
}

std::string JobStateName(v1::JobState s) {
  if (s == v1::JOB_STATE_UNSPECIFIED) return "-";
  std::string name = v1::JobState_Name(s);
  if (absl::StartsWith(name, "JOB_STATE_")) name = name.substr(10);
  return name.empty() ? absl::StrCat(static_cast<int>(s)) : name;
}

std::string AgentStateName(v1::AgentState s) {
  if (s == v1::AGENT_STATE_UNSPECIFIED) return "-";
  std::string name = v1::AgentState_Name(s);
  if (absl::StartsWith(name, "AGENT_STATE_")) name = name.substr(12);
  return name.empty() ? absl::StrCat(static_cast<int>(s)) : name;
}

bool ParseJobStateName(absl::string_view name, v1::JobState* out) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (!absl::StartsWith(upper, "JOB_STATE_")) upper = absl::StrCat("JOB_STATE_", upper);
  v1::JobState s;
  if (!v1::JobState_Parse(upper, &s) || s == v1::JOB_STATE_UNSPECIFIED) return false;
  *out = s;
  return true;
}

std::string AllStateNames() {
  std::string out;
  for (int s = v1::TaskState_MIN; s <= v1::TaskState_MAX; ++s) {
    if (s == v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(s)) continue;
    absl::StrAppend(&out, out.empty() ? "" : " ", StateName(static_cast<TaskState>(s)));
  }
  return out;
}

std::string AllJobStateNames() {
  std::string out;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) continue;
    absl::StrAppend(&out, out.empty() ? "" : " ", JobStateName(static_cast<v1::JobState>(s)));
  }
  return out;
}

}  // namespace taskgrid::core
