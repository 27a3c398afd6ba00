#include "scheduler/store/postgres_schema.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "scheduler/store/postgres_util.h"

namespace taskgrid::store::pg {

const std::vector<std::string>& Migrations() {
  static const auto* kMigrations = new std::vector<std::string>{
      // 0 -> 1: the shape of the SQLite store's schema 11. Tasks keyed by
      // their submit seq alone (ids are unique in the Scheduler's table,
      // which restore checks), so an update touches one index. Names
      // (ids, queues, agents, jobs, keys) are text in the "C" collation:
      // ordered by bytes, as SQLite orders them, and compared with memcmp
      // rather than the locale's rules. Everything else that is a string is
      // bytea: reasons and errors quote what agents sent, which may hold
      // bytes PostgreSQL's text refuses (NUL, or UTF-8 cut short), and the
      // blobs are serialized protobufs. `meta` holds the schema version
      // and the newest pruned event revision (revisions never go
      // backwards, not even after retention pruned every event).
      R"sql(
      CREATE TABLE meta (
        key   text COLLATE "C" PRIMARY KEY,
        value bigint NOT NULL
      );
      CREATE TABLE tasks (
        seq                 bigint PRIMARY KEY,
        id                  text COLLATE "C" NOT NULL,
        queue               text COLLATE "C" NOT NULL,
        state               integer NOT NULL,
        attempt             integer NOT NULL,
        agent_id            text COLLATE "C" NOT NULL,
        create_us           bigint NOT NULL,
        update_us           bigint NOT NULL,
        next_run_us         bigint NOT NULL,
        dispatch_us         bigint NOT NULL,
        start_us            bigint NOT NULL,
        reason              bytea NOT NULL,
        result              bytea NOT NULL,
        spec                bytea NOT NULL,
        pause_requested     boolean NOT NULL,
        job_id              text COLLATE "C" NOT NULL,
        attempt_base        integer NOT NULL,
        attempts_dropped    integer NOT NULL,
        interrupted_dropped integer NOT NULL,
        claim_until_us      bigint NOT NULL,
        merge_fire_us       bigint NOT NULL,
        unique_key          text COLLATE "C" NOT NULL,
        unique_until_us     bigint NOT NULL,
        family              smallint NOT NULL
      );
      CREATE TABLE attempts (
        task_id text COLLATE "C" NOT NULL,
        attempt integer NOT NULL,
        data    bytea NOT NULL,
        PRIMARY KEY (task_id, attempt)
      );
      CREATE TABLE merged (
        task_id text COLLATE "C" NOT NULL,
        n       integer NOT NULL,
        payload bytea NOT NULL,
        PRIMARY KEY (task_id, n)
      );
      CREATE TABLE events (
        revision   bigint PRIMARY KEY,
        task_id    text COLLATE "C" NOT NULL,
        queue      text COLLATE "C" NOT NULL,
        from_state integer NOT NULL,
        to_state   integer NOT NULL,
        attempt    integer NOT NULL,
        agent_id   text COLLATE "C" NOT NULL,
        time_us    bigint NOT NULL,
        reason     bytea NOT NULL,
        job_id     text COLLATE "C" NOT NULL
      );
      CREATE TABLE queues (
        name     text COLLATE "C" PRIMARY KEY,
        settings bytea NOT NULL
      );
      CREATE TABLE schedules (
        id           text COLLATE "C" PRIMARY KEY,
        definition   bytea NOT NULL,
        paused       boolean NOT NULL,
        next_fire_us bigint NOT NULL,
        last_fire_us bigint NOT NULL,
        last_task_id text COLLATE "C" NOT NULL,
        fire_count   bigint NOT NULL,
        last_error   bytea NOT NULL,
        create_us    bigint NOT NULL,
        update_us    bigint NOT NULL
      );
      )sql",
      // 1 -> 2: the leader lease (postgres_lease.h). One row, there from
      // the start so taking it is an UPDATE that a row lock orders with
      // the leader's commits; expires_at is the server's clock, so the
      // schedulers' clocks do not matter. The epoch only goes up: each
      // taking of the lease bumps it, and the leader's writes are fenced
      // by it.
      R"sql(
      CREATE TABLE lease (
        id         smallint PRIMARY KEY CHECK (id = 1),
        holder     text COLLATE "C" NOT NULL,
        epoch      bigint NOT NULL,
        address    text COLLATE "C" NOT NULL,
        expires_at timestamptz NOT NULL
      );
      INSERT INTO lease VALUES (1, '', 0, '', '-infinity');
      )sql",
      // 2 -> 3: task labels (EncodeLabels of the spec's), readable
      // without the spec blob so the index of tasks on disk can be
      // searched by label. Specs written before had no labels.
      R"sql(
      ALTER TABLE tasks ADD COLUMN labels bytea NOT NULL DEFAULT ''::bytea;
      )sql",
  };
  return *kMigrations;
}

namespace {

// The version stored in `meta`, 0 when the schema has no `meta` table.
absl::StatusOr<int> StoredVersion(PGconn* conn, const std::string& where) {
  Result r(PQexec(conn, "SELECT current_schema(), to_regclass('meta') IS NOT NULL"));
  if (absl::Status s = Check(conn, r.get(), "reading the schema version"); !s.ok()) return s;
  if (PQgetisnull(r.get(), 0, 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat(where,
                     ": no schema to create the task tables in (the search_path names none that "
                     "exists: create it, or set options=-csearch_path=SCHEMA in the URL)"));
  }
  if (PQgetvalue(r.get(), 0, 1)[0] != 't') return 0;
  Result v(PQexec(conn, "SELECT value FROM meta WHERE key = 'schema_version'"));
  if (absl::Status s = Check(conn, v.get(), "reading the schema version"); !s.ok()) return s;
  int version = 0;
  if (PQntuples(v.get()) != 1 || !absl::SimpleAtoi(PQgetvalue(v.get(), 0, 0), &version)) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": schema ", PQgetvalue(r.get(), 0, 0),
                     " has a meta table without a schema_version: not a taskgrid schema"));
  }
  return version;
}

}  // namespace

absl::StatusOr<int> Migrate(PGconn* conn, const std::vector<std::string>& migrations,
                            const std::string& where) {
  absl::StatusOr<int> version = StoredVersion(conn, where);
  if (!version.ok()) return version.status();
  const int latest = static_cast<int>(migrations.size());
  if (*version > latest) {
    return absl::FailedPreconditionError(absl::StrCat(where, " has schema version ", *version,
                                                      "; this build knows up to ", latest,
                                                      ": use a newer taskgrid-scheduler"));
  }
  for (int v = *version; v < latest; ++v) {
    absl::Status s = Exec(conn, "BEGIN", "beginning a migration");
    if (s.ok()) s = Exec(conn, migrations[v].c_str(), "migrating");
    if (s.ok()) {
      Params p;
      p.Int8(v + 1);
      Result r(ExecParams(conn,
                          "INSERT INTO meta (key, value) VALUES ('schema_version', $1::int8) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                          p));
      s = Check(conn, r.get(), "recording the schema version");
    }
    if (s.ok()) s = Exec(conn, "COMMIT", "committing a migration");
    if (!s.ok()) {
      Exec(conn, "ROLLBACK", "rolling back a migration").IgnoreError();
      return absl::Status(s.code(), absl::StrCat(where, ": migration to schema version ", v + 1,
                                                 " failed: ", s.message()));
    }
  }
  return latest;
}

}  // namespace taskgrid::store::pg
