// The transition table (README, "What happens to a task"). Scheduler::Transition is the
// one function that changes a task's state, and it asks this table first.
//
// TASK_STATE_UNSPECIFIED stands for "not yet submitted" as a from-state.
#pragma once

#include <string>

#include "absl/status/status.h"
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

}  // namespace taskgrid::core
