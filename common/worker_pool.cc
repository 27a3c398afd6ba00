#include "common/worker_pool.h"

#include <utility>

namespace taskgrid {

WorkerPool::~WorkerPool() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void WorkerPool::Run(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(f));
  // Every waiting thread takes one closure; a start covers the rest.
  if (queue_.size() > waiting_) {
    threads_.emplace_back([this] { Loop(); });
  } else {
    cv_.notify_one();
  }
}

int WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void WorkerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (queue_.empty() && !stop_) {
      ++waiting_;
      cv_.wait(lock);
      --waiting_;
    }
    if (queue_.empty()) return;  // stopping, and nothing is left to run
    std::function<void()> f = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    f();
    f = nullptr;  // whatever it captured goes before the next wait
    lock.lock();
  }
}

}  // namespace taskgrid
