// QueueControls: what each queue is told (paused, most tasks in flight,
// most starts per second) and the token buckets of its rate limit. Pure
// bookkeeping on a monotonic time the caller passes in; the Scheduler asks
// it before each start and holds the queue's ready tasks while it says no.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/resources.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::core {

// The most a limit may be set to (concurrency, rate, burst).
inline constexpr int64_t kMaxQueueLimit = 1'000'000;

// INVALID_ARGUMENT naming the field when a limit is out of range or the
// quota does not parse.
absl::Status ValidateQueueLimits(const v1::SetQueueLimitsRequest& req);

// Whether settings are the defaults (running, no limits): then nothing is
// stored for the queue.
bool IsDefault(const v1::QueueSettings& s);

class QueueControls {
 public:
  // Why a task of a queue may not start now.
  enum class Gate { kOpen, kPaused, kConcurrency, kRate };

  // The queue's settings, or nullptr for the defaults.
  const v1::QueueSettings* Find(const std::string& queue) const;
  // Its quota as amounts, or nullptr when it has none.
  const Resources* QuotaOf(const std::string& queue) const;
  // Whether any queue has a weight (then queues share by weight), and a
  // queue's weight: its own, else 1.
  bool weighted() const { return weighted_ > 0; }
  int32_t WeightOf(const std::string& queue) const;
  // Replaces the queue's settings; the defaults erase it. A rate limit
  // that is new or changed starts with a full bucket.
  void Set(const std::string& queue, const v1::QueueSettings& s, absl::Duration mono);
  // May a task of `queue`, which has `in_flight` tasks DISPATCHED or
  // RUNNING, start at `mono`?
  Gate Check(const std::string& queue, int64_t in_flight, absl::Duration mono) const;
  // A task of `queue` started at `mono` (after Check said kOpen): it takes
  // a token of the rate limit.
  void Take(const std::string& queue, absl::Duration mono);
  bool empty() const { return queues_.empty(); }
  template <typename F>
  void ForEach(const F& f) const {
    for (const auto& [name, q] : queues_) f(name, q.settings);
  }

  // "paused", "at its concurrency limit of N", "past its rate of R per second".
  static std::string Describe(Gate g, const v1::QueueSettings& s);

 private:
  struct Queue {
    v1::QueueSettings settings;
    Resources quota;  // settings.quota, parsed
    double tokens = 0;
    absl::Duration refilled;  // when `tokens` was last brought up to date
  };
  static double Burst(const v1::QueueSettings& s);
  // The queue's tokens at `mono`.
  static double TokensAt(const Queue& q, absl::Duration mono);
  absl::flat_hash_map<std::string, Queue> queues_;
  int weighted_ = 0;  // queues with a weight
};

// The largest weight a queue may have.
inline constexpr int32_t kMaxQueueWeight = 10'000;

}  // namespace taskgrid::core
