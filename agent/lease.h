// Self-fencing: when an agent must stop its running tasks because the
// scheduler may have given them to another agent. A pure function of the
// messages and the times they passed (monotonic durations the caller
// reads from its clock), so its rules are tested without a clock or a
// stream. Not thread-safe: the Agent holds its mutex around it.
//
// With a scheduler that grants a lease (Welcome.heartbeat_lease): the
// Welcome answers the Hello, and each HeartbeatAck answers the oldest
// unanswered Heartbeat of the stream, in order; each answer lets the
// tasks run until that message's send time + the lease. A stream that
// ends cuts this to stop_on_lost_after from then (the scheduler may have
// seen it end too, and moves the tasks after its grace).
// Without a lease (an older scheduler), or with a fixed stop_on_lost_after
// of the agent's own: no message from the scheduler for that long.
//
// A restart of the scheduler is the exception (Welcome.restart_grace):
// after a stream that had its Welcome ended, while the tries to reach the
// scheduler are refused (its host answers, nothing listens: the process is
// gone, being restarted or upgraded) and nothing rules a restart out, the
// tasks run on until the stream's end + the restart grace - 1 s: the
// restarted scheduler keeps every attempt in flight for the restart grace
// from when it is back, which is later. Anything that says the scheduler
// is not restarting (no answer at all, our own silence watchdog, a
// scheduler that answers but does not welcome) ends that hold, and the
// usual rule applies again, counted from the stream's end as before.
#pragma once

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/time/time.h"

namespace taskgrid::agent {

inline constexpr absl::Duration kDefaultStopOnLostAfter = absl::Seconds(4);
// Tasks held through a restart stop this much before the restart grace
// ends (as stop_on_lost_after is the reconnect grace less a second).
inline constexpr absl::Duration kRestartMargin = absl::Seconds(1);

class Lease {
 public:
  // `own_stop_on_lost_after`: the agent's --stop_on_lost_after (zero: the
  // scheduler's Welcome.stop_on_lost_after, else kDefaultStopOnLostAfter).
  explicit Lease(absl::Duration own_stop_on_lost_after)
      : own_stop_on_lost_after_(own_stop_on_lost_after) {}

  // A stream opened and its Hello went out at `now`.
  void HelloSent(absl::Duration now);
  // Anything arrived from the scheduler at `now`.
  void Heard(absl::Duration now) { last_heard_ = now; }
  // The Welcome: it answers the Hello (`now` if none is waiting).
  void Welcomed(absl::Duration now, absl::Duration stop_on_lost_after, absl::Duration lease);
  // A Heartbeat went out at `at`, or did not after all (not on a stream:
  // nothing will answer it).
  void HeartbeatSent(absl::Duration at) { unanswered_.push_back(at); }
  void HeartbeatNotSent(absl::Duration at);
  // A HeartbeatAck, maybe with a new lease (zero: the same).
  void HeartbeatAcked(absl::Duration lease);
  // The stream ended at `now`; `welcomed`: it had got its Welcome (then
  // an outage begins).
  void StreamEnded(absl::Duration now, bool welcomed);
  // Welcome.restart_grace (zero or less: no hold through restarts).
  void SetRestartGrace(absl::Duration grace);
  // During an outage: a try to reach the scheduler was refused, or
  // something ruled a restart out (see above). Outside one: no effect.
  void Refused();
  void RestartRuledOut();

  // Attempts an earlier agent kept for this one (agent/executor.h) are
  // this agent's until `until`, however long it takes to be welcomed: the
  // scheduler holds them longer. The first Welcome ends this.
  void KeptUntil(absl::Duration until) {
    kept_until_ = kept_until_.has_value() ? std::max(*kept_until_, until) : until;
  }

  // Running tasks must stop at this time.
  absl::Duration FenceAt() const {
    absl::Duration usual = ByLease() ? lease_until_ : last_heard_ + StopOnLostAfter();
    if (kept_until_.has_value()) usual = std::max(usual, *kept_until_);
    return HoldingForRestart() ? std::max(usual, *outage_start_ + restart_grace_ - kRestartMargin)
                               : usual;
  }
  // The tasks are held through what looks like a restart of the scheduler.
  bool HoldingForRestart() const {
    return outage_start_.has_value() && refused_ && !ruled_out_ && restart_grace_ > kRestartMargin;
  }
  // When the outage began (the welcomed stream ended), if one is on.
  std::optional<absl::Duration> outage_start() const { return outage_start_; }
  absl::Duration restart_grace() const { return restart_grace_; }
  // The lease decides (else the silence since last_heard()).
  bool ByLease() const {
    return lease_ > absl::ZeroDuration() && own_stop_on_lost_after_ <= absl::ZeroDuration();
  }
  absl::Duration StopOnLostAfter() const;
  absl::Duration last_heard() const { return last_heard_; }
  // When the oldest Hello or Heartbeat of the live stream that no answer
  // has come for went out, if any.
  std::optional<absl::Duration> OldestUnanswered() const {
    if (unanswered_.empty()) return std::nullopt;
    return unanswered_.front();
  }

 private:
  std::optional<absl::Duration> TakeUnanswered();

  const absl::Duration own_stop_on_lost_after_;
  absl::Duration welcome_stop_on_lost_after_ = absl::ZeroDuration();
  absl::Duration last_heard_ = absl::ZeroDuration();
  absl::Duration lease_ = absl::ZeroDuration();  // zero: the scheduler grants none
  absl::Duration lease_until_ = absl::ZeroDuration();
  // When each Hello or Heartbeat of the live stream not yet answered was
  // sent, oldest first.
  std::deque<absl::Duration> unanswered_;
  absl::Duration restart_grace_ = absl::ZeroDuration();
  // From the end of a welcomed stream to the next Welcome.
  std::optional<absl::Duration> outage_start_;
  bool refused_ = false;                      // this outage: a try was refused
  bool ruled_out_ = false;                    // this outage: something said no restart
  std::optional<absl::Duration> kept_until_;  // until the first Welcome
};

}  // namespace taskgrid::agent
