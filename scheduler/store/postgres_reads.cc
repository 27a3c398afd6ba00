// PostgresStore's reads: the recovery scan and loads, and the reads of
// tasks and events made at any time (postgres_store.h says on which
// connection each runs).
#include <libpq-fe.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/store/postgres_store.h"
#include "scheduler/store/postgres_util.h"

namespace taskgrid::store {

using pg::ArrayParam;
using pg::Params;
using pg::Result;

namespace {

// The columns of a whole task row, in the order ReadRow reads them.
constexpr char kTaskColumns[] =
    "id, seq, queue, state, attempt, agent_id, create_us, update_us, next_run_us, dispatch_us, "
    "start_us, reason, result, spec, pause_requested, job_id, attempt_base, attempts_dropped, "
    "interrupted_dropped, claim_until_us, merge_fire_us, unique_key, unique_until_us, family, "
    "labels";

// The terminal states as an SQL list, for the light scan.
std::string TerminalStates() {
  std::vector<int> states;
  for (int s = 0; s <= 64; ++s) {
    if (v1::TaskState_IsValid(s) && core::IsTerminal(static_cast<v1::TaskState>(s))) {
      states.push_back(s);
    }
  }
  return absl::StrJoin(states, ", ");
}

// kTaskColumns with a finished task's agent, reason and blobs left out
// by the server, so they never cross the network.
std::string LightColumns() {
  const std::string finished = absl::StrCat("state IN (", TerminalStates(), ")");
  auto empty_if = [&](const char* col, const char* empty) {
    return absl::StrCat("CASE WHEN ", finished, " THEN ", empty, " ELSE ", col, " END");
  };
  return absl::StrCat("id, seq, queue, state, attempt, ", empty_if("agent_id", "''"),
                      ", create_us, update_us, next_run_us, dispatch_us, start_us, ",
                      empty_if("reason", "''::bytea"), ", ", empty_if("result", "''::bytea"), ", ",
                      empty_if("spec", "''::bytea"),
                      ", pause_requested, job_id, attempt_base, attempts_dropped, "
                      "interrupted_dropped, claim_until_us, merge_fire_us, unique_key, "
                      "unique_until_us, family, labels");
}

// One row of kTaskColumns (from column `c`) into `r`; assign() into a row
// left by an earlier chunk reuses its buffers.
void ReadRow(const PGresult* res, int i, int c, bool light_finished, core::TaskRow* r) {
  r->insert = false;
  r->state = pg::GetInt4(res, i, c + 3);
  r->light = light_finished && core::IsTerminal(static_cast<v1::TaskState>(r->state));
  pg::Assign(res, i, c + 0, &r->id);
  r->seq = pg::GetInt8(res, i, c + 1);
  pg::Assign(res, i, c + 2, &r->queue);
  r->attempt = pg::GetInt4(res, i, c + 4);
  r->create_us = pg::GetInt8(res, i, c + 6);
  r->update_us = pg::GetInt8(res, i, c + 7);
  pg::Assign(res, i, c + 15, &r->job_id);
  pg::Assign(res, i, c + 21, &r->unique_key);
  r->unique_until_us = pg::GetInt8(res, i, c + 22);
  const int family = pg::GetInt2(res, i, c + 23);
  r->replica = family == 1;
  r->has_replicas = family == 2;
  pg::Assign(res, i, c + 24, &r->labels);
  if (r->light) {
    for (std::string* cleared : {&r->agent_id, &r->reason, &r->result, &r->spec}) cleared->clear();
    return;
  }
  pg::Assign(res, i, c + 5, &r->agent_id);
  r->next_run_us = pg::GetInt8(res, i, c + 8);
  r->dispatch_us = pg::GetInt8(res, i, c + 9);
  r->start_us = pg::GetInt8(res, i, c + 10);
  pg::Assign(res, i, c + 11, &r->reason);
  pg::Assign(res, i, c + 12, &r->result);
  pg::Assign(res, i, c + 13, &r->spec);
  r->pause_requested = pg::GetBool(res, i, c + 14);
  r->attempt_base = pg::GetInt4(res, i, c + 16);
  r->attempts_dropped = pg::GetInt4(res, i, c + 17);
  r->interrupted_dropped = pg::GetInt4(res, i, c + 18);
  r->claim_until_us = pg::GetInt8(res, i, c + 19);
  r->merge_fire_us = pg::GetInt8(res, i, c + 20);
}

// Runs read statements in one read-only REPEATABLE READ transaction, in
// one round trip (pipeline mode): every result from one snapshot.
absl::StatusOr<std::vector<Result>> ReadInOneSnapshot(
    PGconn* conn, std::vector<std::pair<const char*, Params>>& queries, const char* what) {
  if (PQenterPipelineMode(conn) != 1) return pg::Error(conn, nullptr, what);
  auto send_plain = [&](const char* sql) {
    return PQsendQueryParams(conn, sql, 0, nullptr, nullptr, nullptr, nullptr, 1) == 1;
  };
  bool sent = send_plain("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  for (auto& [sql, params] : queries) {
    sent = sent && PQsendQueryParams(conn, sql, params.size(), nullptr, params.values(),
                                     params.lengths(), params.formats(), 1) == 1;
  }
  sent = sent && send_plain("COMMIT") && PQpipelineSync(conn) == 1;
  absl::Status status;
  if (!sent) status = pg::Error(conn, nullptr, what);
  std::vector<Result> out;
  // Every result up to the sync, each followed by a null; stops early
  // only when the connection is gone.
  for (size_t i = 0; sent && i < queries.size() + 3; ++i) {
    Result r(PQgetResult(conn));
    if (r == nullptr) continue;  // the end of one statement's results
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_PIPELINE_SYNC) break;
    --i;  // a result, not a statement's end
    if (st == PGRES_FATAL_ERROR || st == PGRES_PIPELINE_ABORTED) {
      if (status.ok()) status = pg::Error(conn, r.get(), what);
      if (PQstatus(conn) == CONNECTION_BAD) break;
      continue;
    }
    if (st == PGRES_TUPLES_OK) out.push_back(std::move(r));
  }
  PQexitPipelineMode(conn);
  // A failed statement leaves the transaction open and aborted: end it, so
  // the connection's next read can begin its own.
  if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) != PQTRANS_IDLE) {
    Result rollback(PQexec(conn, "ROLLBACK"));
  }
  if (status.ok() && out.size() != queries.size()) status = pg::Error(conn, nullptr, what);
  if (!status.ok()) return status;
  return out;
}

// Runs a read with binary results on `conn`, connecting first; a read that
// finds the connection broken is tried once more on a new one (reads
// change nothing, so that is safe).
template <typename Fn>
auto WithRetry(pg::Conn& conn, Fn read) -> decltype(read(static_cast<PGconn*>(nullptr))) {
  for (int round = 0;; ++round) {
    if (absl::Status s = conn.Ensure(); !s.ok()) return s;
    auto out = read(conn.get());
    if (out.ok() || PQstatus(conn.get()) == CONNECTION_OK || round == 1) {
      if (!out.ok() && PQstatus(conn.get()) != CONNECTION_OK) conn.Close();
      return out;
    }
    conn.Close();
  }
}

absl::StatusOr<Result> Query(PGconn* conn, const char* sql, Params& params, const char* what) {
  Result r(pg::ExecParams(conn, sql, params));
  if (absl::Status s = pg::Check(conn, r.get(), what); !s.ok()) return s;
  return r;
}

}  // namespace

absl::StatusOr<int64_t> PostgresStore::CountTasks() {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  Params none;
  auto r = Query(writer_->get(), "SELECT count(*) FROM tasks", none, "counting tasks");
  if (!r.ok()) return r.status();
  return pg::GetInt8(r->get(), 0, 0);
}

absl::Status PostgresStore::ScanTasks(const RowSink& sink, bool light_finished) {
  // A connection of its own, for this call only, with a cursor in one
  // read-only snapshot: the table streams in chunks, never whole. The next
  // chunk is asked for before the sink gets this one, so the server reads
  // while the caller files.
  pg::Conn own(url_, "scan");
  if (absl::Status s = own.Ensure(); !s.ok()) return s;
  PGconn* conn = own.get();
  const std::string declare = absl::StrCat(
      "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; DECLARE scan NO SCROLL CURSOR "
      "FOR SELECT ",
      light_finished ? LightColumns() : std::string(kTaskColumns), " FROM tasks ORDER BY seq");
  if (absl::Status s = pg::Exec(conn, declare.c_str(), "loading tasks"); !s.ok()) return s;
  const std::string fetch = absl::StrCat("FETCH ", kScanChunkRows, " FROM scan");
  auto send_fetch = [&] {
    return PQsendQueryParams(conn, fetch.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1) == 1;
  };
  // The result of the FETCH sent last (and the null that ends it).
  auto take = [&]() -> absl::StatusOr<Result> {
    Result r(PQgetResult(conn));
    while (Result more{PQgetResult(conn)}) {
    }
    if (absl::Status s = pg::Check(conn, r.get(), "loading tasks"); !s.ok()) return s;
    return r;
  };
  if (!send_fetch()) return pg::Error(conn, nullptr, "loading tasks");
  std::vector<core::TaskRow> rows;
  for (;;) {
    absl::StatusOr<Result> chunk = take();
    if (!chunk.ok()) return chunk.status();
    const int n = PQntuples(chunk->get());
    if (n == 0) break;
    const bool more = n == static_cast<int>(kScanChunkRows);
    if (more && !send_fetch()) return pg::Error(conn, nullptr, "loading tasks");
    rows.resize(n);  // the sink may have swapped the vector
    for (int i = 0; i < n; ++i) ReadRow(chunk->get(), i, 0, light_finished, &rows[i]);
    chunk->reset();
    if (absl::Status s = sink(&rows); !s.ok()) return s;  // the connection goes with `own`
    if (!more) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::AttemptRow>> PostgresStore::LoadAttempts() {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  Params none;
  auto r =
      Query(writer_->get(), "SELECT task_id, attempt, data FROM attempts ORDER BY task_id, attempt",
            none, "loading attempts");
  if (!r.ok()) return r.status();
  std::vector<core::AttemptRow> out(PQntuples(r->get()));
  for (size_t i = 0; i < out.size(); ++i) {
    pg::Assign(r->get(), i, 0, &out[i].task_id);
    out[i].attempt = pg::GetInt4(r->get(), i, 1);
    pg::Assign(r->get(), i, 2, &out[i].data);
  }
  return out;
}

absl::StatusOr<std::vector<core::MergedRow>> PostgresStore::LoadMerged() {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  Params none;
  auto r = Query(writer_->get(), "SELECT task_id, n, payload FROM merged ORDER BY task_id, n", none,
                 "loading merged payloads");
  if (!r.ok()) return r.status();
  std::vector<core::MergedRow> out(PQntuples(r->get()));
  for (size_t i = 0; i < out.size(); ++i) {
    pg::Assign(r->get(), i, 0, &out[i].task_id);
    out[i].n = pg::GetInt4(r->get(), i, 1);
    pg::Assign(r->get(), i, 2, &out[i].payload);
  }
  return out;
}

absl::Status PostgresStore::ReadHistory(const std::vector<std::string>& task_ids,
                                        std::vector<core::AttemptRow>* attempts,
                                        std::vector<core::MergedRow>* merged) {
  if (task_ids.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(task_mu_);
  // By the order asked (WITH ORDINALITY), each task's rows together.
  auto results = WithRetry(*task_conn_, [&](PGconn* conn) {
    ArrayParam ids(pg::kTextOid);
    for (const std::string& id : task_ids) ids.Bytes(id);
    const std::string id_array = ids.Finish();
    std::vector<std::pair<const char*, Params>> queries(2);
    queries[0].first =
        "SELECT a.task_id, a.attempt, a.data FROM unnest($1::text[]) WITH ORDINALITY AS k(id, i) "
        "JOIN attempts a ON a.task_id = k.id ORDER BY k.i, a.attempt";
    queries[1].first =
        "SELECT m.task_id, m.n, m.payload FROM unnest($1::text[]) WITH ORDINALITY AS k(id, i) "
        "JOIN merged m ON m.task_id = k.id ORDER BY k.i, m.n";
    for (auto& q : queries) q.second.Add(std::string(id_array));
    return ReadInOneSnapshot(conn, queries, "reading attempts and payloads");
  });
  if (!results.ok()) return results.status();
  const PGresult* a = (*results)[0].get();
  for (int i = 0; i < PQntuples(a); ++i) {
    core::AttemptRow& row = attempts->emplace_back();
    pg::Assign(a, i, 0, &row.task_id);
    row.attempt = pg::GetInt4(a, i, 1);
    pg::Assign(a, i, 2, &row.data);
  }
  const PGresult* m = (*results)[1].get();
  for (int i = 0; i < PQntuples(m); ++i) {
    core::MergedRow& row = merged->emplace_back();
    pg::Assign(m, i, 0, &row.task_id);
    row.n = pg::GetInt4(m, i, 1);
    pg::Assign(m, i, 2, &row.payload);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::StoredTask>> PostgresStore::ReadTasks(
    const std::vector<int64_t>& seqs) {
  std::vector<core::StoredTask> out;
  if (seqs.empty()) return out;
  std::lock_guard<std::mutex> lock(task_mu_);
  // The rows, their attempts and their payloads from one snapshot, in one
  // round trip; each keyed by the position asked (k.i).
  auto results = WithRetry(*task_conn_, [&](PGconn* conn) {
    ArrayParam want(pg::kInt8Oid);
    for (int64_t seq : seqs) want.Int8(seq);
    const std::string seq_array = want.Finish();
    constexpr char kAsked[] =
        " FROM unnest($1::int8[]) WITH ORDINALITY AS k(want, i) "
        "JOIN tasks t ON t.seq = k.want ";
    const std::string rows = absl::StrCat("SELECT k.i, ", kTaskColumns, kAsked, "ORDER BY k.i");
    const std::string attempts =
        absl::StrCat("SELECT k.i, a.attempt, a.data", kAsked,
                     "JOIN attempts a ON a.task_id = t.id ORDER BY k.i, a.attempt");
    const std::string merged = absl::StrCat("SELECT k.i, m.n, m.payload", kAsked,
                                            "JOIN merged m ON m.task_id = t.id ORDER BY k.i, m.n");
    std::vector<std::pair<const char*, Params>> queries(3);
    queries[0].first = rows.c_str();
    queries[1].first = attempts.c_str();
    queries[2].first = merged.c_str();
    for (auto& q : queries) q.second.Add(std::string(seq_array));
    return ReadInOneSnapshot(conn, queries, "reading tasks");
  });
  if (!results.ok()) return results.status();
  const PGresult* t = (*results)[0].get();
  absl::flat_hash_map<int64_t, size_t> at;  // position asked -> index in out
  for (int i = 0; i < PQntuples(t); ++i) {
    at[pg::GetInt8(t, i, 0)] = out.size();
    ReadRow(t, i, 1, /*light_finished=*/false, &out.emplace_back().row);
  }
  const PGresult* a = (*results)[1].get();
  for (int i = 0; i < PQntuples(a); ++i) {
    core::StoredTask& task = out[at[pg::GetInt8(a, i, 0)]];
    core::AttemptRow& row = task.attempts.emplace_back();
    row.task_id = task.row.id;
    row.attempt = pg::GetInt4(a, i, 1);
    pg::Assign(a, i, 2, &row.data);
  }
  const PGresult* m = (*results)[2].get();
  for (int i = 0; i < PQntuples(m); ++i) {
    core::StoredTask& task = out[at[pg::GetInt8(m, i, 0)]];
    core::MergedRow& row = task.merged.emplace_back();
    row.task_id = task.row.id;
    row.n = pg::GetInt4(m, i, 1);
    pg::Assign(m, i, 2, &row.payload);
  }
  return out;
}

absl::StatusOr<std::vector<core::QueueRow>> PostgresStore::LoadQueues() {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  Params none;
  auto r = Query(writer_->get(), "SELECT name, settings FROM queues ORDER BY name", none,
                 "loading queue settings");
  if (!r.ok()) return r.status();
  std::vector<core::QueueRow> out(PQntuples(r->get()));
  for (size_t i = 0; i < out.size(); ++i) {
    pg::Assign(r->get(), i, 0, &out[i].queue);
    pg::Assign(r->get(), i, 1, &out[i].settings);
  }
  return out;
}

absl::StatusOr<std::vector<core::ScheduleRow>> PostgresStore::LoadSchedules() {
  if (absl::Status s = EnsureWriter(); !s.ok()) return s;
  Params none;
  auto r = Query(writer_->get(),
                 "SELECT id, definition, paused, next_fire_us, last_fire_us, last_task_id, "
                 "fire_count, last_error, create_us, update_us FROM schedules ORDER BY id",
                 none, "loading schedules");
  if (!r.ok()) return r.status();
  const PGresult* res = r->get();
  std::vector<core::ScheduleRow> out(PQntuples(res));
  for (size_t j = 0; j < out.size(); ++j) {
    const int i = static_cast<int>(j);
    core::ScheduleRow& row = out[j];
    pg::Assign(res, i, 0, &row.id);
    pg::Assign(res, i, 1, &row.definition);
    row.paused = pg::GetBool(res, i, 2);
    row.next_fire_us = pg::GetInt8(res, i, 3);
    row.last_fire_us = pg::GetInt8(res, i, 4);
    pg::Assign(res, i, 5, &row.last_task_id);
    row.fire_count = pg::GetInt8(res, i, 6);
    pg::Assign(res, i, 7, &row.last_error);
    row.create_us = pg::GetInt8(res, i, 8);
    row.update_us = pg::GetInt8(res, i, 9);
  }
  return out;
}

absl::StatusOr<std::vector<StoredEvent>> PostgresStore::ReadEvents(int64_t after, int limit) {
  std::lock_guard<std::mutex> lock(event_mu_);
  auto r = WithRetry(*event_conn_, [&](PGconn* conn) {
    Params p;
    p.Int8(after);
    p.Int8(limit);
    return Query(conn,
                 "SELECT revision, task_id, queue, from_state, to_state, attempt, agent_id, "
                 "time_us, reason, job_id FROM events WHERE revision > $1::int8 "
                 "ORDER BY revision LIMIT $2::int8",
                 p, "reading events");
  });
  if (!r.ok()) return r.status();
  const PGresult* res = r->get();
  std::vector<StoredEvent> out(PQntuples(res));
  for (size_t j = 0; j < out.size(); ++j) {
    const int i = static_cast<int>(j);
    StoredEvent& ev = out[j];
    ev.revision = pg::GetInt8(res, i, 0);
    pg::Assign(res, i, 1, &ev.event.task_id);
    pg::Assign(res, i, 2, &ev.event.queue);
    ev.event.from_state = pg::GetInt4(res, i, 3);
    ev.event.to_state = pg::GetInt4(res, i, 4);
    ev.event.attempt = pg::GetInt4(res, i, 5);
    pg::Assign(res, i, 6, &ev.event.agent_id);
    ev.event.time_us = pg::GetInt8(res, i, 7);
    pg::Assign(res, i, 8, &ev.event.reason);
    pg::Assign(res, i, 9, &ev.event.job_id);
    ev.event.revision = ev.revision;
  }
  return out;
}

absl::StatusOr<EventSpan> PostgresStore::GetEventSpan() {
  std::lock_guard<std::mutex> lock(event_mu_);
  // One statement: one snapshot, so a prune between the parts cannot be
  // seen half.
  auto r = WithRetry(*event_conn_, [&](PGconn* conn) {
    Params none;
    return Query(conn,
                 "SELECT coalesce(min(revision), 0)::int8, coalesce(max(revision), 0)::int8, "
                 "(SELECT coalesce(max(value), 0) FROM meta "
                 "WHERE key = 'newest_pruned_revision')::int8 FROM events",
                 none, "reading the event span");
  });
  if (!r.ok()) return r.status();
  EventSpan span;
  span.oldest = pg::GetInt8(r->get(), 0, 0);
  span.newest_pruned = pg::GetInt8(r->get(), 0, 2);
  span.newest = std::max(pg::GetInt8(r->get(), 0, 1), span.newest_pruned);
  return span;
}

}  // namespace taskgrid::store
