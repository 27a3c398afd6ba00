#include "scheduler/core/queue_controls.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace taskgrid::core {

absl::Status ValidateQueueLimits(const v1::SetQueueLimitsRequest& req) {
  if (req.max_concurrency() < 0 || req.max_concurrency() > kMaxQueueLimit) {
    return absl::InvalidArgumentError(absl::StrCat("max_concurrency: ", req.max_concurrency(),
                                                   " is out of range 0-", kMaxQueueLimit,
                                                   " (0: no limit)"));
  }
  const double rate = req.rate_per_second();
  if (!std::isfinite(rate) || rate < 0 || rate > kMaxQueueLimit) {
    return absl::InvalidArgumentError(absl::StrCat("rate_per_second: ", rate, " is out of range 0-",
                                                   kMaxQueueLimit, " (0: no limit)"));
  }
  if (rate > 0 && rate < 0.001) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate_per_second: ", rate, " is below the smallest rate, 0.001 per second"));
  }
  if (req.burst() < 0 || req.burst() > kMaxQueueLimit) {
    return absl::InvalidArgumentError(absl::StrCat("burst: ", req.burst(), " is out of range 0-",
                                                   kMaxQueueLimit, " (0: max(1, rate))"));
  }
  if (req.burst() > 0 && rate == 0) {
    return absl::InvalidArgumentError("burst: needs rate_per_second (a burst of what?)");
  }
  if (absl::StatusOr<Resources> quota = ParseResourceMap(req.quota()); !quota.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("quota: ", quota.status().message()));
  }
  return absl::OkStatus();
}

bool IsDefault(const v1::QueueSettings& s) {
  return !s.paused() && s.max_concurrency() == 0 && s.rate_per_second() == 0 && s.burst() == 0 &&
         !s.has_retention() && !s.has_failed_retention() && s.quota().empty() && !s.has_weight();
}

const Resources* QueueControls::QuotaOf(const std::string& queue) const {
  auto it = queues_.find(queue);
  return it == queues_.end() || it->second.quota.empty() ? nullptr : &it->second.quota;
}

const v1::QueueSettings* QueueControls::Find(const std::string& queue) const {
  auto it = queues_.find(queue);
  return it == queues_.end() ? nullptr : &it->second.settings;
}

double QueueControls::Burst(const v1::QueueSettings& s) {
  return s.burst() > 0 ? s.burst() : std::max(1.0, s.rate_per_second());
}

double QueueControls::TokensAt(const Queue& q, absl::Duration mono) {
  if (mono <= q.refilled) return q.tokens;
  return std::min(Burst(q.settings), q.tokens + q.settings.rate_per_second() *
                                                    absl::ToDoubleSeconds(mono - q.refilled));
}

int32_t QueueControls::WeightOf(const std::string& queue) const {
  auto it = queues_.find(queue);
  return it != queues_.end() && it->second.settings.has_weight() ? it->second.settings.weight() : 1;
}

void QueueControls::Set(const std::string& queue, const v1::QueueSettings& s, absl::Duration mono) {
  if (auto it = queues_.find(queue); it != queues_.end() && it->second.settings.has_weight()) {
    --weighted_;
  }
  if (s.has_weight()) ++weighted_;
  if (IsDefault(s)) {
    queues_.erase(queue);
    return;
  }
  Queue& q = queues_[queue];
  q.quota = ParseResourceMap(s.quota()).value_or(Resources{});  // validated
  const bool new_rate =
      q.settings.rate_per_second() != s.rate_per_second() || q.settings.burst() != s.burst();
  q.settings = s;
  if (new_rate) {
    q.tokens = Burst(s);
    q.refilled = mono;
  }
}

QueueControls::Gate QueueControls::Check(const std::string& queue, int64_t in_flight,
                                         absl::Duration mono) const {
  auto it = queues_.find(queue);
  if (it == queues_.end()) return Gate::kOpen;
  const Queue& q = it->second;
  if (q.settings.paused()) return Gate::kPaused;
  if (q.settings.max_concurrency() > 0 && in_flight >= q.settings.max_concurrency()) {
    return Gate::kConcurrency;
  }
  if (q.settings.rate_per_second() > 0 && TokensAt(q, mono) < 1) return Gate::kRate;
  return Gate::kOpen;
}

void QueueControls::Take(const std::string& queue, absl::Duration mono) {
  auto it = queues_.find(queue);
  if (it == queues_.end() || it->second.settings.rate_per_second() <= 0) return;
  Queue& q = it->second;
  q.tokens = TokensAt(q, mono) - 1;
  q.refilled = std::max(q.refilled, mono);
}

std::string QueueControls::Describe(Gate g, const v1::QueueSettings& s) {
  switch (g) {
    case Gate::kOpen:
      return "open";
    case Gate::kPaused:
      return "the queue is paused";
    case Gate::kConcurrency:
      return absl::StrCat("the queue is at its concurrency limit of ", s.max_concurrency());
    case Gate::kRate:
      return absl::StrCat("the queue is at its rate limit of ", s.rate_per_second(), " per second");
  }
  return "";
}

}  // namespace taskgrid::core
