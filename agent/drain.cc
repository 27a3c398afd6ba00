#include "agent/drain.h"

#include <algorithm>

namespace taskgrid::agent {

std::string DurationText(absl::Duration d) {
  return d == absl::ZeroDuration() ? "0s" : absl::FormatDuration(d);
}

bool DrainPlan::StopTakingWork() {
  if (draining_) return false;
  draining_ = true;
  return true;
}

bool DrainPlan::TakeWorkAgain() {
  if (exiting_) return false;
  draining_ = false;
  return true;
}

bool DrainPlan::Begin(absl::Duration now, absl::Duration timeout, bool no_tasks) {
  timeout = std::max(timeout, absl::ZeroDuration());
  draining_ = true;
  exiting_ = true;
  if (!released_ && now + timeout < release_at_) {
    release_at_ = now + timeout;
    timeout_ = timeout;
    exit_deadline_ = std::min(exit_deadline_, release_at_ + kill_grace_ + stop_flush_);
  }
  if (no_tasks) exit_deadline_ = std::min(exit_deadline_, now + stop_flush_);
  return ReleaseDue(now);
}

void DrainPlan::TasksEnded(absl::Duration now) {
  if (exiting_) exit_deadline_ = std::min(exit_deadline_, now + stop_flush_);
}

bool DrainPlan::ReleaseDue(absl::Duration now) {
  if (!exiting_ || released_ || now < release_at_) return false;
  released_ = true;
  return true;
}

bool DrainPlan::GoodbyeDue(absl::Duration now, bool handed_over) {
  if (goodbye_sent_ || !handed_over) return false;
  goodbye_sent_ = true;
  goodbye_deadline_ = now + kGoodbyeWait;
  return true;
}

absl::Duration DrainPlan::NextDeadline() const {
  absl::Duration next = exit_deadline_;
  if (exiting_ && !released_) next = std::min(next, release_at_);
  return next;
}

std::string DrainPlan::ReleaseNote() const {
  return "agent drained: " + DurationText(timeout_) + " passed";
}

}  // namespace taskgrid::agent
