// What the Scheduler counts for the /metrics page: plain integers and
// histograms bumped as tasks move (the Scheduler is single-threaded, under
// the Engine's mutex), and the snapshot Scheduler::Metrics() returns,
// O(queues + agents) to take, never O(tasks).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/histogram.h"
#include "scheduler/core/model.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::core {

// One queue's part of TaskCounters.
struct QueueCounters {
  int64_t submitted = 0;
  int64_t dispatched = 0;
  std::array<int64_t, kNumTaskStates> ended{};
};

// Since the process started (a restore counts nothing).
struct TaskCounters {
  // Tasks made by a submit (replicas included; a submit merged into a task
  // or repeating an existing one makes none).
  int64_t submitted = 0;
  // Attempts handed out: dispatched to an agent or claimed by a worker.
  int64_t dispatched = 0;
  // Tasks that reached each terminal state (by state number).
  std::array<int64_t, kNumTaskStates> ended{};
  // Seconds from when a task became ready to run (PENDING: past its
  // not_before, its dependencies and any retry backoff) to the start of
  // the attempt it got then, for every attempt: the scheduler's and the
  // fleet's part of the wait, not the one the task asked for.
  Histogram start_latency{LatencyBounds()};
  // Seconds from submit to the start of the task's first attempt, delays
  // asked for included.
  Histogram submit_to_start{LatencyBounds()};
  // Seconds from the start of an attempt to its end (attempts that started).
  Histogram run_time{RunTimeBounds()};
  // Fires of schedules that did not run (their misfire policy after an
  // outage, or a stall that left only the latest to fire).
  int64_t schedule_fires_skipped = 0;
  // Fires of schedules that made their task, and fires whose submit was
  // refused (a full queue, a spec the scheduler no longer accepts).
  int64_t schedule_fires = 0;
  int64_t schedule_fires_refused = 0;
  // Seconds from a fire's time to when its task was made: the timer's and
  // the tick's delay (a fire made up after an outage counts its wait).
  Histogram schedule_fire_lag{LatencyBounds()};
  // submitted, dispatched and ended by queue: the first kMaxQueues queues
  // to count something have their own; any later one counts in `other`
  // (shown as kOtherQueues, which no queue can be named: names have no
  // parentheses), so the series /metrics shows stay bounded however many
  // queues come and go.
  static constexpr size_t kMaxQueues = 200;
  static constexpr char kOtherQueues[] = "(other)";
  absl::flat_hash_map<std::string, QueueCounters> by_queue;
  QueueCounters other;
  QueueCounters& ForQueue(const std::string& queue);

  // 1 ms to ~4.4 min, doubling: a dispatch on a loaded machine up to a
  // backlog of minutes.
  static std::vector<double> LatencyBounds() { return Histogram::ExponentialBounds(0.001, 2, 19); }
  // 10 ms to ~7.8 days, by 4: builtins to week-long batch jobs.
  static std::vector<double> RunTimeBounds() { return Histogram::ExponentialBounds(0.01, 4, 14); }

  // Transition's part: counts the move of `t` from `from` to `to` at `now`.
  void CountTransition(const TaskRecord& t, v1::TaskState from, v1::TaskState to, absl::Time now);
  // An attempt of `t` ends at `now` (before its start time is cleared).
  void CountAttemptEnd(const TaskRecord& t, absl::Time now);
};

// What each queue did minute by minute over the last hour, for charts:
// snapshots of TaskCounters' per-queue counters taken at the first Sample
// of each minute, kMinutes + 1 of them at most, so it stays bounded like
// the counters (kMaxQueues queues and `other`). Starts empty with the
// process, as the counters do.
class QueueHistory {
 public:
  static constexpr int kMinutes = 60;

  // Cheap unless a new minute began since the last call.
  void Sample(const TaskCounters& c, absl::Time now);
  // `queue`'s minutes within the last hour, oldest first; the newest is
  // counted up to `c` (the counters now). Nothing for a queue without its
  // own counters (none yet, or one of those past the cap).
  void Describe(const std::string& queue, const TaskCounters& c, absl::Time now,
                google::protobuf::RepeatedPtrField<v1::QueueMinute>* out) const;

 private:
  struct Snapshot {
    absl::Time minute;  // when it was taken, truncated to the minute
    absl::flat_hash_map<std::string, QueueCounters> by_queue;
  };
  std::deque<Snapshot> snapshots_;  // oldest first
};

struct SchedulerMetrics {
  // Stats(""): every queue that holds tasks or has a limit, by name.
  std::vector<v1::QueueStats> queues;
  // Per entry of `queues`: seconds since the oldest PENDING task was
  // submitted, 0 when none is PENDING.
  std::vector<double> oldest_pending_seconds;
  // ClusterStats(): agents by state, slots, stale messages refused.
  v1::ClusterStats cluster;
  TaskCounters counters;
  // Tasks whose records are in memory, finished tasks kept on disk only,
  // and finished tasks deleted since start-up (retention and deletes).
  int64_t tasks_in_memory = 0;
  int64_t tasks_on_disk = 0;
  int64_t tasks_deleted = 0;
};

}  // namespace taskgrid::core
