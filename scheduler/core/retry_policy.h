// What follows a finished attempt, as a pure function of the task, how the
// attempt ended, and the time: success, the end of the task, or when it
// may run again. The Scheduler applies the answer (the state change, where
// the task waits); the rules live here alone.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "scheduler/core/model.h"
#include "scheduler/core/options.h"

namespace taskgrid::core {

// Attempts a task is allowed: its spec's, or the scheduler's default.
int32_t MaxAttemptsOf(const TaskRecord& t, const SchedulerOptions& opts);
// The wait before a retry of `t` whose attempt number `t.attempt` just
// failed: initial * multiplier^(failures since the base - 1), at most the
// max, less up to backoff_jitter of it. `u` is uniform in [0, 1].
absl::Duration BackoffOf(const TaskRecord& t, const SchedulerOptions& opts, double u);
// The first retry's wait (an agent's busy reject waits this long).
absl::Duration InitialBackoffOf(const TaskRecord& t, const SchedulerOptions& opts);

// How the attempt ended, beyond its result.
struct AttemptEnd {
  // Stopped by a pause, a drain or a reject: it does not count.
  bool interrupted = false;
  // A pause was waiting for this attempt to stop.
  bool pausing = false;
  // An interrupted task waits this long before it may run (zero: at once).
  absl::Duration requeue_after = absl::ZeroDuration();
  // Its schedule_timeout passed while the attempt was dispatched and it
  // never started: short of a success, the task fails (`expired_after`
  // is that timeout, for the reason).
  bool expired = false;
  absl::Duration expired_after = absl::ZeroDuration();
};

struct AfterAttempt {
  enum class Next {
    kSucceeded,
    kCancelled,
    kPaused,
    kFailed,
    // Waits again, not counted (interrupted): the caller says where.
    kRequeue,
    // Waits again to retry, counted.
    kRetry,
  };
  Next next;
  // kRequeue, kRetry: when it may run (InfinitePast: at once).
  absl::Time next_run_time = absl::InfinitePast();
  std::string reason;
};

// A running task being cancelled reads, while its agent stops it, why it
// is cancelled and whom it waits for ("cancel requested; waiting for agent
// a1", "not needed: task t succeeded; waiting for agent a1"); once
// stopped, why it was ("cancelled by request", "not needed: task t
// succeeded"). The reason is what carries the why across a restart.
std::string CancellingReason(const std::string& why, const std::string& agent_id);
std::string CancelledReason(const std::string& cancelling_reason);

// A failed result marked `permanent` ends the task FAILED whatever attempts
// are left, as does an exit code the retry policy calls not retryable.
// `t` has its history and result updated (t.result is the attempt's) and
// is still in its in-flight state (CANCELLING when a cancel waited for
// it). `what` names the attempt ("attempt 2 on agent a1"); `attempts_used`
// counts this one when it counts. `draw` gives the jitter's u, called only
// for a backed-off retry.
AfterAttempt DecideAfterAttempt(const TaskRecord& t, const std::string& what, const AttemptEnd& end,
                                int32_t attempts_used, const SchedulerOptions& opts, absl::Time now,
                                const std::function<double()>& draw);

}  // namespace taskgrid::core
