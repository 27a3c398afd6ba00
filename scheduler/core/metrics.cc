// The counters of TaskCounters: what each transition and each ended
// attempt adds.

#include "scheduler/core/metrics.h"

#include <algorithm>

#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

QueueCounters& TaskCounters::ForQueue(const std::string& queue) {
  if (auto it = by_queue.find(queue); it != by_queue.end()) return it->second;
  if (by_queue.size() >= kMaxQueues) return other;
  return by_queue[queue];
}

void TaskCounters::CountTransition(const TaskRecord& t, v1::TaskState from, v1::TaskState to,
                                   absl::Time now) {
  const bool made = from == v1::TASK_STATE_UNSPECIFIED;
  const bool handed_out = IsInFlight(to) && !IsInFlight(from);
  const bool ended_now = IsTerminal(to) && !IsTerminal(from);
  if (made || handed_out || ended_now) {
    QueueCounters& q = ForQueue(t.queue());
    if (made) {
      ++submitted;
      ++q.submitted;
    }
    if (handed_out) {
      ++dispatched;
      ++q.dispatched;
    }
    if (ended_now) {
      ++ended[to];
      ++q.ended[to];
    }
  }
  if (to == v1::TASK_STATE_RUNNING && from != v1::TASK_STATE_RUNNING) {
    if (t.ready_time != absl::InfinitePast()) {
      start_latency.Observe(std::max(0.0, absl::ToDoubleSeconds(now - t.ready_time)));
    }
    // Attempt numbers are never reused, so attempt 1 is the task's first.
    if (t.attempt == 1) {
      submit_to_start.Observe(std::max(0.0, absl::ToDoubleSeconds(now - t.create_time)));
    }
  }
}

void TaskCounters::CountAttemptEnd(const TaskRecord& t, absl::Time now) {
  if (t.start_time == absl::InfinitePast()) return;  // never started (a chain link)
  run_time.Observe(std::max(0.0, absl::ToDoubleSeconds(now - t.start_time)));
}

}  // namespace taskgrid::core
