// Waiters: the WaitTask calls in progress, each answered exactly once: when
// its task reaches a terminal state, when its deadline comes, or when the
// caller goes away (Cancel).
//
// Indexed three ways: by waiter id (Cancel), by task id (a commit answers
// the waiters of the tasks it finished) and by deadline, ordered, so expiry
// looks only at the waiters that are due, never at all of them. Bounded:
// Add past `max` is RESOURCE_EXHAUSTED.
//
// Not thread-safe: the Engine holds its mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::engine {

class Waiters {
 public:
  using Reply = std::function<void(absl::StatusOr<v1::WaitTaskResponse>)>;
  struct Waiter {
    uint64_t id = 0;
    std::string task_id;
    absl::Duration deadline;  // monotonic
    Reply done;
  };

  // `max`: most waiters at once; `flag` names the setting in the error.
  Waiters(size_t max, std::string flag) : max_(max), flag_(std::move(flag)) {}

  // Registers a waiter; returns its id (never 0).
  absl::StatusOr<uint64_t> Add(const std::string& task_id, absl::Duration deadline, Reply done);
  // Takes the waiter out; false if it is gone already (answered).
  bool Remove(uint64_t id, Waiter* out);
  // Takes every waiter of `task_id`.
  std::vector<Waiter> TakeTask(const std::string& task_id);
  // Takes the waiters whose deadline is <= now, earliest first.
  std::vector<Waiter> TakeExpired(absl::Duration now);
  // Takes every waiter.
  std::vector<Waiter> TakeAll();

  size_t size() const { return by_id_.size(); }
  // Deadline entries TakeExpired has looked at, in all (for tests: expiry
  // costs the waiters that expire, plus one).
  int64_t deadlines_examined() const { return examined_; }

 private:
  Waiter Take(absl::flat_hash_map<uint64_t, Waiter>::iterator it);

  const size_t max_;
  const std::string flag_;
  uint64_t next_id_ = 1;
  int64_t examined_ = 0;
  absl::flat_hash_map<uint64_t, Waiter> by_id_;
  std::set<std::pair<std::string, uint64_t>> by_task_;
  std::set<std::pair<absl::Duration, uint64_t>> by_deadline_;
};

}  // namespace taskgrid::engine
