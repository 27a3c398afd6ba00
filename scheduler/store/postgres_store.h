// PostgresStore: the task table in a PostgreSQL database (libpq), for a
// scheduler that must survive the loss of its host; PostgreSQL's own
// tooling (replication, failover) keeps the database available.
//
// The tables live in the first schema the connection's search_path names
// (`options=-csearch_path=NAME` in the URL), made at open when it is not
// there yet; when that is "$user" (the default path), in the connection's
// current schema. They are versioned by a `schema_version` row in `meta`
// and migrated forward at open; a newer schema is refused.
//
// One leader per schema: the lease (postgres_lease.h) says which scheduler
// may write; once the store is told the leader's epoch (SetFence), every
// Apply checks it in its own transaction, so a scheduler that lost the
// lease (stopped, partitioned, superseded) can never commit again. Open()
// itself takes a session advisory lock only while it migrates, so two
// schedulers starting together do not both move the schema forward.
//
// Apply writes a batch in one transaction and one round trip for its rows:
// each kind of row goes in one statement over arrays (unnest), the
// statements sent together in libpq's pipeline mode, deletes first; a
// second round trip commits once every row count was checked. Durability
// is PostgreSQL's own: COMMIT returns once the server's synchronous_commit
// says so (by default, when the WAL is flushed; with synchronous standbys,
// when they have it too). The fence (the leader's epoch, checked in the
// same transaction) is the pipeline's last statement, sent with its Sync:
// the lease row is never locked by a transaction not wholly sent. A fenced
// writer names its session with its epoch (kTagWriterSql), so that the
// next leader can end it should it be cut off mid-batch holding row locks.
//
// Connections: the writer (Apply and the recovery reads), one for the
// event reads (ReadEvents, GetEventSpan) and one for the task reads
// (ReadTasks, ReadHistory), each behind its own mutex, so no read waits
// for the writer's transaction; each ScanTasks opens one of its own.
// A connection that broke is made again on its next use; the call that
// found it broken returns UNAVAILABLE naming the cause (for Apply: nothing
// is known to be committed, which the Engine treats as a failed commit),
// except a read, which is tried once more on a new connection first.
//
// Thread contract: as Store. Every call must have returned before the
// object is destroyed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/store/store.h"

typedef struct pg_conn PGconn;

namespace taskgrid::store {

namespace pg {
class Conn;
}

struct PostgresOptions {
  // A libpq connection URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DB?...)
  // or key=value string.
  std::string url;
  // How long Open waits for another scheduler migrating the schema before
  // it refuses.
  absl::Duration lock_wait = absl::Seconds(5);
  // The writer's idle_in_transaction_session_timeout: a leader stopped
  // between a batch and its COMMIT holds the lease row's lock; the server
  // ends its session after this long, so a standby can take the lease
  // (and the stopped leader's COMMIT fails). At most the lease's TTL.
  absl::Duration writer_idle_limit = absl::Seconds(6);
};

class PostgresStore final : public Store {
 public:
  // INVALID_ARGUMENT for a URL libpq cannot parse, UNAVAILABLE when the
  // server cannot be reached, FAILED_PRECONDITION when another scheduler
  // holds the schema or its version is newer than this build's.
  static absl::StatusOr<std::unique_ptr<PostgresStore>> Open(const PostgresOptions& opts);
  ~PostgresStore() override;

  // From now on every Apply commits only while the lease's epoch is
  // `epoch` (the one PostgresLease::TryAcquire took); otherwise it fails
  // with FAILED_PRECONDITION naming both epochs and writes nothing. 0: no
  // fence (tools and tests that own the schema). Call before the first
  // Apply of the leader, from the thread that calls Apply.
  void SetFence(int64_t epoch) { fence_epoch_ = epoch; }
  int64_t fence() const { return fence_epoch_; }

  // From any thread: how long the Apply in flight has been waiting (zero
  // when none), and a way to end that wait: the Apply fails UNAVAILABLE at
  // once and the next connects again. The leader's watchdog
  // (RenewLease) uses both, so a commit the database never answers ends.
  absl::Duration CommitInFlightFor() const;
  void InterruptCommit();

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
  // "postgres://HOST:PORT/DB" (never the password), for logs.
  const std::string& display_name() const { return display_; }
  // The schema the tables are in.
  const std::string& schema() const { return schema_; }

 private:
  explicit PostgresStore(const PostgresOptions& opts);
  absl::Status Init();
  absl::Status CreateSchemaIfNamed(PGconn* conn);
  absl::Status Lock(PGconn* conn);
  absl::Status Prepare(PGconn* conn);
  // Connects the writer if needed: prepares Apply's statements on a fresh
  // connection.
  absl::Status EnsureWriter();
  absl::Status ApplyOnWriter(const core::WriteBatch& batch);
  absl::Status ApplyPipelined(const core::WriteBatch& batch);
  // After the writer's connection was lost: FAILED_PRECONDITION when the
  // lease's epoch is no longer the fence's (asked on a new connection);
  // OK when it still is, or cannot be told.
  absl::Status SupersededSince();

  std::string url_;
  std::string display_;
  absl::Duration lock_wait_;
  absl::Duration writer_idle_limit_;
  std::atomic<int64_t> apply_since_ns_{0};  // steady clock; 0: no Apply in flight
  int64_t fence_epoch_ = 0;                 // Apply's thread
  int64_t tagged_epoch_ = 0;  // Apply's thread: the epoch the writer's session is named with
  std::string schema_;
  int schema_version_ = 0;
  std::unique_ptr<pg::Conn> writer_;  // Apply's thread, or recovery's

  std::mutex event_mu_;
  std::unique_ptr<pg::Conn> event_conn_;  // guarded by event_mu_
  std::mutex task_mu_;
  std::unique_ptr<pg::Conn> task_conn_;  // guarded by task_mu_
};

}  // namespace taskgrid::store
