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
// A caller may commit its own batch (CallerCommit): when the writer thread
// is idle and nothing is queued, a Submit made inside that scope is not
// handed to the writer thread; the scope's end commits it (with whatever
// other callers queued meanwhile) on the calling thread, and the writer
// thread takes over what is queued after. One submit at a time then wakes
// no writer thread.
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
    // Whether a CallerCommit may commit on its thread. Off where a commit
    // is a network round trip (PostgreSQL): a thread hand-off is small
    // beside it, and a caller's thread (a gRPC one) must not hang with a
    // frozen connection.
    bool caller_commits = true;
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

  // While one lives on a thread (and Options.caller_commits), the first
  // Submit that finds the writer thread idle and nothing queued makes this
  // thread the committer: the scope's end commits what is queued then and
  // runs the callbacks, as the writer thread would (in order, on this
  // thread unless earlier callbacks are still being delivered). Open it only where the thread holds
  // no lock a callback or another caller needs, and do not wait for a commit inside it (the commit
  // happens at its end): the other callers' commits wait for it meanwhile.
  class CallerCommit {
   public:
    explicit CallerCommit(GroupCommitWriter* writer);
    ~CallerCommit();
    CallerCommit(const CallerCommit&) = delete;
    CallerCommit& operator=(const CallerCommit&) = delete;

   private:
    GroupCommitWriter* const writer_;
    GroupCommitWriter* const outer_;  // the enclosing scope's writer, if any
  };

  // True while the writer thread waits for work, nothing is queued, no
  // caller commits and no callback waits to be run (tests wait for it
  // before they open a CallerCommit).
  bool idle() const;
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
  // Moves queued items into `items`, up to max_rows_per_commit rows (a
  // batch is never split); mu_ held.
  void TakeLocked(std::vector<Item>* items);
  // Commits `items` (unless the writer is `broken`) and runs or hands on
  // their callbacks; on the writer thread or a CallerCommit's, never both.
  void CommitAndAnswer(std::vector<Item>* items, absl::Status broken);
  // A CallerCommit's end: commits what this thread took on, if anything.
  void CommitAsCaller();

  Store* const store_;
  const Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;    // guarded by mu_
  bool stopping_ = false;     // guarded by mu_
  absl::Status broken_;       // guarded by mu_
  Stats stats_;               // guarded by mu_
  bool writer_idle_ = false;  // guarded by mu_: Run() waits for work
  // A CallerCommit's thread will commit what is queued: the writer thread
  // leaves the queue alone until it is done.
  bool caller_commits_ = false;  // guarded by mu_

  mutable std::mutex deliver_mu_;
  std::condition_variable deliver_cv_;
  std::deque<Committed> committed_;  // guarded by deliver_mu_
  bool deliver_stop_ = false;        // guarded by deliver_mu_
  bool deliverer_idle_ = false;      // guarded by deliver_mu_

  std::thread deliverer_;
  std::thread thread_;
};

}  // namespace taskgrid::store
