// The SQLite store's schema: its migrations, version by version, and the
// one that needs code besides SQL (schema 11's backfill).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "scheduler/core/model.h"
#include "scheduler/store/sqlite_store.h"
#include "scheduler/store/sqlite_util.h"

namespace taskgrid::store {

using sqlite::BindText;
using sqlite::Exec;
using sqlite::SqlError;
using sqlite::Statement;
using sqlite::Step;

namespace {

// Each entry moves the schema from version i to i + 1. Append only: a
// released migration is never edited.
const std::vector<const char*>& Migrations() {
  static const auto* kMigrations = new std::vector<const char*>{
      // 0 -> 1: tasks, their finished attempts, and the event log.
      R"sql(
      CREATE TABLE tasks (
        id          TEXT PRIMARY KEY,
        seq         INTEGER NOT NULL UNIQUE,
        queue       TEXT NOT NULL,
        state       INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        agent_id    TEXT NOT NULL,
        create_us   INTEGER NOT NULL,
        update_us   INTEGER NOT NULL,
        next_run_us INTEGER NOT NULL,
        dispatch_us INTEGER NOT NULL,
        start_us    INTEGER NOT NULL,
        reason      TEXT NOT NULL,
        result      BLOB NOT NULL,
        spec        BLOB NOT NULL
      );
      CREATE TABLE attempts (
        task_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        data    BLOB NOT NULL,
        PRIMARY KEY (task_id, attempt)
      ) WITHOUT ROWID;
      CREATE TABLE events (
        revision   INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id    TEXT NOT NULL,
        queue      TEXT NOT NULL,
        from_state INTEGER NOT NULL,
        to_state   INTEGER NOT NULL,
        attempt    INTEGER NOT NULL,
        agent_id   TEXT NOT NULL,
        time_us    INTEGER NOT NULL,
        reason     TEXT NOT NULL
      );
      )sql",
      // 1 -> 2: a pause waiting for the agent to stop the live attempt.
      R"sql(
      ALTER TABLE tasks ADD COLUMN pause_requested INTEGER NOT NULL DEFAULT 0;
      )sql",
      // 2 -> 3: jobs. A task's job (also in its spec, here for queries);
      // attempts made before a RetryJob, which no longer count; the job of
      // each event, for WatchTasks filtered by job.
      R"sql(
      ALTER TABLE tasks ADD COLUMN job_id TEXT NOT NULL DEFAULT '';
      ALTER TABLE tasks ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
      CREATE INDEX tasks_by_job ON tasks (job_id) WHERE job_id != '';
      ALTER TABLE events ADD COLUMN job_id TEXT NOT NULL DEFAULT '';
      )sql",
      // 3 -> 4: fewer b-trees per write. A task row is keyed by its submit
      // seq alone (the rowid): an update touches one b-tree and an insert
      // appends to it, where the text primary key and the unique seq index
      // made three. Ids are unique in the Scheduler's table, which restore
      // checks. Events lose AUTOINCREMENT: revisions come from the
      // Scheduler, so the sqlite_sequence update per insert bought nothing.
      R"sql(
      CREATE TABLE tasks_v4 (
        seq             INTEGER PRIMARY KEY,
        id              TEXT NOT NULL,
        queue           TEXT NOT NULL,
        state           INTEGER NOT NULL,
        attempt         INTEGER NOT NULL,
        agent_id        TEXT NOT NULL,
        create_us       INTEGER NOT NULL,
        update_us       INTEGER NOT NULL,
        next_run_us     INTEGER NOT NULL,
        dispatch_us     INTEGER NOT NULL,
        start_us        INTEGER NOT NULL,
        reason          TEXT NOT NULL,
        result          BLOB NOT NULL,
        spec            BLOB NOT NULL,
        pause_requested INTEGER NOT NULL DEFAULT 0,
        job_id          TEXT NOT NULL DEFAULT '',
        attempt_base    INTEGER NOT NULL DEFAULT 0
      );
      INSERT INTO tasks_v4 (seq, id, queue, state, attempt, agent_id, create_us, update_us,
                            next_run_us, dispatch_us, start_us, reason, result, spec,
                            pause_requested, job_id, attempt_base)
        SELECT seq, id, queue, state, attempt, agent_id, create_us, update_us, next_run_us,
               dispatch_us, start_us, reason, result, spec, pause_requested, job_id,
               attempt_base FROM tasks;
      DROP TABLE tasks;
      ALTER TABLE tasks_v4 RENAME TO tasks;
      CREATE INDEX tasks_by_job ON tasks (job_id) WHERE job_id != '';
      CREATE TABLE events_v4 (
        revision   INTEGER PRIMARY KEY,
        task_id    TEXT NOT NULL,
        queue      TEXT NOT NULL,
        from_state INTEGER NOT NULL,
        to_state   INTEGER NOT NULL,
        attempt    INTEGER NOT NULL,
        agent_id   TEXT NOT NULL,
        time_us    INTEGER NOT NULL,
        reason     TEXT NOT NULL,
        job_id     TEXT NOT NULL DEFAULT ''
      );
      INSERT INTO events_v4 SELECT revision, task_id, queue, from_state, to_state, attempt,
        agent_id, time_us, reason, job_id FROM events;
      DROP TABLE events;
      ALTER TABLE events_v4 RENAME TO events;
      )sql",
      // 4 -> 5: revisions never go backwards. `meta` keeps the newest
      // pruned event revision (written in the transaction that prunes), so
      // a restart after retention pruned every event goes on above it. A
      // table pruned before this version knows only what it still keeps.
      R"sql(
      CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value INTEGER NOT NULL
      ) WITHOUT ROWID;
      INSERT INTO meta (key, value)
        SELECT 'newest_pruned_revision', min(revision) - 1 FROM events HAVING count(*) > 0;
      )sql",
      // 5 -> 6: the attempt history is bounded. A task counts the oldest
      // attempts it dropped, and the interrupted ones among them.
      R"sql(
      ALTER TABLE tasks ADD COLUMN attempts_dropped INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE tasks ADD COLUMN interrupted_dropped INTEGER NOT NULL DEFAULT 0;
      )sql",
      // 6 -> 7: pull mode. When a pull worker's claim on the live attempt
      // ends (0: the attempt is an agent's, or there is none), so a
      // restart arms the claim's expiry where it was.
      R"sql(
      ALTER TABLE tasks ADD COLUMN claim_until_us INTEGER NOT NULL DEFAULT 0;
      )sql",
      // 7 -> 8: delivery by merge key. A task's fire time, and the
      // payloads merged into it, a row each, written once (a merge appends
      // one row instead of rewriting what the task gathered).
      R"sql(
      ALTER TABLE tasks ADD COLUMN merge_fire_us INTEGER NOT NULL DEFAULT 0;
      CREATE TABLE merged (
        task_id TEXT NOT NULL,
        n       INTEGER NOT NULL,
        payload BLOB NOT NULL,
        PRIMARY KEY (task_id, n)
      ) WITHOUT ROWID;
      )sql",
      // 8 -> 9: queue controls. A row per queue told something other than
      // the defaults (paused, limits): a serialized v1.QueueSettings.
      R"sql(
      CREATE TABLE queues (
        name     TEXT PRIMARY KEY,
        settings BLOB NOT NULL
      ) WITHOUT ROWID;
      )sql",
      // 9 -> 10: periodic tasks. A schedule's definition (a v1.Schedule
      // blob) and where its fires stand, rewritten whole in the
      // transaction of each fire's task.
      R"sql(
      CREATE TABLE schedules (
        id           TEXT PRIMARY KEY,
        definition   BLOB NOT NULL,
        paused       INTEGER NOT NULL,
        next_fire_us INTEGER NOT NULL,
        last_fire_us INTEGER NOT NULL,
        last_task_id TEXT NOT NULL,
        fire_count   INTEGER NOT NULL,
        last_error   TEXT NOT NULL,
        create_us    INTEGER NOT NULL,
        update_us    INTEGER NOT NULL
      ) WITHOUT ROWID;
      )sql",
      // 10 -> 11: finished tasks live on disk only. What the scheduler's
      // index of them needs, readable without the spec blob: a task's
      // unique key and until when it holds it, and whether it is a replica
      // (1) or has replicas (2). Rows written before are filled in by
      // BackfillV11 in the same transaction.
      R"sql(
      ALTER TABLE tasks ADD COLUMN unique_key TEXT NOT NULL DEFAULT '';
      ALTER TABLE tasks ADD COLUMN unique_until_us INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE tasks ADD COLUMN family INTEGER NOT NULL DEFAULT 0;
      )sql",
      // 11 -> 12: task labels (EncodeLabels of the spec's), readable
      // without the spec blob so the index of tasks on disk can be
      // searched by label. Specs written before had no labels.
      R"sql(
      ALTER TABLE tasks ADD COLUMN labels TEXT NOT NULL DEFAULT '';
      )sql",
  };
  return *kMigrations;
}

}  // namespace

int SqliteStore::LatestSchemaVersion() { return static_cast<int>(Migrations().size()); }

absl::Status SqliteStore::Migrate() {
  {
    ASSIGN_OR_RETURN(const Statement st,
                     sqlite::Prepare(db_, "PRAGMA user_version", "reading the schema version"));
    sqlite3_step(st.get());
    schema_version_ = sqlite3_column_int(st.get(), 0);
  }
  const int latest = LatestSchemaVersion();
  if (schema_version_ > latest) {
    return absl::FailedPreconditionError(absl::StrCat(db_path_, " has schema version ",
                                                      schema_version_, "; this build knows up to ",
                                                      latest, ": use a newer taskgrid-scheduler"));
  }
  while (schema_version_ < latest) {
    if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
    absl::Status s = Exec(db_, Migrations()[schema_version_]);
    if (s.ok() && schema_version_ + 1 == 11) s = BackfillV11();
    if (s.ok()) s = Exec(db_, absl::StrCat("PRAGMA user_version=", schema_version_ + 1).c_str());
    if (s.ok()) s = Exec(db_, "COMMIT");
    if (!s.ok()) {
      Exec(db_, "ROLLBACK").IgnoreError();
      return absl::InternalError(absl::StrCat("migration to schema version ", schema_version_ + 1,
                                              " failed: ", s.message()));
    }
    ++schema_version_;
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::BackfillV11() {
  ASSIGN_OR_RETURN(const Statement r, sqlite::Prepare(db_, "SELECT seq, spec, create_us FROM tasks",
                                                      "reading specs for schema 11"));
  sqlite3_stmt* const read = r.get();
  // Only tasks with a unique key or replicas change; collected first, so
  // the table is not written while it is read.
  struct Fill {
    int64_t seq;
    std::string unique_key;
    int64_t unique_until_us;
    int family;
  };
  std::vector<Fill> fills;
  int rc;
  while ((rc = sqlite3_step(read)) == SQLITE_ROW) {
    v1::TaskSpec spec;
    const void* blob = sqlite3_column_blob(read, 1);
    if (blob != nullptr && !spec.ParseFromArray(blob, sqlite3_column_bytes(read, 1))) {
      return absl::DataLossError(
          absl::StrCat("task seq ", sqlite3_column_int64(read, 0), ": stored spec does not parse"));
    }
    const int family =
        FamilyOf(!spec.replica_of().empty(), spec.has_replicas() && core::ReplicaCount(spec) > 0);
    if (spec.unique_key().empty() && family == 0) continue;
    int64_t until = 0;
    if (!spec.unique_key().empty()) {
      until =
          sqlite3_column_int64(read, 2) + absl::ToInt64Microseconds(FromProto(spec.unique_ttl()));
    }
    fills.push_back({sqlite3_column_int64(read, 0), spec.unique_key(), until, family});
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "reading specs for schema 11");
  ASSIGN_OR_RETURN(
      const Statement w,
      sqlite::Prepare(db_,
                      "UPDATE tasks SET unique_key = ?2, unique_until_us = ?3, family = ?4 "
                      "WHERE seq = ?1",
                      "filling in schema 11"));
  sqlite3_stmt* const write = w.get();
  for (const Fill& f : fills) {
    sqlite3_bind_int64(write, 1, f.seq);
    BindText(write, 2, f.unique_key);
    sqlite3_bind_int64(write, 3, f.unique_until_us);
    sqlite3_bind_int(write, 4, f.family);
    if (absl::Status s = Step(db_, write, "filling in schema 11"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::store
