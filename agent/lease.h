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
#pragma once

#include <deque>
#include <optional>

#include "absl/time/time.h"

namespace taskgrid::agent {

inline constexpr absl::Duration kDefaultStopOnLostAfter = absl::Seconds(4);

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
  // The stream ended at `now`; `welcomed`: it had got its Welcome.
  void StreamEnded(absl::Duration now, bool welcomed);

  // Running tasks must stop at this time.
  absl::Duration FenceAt() const {
    return ByLease() ? lease_until_ : last_heard_ + StopOnLostAfter();
  }
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
};

}  // namespace taskgrid::agent
