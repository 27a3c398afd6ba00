// SqliteStore: the task table in one SQLite file, WAL mode.
//
// Open() takes an exclusive lock on <data_dir>/LOCK for the life of the
// object, so a second scheduler on the same directory refuses to start
// instead of writing beside the first. The schema is versioned with
// PRAGMA user_version and migrated forward at open.
//
// Durability: kFull (synchronous=FULL, the default) makes every Apply
// survive power loss; kNormal survives a process crash but may lose the
// last transactions on power loss.
//
// Thread contract: Apply is called from one thread at a time; ReadEvents
// and ReadTasks (and ReadHistory) use a connection of their own each and may be called from
// any thread; each ScanTasks call reads on a connection of its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "scheduler/store/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace taskgrid::store {

enum class Durability { kFull, kNormal };

struct SqliteOptions {
  std::string data_dir;
  Durability durability = Durability::kFull;
};

class SqliteStore final : public Store {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const SqliteOptions& opts);
  ~SqliteStore() override;

  absl::Status Apply(const core::WriteBatch& batch) override;
  absl::StatusOr<int64_t> CountTasks() override;
  absl::Status ScanTasks(const RowSink& sink, bool light_finished = false) override;
  absl::StatusOr<std::vector<core::AttemptRow>> LoadAttempts() override;
  absl::StatusOr<std::vector<core::MergedRow>> LoadMerged() override;
  absl::Status ReadHistory(const std::vector<std::string>& task_ids,
                           std::vector<core::AttemptRow>* attempts,
                           std::vector<core::MergedRow>* merged) override;
  absl::StatusOr<std::vector<core::StoredTask>> ReadTasks(
      const std::vector<int64_t>& seqs) override;
  absl::StatusOr<std::vector<core::QueueRow>> LoadQueues() override;
  absl::StatusOr<std::vector<core::ScheduleRow>> LoadSchedules() override;
  absl::StatusOr<std::vector<StoredEvent>> ReadEvents(int64_t after, int limit) override;
  absl::StatusOr<EventSpan> GetEventSpan() override;

  // The schema version this code writes.
  static int LatestSchemaVersion();
  int schema_version() const { return schema_version_; }
  // Checkpoints the background thread has finished (for tests).
  int64_t background_checkpoints() const { return ckpt_done_.load(); }
  const std::string& db_path() const { return db_path_; }

 private:
  SqliteStore() = default;
  absl::Status Init(const SqliteOptions& opts);
  absl::Status Migrate();
  absl::Status Prepare();
  absl::Status ApplyLocked(const core::WriteBatch& batch);
  // One task's attempts and payloads on task_db_ (task_mu_ held).
  absl::Status ReadHistoryLocked(const std::string& task_id,
                                 std::vector<core::AttemptRow>* attempts,
                                 std::vector<core::MergedRow>* merged);
  // Schema 11's columns for the rows written before it (in its migration).
  absl::Status BackfillV11();

  int lock_fd_ = -1;
  std::string db_path_;
  int schema_version_ = 0;
  sqlite3* db_ = nullptr;
  // BEGIN IMMEDIATE, COMMIT and ROLLBACK, prepared once (sqlite3_exec
  // would parse them on every commit).
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* rollback_ = nullptr;
  sqlite3_stmt* insert_task_ = nullptr;
  sqlite3_stmt* update_task_ = nullptr;
  sqlite3_stmt* insert_attempt_ = nullptr;
  sqlite3_stmt* clear_attempts_ = nullptr;
  sqlite3_stmt* trim_attempts_ = nullptr;
  sqlite3_stmt* insert_merged_ = nullptr;
  sqlite3_stmt* put_queue_ = nullptr;
  sqlite3_stmt* delete_queue_ = nullptr;
  sqlite3_stmt* insert_event_ = nullptr;
  sqlite3_stmt* prune_events_ = nullptr;
  sqlite3_stmt* note_pruned_ = nullptr;
  sqlite3_stmt* put_schedule_ = nullptr;
  sqlite3_stmt* delete_schedule_ = nullptr;
  sqlite3_stmt* delete_task_ = nullptr;
  sqlite3_stmt* delete_merged_ = nullptr;

  // Checkpoints run on a thread and connection of their own, asked for by
  // the writer connection's WAL hook once the WAL holds
  // kWalCheckpointPages; past kWalForcePages the writer checkpoints itself.
  static constexpr int kWalCheckpointPages = 1000;
  static constexpr int kWalForcePages = 100'000;
  absl::Status StartCheckpointer(Durability durability);
  static int WalHook(void* self, sqlite3* db, const char* name, int pages);
  void CheckpointLoop();
  sqlite3* ckpt_db_ = nullptr;  // the checkpoint thread's only
  std::mutex ckpt_mu_;
  std::condition_variable ckpt_cv_;
  bool ckpt_wanted_ = false;  // guarded by ckpt_mu_
  bool ckpt_stop_ = false;    // guarded by ckpt_mu_
  std::thread ckpt_thread_;
  std::atomic<int64_t> ckpt_done_{0};

  std::mutex read_mu_;
  sqlite3* read_db_ = nullptr;  // guarded by read_mu_
  // The watch replay path: prepared once on read_db_.
  sqlite3_stmt* read_events_ = nullptr;  // guarded by read_mu_

  std::mutex task_mu_;
  sqlite3* task_db_ = nullptr;                  // guarded by task_mu_: ReadTasks
  sqlite3_stmt* read_task_ = nullptr;           // guarded by task_mu_
  sqlite3_stmt* read_task_attempts_ = nullptr;  // guarded by task_mu_
  sqlite3_stmt* read_task_merged_ = nullptr;    // guarded by task_mu_
};

}  // namespace taskgrid::store
