#include "scheduler/core/retry_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/proto_time.h"

namespace taskgrid::core {

namespace {

const char* OutcomeWord(v1::Outcome o) {
  switch (o) {
    case v1::OUTCOME_SUCCEEDED:
      return "succeeded";
    case v1::OUTCOME_TIMED_OUT:
      return "timed out";
    case v1::OUTCOME_CANCELLED:
      return "was cancelled";
    case v1::OUTCOME_LOST:
      return "was lost";
    default:
      return "failed";
  }
}

bool IsRetryableFailure(const TaskRecord& t, const v1::TaskResult& r) {
  if (r.outcome() == v1::OUTCOME_FAILED) {
    for (int32_t code : t.spec.retry().non_retryable_exit_codes()) {
      if (code == r.exit_code()) return false;
    }
  }
  return true;
}

}  // namespace

int32_t MaxAttemptsOf(const TaskRecord& t, const SchedulerOptions& opts) {
  return t.spec.max_attempts() > 0 ? t.spec.max_attempts() : opts.default_max_attempts;
}

absl::Duration InitialBackoffOf(const TaskRecord& t, const SchedulerOptions& opts) {
  const v1::RetryPolicy& r = t.spec.retry();
  return r.has_initial_backoff() ? FromProto(r.initial_backoff()) : opts.default_initial_backoff;
}

absl::Duration BackoffOf(const TaskRecord& t, const SchedulerOptions& opts, double u) {
  const v1::RetryPolicy& r = t.spec.retry();
  const absl::Duration initial = InitialBackoffOf(t, opts);
  absl::Duration max = FromProto(r.max_backoff());
  if (!r.has_max_backoff()) max = opts.default_max_backoff;
  const double mult = r.multiplier() > 0 ? r.multiplier() : opts.default_backoff_multiplier;
  // attempt 1 failed -> initial; attempt 2 failed -> initial * mult; ...
  const double factor = std::pow(mult, std::max(0, t.attempt - t.attempt_base - 1));
  absl::Duration d = std::min(std::isfinite(factor) ? initial * factor : max, max);
  d *= 1.0 - opts.backoff_jitter * std::clamp(u, 0.0, 1.0);
  return d;
}

namespace {
constexpr absl::string_view kByRequest = "cancelled by request";
constexpr absl::string_view kRequested = "cancel requested";
constexpr absl::string_view kWaitingFor = "; waiting for agent ";
}  // namespace

std::string CancellingReason(const std::string& why, const std::string& agent_id) {
  return absl::StrCat(why == kByRequest ? kRequested : absl::string_view(why), kWaitingFor,
                      agent_id);
}

std::string CancelledReason(const std::string& cancelling_reason) {
  absl::string_view why = cancelling_reason;
  if (const size_t at = why.rfind(kWaitingFor); at != absl::string_view::npos) {
    why = why.substr(0, at);
  }
  // A reason of another shape (from an older scheduler) says the least.
  if (why.empty() || why == kRequested || why == cancelling_reason) return std::string(kByRequest);
  return std::string(why);
}

AfterAttempt DecideAfterAttempt(const TaskRecord& t, const std::string& what, const AttemptEnd& end,
                                int32_t attempts_used, const SchedulerOptions& opts, absl::Time now,
                                const std::function<double()>& draw) {
  using Next = AfterAttempt::Next;
  const v1::TaskResult& r = t.result();
  if (t.state == v1::TASK_STATE_CANCELLING) {
    if (r.outcome() == v1::OUTCOME_SUCCEEDED) {
      return {Next::kSucceeded, absl::InfinitePast(),
              what + " succeeded before the cancel reached it"};
    }
    return {Next::kCancelled, absl::InfinitePast(), CancelledReason(t.reason)};
  }
  if (r.outcome() == v1::OUTCOME_SUCCEEDED) {
    return {Next::kSucceeded, absl::InfinitePast(), what + " succeeded"};
  }
  std::string why = absl::StrCat(what, " ", OutcomeWord(r.outcome()));
  if (!r.error().empty()) absl::StrAppend(&why, ": ", r.error());
  if (end.expired) {
    return {Next::kFailed, absl::InfinitePast(),
            absl::StrCat("expired before start: not started within schedule_timeout ",
                         absl::FormatDuration(end.expired_after), " (", why, ")")};
  }
  if (end.pausing) {
    return {Next::kPaused, absl::InfinitePast(), absl::StrCat("paused by request (", why, ")")};
  }
  if (end.interrupted) {
    return {
        Next::kRequeue,
        end.requeue_after > absl::ZeroDuration() ? now + end.requeue_after : absl::InfinitePast(),
        std::move(why)};
  }
  // The agent knows another attempt would end the same (an HTTP status
  // that is neither a success nor the server's passing trouble).
  if (r.permanent()) {
    std::string reason = absl::StrCat(what, " ", OutcomeWord(r.outcome()), " for good");
    if (!r.error().empty()) absl::StrAppend(&reason, ": ", r.error());
    return {Next::kFailed, absl::InfinitePast(), std::move(reason)};
  }
  if (!IsRetryableFailure(t, r)) {
    return {Next::kFailed, absl::InfinitePast(),
            absl::StrCat(why, " (exit code ", r.exit_code(), " is not retryable)")};
  }
  const int32_t max = MaxAttemptsOf(t, opts);
  if (attempts_used >= max) {
    return {Next::kFailed, absl::InfinitePast(),
            max == 1 ? absl::StrCat(why, "; its only attempt used")
                     : absl::StrCat(why, "; all ", max, " attempts used")};
  }
  // A lost attempt (agent gone, hand-over not confirmed) says nothing about
  // the task: it counts, but is re-queued at once rather than backed off.
  const absl::Time at =
      r.outcome() == v1::OUTCOME_LOST ? absl::InfinitePast() : now + BackoffOf(t, opts, draw());
  return {Next::kRetry, at, absl::StrCat(why, "; will retry")};
}

}  // namespace taskgrid::core
