// PostgresLease: which of the schedulers pointed at one PostgreSQL schema
// leads. The `lease` row of the store's schema (version 2) holds the
// leader's id, its epoch, the address it serves on and when the lease
// expires, by the server's clock (now()), so the schedulers' clocks do
// not matter. A scheduler takes the row when it is free or expired,
// bumping the epoch, and renews it before it expires; the store fences
// every commit with that epoch (PostgresStore::SetFence), so a leader
// that lost the lease (stopped, partitioned, too slow to renew) can never
// commit after another took over.
//
// Timing, all set by the caller: a standby polls TryAcquire, the leader
// renews every ttl / 3; a standby takes over within ttl + its poll period
// of the leader's last renewal.
//
// Its connection's I/O is bounded by ttl / 3 (connect, and requests the
// server does not acknowledge), so a leader cut off from the database
// sees its renewal fail in time rather than hang past its lease.
//
// Thread contract: not thread-safe; one thread (or a mutex) at a time. It
// has its own connection, apart from the store's, so renewing never waits
// for a commit's round trips. Destroy it after the last call returned.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace taskgrid::store {

// The fence every commit of the leader takes first (PostgresStore): the
// lease row's epoch under a KEY SHARE lock until the commit. A standby's
// taking locks the row FOR UPDATE, which waits for it, so a commit in
// flight is ordered before a takeover; the leader's own renewal is a
// plain UPDATE of columns no key holds (a NO KEY UPDATE lock), which a
// KEY SHARE lock does not block: renewing never waits for a commit, however
// slow (a slow fsync, a stalled synchronous replica).
inline constexpr char kLeaseFenceSql[] = "SELECT epoch FROM lease WHERE id = 1 FOR KEY SHARE";

// What a fenced writer calls its session (application_name), with its
// epoch as $1: "taskgrid writer <schema oid> epoch <epoch>", then the name
// it had (the URL's application_name, if any). A writer is only sure to
// end its transaction when it can send the rest of it: one cut off
// mid-batch (a frozen path, a host gone with its connection held open)
// keeps its row locks, the lease row's among them, until the server ends
// the session, which it may never do (no Sync came, so no idle timeout
// applies). A scheduler taking over ends such sessions itself, found by
// this name (PostgresLease::TryAcquire).
inline constexpr char kTagWriterSql[] =
    "SELECT set_config('application_name', rtrim(format('taskgrid writer %s epoch %s %s', "
    "(SELECT oid FROM pg_namespace WHERE nspname = current_schema()), $1::int8, "
    "regexp_replace(current_setting('application_name'), '^taskgrid writer [0-9]+ epoch [0-9]+ ?', "
    "''))), false)";

namespace pg {
class Conn;
}

struct LeaseOptions {
  // A libpq URL naming the store's schema (the store made the row: open
  // the PostgresStore first).
  std::string url;
  // This scheduler, unique among those sharing the schema (host:pid:...).
  std::string holder;
  // Where this scheduler serves, for standbys to tell (may be set later
  // with set_address; written by the next TryAcquire or Renew).
  std::string address;
  // How long a taking or a renewal holds, from the server's now().
  absl::Duration ttl = absl::Seconds(6);
  // How long TryAcquire waits for the leader's commit in flight (it holds
  // the row's lock) before it answers "not now".
  absl::Duration lock_wait = absl::Seconds(1);
};

// The lease as one TryAcquire saw it.
struct LeaseState {
  bool ours = false;         // this scheduler took it (epoch is now ours)
  int64_t epoch = 0;         // ours, or the leader's
  std::string holder;        // the leader ("" when none ever held it)
  std::string address;       // where the leader serves
  absl::Duration remaining;  // until the leader's lease expires (not ours)
  // Writer sessions of earlier leaders this call ended (TryAcquire), and
  // why it could not: ending another's session needs the same role or
  // pg_signal_backend; without it the server's own timeouts decide.
  int64_t writers_ended = 0;
  std::string reap_error;
};

class PostgresLease {
 public:
  // UNAVAILABLE when the server cannot be reached.
  static absl::StatusOr<std::unique_ptr<PostgresLease>> Open(const LeaseOptions& opts);
  ~PostgresLease();

  // One statement: takes the lease when it is free, expired or already
  // this holder's, bumping the epoch; otherwise reports the leader. A
  // leader committing at the moment (its fence holds the row) reads as
  // not ours, with the epoch unknown (0). When that leader's lease has
  // expired, the writer sessions of its epoch and before (kTagWriterSql)
  // are ended first, so a commit cut off mid-batch cannot hold the row for
  // ever; once the lease is ours, every writer session of an earlier epoch
  // is ended, so none of their row locks outlives the takeover.
  absl::StatusOr<LeaseState> TryAcquire();
  // Extends the lease by ttl from the server's now(), and writes the
  // address, only while the epoch is still ours: FAILED_PRECONDITION
  // naming both epochs when another took it.
  absl::Status Renew();
  // Ends the lease at once (a clean stop), so a standby need not wait for
  // it to expire; no-op when it is no longer ours.
  absl::Status Release();

  // From any thread, any time: a call blocked on the connection (a path
  // that takes the bytes and never answers) fails at once, and the next
  // call connects again.
  void Interrupt();

  int64_t epoch() const { return epoch_; }
  void set_address(std::string address) { address_ = std::move(address); }
  const LeaseOptions& options() const { return opts_; }

 private:
  explicit PostgresLease(const LeaseOptions& opts);
  absl::Status Connect();
  // Ends the fenced writer sessions of this schema with an epoch below
  // `below` (0: up to the lease's epoch, and only when it has expired).
  void ReapWriters(int64_t below, LeaseState* out);

  LeaseOptions opts_;
  std::string address_;
  int64_t epoch_ = 0;
  std::unique_ptr<pg::Conn> conn_;
};

}  // namespace taskgrid::store
