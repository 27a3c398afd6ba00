// DrainPlan: how an agent stops taking work and then leaves, as a function
// of the times it is told (monotonic durations the caller reads from its
// clock), so its rules are tested without a clock, threads or a stream.
// Not thread-safe: the agent holds its mutex around it.
//
//   StopTakingWork(): no more work (the scheduler's Drain, SIGTSTP).
//   TakeWorkAgain(): undoes it (the scheduler's Undrain), unless leaving.
//   Begin(now, timeout): also leave (SIGTERM: timeout; Stop(): zero).
//     Tasks still running at now + timeout are released (ReleaseDue);
//     a later Begin may only bring that forward.
//   The agent may go (Complete) once every task ended and every Result or
//   Release is acknowledged, or at the exit deadline: the release deadline
//   + kill_grace + stop_flush, or stop_flush after the last task ended.
//   Then it says Goodbye on a live stream, and the stream ends when the
//   scheduler closes it or kGoodbyeWait later.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace taskgrid::agent {

// How long a Goodbye waits for the scheduler to close the stream.
inline constexpr absl::Duration kGoodbyeWait = absl::Seconds(2);

class DrainPlan {
 public:
  // `kill_grace`: how long a cancelled task may take to end; `stop_flush`:
  // how long to wait for the last acknowledgements once the tasks ended.
  DrainPlan(absl::Duration kill_grace, absl::Duration stop_flush)
      : kill_grace_(kill_grace), stop_flush_(stop_flush) {}

  // True the first time (the caller says Draining to the scheduler).
  bool StopTakingWork();
  // Work again after StopTakingWork; false (nothing changes) once the
  // agent is leaving (Begin).
  bool TakeWorkAgain();
  // Drain with `timeout` (negative: zero) from `now`; `no_tasks`: no task
  // thread is left. True when the running tasks must be released now.
  bool Begin(absl::Duration now, absl::Duration timeout, bool no_tasks);
  // The last task thread ended at `now`.
  void TasksEnded(absl::Duration now);
  // True once, when the release deadline has passed at `now`.
  bool ReleaseDue(absl::Duration now);
  // The agent may go: `handed_over` (every task ended and acknowledged) or
  // the exit deadline passed.
  bool Complete(absl::Duration now, bool handed_over) const {
    return exiting_ && (handed_over || now >= exit_deadline_);
  }
  // At `now`, with the drain complete: true once, when a Goodbye should go
  // out on the live stream (`handed_over` only: a Goodbye says nothing is
  // left here).
  bool GoodbyeDue(absl::Duration now, bool handed_over);
  // A Goodbye went out and the scheduler may still close the stream itself.
  bool AwaitingClose(absl::Duration now) const { return goodbye_sent_ && now < goodbye_deadline_; }

  // The earliest deadline still ahead (release or exit), or infinity.
  absl::Duration NextDeadline() const;
  // Why the running tasks were released ("agent drained: 30s passed").
  std::string ReleaseNote() const;

  bool draining() const { return draining_; }
  bool exiting() const { return exiting_; }
  bool released() const { return released_; }
  absl::Duration timeout() const { return timeout_; }
  absl::Duration goodbye_deadline() const { return goodbye_deadline_; }

 private:
  const absl::Duration kill_grace_;
  const absl::Duration stop_flush_;
  bool draining_ = false;  // takes no more work
  bool exiting_ = false;   // Begin() was called
  absl::Duration release_at_ = absl::InfiniteDuration();
  absl::Duration timeout_ = absl::InfiniteDuration();  // for the Release reason
  bool released_ = false;                              // the running tasks were released
  absl::Duration exit_deadline_ = absl::InfiniteDuration();
  bool goodbye_sent_ = false;
  absl::Duration goodbye_deadline_ = absl::InfiniteDuration();
};

// "30s", "1.5s", "0s" (absl says "0").
std::string DurationText(absl::Duration d);

}  // namespace taskgrid::agent
