#include "scheduler/store/postgres_lease.h"

#include <libpq-fe.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/store/postgres_util.h"

namespace taskgrid::store {

using pg::Params;
using pg::Result;

namespace {

// Takes the row when it is free, expired or ours; the outer SELECT reads
// the row as it was before (a data-modifying WITH's snapshot), so a row
// not taken names the leader. Expiry by the server's clock. The row is
// locked FOR UPDATE first: that waits (up to lock_wait) for a commit in
// flight, whose fence holds KEY SHARE (kLeaseFenceSql).
constexpr char kAcquire[] =
    "WITH locked AS (SELECT id FROM lease WHERE id = 1 FOR UPDATE), "
    "taken AS (UPDATE lease SET holder = $1::text, address = $2::text, epoch = epoch + 1, "
    "expires_at = now() + $3::int8 * interval '1 microsecond' FROM locked "
    "WHERE lease.id = locked.id AND (expires_at <= now() OR holder = $1::text) "
    "RETURNING lease.epoch) "
    "SELECT (SELECT epoch FROM taken), l.holder, l.address, l.epoch, "
    "(extract(epoch FROM greatest(l.expires_at, now()) - now()) * 1000000)::int8 "
    "FROM lease l WHERE l.id = 1";
// Extends only while the epoch is ours; the current epoch names the
// successor when not.
constexpr char kRenew[] =
    "WITH r AS (UPDATE lease SET address = $2::text, "
    "expires_at = now() + $3::int8 * interval '1 microsecond' "
    "WHERE id = 1 AND epoch = $1::int8 RETURNING epoch) "
    "SELECT (SELECT epoch FROM r), l.epoch, l.holder FROM lease l WHERE l.id = 1";
// The writer sessions (kTagWriterSql) of this schema and database, other
// than this one, whose epoch is below $1 (0: at most the lease's, and only
// once it expired), ended; how many.
constexpr char kReapWriters[] =
    "WITH w AS (SELECT a.pid, substring(a.application_name FROM "
    "'^taskgrid writer ([0-9]+) epoch ')::oid AS nsp, "
    "substring(a.application_name FROM '^taskgrid writer [0-9]+ epoch ([0-9]+)')::int8 AS epoch "
    "FROM pg_stat_activity a WHERE a.datname = current_database() "
    "AND a.pid <> pg_backend_pid() AND a.application_name LIKE 'taskgrid writer %') "
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(w.pid)) FROM w, lease l "
    "WHERE l.id = 1 AND w.nsp = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
    "AND w.epoch >= 1 AND CASE WHEN $1::int8 = 0 "
    "THEN l.expires_at <= now() AND w.epoch <= l.epoch ELSE w.epoch < $1::int8 END";
constexpr char kRelease[] =
    "UPDATE lease SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1::int8";

}  // namespace

PostgresLease::PostgresLease(const LeaseOptions& opts)
    : opts_(opts),
      address_(opts.address),
      conn_(std::make_unique<pg::Conn>(opts.url, "lease", opts.ttl / 3)) {}

PostgresLease::~PostgresLease() = default;

absl::StatusOr<std::unique_ptr<PostgresLease>> PostgresLease::Open(const LeaseOptions& opts) {
  std::unique_ptr<PostgresLease> l(new PostgresLease(opts));
  if (absl::Status s = l->Connect(); !s.ok()) return s;
  return l;
}

absl::Status PostgresLease::Connect() {
  bool fresh = false;
  if (absl::Status s = conn_->Ensure(&fresh); !s.ok()) return s;
  if (!fresh) return absl::OkStatus();
  // A leader's commit holds the row for one round trip; one stopped
  // between its batch and its COMMIT holds it until the server ends its
  // session (the store's writer_idle_limit), one cut off mid-batch until
  // it is ended (kReapWriters): wait only so long, then answer "not now".
  absl::Status s = pg::Exec(
      conn_->get(),
      absl::StrCat("SET lock_timeout = ", absl::ToInt64Milliseconds(opts_.lock_wait)).c_str(),
      "setting the lease's lock wait");
  if (!s.ok()) conn_->Close();
  return s;
}

void PostgresLease::Interrupt() { conn_->Interrupt(); }

absl::StatusOr<LeaseState> PostgresLease::TryAcquire() {
  if (absl::Status s = Connect(); !s.ok()) return s;
  Params p;
  p.Bytes(opts_.holder);
  p.Bytes(address_);
  p.Int8(absl::ToInt64Microseconds(opts_.ttl));
  auto lock_waited_out = [](const Result& r) {
    const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
    return state != nullptr && std::string(state) == "55P03";
  };
  Result r(pg::ExecParams(conn_->get(), kAcquire, p));
  int64_t ended = 0;
  if (lock_waited_out(r)) {
    // A commit of the leader's holds the row: alive, unless its lease
    // expired (then it was cut off mid-commit; its session is ended, and
    // taking is tried once more, the lock wait covering its end).
    LeaseState out;
    ReapWriters(0, &out);
    if (out.writers_ended == 0) return out;
    ended = out.writers_ended;
    r = Result(pg::ExecParams(conn_->get(), kAcquire, p));
    if (lock_waited_out(r)) return out;
  }
  if (absl::Status s = pg::Check(conn_->get(), r.get(), "taking the lease"); !s.ok()) {
    if (PQstatus(conn_->get()) != CONNECTION_OK) conn_->Close();
    return s;
  }
  if (PQntuples(r.get()) != 1) {
    return absl::FailedPreconditionError("the lease row is missing: not a taskgrid schema");
  }
  LeaseState out;
  out.writers_ended = ended;
  out.ours = !PQgetisnull(r.get(), 0, 0);
  if (out.ours) {
    epoch_ = out.epoch = pg::GetInt8(r.get(), 0, 0);
    ReapWriters(epoch_, &out);
    out.holder = opts_.holder;
    out.address = address_;
    out.remaining = opts_.ttl;
    return out;
  }
  out.holder = std::string(pg::GetBytes(r.get(), 0, 1));
  out.address = std::string(pg::GetBytes(r.get(), 0, 2));
  out.epoch = pg::GetInt8(r.get(), 0, 3);
  out.remaining = absl::Microseconds(pg::GetInt8(r.get(), 0, 4));
  return out;
}

void PostgresLease::ReapWriters(int64_t below, LeaseState* out) {
  Params p;
  p.Int8(below);
  Result r(pg::ExecParams(conn_->get(), kReapWriters, p));
  if (absl::Status s = pg::Check(conn_->get(), r.get(),
                                 "ending the writer sessions of earlier "
                                 "leaders");
      !s.ok()) {
    if (PQstatus(conn_->get()) != CONNECTION_OK) conn_->Close();
    out->reap_error = std::string(s.message());
    return;
  }
  out->writers_ended += PQntuples(r.get()) == 1 ? pg::GetInt8(r.get(), 0, 0) : 0;
}

absl::Status PostgresLease::Renew() {
  if (epoch_ == 0) return absl::FailedPreconditionError("the lease was never taken");
  if (absl::Status s = Connect(); !s.ok()) return s;
  Params p;
  p.Int8(epoch_);
  p.Bytes(address_);
  p.Int8(absl::ToInt64Microseconds(opts_.ttl));
  Result r(pg::ExecParams(conn_->get(), kRenew, p));
  if (absl::Status s = pg::Check(conn_->get(), r.get(), "renewing the lease"); !s.ok()) {
    if (PQstatus(conn_->get()) != CONNECTION_OK) conn_->Close();
    return s;
  }
  if (PQntuples(r.get()) != 1) {
    return absl::FailedPreconditionError("the lease row is missing: not a taskgrid schema");
  }
  if (PQgetisnull(r.get(), 0, 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease epoch ", epoch_, " was superseded by epoch ",
                     pg::GetInt8(r.get(), 0, 1), " (", pg::GetBytes(r.get(), 0, 2), ")"));
  }
  return absl::OkStatus();
}

absl::Status PostgresLease::Release() {
  if (epoch_ == 0) return absl::OkStatus();
  if (absl::Status s = Connect(); !s.ok()) return s;
  Params p;
  p.Int8(epoch_);
  Result r(pg::ExecParams(conn_->get(), kRelease, p));
  return pg::Check(conn_->get(), r.get(), "releasing the lease");
}

}  // namespace taskgrid::store
