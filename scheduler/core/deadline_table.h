// Deadlines by key, popped in expiry order: the lease table's mechanism.
// Scheduler keeps one for task deadlines (ack, attempt) and one for agent
// deadlines (heartbeat silence, reconnect grace). Setting a key again moves
// its deadline (a heartbeat extends a lease).
//
// Not thread-safe; owned by the Scheduler. Time is whatever the caller passes
// (the Scheduler passes Clock::Monotonic()), so tests need no clock at all.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace taskgrid::core {

class DeadlineTable {
 public:
  // Adds the key, or moves its deadline.
  void Set(const std::string& key, absl::Duration deadline) {
    Remove(key);
    by_key_.emplace(key, deadline);
    by_time_.emplace(deadline, key);
  }

  void Remove(const std::string& key) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return;
    by_time_.erase({it->second, key});
    by_key_.erase(it);
  }

  bool Contains(const std::string& key) const { return by_key_.contains(key); }

  // The deadline of `key`; absl::InfiniteDuration() when absent.
  absl::Duration Get(const std::string& key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? absl::InfiniteDuration() : it->second;
  }

  // Removes and returns every key whose deadline is <= now, earliest first
  // (ties by key).
  std::vector<std::string> PopExpired(absl::Duration now) {
    std::vector<std::string> out;
    while (!by_time_.empty() && by_time_.begin()->first <= now) {
      out.push_back(by_time_.begin()->second);
      by_key_.erase(by_time_.begin()->second);
      by_time_.erase(by_time_.begin());
    }
    return out;
  }

  // The earliest deadline; absl::InfiniteDuration() when empty.
  absl::Duration Earliest() const {
    return by_time_.empty() ? absl::InfiniteDuration() : by_time_.begin()->first;
  }

  size_t size() const { return by_key_.size(); }

 private:
  absl::flat_hash_map<std::string, absl::Duration> by_key_;
  std::set<std::pair<absl::Duration, std::string>> by_time_;
};

}  // namespace taskgrid::core
