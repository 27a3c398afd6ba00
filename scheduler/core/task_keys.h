// TaskKeys: the two indexes a submit consults by (queue, key) before it
// makes a task.
//
// Merge keys. Submits with the same (queue, merge key) gather into one
// task until it is dispatched: the first makes the task and its
// MergeState (payloads, fire time), each later one appends its payload
// and, with MERGE_UPDATE_ALWAYS, moves the fire time of a task still
// SCHEDULED to its own not_before. The index finds the task a submit
// joins.
//
// Unique keys. A task with spec.unique_key holds (queue, key) for
// spec.unique_ttl from its not_before (UniqueUntil); a submit with the key
// meanwhile gets that task back, or ALREADY_EXISTS with unique_refuse.
// Unless spec.unique_release is AT_TTL, the task lets go of the key when
// it succeeds or is cancelled (Release). A task on disk holds its key too
// (by seq): the index is derived from the task rows (the unique_key and
// unique_until_us columns, the latter 0 once let go of), so a restart
// rebuilds it.
//
// Owns: the merge index, the unique holds and their expiry order.
// Invariants (CheckInvariants checks the first against the tasks):
//   - the merge index holds exactly the Joinable() tasks, one per key;
//   - every unique hold has exactly one expiry entry, at its `until`, and
//     a key is held by the latest task (by seq) that took it.
// Reaches task state only as the Scheduler hands it a record: Index
// after every change of one, Release before a transition's row is
// written (it sets unique_released, stored with the row), Merge through
// TaskTable::Amend (the one door for a change that keeps the state).
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/core/model.h"
#include "scheduler/core/task_table.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

class TaskKeys {
 public:
  using Key = std::pair<std::string, std::string>;  // (queue, merge or unique key)

  // The payload limits of a merge key's task (SchedulerOptions).
  TaskKeys(int64_t max_merged_payloads, int64_t max_merged_payload_bytes)
      : max_payloads_(max_merged_payloads), max_payload_bytes_(max_merged_payload_bytes) {}
  TaskKeys(const TaskKeys&) = delete;
  TaskKeys& operator=(const TaskKeys&) = delete;

  // --- Merge keys. ---
  static Key MergeKeyOf(const TaskRecord& t) { return {t.queue(), t.spec.merge_key()}; }
  // A later submit with its merge key may join `t`: it has one, was never
  // dispatched, and waits (SCHEDULED, PENDING or PAUSED).
  static bool Joinable(const TaskRecord& t);
  // A submit joins a merge key's task only with the same steps (where the
  // gathered payloads go).
  static bool SameSteps(const v1::TaskSpec& a, const v1::TaskSpec& b);
  // Keeps the index true to Joinable(t) after t changed.
  void Index(TaskRecord& t);
  // The joinable task of `key`, or nullptr.
  TaskRecord* JoinableTask(const Key& key) const;
  size_t joinable_count() const { return merge_.size(); }
  // A new task with a merge key gathers its own payload first (a merged
  // row in `batch`).
  static void StartMerge(TaskRecord& t, absl::Time now, WriteBatch* batch);
  // RESOURCE_EXHAUSTED naming `field` when a task of `key` holding
  // `count` payloads of `bytes` cannot take `spec`'s payload too.
  absl::Status CheckRoom(const Key& key, int64_t count, int64_t bytes, const v1::TaskSpec& spec,
                         const FieldPath& field) const;
  // `spec` joins `t` through table.Amend (its row, a merged row and an
  // event in `batch`): its payload is appended, and with
  // MERGE_UPDATE_ALWAYS a SCHEDULED task fires at the spec's not_before
  // (now when unset). Returns whether that fire time has come: the
  // caller then makes the task PENDING.
  static bool Merge(TaskTable& table, TaskRecord& t, const v1::TaskSpec& spec, absl::Time now,
                    WriteBatch* batch);

  // --- Unique keys. ---
  // The seq of the task holding `key` at `now`, or 0.
  int64_t UniqueHolder(const Key& key, absl::Time now) const;
  // A new or restored task with a unique key holds it until `until`
  // (UniqueUntil); a later holder of the key (by seq) wins.
  void Hold(const Key& key, int64_t seq, absl::Time until);
  void Hold(const TaskRecord& t);
  // A task that succeeded or was cancelled lets go of its key (and says
  // so in t.unique_released), unless its spec keeps it for the whole ttl.
  void Release(TaskRecord& t);
  // Lets go of the keys whose time is up.
  void Expire(absl::Time now);

 private:
  // `seq` lets go of `key` (if it still holds it).
  void Drop(const Key& key, int64_t seq);

  struct UniqueHold {
    int64_t seq = 0;
    absl::Time until;
  };
  const int64_t max_payloads_;
  const int64_t max_payload_bytes_;
  absl::flat_hash_map<Key, TaskRecord*> merge_;  // Joinable tasks only
  absl::flat_hash_map<Key, UniqueHold> unique_;
  absl::btree_set<std::pair<absl::Time, Key>> unique_expiry_;
};

}  // namespace taskgrid::core
