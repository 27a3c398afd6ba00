// The counters of TaskCounters: what each transition and each ended
// attempt adds.

#include "scheduler/core/metrics.h"

#include <algorithm>

#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

void TaskCounters::CountTransition(const TaskRecord& t, v1::TaskState from, v1::TaskState to,
                                   absl::Time now) {
  if (from == v1::TASK_STATE_UNSPECIFIED) ++submitted;
  if (IsInFlight(to) && !IsInFlight(from)) ++dispatched;
  // Attempt numbers are never reused, so attempt 1 is the task's first.
  if (to == v1::TASK_STATE_RUNNING && from != v1::TASK_STATE_RUNNING && t.attempt == 1) {
    start_latency.Observe(std::max(0.0, absl::ToDoubleSeconds(now - t.create_time)));
  }
  if (IsTerminal(to) && !IsTerminal(from)) ++ended[to];
}

void TaskCounters::CountAttemptEnd(const TaskRecord& t, absl::Time now) {
  if (t.start_time == absl::InfinitePast()) return;  // never started (a chain link)
  run_time.Observe(std::max(0.0, absl::ToDoubleSeconds(now - t.start_time)));
}

}  // namespace taskgrid::core
