// ColdStore: finished tasks on disk and their retention. Moving finished
// tasks out of memory (Evict), taking them back (Warm), deleting them for
// good (Delete*, and retention's DeleteExpired), and the start-up half of
// it (Adopt).
//
// The rule that keeps it simple: a task in memory has its dependencies,
// its job's other tasks, the task it is a replica of and its own replicas
// in memory too (a dependency deleted while everything was finished is
// the one exception, marked deps_deleted). So a task leaves memory with
// its unit (UnitOf) once no task in memory depends on it, and comes back
// with what it needs (Needs); nothing in memory ever points at a task on
// disk.
//
// Owns: the queue of finished tasks to look at for eviction, the tasks
// and jobs on disk waiting for their retention (by queue and kind, in the
// order they finished), the tasks on disk that time-driven work waits for,
// and the count of tasks deleted. The records themselves are TaskTable's:
// it moves them through TaskTable's own doors (Evict, Warm, DeleteCold).
// Invariant (the Scheduler's checker counts it against the table): each
// task on disk that is in no job and no replica, and each job on disk,
// waits for its retention exactly once.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "scheduler/core/effects.h"
#include "scheduler/core/model.h"
#include "scheduler/core/options.h"
#include "scheduler/core/queue_controls.h"
#include "scheduler/core/task_table.h"

namespace taskgrid::core {

class ColdStore {
 public:
  ColdStore(TaskTable* table, const SchedulerOptions* opts, const QueueControls* controls)
      : table_(table), opts_(opts), controls_(controls) {}
  ColdStore(const ColdStore&) = delete;
  ColdStore& operator=(const ColdStore&) = delete;

  // Which retention a finished state falls under: 1 for FAILED and
  // TRASHED (the dead letter), 0 for the others.
  static int RetentionKind(v1::TaskState s);
  // How long the queue's finished tasks are kept: SUCCEEDED and CANCELLED
  // ones, and (failed) FAILED and TRASHED ones. Zero: kept.
  absl::Duration RetentionOf(const std::string& queue, bool failed) const;

  // --- Out of memory. ---
  // `t` finished (by the change of its t.revision): to disk once that
  // change is committed and old enough.
  void Finished(const TaskRecord& t) { evict_queue_.push_back({t.revision, t.seq}); }
  // The task of `seq` may leave memory now (what kept it let go).
  void LookAgain(int64_t seq) { evict_queue_.push_back({0, seq}); }
  // Moves out of memory the finished tasks whose last change is committed
  // (revision <= `committed`), that finished at least finished_in_memory
  // before `now`, and that nothing in memory needs. At most
  // max_evictions_per_call; returns how many went.
  size_t Evict(int64_t committed, absl::Time now);
  // A finished task (or its job) a delete may delete: moved to disk now if
  // in memory. FAILED_PRECONDITION saying why not.
  absl::Status ToDiskForDelete(TaskRecord& t);

  // --- Back into memory. ---
  // What tasks read back from the store need in memory with them: the
  // seqs on disk not among `records`.
  std::vector<int64_t> Needs(const std::vector<std::unique_ptr<TaskRecord>>& records) const;
  // Takes back into memory tasks read back from the store (and empties
  // `records`). All or nothing: when a record is not its task as it is on
  // disk now, or Needs(*records) is not empty, nothing changes and those
  // seqs are returned. A record whose task is no longer on disk is
  // dropped. `adopt` is called for each task that came back, before any
  // is linked to its dependencies and its task.
  std::vector<int64_t> Warm(std::vector<std::unique_ptr<TaskRecord>>* records,
                            absl::FunctionRef<void(TaskRecord&)> adopt);
  // Tasks on disk that time-driven work (a schedule's fire) waits for:
  // the Engine reads them back and Warms them.
  void Want(absl::Span<const int64_t> seqs) {
    wanted_.insert(wanted_.end(), seqs.begin(), seqs.end());
  }
  std::vector<int64_t> TakeWanted() { return std::exchange(wanted_, {}); }

  // --- Deleting (the rows go into `batch`). ---
  // A task on disk (not a replica, in no job) with its replicas; appends
  // their ids.
  void DeleteTask(const ColdTask& c, std::vector<std::string>* ids, WriteBatch* batch);
  // A job on disk with its tasks and their replicas; returns how many went.
  int64_t DeleteJob(JobRecord& j, WriteBatch* batch);
  // Deletes what retention says is due by `now`, at most
  // max_deletes_per_tick.
  void DeleteExpired(absl::Time now, WriteBatch* batch);

  // --- Start-up. ---
  // A finished task read back light (TaskRow::light), kept on disk only.
  absl::Status Adopt(const TaskRow& row);
  // The task `c`, read light, is needed in memory after all: it is no
  // longer on disk (its record is adopted next).
  void Unadopt(const ColdTask& c);
  // A job all on disk after start-up: it waits for its retention.
  void AdoptJob(const JobRecord& j) { JobExpiring(j, /*add=*/true); }

  int64_t tasks_deleted() const { return tasks_deleted_; }
  // Entries waiting for their retention (for the invariant checker).
  size_t expiring() const;

 private:
  // A task that went on disk (a job by its first task's queue, a task
  // with replicas for them all) waits for its retention here.
  void AddExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq, bool job);
  void RemoveExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq, bool job);
  // The expiry entry of a job on disk (its first task's queue, its state).
  void JobExpiring(const JobRecord& j, bool add);
  // The tasks that leave or come back to memory together with `t`: its
  // job's tasks, the task it is a replica of, and replicas, closed under
  // those links.
  static std::vector<TaskRecord*> UnitOf(TaskRecord& t);
  // Why the unit may not leave memory at `now` (empty: it may). `force`:
  // no age, no commit needed (a delete: nothing will read it back).
  std::string Unevictable(const std::vector<TaskRecord*>& unit, int64_t committed, bool force,
                          absl::Time now) const;
  // Moves a unit (UnitOf) out of memory.
  void EvictUnit(const std::vector<TaskRecord*>& unit);

  TaskTable* const table_;
  const SchedulerOptions* const opts_;
  const QueueControls* const controls_;

  // Finished tasks to look at for eviction: (revision of the change that
  // finished them, or 0 for one to look at again; seq), in that order.
  std::deque<std::pair<int64_t, int64_t>> evict_queue_;
  // Tasks and jobs on disk waiting for their retention, by queue and kind
  // (RetentionKind), in the order they finished: (finish, seq * 2 + 1 for
  // a job or + 0 for a task), 16 bytes an entry in a set that holds every
  // finished task on disk.
  using ExpiringSet = absl::btree_set<std::pair<CompactTime, int64_t>>;
  absl::flat_hash_map<std::string, std::array<ExpiringSet, 2>> expiring_;
  int64_t tasks_deleted_ = 0;
  std::vector<int64_t> wanted_;
};

}  // namespace taskgrid::core
