#include "agent/lease.h"

#include <algorithm>

namespace taskgrid::agent {

void Lease::HelloSent(absl::Duration now) { unanswered_.assign(1, now); }

void Lease::Welcomed(absl::Duration now, absl::Duration stop_on_lost_after, absl::Duration lease) {
  outage_start_.reset();
  kept_until_.reset();
  welcome_stop_on_lost_after_ = std::max(stop_on_lost_after, absl::ZeroDuration());
  lease_ = std::max(lease, absl::ZeroDuration());
  lease_until_ = TakeUnanswered().value_or(now) + lease_;
}

void Lease::HeartbeatNotSent(absl::Duration at) {
  auto it = std::find(unanswered_.begin(), unanswered_.end(), at);
  if (it != unanswered_.end()) unanswered_.erase(it);
}

void Lease::HeartbeatAcked(absl::Duration lease) {
  // Acks come in the order of the heartbeats: this one answers the oldest
  // unanswered. (None: an ack nothing asked for, which extends nothing.)
  const std::optional<absl::Duration> sent = TakeUnanswered();
  if (!sent.has_value()) return;
  if (lease > absl::ZeroDuration()) lease_ = lease;
  if (lease_ > absl::ZeroDuration()) lease_until_ = std::max(lease_until_, *sent + lease_);
}

void Lease::StreamEnded(absl::Duration now, bool welcomed) {
  unanswered_.clear();
  if (welcomed) {
    outage_start_ = now;
    refused_ = false;
    ruled_out_ = false;
  }
  if (welcomed && lease_ > absl::ZeroDuration()) {
    lease_until_ = std::min(lease_until_, now + StopOnLostAfter());
  }
}

void Lease::SetRestartGrace(absl::Duration grace) {
  restart_grace_ = std::max(grace, absl::ZeroDuration());
}

void Lease::Refused() {
  if (outage_start_.has_value()) refused_ = true;
}

void Lease::RestartRuledOut() {
  if (outage_start_.has_value()) ruled_out_ = true;
}

absl::Duration Lease::StopOnLostAfter() const {
  if (own_stop_on_lost_after_ > absl::ZeroDuration()) return own_stop_on_lost_after_;
  if (welcome_stop_on_lost_after_ > absl::ZeroDuration()) return welcome_stop_on_lost_after_;
  return kDefaultStopOnLostAfter;
}

std::optional<absl::Duration> Lease::TakeUnanswered() {
  if (unanswered_.empty()) return std::nullopt;
  const absl::Duration sent = unanswered_.front();
  unanswered_.pop_front();
  return sent;
}

}  // namespace taskgrid::agent
