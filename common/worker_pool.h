// WorkerPool: threads reused from one closure to the next. Run() hands the
// closure to a waiting thread, or starts a thread when none waits, so the
// pool holds as many threads as closures ever ran at once (for the agent:
// its slots). Starting and ending a thread per task cost the agent more
// than a short task itself (clone, stack pages, exit).
//
// Thread-safe. The destructor runs what is queued, then joins every thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace taskgrid {

class WorkerPool {
 public:
  WorkerPool() = default;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  void Run(std::function<void()> f);

  // Threads started so far (none ends before the destructor).
  int threads() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  size_t waiting_ = 0;                       // guarded by mu_: threads in wait()
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
};

}  // namespace taskgrid
