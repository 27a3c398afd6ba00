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

namespace {

absl::Time MinuteOf(absl::Time t) {
  return absl::FromUnixSeconds(absl::ToUnixSeconds(t) / 60 * 60);
}

}  // namespace

void QueueHistory::Sample(const TaskCounters& c, absl::Time now) {
  const absl::Time minute = MinuteOf(now);
  if (!snapshots_.empty() && snapshots_.back().minute >= minute) return;
  snapshots_.push_back(Snapshot{minute, c.by_queue});
  while (snapshots_.size() > static_cast<size_t>(kMinutes) + 1) snapshots_.pop_front();
}

void QueueHistory::Describe(const std::string& queue, const TaskCounters& c, absl::Time now,
                            google::protobuf::RepeatedPtrField<v1::QueueMinute>* out) const {
  auto current = c.by_queue.find(queue);
  if (current == c.by_queue.end()) return;
  static const QueueCounters kNone;
  auto at = [&](const Snapshot& s) -> const QueueCounters& {
    auto it = s.by_queue.find(queue);
    return it == s.by_queue.end() ? kNone : it->second;
  };
  const absl::Time first = MinuteOf(now) - absl::Minutes(kMinutes - 1);
  for (size_t i = 0; i < snapshots_.size(); ++i) {
    if (snapshots_[i].minute < first) continue;
    const QueueCounters& from = at(snapshots_[i]);
    const QueueCounters& to = i + 1 < snapshots_.size() ? at(snapshots_[i + 1]) : current->second;
    v1::QueueMinute* m = out->Add();
    const int64_t s = absl::ToUnixSeconds(snapshots_[i].minute);
    m->mutable_start_time()->set_seconds(s);
    m->set_submitted(to.submitted - from.submitted);
    m->set_dispatched(to.dispatched - from.dispatched);
    m->set_succeeded(to.ended[v1::TASK_STATE_SUCCEEDED] - from.ended[v1::TASK_STATE_SUCCEEDED]);
    m->set_failed(to.ended[v1::TASK_STATE_FAILED] - from.ended[v1::TASK_STATE_FAILED]);
    m->set_cancelled(to.ended[v1::TASK_STATE_CANCELLED] - from.ended[v1::TASK_STATE_CANCELLED]);
  }
}

}  // namespace taskgrid::core
