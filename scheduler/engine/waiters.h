// Waiters: long polls in progress (WaitTask, WaitForWork), each answered
// exactly once: when what it waits for happens, when its deadline comes,
// or when the caller goes away (Remove).
//
// Indexed three ways: by waiter id (Remove), by key (a task id, a queue: a
// commit answers the waiters of the keys it changed) and by deadline,
// ordered, so expiry looks only at the waiters that are due, never at all
// of them. Bounded: Add past `max` is RESOURCE_EXHAUSTED.
//
// Not thread-safe: the Engine holds its mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::engine {

// `Response`: what a waiter is answered with; `Extra`: what else the
// Engine keeps per waiter (a worker's labels).
template <typename Response, typename Extra = std::monostate>
class Waiters {
 public:
  using Reply = std::function<void(absl::StatusOr<Response>)>;
  struct Waiter {
    uint64_t id = 0;
    std::string key;
    absl::Duration deadline;  // monotonic
    Extra extra;
    Reply done;
  };

  // `max`: most waiters at once; `calls` names them and `flag` the setting
  // in the error ("WaitTask calls", "--max_waits").
  Waiters(size_t max, std::string calls, std::string flag)
      : max_(max), calls_(std::move(calls)), flag_(std::move(flag)) {}

  // Registers a waiter; returns its id (never 0).
  absl::StatusOr<uint64_t> Add(const std::string& key, absl::Duration deadline, Reply done,
                               Extra extra = {}) {
    if (by_id_.size() >= max_) {
      return absl::ResourceExhaustedError(absl::StrCat("too many ", calls_, " in progress (", flag_,
                                                       "=", max_, "); try again later"));
    }
    const uint64_t id = next_id_++;
    by_key_.emplace(key, id);
    by_deadline_.emplace(deadline, id);
    by_id_.emplace(id, Waiter{id, key, deadline, std::move(extra), std::move(done)});
    return id;
  }
  // Takes the waiter out; false if it is gone already (answered).
  bool Remove(uint64_t id, Waiter* out) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    *out = Take(it);
    return true;
  }
  // Takes every waiter of `key` for which `pred(waiter)` holds.
  template <typename Pred>
  std::vector<Waiter> TakeKeyIf(const std::string& key, const Pred& pred) {
    std::vector<Waiter> out;
    auto it = by_key_.lower_bound({key, 0});
    while (it != by_key_.end() && it->first == key) {
      const uint64_t id = it->second;
      ++it;  // Take erases the entry
      auto w = by_id_.find(id);
      if (pred(w->second)) out.push_back(Take(w));
    }
    return out;
  }
  std::vector<Waiter> TakeKey(const std::string& key) {
    return TakeKeyIf(key, [](const Waiter&) { return true; });
  }
  bool HasKey(const std::string& key) const {
    auto it = by_key_.lower_bound({key, 0});
    return it != by_key_.end() && it->first == key;
  }
  // Takes the waiters whose deadline is <= now, earliest first.
  std::vector<Waiter> TakeExpired(absl::Duration now) {
    std::vector<Waiter> out;
    while (!by_deadline_.empty()) {
      ++examined_;
      const auto& [deadline, id] = *by_deadline_.begin();
      if (deadline > now) break;
      out.push_back(Take(by_id_.find(id)));
    }
    return out;
  }
  // Takes every waiter.
  std::vector<Waiter> TakeAll() {
    std::vector<Waiter> out;
    out.reserve(by_id_.size());
    for (auto& [id, w] : by_id_) out.push_back(std::move(w));
    by_id_.clear();
    by_key_.clear();
    by_deadline_.clear();
    return out;
  }

  size_t size() const { return by_id_.size(); }
  // Deadline entries TakeExpired has looked at, in all (for tests: expiry
  // costs the waiters that expire, plus one).
  int64_t deadlines_examined() const { return examined_; }

 private:
  Waiter Take(typename absl::flat_hash_map<uint64_t, Waiter>::iterator it) {
    Waiter w = std::move(it->second);
    by_id_.erase(it);
    by_key_.erase({w.key, w.id});
    by_deadline_.erase({w.deadline, w.id});
    return w;
  }

  const size_t max_;
  const std::string calls_;
  const std::string flag_;
  uint64_t next_id_ = 1;
  int64_t examined_ = 0;
  absl::flat_hash_map<uint64_t, Waiter> by_id_;
  std::set<std::pair<std::string, uint64_t>> by_key_;
  std::set<std::pair<absl::Duration, uint64_t>> by_deadline_;
};

// WaitTask calls, by task id.
using TaskWaiters = Waiters<v1::WaitTaskResponse>;

}  // namespace taskgrid::engine
