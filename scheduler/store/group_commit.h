// GroupCommitWriter: one thread that commits many callers' WriteBatches in
// one store transaction and answers each caller only after that transaction
// committed (invariant 1 in docs/architecture.md). Throughput grows with the batch; the
// latency a caller sees is about one commit.
//
// Order: batches commit in the order Submit was called, and callbacks run in
// that order, on one delivery thread, after their batch's commit. Callbacks
// must not block (they send messages and finish RPCs). The next commit
// starts while the previous one's callbacks run: writing to SQLite and
// answering callers overlap. When nothing else is queued or being
// delivered, the writer thread runs the callbacks itself (one hand-off
// less for a lone caller).
//
// Failure: when a commit fails, its callers get the error and the writer is
// broken from then on: every later Submit gets the same error. The caller
// has applied those changes to memory already, so it must stop (see
// Scheduler); restarting recovers from the store.
//
// Thread-safe. The Store is borrowed and must outlive the writer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "scheduler/core/model.h"
#include "scheduler/store/store.h"

namespace taskgrid::store {

class GroupCommitWriter {
 public:
  using Done = std::function<void(const absl::Status&)>;

  struct Options {
    // Rows merged into one transaction at most (a batch is never split).
    size_t max_rows_per_commit = 20'000;
    // Times the commits (Monotonic) for stats(); borrowed, must outlive
    // the writer.
    const Clock* clock = RealClock::Get();
  };

  // What the writer did since it started, for /metrics.
  struct Stats {
    int64_t commits = 0;
    // Seconds each transaction took in the store (BEGIN to COMMIT).
    Histogram commit_seconds{Histogram::ExponentialBounds(0.0001, 2, 16)};  // 0.1 ms .. 3.3 s
    // Rows (tasks, events, attempts, ...) each transaction wrote.
    Histogram commit_rows{Histogram::ExponentialBounds(1, 2, 16)};  // 1 .. 32768
  };

  GroupCommitWriter(Store* store, Options opts);
  explicit GroupCommitWriter(Store* store) : GroupCommitWriter(store, Options{}) {}
  ~GroupCommitWriter();  // Stop()s

  // Queues `batch`; `done` runs once it is committed (or failed). An empty
  // batch is a barrier: `done` runs once everything queued before is durable.
  void Submit(core::WriteBatch batch, Done done);

  // Commits what is queued, runs its callbacks, and ends the thread. Later
  // Submits fail with UNAVAILABLE.
  void Stop();

  // Transactions committed so far.
  int64_t commits() const;
  // A copy of the stats (takes the writer's mutex briefly).
  Stats stats() const;

 private:
  struct Item {
    core::WriteBatch batch;
    Done done;
  };
  // One commit's callers and its outcome, for the delivery thread.
  struct Committed {
    std::vector<Done> done;
    absl::Status status;
  };
  void Run();
  void Deliver();

  Store* const store_;
  const Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;    // guarded by mu_
  bool stopping_ = false;     // guarded by mu_
  absl::Status broken_;       // guarded by mu_
  Stats stats_;               // guarded by mu_
  bool writer_idle_ = false;  // guarded by mu_: Run() waits for work

  std::mutex deliver_mu_;
  std::condition_variable deliver_cv_;
  std::deque<Committed> committed_;  // guarded by deliver_mu_
  bool deliver_stop_ = false;        // guarded by deliver_mu_
  bool deliverer_idle_ = false;      // guarded by deliver_mu_

  std::thread deliverer_;
  std::thread thread_;
};

}  // namespace taskgrid::store
