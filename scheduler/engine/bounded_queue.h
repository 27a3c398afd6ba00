// BoundedQueue: hands items from one producer thread to one consumer
// thread, holding at most `capacity` of them, so a fast producer cannot run
// ahead of the consumer without bound. Recovery uses it to pass chunks of
// task rows and records between its two threads.
//
// Either side can end it: the producer with Close() (no more items; the
// consumer still gets what is queued), the consumer with Cancel() (it wants
// no more; Push returns false from then on, and a producer blocked in Push
// wakes up). Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

namespace taskgrid::engine {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}

  // Waits while the queue is full. False (and `item` is dropped) once
  // cancelled.
  bool Push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [this] { return cancelled_ || items_.size() < capacity_; });
    if (cancelled_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }

  // Waits for an item. nullopt once closed and drained, or cancelled.
  std::optional<T> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [this] { return cancelled_ || closed_ || !items_.empty(); });
    if (cancelled_ || items_.empty()) return std::nullopt;
    std::optional<T> item(std::move(items_.front()));
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  // Like Push, but never waits: false (and `item` is dropped) when full or
  // cancelled.
  bool TryPush(T item) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || items_.size() >= capacity_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }

  // Like Pop, but never waits: nullopt when nothing is queued now.
  std::optional<T> TryPop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || items_.empty()) return std::nullopt;
    std::optional<T> item(std::move(items_.front()));
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
  }

  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    items_.clear();
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::deque<T> items_;     // guarded by mu_
  bool closed_ = false;     // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

}  // namespace taskgrid::engine
