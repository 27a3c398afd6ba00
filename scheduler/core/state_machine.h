// The transition table (docs/tasks.md, "What happens to a task"). Scheduler::Transition is the
// one function that changes a task's state, and it asks this table first.
//
// TASK_STATE_UNSPECIFIED stands for "not yet submitted" as a from-state.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::core {

using v1::TaskState;

bool IsTerminal(TaskState s);

// True while an agent holds a live attempt (DISPATCHED, RUNNING, CANCELLING).
bool IsInFlight(TaskState s);

bool IsAllowedTransition(TaskState from, TaskState to);

// "PENDING" for TASK_STATE_PENDING.
std::string StateName(TaskState s);

// Accepts "PENDING", "pending" and "TASK_STATE_PENDING".
bool ParseStateName(const std::string& name, TaskState* out);

// The names people read and type for the API's other states: "RUNNING"
// for JOB_STATE_RUNNING, "LOST" for AGENT_STATE_LOST; "-" for unspecified.
std::string JobStateName(v1::JobState s);
std::string AgentStateName(v1::AgentState s);
// Accepts "RUNNING", "running" and "JOB_STATE_RUNNING".
bool ParseJobStateName(absl::string_view name, v1::JobState* out);
// Every task (job) state name, space-separated, in enum order.
std::string AllStateNames();
std::string AllJobStateNames();

}  // namespace taskgrid::core
