// Validation of client input (DESIGN.md invariant 7): every error is
// INVALID_ARGUMENT naming the field, e.g. "tasks[2].steps[0].exec.argv is
// empty". Pure functions; nothing here changes state.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "scheduler/core/options.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::core {

// The builtin step names agents provide.
bool IsKnownBuiltin(absl::string_view name);

// Checks one spec; `field` prefixes the messages (e.g. "tasks[3]").
// An empty id is allowed (the scheduler generates one).
absl::Status ValidateSpec(const v1::TaskSpec& spec, const SchedulerOptions& opts,
                          absl::string_view field);

}  // namespace taskgrid::core
