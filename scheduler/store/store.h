// Store: where the task table lives. The scheduler keeps everything it
// decides on in memory and treats the store as the durable truth it reads
// back at start-up (recovery) and appends to in WriteBatch transactions.
//
// Implementations: SqliteStore (production, the default), PostgresStore
// (production, --store=postgres://...), MemoryStore (tests). All pass the
// shared conformance suite in tests/unit/store_test.cc.
//
// Thread contract: Apply is called by one writer thread at a time (the
// GroupCommitWriter); the whole-table reads (CountTasks, ScanTasks,
// LoadAttempts, LoadMerged, LoadSchedules, LoadTasks) only before that
// writer starts, from one thread at a time; ReadEvents and ReadTasks may be
// called from any thread, at any time; ReadHistory too.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/core/model.h"

namespace taskgrid::store {

// What the event history holds. Revisions never go backwards, not even
// when retention pruned every event: the newest pruned revision is kept
// durably, in the transaction that prunes.
struct EventSpan {
  int64_t oldest = 0;         // the oldest kept event; 0 when none is kept
  int64_t newest = 0;         // the newest revision ever stored, kept or pruned
  int64_t newest_pruned = 0;  // every event through this one was pruned
  bool operator==(const EventSpan& o) const {
    return oldest == o.oldest && newest == o.newest && newest_pruned == o.newest_pruned;
  }
};

struct StoredEvent {
  int64_t revision = 0;  // increasing, from 1
  core::EventRow event;
};

// The tasks table's `family` column in both stores: 1 for a replica, 2 for
// a task with replicas, 0 for the others.
inline int FamilyOf(bool replica, bool has_replicas) { return replica ? 1 : has_replicas ? 2 : 0; }

class Store {
 public:
  virtual ~Store() = default;

  // Applies the whole batch in one transaction, or nothing of it. Returns
  // only once the transaction is as durable as the store promises.
  virtual absl::Status Apply(const core::WriteBatch& batch) = 0;

  // --- Recovery. A large table is read once, in chunks, without holding
  // it whole: ScanTasks hands over rows as they are read. ---

  // How many tasks are stored (to size the in-memory indexes).
  virtual absl::StatusOr<int64_t> CountTasks() = 0;

  // Every task row in submit (seq) order, in chunks of at most
  // kScanChunkRows, each handed to `sink` as soon as it is read. The sink
  // may move the rows' strings out or swap the vector for another one; what
  // it leaves is cleared and refilled, so strings it leaves keep their
  // capacity. An error from the sink ends the scan and is returned.
  //
  // `light_finished`: the rows of finished tasks (SUCCEEDED, FAILED,
  // CANCELLED, TRASHED) come light (TaskRow::light): only the columns an
  // index of tasks kept on disk needs, never the spec or result blobs.
  static constexpr size_t kScanChunkRows = 1024;
  using RowSink = std::function<absl::Status(std::vector<core::TaskRow>* rows)>;
  virtual absl::Status ScanTasks(const RowSink& sink, bool light_finished = false) = 0;

  // Every finished attempt, by task id and then attempt number (for
  // LoadTasks; recovery reads history per chunk with ReadHistory).
  virtual absl::StatusOr<std::vector<core::AttemptRow>> LoadAttempts() = 0;
  // Every merged payload, by task id and then number.
  virtual absl::StatusOr<std::vector<core::MergedRow>> LoadMerged() = 0;
  // The finished attempts and merged payloads of these tasks, each task's
  // together and in order (by attempt, by number), the tasks in the order
  // asked: what recovery needs of the few tasks that have any, found by
  // their keys instead of a walk over every task's.
  virtual absl::Status ReadHistory(const std::vector<std::string>& task_ids,
                                   std::vector<core::AttemptRow>* attempts,
                                   std::vector<core::MergedRow>* merged) = 0;

  // The tasks stored under these seqs (those not stored are left out), each
  // whole: its row, its finished attempts and its merged payloads. In the
  // order asked; read in one read transaction.
  virtual absl::StatusOr<std::vector<core::StoredTask>> ReadTasks(
      const std::vector<int64_t>& seqs) = 0;
  // Every queue's stored settings, by name.
  virtual absl::StatusOr<std::vector<core::QueueRow>> LoadQueues() = 0;
  // Every schedule, by id.
  virtual absl::StatusOr<std::vector<core::ScheduleRow>> LoadSchedules() = 0;

  // Every task with its finished attempts, in submit (seq) order: the whole
  // table at once, for tests and tools (recovery uses the calls above).
  absl::StatusOr<std::vector<core::StoredTask>> LoadTasks();

  // Up to `limit` events with revision > after, oldest first.
  virtual absl::StatusOr<std::vector<StoredEvent>> ReadEvents(int64_t after, int limit) = 0;

  // The kept history and the high-water mark, read at one point in time.
  virtual absl::StatusOr<EventSpan> GetEventSpan() = 0;
};

}  // namespace taskgrid::store
