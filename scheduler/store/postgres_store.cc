#include "scheduler/store/postgres_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "scheduler/store/postgres_lease.h"
#include "scheduler/store/postgres_schema.h"
#include "scheduler/store/postgres_util.h"
#include "scheduler/store/redact.h"

namespace taskgrid::store {

using pg::ArrayParam;
using pg::Params;
using pg::Result;

namespace {

// Apply's statements, prepared on each new writer connection. Each writes
// every row of its kind in the batch: the columns come as arrays, zipped
// by unnest().
struct Statement {
  const char* name;
  const char* sql;
};
constexpr Statement kDeleteTasks{
    "tg_delete_tasks",
    "DELETE FROM tasks AS t USING unnest($1::int8[], $2::text[]) AS v(seq, id) "
    "WHERE t.seq = v.seq AND t.id = v.id"};
constexpr Statement kDeleteAttempts{"tg_delete_attempts",
                                    "DELETE FROM attempts WHERE task_id = ANY($1::text[])"};
constexpr Statement kDeleteMerged{"tg_delete_merged",
                                  "DELETE FROM merged WHERE task_id = ANY($1::text[])"};
constexpr Statement kInsertTasks{
    "tg_insert_tasks",
    "INSERT INTO tasks (id, seq, queue, state, attempt, agent_id, create_us, update_us, "
    "next_run_us, dispatch_us, start_us, reason, result, spec, pause_requested, job_id, "
    "attempt_base, attempts_dropped, interrupted_dropped, claim_until_us, merge_fire_us, "
    "unique_key, unique_until_us, family, labels) "
    "SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::int4[], $5::int4[], "
    "$6::text[], $7::int8[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::bytea[], "
    "$13::bytea[], $14::bytea[], $15::bool[], $16::text[], $17::int4[], $18::int4[], "
    "$19::int4[], $20::int8[], $21::int8[], $22::text[], $23::int8[], $24::int2[], "
    "$25::bytea[])"};
constexpr Statement kUpdateTasks{
    "tg_update_tasks",
    "UPDATE tasks AS t SET state = v.state, attempt = v.attempt, agent_id = v.agent_id, "
    "update_us = v.update_us, next_run_us = v.next_run_us, dispatch_us = v.dispatch_us, "
    "start_us = v.start_us, reason = v.reason, result = v.result, "
    "pause_requested = v.pause_requested, attempt_base = v.attempt_base, "
    "attempts_dropped = v.attempts_dropped, interrupted_dropped = v.interrupted_dropped, "
    "claim_until_us = v.claim_until_us, merge_fire_us = v.merge_fire_us, "
    "unique_until_us = v.unique_until_us "
    "FROM unnest($1::text[], $2::int8[], $3::int4[], $4::int4[], $5::text[], $6::int8[], "
    "$7::int8[], $8::int8[], $9::int8[], $10::bytea[], $11::bytea[], $12::bool[], $13::int4[], "
    "$14::int4[], $15::int4[], $16::int8[], $17::int8[], $18::int8[]) AS v(id, seq, state, "
    "attempt, agent_id, update_us, next_run_us, dispatch_us, start_us, reason, result, "
    "pause_requested, attempt_base, attempts_dropped, interrupted_dropped, claim_until_us, "
    "merge_fire_us, unique_until_us) "
    "WHERE t.seq = v.seq AND t.id = v.id"};
constexpr Statement kPutMerged{"tg_put_merged",
                               "INSERT INTO merged (task_id, n, payload) "
                               "SELECT * FROM unnest($1::text[], $2::int4[], $3::bytea[]) "
                               "ON CONFLICT (task_id, n) DO UPDATE SET payload = excluded.payload"};
constexpr Statement kDeleteQueues{"tg_delete_queues",
                                  "DELETE FROM queues WHERE name = ANY($1::text[])"};
constexpr Statement kPutQueues{"tg_put_queues",
                               "INSERT INTO queues (name, settings) "
                               "SELECT * FROM unnest($1::text[], $2::bytea[]) "
                               "ON CONFLICT (name) DO UPDATE SET settings = excluded.settings"};
constexpr Statement kPutAttempts{
    "tg_put_attempts",
    "INSERT INTO attempts (task_id, attempt, data) "
    "SELECT * FROM unnest($1::text[], $2::int4[], $3::bytea[]) "
    "ON CONFLICT (task_id, attempt) DO UPDATE SET data = excluded.data"};
constexpr Statement kTrimAttempts{
    "tg_trim_attempts",
    "DELETE FROM attempts AS a USING unnest($1::text[], $2::int4[]) AS v(task_id, below) "
    "WHERE a.task_id = v.task_id AND a.attempt < v.below"};
constexpr Statement kInsertEvents{
    "tg_insert_events",
    "INSERT INTO events (revision, task_id, queue, from_state, to_state, attempt, agent_id, "
    "time_us, reason, job_id) "
    "SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int4[], $5::int4[], "
    "$6::int4[], $7::text[], $8::int8[], $9::bytea[], $10::text[])"};
constexpr Statement kDeleteSchedules{"tg_delete_schedules",
                                     "DELETE FROM schedules WHERE id = ANY($1::text[])"};
constexpr Statement kPutSchedules{
    "tg_put_schedules",
    "INSERT INTO schedules (id, definition, paused, next_fire_us, last_fire_us, last_task_id, "
    "fire_count, last_error, create_us, update_us) "
    "SELECT * FROM unnest($1::text[], $2::bytea[], $3::bool[], $4::int8[], $5::int8[], "
    "$6::text[], $7::int8[], $8::bytea[], $9::int8[], $10::int8[]) "
    "ON CONFLICT (id) DO UPDATE SET definition = excluded.definition, paused = excluded.paused, "
    "next_fire_us = excluded.next_fire_us, last_fire_us = excluded.last_fire_us, "
    "last_task_id = excluded.last_task_id, fire_count = excluded.fire_count, "
    "last_error = excluded.last_error, create_us = excluded.create_us, "
    "update_us = excluded.update_us"};
constexpr Statement kPruneEvents{"tg_prune_events",
                                 "DELETE FROM events WHERE revision <= $1::int8"};
constexpr Statement kNotePruned{
    "tg_note_pruned",
    "INSERT INTO meta (key, value) VALUES ('newest_pruned_revision', $1::int8) "
    "ON CONFLICT (key) DO UPDATE SET value = greatest(meta.value, excluded.value)"};
// The fence: the lease row's epoch, locked until the commit, so a
// standby's taking of the lease is ordered after this transaction (and the
// leader's own renewal is not: kLeaseFenceSql).
constexpr Statement kFence{"tg_fence", kLeaseFenceSql};
constexpr Statement kStatements[] = {
    kFence,           kDeleteTasks,  kDeleteAttempts, kDeleteMerged, kInsertTasks,  kUpdateTasks,
    kPutMerged,       kDeleteQueues, kPutQueues,      kPutAttempts,  kTrimAttempts, kInsertEvents,
    kDeleteSchedules, kPutSchedules, kPruneEvents,    kNotePruned};

// One statement of a batch: its parameters, and how many rows it must
// touch (-1: any number).
struct Pending {
  const Statement* st;
  Params params;
  int64_t expect = -1;
  std::string what;
};

// The indexes of `rows` to write when a later row with the same key
// replaces an earlier one: the last of each key, in their order.
template <typename Row, typename KeyFn>
std::vector<size_t> LastOfEachKey(const std::vector<Row>& rows, KeyFn key) {
  using Key = decltype(key(rows[0]));
  absl::flat_hash_set<Key> seen;
  std::vector<size_t> out;
  for (size_t i = rows.size(); i-- > 0;) {
    if (seen.insert(key(rows[i])).second) out.push_back(i);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

int PostgresStore::LatestSchemaVersion() { return static_cast<int>(pg::Migrations().size()); }

PostgresStore::PostgresStore(const PostgresOptions& opts)
    : url_(opts.url),
      display_(pg::DisplayName(opts.url)),
      lock_wait_(opts.lock_wait),
      writer_idle_limit_(opts.writer_idle_limit),
      writer_(std::make_unique<pg::Conn>(opts.url, "writer")),
      event_conn_(std::make_unique<pg::Conn>(opts.url, "event reader")),
      task_conn_(std::make_unique<pg::Conn>(opts.url, "task reader")) {}

PostgresStore::~PostgresStore() = default;

absl::StatusOr<std::unique_ptr<PostgresStore>> PostgresStore::Open(const PostgresOptions& opts) {
  char* err = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(opts.url.c_str(), &err);
  if (parsed == nullptr) {
    absl::Status s = absl::InvalidArgumentError(absl::StrCat(
        "not a PostgreSQL connection URL: ", RedactPasswords(absl::StripTrailingAsciiWhitespace(
                                                 err != nullptr ? err : "out of memory"))));
    if (err != nullptr) PQfreemem(err);
    return s;
  }
  PQconninfoFree(parsed);
  std::unique_ptr<PostgresStore> s(new PostgresStore(opts));
  if (absl::Status st = s->Init(); !st.ok()) return st;
  return s;
}

absl::Status PostgresStore::Lock(PGconn* conn) {
  Result r(PQexec(conn, absl::StrCat("SET lock_timeout = ", absl::ToInt64Milliseconds(lock_wait_),
                                     "; SELECT pg_advisory_lock(hashtextextended("
                                     "'taskgrid:' || current_schema(), 0)); RESET lock_timeout")
                            .c_str()));
  // PQexec returns the last statement's result: find the lock's failure.
  const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
  if (state != nullptr && std::string(state) == "55P03") {
    return absl::FailedPreconditionError(
        absl::StrCat(display_, " schema ", schema_,
                     " is being migrated by another taskgrid-scheduler for longer than ",
                     absl::FormatDuration(lock_wait_)));
  }
  return pg::Check(conn, r.get(), "locking the schema");
}

absl::Status PostgresStore::CreateSchemaIfNamed(PGconn* conn) {
  // The tables go into the first schema of the search_path: make it when
  // it is not there yet (unless it is the user's own, "$user"), rather
  // than let a later one of the path (public) take the tables.
  Result r(PQexec(conn, "SELECT current_setting('search_path')"));
  if (absl::Status s = pg::Check(conn, r.get(), "reading the search_path"); !s.ok()) return s;
  std::string first(absl::StripAsciiWhitespace(
      std::vector<absl::string_view>(absl::StrSplit(PQgetvalue(r.get(), 0, 0), ','))[0]));
  if (first.size() >= 2 && first.front() == '"' && first.back() == '"') {
    first = absl::StrReplaceAll(first.substr(1, first.size() - 2), {{"\"\"", "\""}});
  } else {
    absl::AsciiStrToLower(&first);  // as PostgreSQL reads an unquoted name
  }
  if (first.empty() || first == "$user") return absl::OkStatus();
  char* quoted = PQescapeIdentifier(conn, first.data(), first.size());
  if (quoted == nullptr) return pg::Error(conn, nullptr, "quoting the schema's name");
  const std::string sql = absl::StrCat("CREATE SCHEMA IF NOT EXISTS ", quoted);
  PQfreemem(quoted);
  // Quietly: "already exists, skipping" is the common case.
  return pg::Exec(
      conn,
      absl::StrCat("SET client_min_messages = warning; ", sql, "; RESET client_min_messages")
          .c_str(),
      absl::StrCat("creating schema ", first));
}

absl::Status PostgresStore::Init() {
  bool fresh = false;
  if (absl::Status s = writer_->Ensure(&fresh); !s.ok()) return s;
  PGconn* conn = writer_->get();
  if (absl::Status s = CreateSchemaIfNamed(conn); !s.ok()) return s;
  Result r(PQexec(conn, "SELECT current_schema()"));
  if (absl::Status s = pg::Check(conn, r.get(), "reading the schema"); !s.ok()) return s;
  schema_ = PQgetisnull(r.get(), 0, 0) ? "" : PQgetvalue(r.get(), 0, 0);
  // The lock first, so two schedulers starting together do not both
  // migrate; let go once migrated (the lease guards the writes).
  if (!schema_.empty()) {
    if (absl::Status s = Lock(conn); !s.ok()) return s;
  }
  absl::StatusOr<int> version =
      pg::Migrate(conn, pg::Migrations(),
                  schema_.empty() ? display_ : absl::StrCat(display_, " schema ", schema_));
  if (!schema_.empty()) {
    Result u(PQexec(conn, "SELECT pg_advisory_unlock_all()"));
    if (absl::Status s = pg::Check(conn, u.get(), "unlocking the schema"); !s.ok()) return s;
  }
  if (!version.ok()) return version.status();
  schema_version_ = *version;
  return Prepare(conn);
}

absl::Status PostgresStore::Prepare(PGconn* conn) {
  if (absl::Status s = pg::Exec(conn,
                                absl::StrCat("SET idle_in_transaction_session_timeout = ",
                                             absl::ToInt64Milliseconds(writer_idle_limit_))
                                    .c_str(),
                                "limiting idle transactions");
      !s.ok()) {
    return s;
  }
  for (const Statement& st : kStatements) {
    Result p(PQprepare(conn, st.name, st.sql, 0, nullptr));
    if (absl::Status s = pg::Check(conn, p.get(), st.name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PostgresStore::EnsureWriter() {
  bool fresh = false;
  if (absl::Status s = writer_->Ensure(&fresh); !s.ok()) return s;
  if (!fresh) return absl::OkStatus();
  tagged_epoch_ = 0;
  // A new session: prepare the statements again (the fence, not a
  // session, says whether this scheduler may still write).
  absl::Status s = Prepare(writer_->get());
  if (!s.ok()) writer_->Close();
  return s;
}

namespace {

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Duration PostgresStore::CommitInFlightFor() const {
  const int64_t since = apply_since_ns_.load();
  return since == 0 ? absl::ZeroDuration() : absl::Nanoseconds(SteadyNs() - since);
}

void PostgresStore::InterruptCommit() { writer_->Interrupt(); }

absl::Status PostgresStore::Apply(const core::WriteBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  apply_since_ns_ = SteadyNs();
  absl::Status s = ApplyOnWriter(batch);
  apply_since_ns_ = 0;
  return s;
}

absl::Status PostgresStore::ApplyOnWriter(const core::WriteBatch& batch) {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  if (fence_epoch_ > 0 && tagged_epoch_ != fence_epoch_) {
    // Named with its epoch, for the next leader to find (kTagWriterSql).
    Params p;
    p.Int8(fence_epoch_);
    Result r(pg::ExecParams(writer_->get(), kTagWriterSql, p));
    if (absl::Status s = pg::Check(writer_->get(), r.get(), "naming the writer's session");
        !s.ok()) {
      if (PQstatus(writer_->get()) != CONNECTION_OK) writer_->Close();
      return s;
    }
    tagged_epoch_ = fence_epoch_;
  }
  absl::Status s = ApplyPipelined(batch);
  PGconn* conn = writer_->get();
  if (!s.ok() && PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) != PQTRANS_IDLE) {
    pg::Exec(conn, "ROLLBACK", "rolling back").IgnoreError();
  }
  if (PQstatus(conn) != CONNECTION_OK) {
    writer_->Close();  // made again on the next call
    // Lost: perhaps ended by a leader that took over (kTagWriterSql). If
    // so, that is what is said.
    if (fence_epoch_ > 0) {
      if (absl::Status why = SupersededSince(); !why.ok()) return why;
    }
  }
  return s;
}

absl::Status PostgresStore::SupersededSince() {
  if (!EnsureWriter().ok()) return absl::OkStatus();
  Result r(PQexec(writer_->get(), "SELECT epoch FROM lease WHERE id = 1"));
  int64_t now = 0;
  if (PQresultStatus(r.get()) != PGRES_TUPLES_OK || PQntuples(r.get()) != 1 ||
      !absl::SimpleAtoi(PQgetvalue(r.get(), 0, 0), &now) || now == fence_epoch_) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "this scheduler's lease epoch ", fence_epoch_, " was superseded by epoch ", now,
      ": another scheduler leads ", schema_, " (and ended this one's database session)"));
}

absl::Status PostgresStore::ApplyPipelined(const core::WriteBatch& batch) {
  std::vector<Pending> stmts;
  stmts.reserve(std::size(kStatements) + 1);  // the attempts' delete may come twice
  auto add = [&](const Statement& st, std::string what, int64_t expect = -1) -> Params& {
    Pending& p = stmts.emplace_back();
    p.st = &st;
    p.expect = expect;
    p.what = std::move(what);
    return p.params;
  };

  // The (seqs, ids) arrays of the updates, kept to name a missing row.
  std::pair<std::string, std::string> updated;

  // Deletes first: a task deleted and submitted again under its id in one
  // batch keeps the new rows.
  if (!batch.deletes.empty()) {
    ArrayParam seqs(pg::kInt8Oid), ids(pg::kTextOid);
    for (const core::TaskDelete& d : batch.deletes) {
      seqs.Int8(d.seq);
      ids.Bytes(d.id);
    }
    const std::string id_array = ids.Finish();
    Params& p = add(kDeleteTasks, "deleting tasks", static_cast<int64_t>(batch.deletes.size()));
    p.Add(seqs.Finish());
    p.Add(std::string(id_array));
    add(kDeleteAttempts, "deleting their attempts").Add(std::string(id_array));
    add(kDeleteMerged, "deleting their merged payloads").Add(std::string(id_array));
  }

  // Each task row carries every status column, so a task changed several
  // times in the batch is written once, with its last status; an insert in
  // the batch is written with that last status.
  absl::flat_hash_map<int64_t, size_t> last;
  last.reserve(batch.tasks.size());
  for (size_t i = 0; i < batch.tasks.size(); ++i) last[batch.tasks[i].seq] = i;
  {
    ArrayParam c[25] = {
        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kTextOid),
        ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kTextOid),
        ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),
        ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kByteaOid),
        ArrayParam(pg::kByteaOid), ArrayParam(pg::kByteaOid), ArrayParam(pg::kBoolOid),
        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt4Oid),
        ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),
        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt2Oid),
        ArrayParam(pg::kByteaOid)};
    for (const core::TaskRow& r : batch.tasks) {
      if (!r.insert) continue;
      const core::TaskRow& now = batch.tasks[last[r.seq]];
      c[0].Bytes(r.id);
      c[1].Int8(r.seq);
      c[2].Bytes(r.queue);
      c[3].Int4(now.state);
      c[4].Int4(now.attempt);
      c[5].Bytes(now.agent_id);
      c[6].Int8(r.create_us);
      c[7].Int8(now.update_us);
      c[8].Int8(now.next_run_us);
      c[9].Int8(now.dispatch_us);
      c[10].Int8(now.start_us);
      c[11].Bytes(now.reason);
      c[12].Bytes(now.result);
      c[13].Bytes(r.spec);
      c[14].Bool(now.pause_requested);
      c[15].Bytes(r.job_id);
      c[16].Int4(now.attempt_base);
      c[17].Int4(now.attempts_dropped);
      c[18].Int4(now.interrupted_dropped);
      c[19].Int8(now.claim_until_us);
      c[20].Int8(now.merge_fire_us);
      c[21].Bytes(r.unique_key);
      c[22].Int8(now.unique_until_us);
      c[23].Int2(static_cast<int16_t>(FamilyOf(r.replica, r.has_replicas)));
      c[24].Bytes(r.labels);
    }
    if (c[0].size() > 0) {
      Params& p = add(kInsertTasks, "inserting tasks");
      for (ArrayParam& a : c) p.Add(a.Finish());
    }
  }
  {
    ArrayParam upd_seqs(pg::kInt8Oid), upd_ids(pg::kTextOid);
    ArrayParam c[18] = {
        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt4Oid),
        ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt8Oid),
        ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),
        ArrayParam(pg::kByteaOid), ArrayParam(pg::kByteaOid), ArrayParam(pg::kBoolOid),
        ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt4Oid),
        ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kInt8Oid)};
    for (size_t i = 0; i < batch.tasks.size(); ++i) {
      const core::TaskRow& r = batch.tasks[i];
      if (r.insert || last[r.seq] != i) continue;
      c[0].Bytes(r.id);
      c[1].Int8(r.seq);
      c[2].Int4(r.state);
      c[3].Int4(r.attempt);
      c[4].Bytes(r.agent_id);
      c[5].Int8(r.update_us);
      c[6].Int8(r.next_run_us);
      c[7].Int8(r.dispatch_us);
      c[8].Int8(r.start_us);
      c[9].Bytes(r.reason);
      c[10].Bytes(r.result);
      c[11].Bool(r.pause_requested);
      c[12].Int4(r.attempt_base);
      c[13].Int4(r.attempts_dropped);
      c[14].Int4(r.interrupted_dropped);
      c[15].Int8(r.claim_until_us);
      c[16].Int8(r.merge_fire_us);
      c[17].Int8(r.unique_until_us);
      upd_seqs.Int8(r.seq);
      upd_ids.Bytes(r.id);
    }
    if (c[0].size() > 0) {
      Params& p = add(kUpdateTasks, "updating tasks", c[0].size());
      for (ArrayParam& a : c) p.Add(a.Finish());
      updated = {upd_seqs.Finish(), upd_ids.Finish()};
    }
  }

  if (!batch.merged.empty()) {
    ArrayParam ids(pg::kTextOid), ns(pg::kInt4Oid), payloads(pg::kByteaOid);
    for (size_t i : LastOfEachKey(batch.merged, [](const core::MergedRow& m) {
           return std::pair<absl::string_view, int32_t>(m.task_id, m.n);
         })) {
      ids.Bytes(batch.merged[i].task_id);
      ns.Int4(batch.merged[i].n);
      payloads.Bytes(batch.merged[i].payload);
    }
    Params& p = add(kPutMerged, "inserting merged payloads");
    p.Add(ids.Finish());
    p.Add(ns.Finish());
    p.Add(payloads.Finish());
  }

  if (!batch.queues.empty()) {
    ArrayParam gone(pg::kTextOid), names(pg::kTextOid), settings(pg::kByteaOid);
    for (size_t i : LastOfEachKey(
             batch.queues, [](const core::QueueRow& q) { return absl::string_view(q.queue); })) {
      const core::QueueRow& q = batch.queues[i];
      if (q.settings.empty()) {
        gone.Bytes(q.queue);
      } else {
        names.Bytes(q.queue);
        settings.Bytes(q.settings);
      }
    }
    if (gone.size() > 0) add(kDeleteQueues, "deleting queue settings").Add(gone.Finish());
    if (names.size() > 0) {
      Params& p = add(kPutQueues, "storing queue settings");
      p.Add(names.Finish());
      p.Add(settings.Finish());
    }
  }

  if (!batch.clear_attempts.empty()) {
    ArrayParam ids(pg::kTextOid);
    for (const std::string& id : batch.clear_attempts) ids.Bytes(id);
    add(kDeleteAttempts, "clearing attempts").Add(ids.Finish());
  }
  if (!batch.attempts.empty()) {
    ArrayParam ids(pg::kTextOid), ns(pg::kInt4Oid), data(pg::kByteaOid);
    for (size_t i : LastOfEachKey(batch.attempts, [](const core::AttemptRow& a) {
           return std::pair<absl::string_view, int32_t>(a.task_id, a.attempt);
         })) {
      ids.Bytes(batch.attempts[i].task_id);
      ns.Int4(batch.attempts[i].attempt);
      data.Bytes(batch.attempts[i].data);
    }
    Params& p = add(kPutAttempts, "inserting attempts");
    p.Add(ids.Finish());
    p.Add(ns.Finish());
    p.Add(data.Finish());
  }
  if (!batch.trim_attempts.empty()) {
    ArrayParam ids(pg::kTextOid), below(pg::kInt4Oid);
    for (const auto& [id, n] : batch.trim_attempts) {
      ids.Bytes(id);
      below.Int4(n);
    }
    Params& p = add(kTrimAttempts, "trimming attempts");
    p.Add(ids.Finish());
    p.Add(below.Finish());
  }

  if (!batch.events.empty()) {
    ArrayParam c[10] = {ArrayParam(pg::kInt8Oid),  ArrayParam(pg::kTextOid),
                        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt4Oid),
                        ArrayParam(pg::kInt4Oid),  ArrayParam(pg::kInt4Oid),
                        ArrayParam(pg::kTextOid),  ArrayParam(pg::kInt8Oid),
                        ArrayParam(pg::kByteaOid), ArrayParam(pg::kTextOid)};
    for (const core::EventRow& e : batch.events) {
      c[0].Int8(e.revision);
      c[1].Bytes(e.task_id);
      c[2].Bytes(e.queue);
      c[3].Int4(e.from_state);
      c[4].Int4(e.to_state);
      c[5].Int4(e.attempt);
      c[6].Bytes(e.agent_id);
      c[7].Int8(e.time_us);
      c[8].Bytes(e.reason);
      c[9].Bytes(e.job_id);
    }
    Params& p = add(kInsertEvents, "inserting events");
    for (ArrayParam& a : c) p.Add(a.Finish());
  }

  if (!batch.schedules.empty()) {
    ArrayParam gone(pg::kTextOid);
    ArrayParam c[10] = {ArrayParam(pg::kTextOid), ArrayParam(pg::kByteaOid),
                        ArrayParam(pg::kBoolOid), ArrayParam(pg::kInt8Oid),
                        ArrayParam(pg::kInt8Oid), ArrayParam(pg::kTextOid),
                        ArrayParam(pg::kInt8Oid), ArrayParam(pg::kByteaOid),
                        ArrayParam(pg::kInt8Oid), ArrayParam(pg::kInt8Oid)};
    for (size_t i : LastOfEachKey(
             batch.schedules, [](const core::ScheduleRow& r) { return absl::string_view(r.id); })) {
      const core::ScheduleRow& r = batch.schedules[i];
      if (r.erase) {
        gone.Bytes(r.id);
        continue;
      }
      c[0].Bytes(r.id);
      c[1].Bytes(r.definition);
      c[2].Bool(r.paused);
      c[3].Int8(r.next_fire_us);
      c[4].Int8(r.last_fire_us);
      c[5].Bytes(r.last_task_id);
      c[6].Int8(r.fire_count);
      c[7].Bytes(r.last_error);
      c[8].Int8(r.create_us);
      c[9].Int8(r.update_us);
    }
    if (gone.size() > 0) add(kDeleteSchedules, "deleting schedules").Add(gone.Finish());
    if (c[0].size() > 0) {
      Params& p = add(kPutSchedules, "writing schedules");
      for (ArrayParam& a : c) p.Add(a.Finish());
    }
  }

  if (batch.prune_events_through > 0) {
    add(kPruneEvents, "pruning events").Int8(batch.prune_events_through);
    add(kNotePruned, "noting the pruned revision").Int8(batch.prune_events_through);
  }

  // The fence last, right before the Sync: its lock on the lease row
  // orders this transaction with a standby taking the lease, and it is
  // taken only once the whole batch is sent, so a writer cut off while
  // sending (the batch passes libpq's 64 KiB buffer and goes out in parts)
  // does not hold it. (Its other rows' locks it may: the next leader ends
  // such sessions, kTagWriterSql.)
  if (fence_epoch_ > 0) add(kFence, "checking the lease", 1);

  // One round trip: BEGIN and every statement, pipelined. Their results
  // are command tags only, so the server never blocks on a full socket
  // while the statements are still being sent.
  PGconn* conn = writer_->get();
  if (PQenterPipelineMode(conn) != 1) return pg::Error(conn, nullptr, "entering pipeline mode");
  bool sent = PQsendQueryParams(conn, "BEGIN", 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
  for (Pending& p : stmts) sent = sent && pg::SendPrepared(conn, p.st->name, p.params);
  sent = sent && PQpipelineSync(conn) == 1;
  absl::Status status;
  if (!sent) status = pg::Error(conn, nullptr, "sending the batch");
  // Each statement's result is followed by a null; then the sync.
  size_t next = 0;                                            // 0: BEGIN, then stmts[next - 1]
  std::pair<std::string, std::string>* missing_in = nullptr;  // the updates' arrays
  while (sent) {
    Result r(PQgetResult(conn));
    if (r == nullptr) {
      if (PQstatus(conn) == CONNECTION_BAD) break;
      ++next;
      continue;
    }
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_PIPELINE_SYNC) break;
    const Pending* p = next >= 1 && next <= stmts.size() ? &stmts[next - 1] : nullptr;
    const std::string what = p != nullptr ? p->what : "beginning a transaction";
    if (st == PGRES_PIPELINE_ABORTED) continue;  // skipped after an earlier error
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      if (status.ok()) status = pg::Error(conn, r.get(), what);
      continue;
    }
    if (p != nullptr && p->st == &kFence) {
      // The batch ran before it; it is rolled back. A lost lease explains
      // a row count that fell short too: it is what is said.
      const int64_t now = PQntuples(r.get()) == 1 ? pg::GetInt8(r.get(), 0, 0) : -1;
      if (now != fence_epoch_) {
        missing_in = nullptr;
        status = absl::FailedPreconditionError(absl::StrCat(
            "this scheduler's lease epoch ", fence_epoch_, " was superseded by epoch ", now,
            ": another scheduler leads ", schema_, "; nothing of the batch was written"));
      }
      continue;
    }
    if (status.ok() && p != nullptr && p->expect >= 0 && pg::Affected(r.get()) != p->expect) {
      status = absl::NotFoundError(absl::StrCat(what, ": ", p->expect - pg::Affected(r.get()),
                                                " of ", p->expect, " rows are not there"));
      if (p->st == &kUpdateTasks) missing_in = &updated;
      if (p->st == &kDeleteTasks && batch.deletes.size() == 1) {
        status = absl::NotFoundError(
            absl::StrCat("deleting task ", batch.deletes[0].id, ": no such row"));
      }
    }
  }
  if (PQstatus(conn) == CONNECTION_BAD && status.ok()) {
    status = pg::Error(conn, nullptr, "writing the batch");
  }
  PQexitPipelineMode(conn);
  if (!status.ok()) {
    // A row count fell short: name a missing task, as the SQLite store
    // does, while the transaction can still be asked (then rolled back).
    if (missing_in != nullptr && PQstatus(conn) == CONNECTION_OK &&
        PQtransactionStatus(conn) == PQTRANS_INTRANS) {
      Params p;
      p.Add(std::move(missing_in->first));
      p.Add(std::move(missing_in->second));
      Result r(pg::ExecParams(conn,
                              "SELECT v.id FROM unnest($1::int8[], $2::text[]) AS v(seq, id) "
                              "WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.seq = v.seq "
                              "AND t.id = v.id) LIMIT 1",
                              p));
      if (r != nullptr && PQresultStatus(r.get()) == PGRES_TUPLES_OK && PQntuples(r.get()) == 1) {
        status = absl::NotFoundError(
            absl::StrCat("updating task ", pg::GetBytes(r.get(), 0, 0), ": no such row"));
      }
    }
    return status;
  }
  Result commit(PQexec(conn, "COMMIT"));
  return pg::Check(conn, commit.get(), "committing");
}

}  // namespace taskgrid::store
