// Small helpers over libpq shared by the PostgreSQL store's files
// (postgres_store.cc, postgres_schema.cc). Not for code outside the store.
//
// Everything goes in and out in libpq's binary format: parameters are
// built here (arrays too, so one statement writes many rows through
// unnest()), results read with the Get* functions. Binary avoids bytea's
// hex text (twice the bytes, and a decode per blob) and integer parsing.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid::store::pg {

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// Type OIDs of the built-in types the store uses (pg_type.dat; fixed
// since PostgreSQL 7).
inline constexpr Oid kBoolOid = 16;
inline constexpr Oid kByteaOid = 17;
inline constexpr Oid kInt8Oid = 20;
inline constexpr Oid kInt2Oid = 21;
inline constexpr Oid kInt4Oid = 23;
inline constexpr Oid kTextOid = 25;

// One connection, made on first use and made again on the next use after
// it broke. Not thread-safe: each user holds its own, or a mutex.
class Conn {
 public:
  // `url`: a libpq connection string, URL or key=value. `role` names the
  // connection in errors ("writer", "event reader").
  // `io_limit` (if not zero) bounds how long a connect, or a request the
  // server does not acknowledge (a partition), may block: libpq's
  // connect_timeout (at least 2 s) and the socket's tcp_user_timeout. For
  // the lease, whose renewals must fail in time rather than hang.
  Conn(std::string url, std::string role, absl::Duration io_limit = absl::ZeroDuration())
      : url_(std::move(url)), role_(std::move(role)), io_limit_(io_limit) {}
  ~Conn() { Close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects when there is no live connection. UNAVAILABLE naming the
  // server's or libpq's reason when it cannot. `*fresh` (if given) says
  // whether this call made a new connection (its prepared statements and
  // session state are gone).
  absl::Status Ensure(bool* fresh = nullptr);
  PGconn* get() const { return conn_; }
  void Close();
  const std::string& role() const { return role_; }

  // From any thread, any time: a call blocked on the connection (a path
  // that takes the bytes and never answers, a server that never answers)
  // fails at once, and the next Ensure connects again. The socket is shut
  // down through a duplicate of its own, closed only under socket_mu_, so
  // this never reaches a descriptor reused by another.
  void Interrupt();

 private:
  std::string url_;
  std::string role_;
  absl::Duration io_limit_;
  PGconn* conn_ = nullptr;
  std::mutex socket_mu_;
  int socket_ = -1;  // guarded by socket_mu_: a duplicate of conn_'s socket
};

// The status for a failed command: UNAVAILABLE when the connection is gone
// or the server is going away (SQLSTATE classes 08 and 57P), INTERNAL
// otherwise; the message names `what` and the server's error. `res` may be
// null (the error is then the connection's).
absl::Status Error(PGconn* conn, const PGresult* res, absl::string_view what);
// OK when `res` is PGRES_COMMAND_OK or PGRES_TUPLES_OK, else Error().
absl::Status Check(PGconn* conn, const PGresult* res, absl::string_view what);
// Runs SQL without parameters (one or more statements, text protocol).
absl::Status Exec(PGconn* conn, const char* sql, absl::string_view what);
// Rows affected by a command (its tag's count).
int64_t Affected(const PGresult* res);

// Parameters of one statement, binary, owned until the statement is sent.
class Params {
 public:
  void Int8(int64_t v);
  void Int4(int32_t v);
  void Bytes(absl::string_view v);  // text and bytea alike
  void Add(std::string&& encoded);  // an array from ArrayParam::Finish()
  int size() const { return static_cast<int>(values_.size()); }
  // Pointers into the values: valid until the next change.
  const char* const* values();
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  std::vector<std::string> values_;
  std::vector<const char*> ptrs_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
};

// A one-dimensional array parameter of one element type, no NULLs.
class ArrayParam {
 public:
  explicit ArrayParam(Oid element) : element_(element) {}
  void Int8(int64_t v);
  void Int4(int32_t v);
  void Int2(int16_t v);
  void Bool(bool v);
  void Bytes(absl::string_view v);
  int size() const { return n_; }
  // The array in binary format; the builder is empty again afterwards.
  std::string Finish();

 private:
  Oid element_;
  int n_ = 0;
  std::string body_;
};

// Column readers for binary results. Text and bytea columns read the same.
int64_t GetInt8(const PGresult* r, int row, int col);
int32_t GetInt4(const PGresult* r, int row, int col);
int16_t GetInt2(const PGresult* r, int row, int col);
bool GetBool(const PGresult* r, int row, int col);
absl::string_view GetBytes(const PGresult* r, int row, int col);
// Into an existing string (keeping its buffer).
void Assign(const PGresult* r, int row, int col, std::string* out);

// Sends a prepared statement with binary parameters and asks for binary
// results (PQsendQueryPrepared).
bool SendPrepared(PGconn* conn, const char* name, Params& params);
// Runs a statement with binary parameters and results, waiting for it.
Result ExecParams(PGconn* conn, const char* sql, Params& params);

// "postgres://HOST[:PORT]/DB" for logs: the server and database only,
// never the user's password. "postgres://?" when the URL does not parse.
std::string DisplayName(const std::string& url);

}  // namespace taskgrid::store::pg
