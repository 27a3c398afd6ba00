// The builtin steps of task.proto's BuiltinStep, run inside the agent
// process. Internal to the executor (TaskRun::Run's thread). Their names
// and argument rules are in common/builtins.h.
#pragma once

#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/process.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::agent::internal {

struct BuiltinResult {
  // kNone when the builtin ran to its end; else what cut it short (and the
  // rest is meaningless).
  StopReason stopped_by = StopReason::kNone;
  int exit_code = 0;
  std::string error;   // readable, non-empty when the step failed
  std::string output;  // what it wrote to stdout
};

// Sleeps for the given time unless stopped first; returns what stopped it,
// or kNone when the whole time passed.
using SleepFn = std::function<StopReason(absl::Duration)>;

// True when the builtin returns at once whatever its arguments (every one
// but sleep): it never waits, so it may run on a thread that must not block.
bool IsInstantBuiltin(const taskgrid::v1::BuiltinStep& step);

// Runs builtin step number `index` (for messages). Unknown names and bad
// arguments fail with exit code -1 and a message naming them.
BuiltinResult RunBuiltin(const taskgrid::v1::BuiltinStep& step, int index,
                         absl::string_view stdin_data, const SleepFn& sleep);

}  // namespace taskgrid::agent::internal
