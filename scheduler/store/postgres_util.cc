#include "scheduler/store/postgres_util.h"

#include <endian.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "scheduler/store/redact.h"

namespace taskgrid::store::pg {

namespace {

void PutBE32(std::string* out, uint32_t v) {
  v = htobe32(v);
  out->append(reinterpret_cast<const char*>(&v), 4);
}
void PutBE64(std::string* out, uint64_t v) {
  v = htobe64(v);
  out->append(reinterpret_cast<const char*>(&v), 8);
}
std::string BE32(uint32_t v) {
  std::string s;
  PutBE32(&s, v);
  return s;
}

absl::string_view Trimmed(const char* msg) {
  return absl::StripAsciiWhitespace(msg == nullptr ? "" : msg);
}

}  // namespace

absl::Status Conn::Ensure(bool* fresh) {
  if (fresh != nullptr) *fresh = false;
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
  Close();
  // Defaults first: the URL, expanded from dbname, overrides them. A
  // connect gives up after 10 s, and keepalives notice a server that went
  // away without closing the connection within about half a minute.
  const std::string connect_timeout =
      io_limit_ > absl::ZeroDuration()
          ? absl::StrCat(std::max<int64_t>(2, absl::ToInt64Seconds(io_limit_)))
          : "10";
  const std::string user_timeout = absl::StrCat(absl::ToInt64Milliseconds(io_limit_));
  const char* keys[] = {
      "connect_timeout",  "keepalives_idle", "keepalives_interval",       "keepalives_count",
      "tcp_user_timeout", "dbname",          "fallback_application_name", nullptr};
  const char* values[] = {
      connect_timeout.c_str(), "15",   "5", "3", user_timeout.c_str(), url_.c_str(),
      "taskgrid-scheduler",    nullptr};
  conn_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn_ == nullptr) return absl::ResourceExhaustedError("libpq: out of memory");
  if (PQstatus(conn_) != CONNECTION_OK) {
    // libpq's message may take several lines (a hint, each address
    // tried): one line here, for logs.
    std::string why = RedactPasswords(Trimmed(PQerrorMessage(conn_)));
    absl::StrReplaceAll({{"\n\t", "; "}, {"\n", "; "}}, &why);
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "cannot connect to PostgreSQL at ", DisplayName(url_), " (", role_, " connection): ", why));
    Close();
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(socket_mu_);
    socket_ = fcntl(PQsocket(conn_), F_DUPFD_CLOEXEC, 3);
  }
  if (fresh != nullptr) *fresh = true;
  return absl::OkStatus();
}

void Conn::Close() {
  if (conn_ != nullptr) PQfinish(conn_);
  conn_ = nullptr;
  std::lock_guard<std::mutex> lock(socket_mu_);
  if (socket_ >= 0) close(socket_);
  socket_ = -1;
}

void Conn::Interrupt() {
  std::lock_guard<std::mutex> lock(socket_mu_);
  // Shuts the socket itself down, under every descriptor of it.
  if (socket_ >= 0) shutdown(socket_, SHUT_RDWR);
}

absl::Status Error(PGconn* conn, const PGresult* res, absl::string_view what) {
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  std::string msg = RedactPasswords(Trimmed(res != nullptr ? PQresultErrorMessage(res) : ""));
  if (msg.empty()) {
    msg = RedactPasswords(Trimmed(conn != nullptr ? PQerrorMessage(conn) : "no connection"));
  }
  const absl::string_view code = state != nullptr ? state : "";
  if (conn == nullptr || PQstatus(conn) == CONNECTION_BAD || absl::StartsWith(code, "08") ||
      absl::StartsWith(code, "57P")) {
    return absl::UnavailableError(
        absl::StrCat(what, ": the connection to PostgreSQL was lost: ", msg));
  }
  if (code == "23505") return absl::AlreadyExistsError(absl::StrCat(what, ": ", msg));
  return absl::InternalError(absl::StrCat(what, ": ", msg));
}

absl::Status Check(PGconn* conn, const PGresult* res, absl::string_view what) {
  const ExecStatusType st = res != nullptr ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return absl::OkStatus();
  return Error(conn, res, what);
}

absl::Status Exec(PGconn* conn, const char* sql, absl::string_view what) {
  Result r(PQexec(conn, sql));
  return Check(conn, r.get(), what);
}

int64_t Affected(const PGresult* res) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(PQcmdTuples(const_cast<PGresult*>(res)), &n)) return -1;
  return n;
}

void Params::Int8(int64_t v) {
  std::string s;
  PutBE64(&s, static_cast<uint64_t>(v));
  Add(std::move(s));
}
void Params::Int4(int32_t v) { Add(BE32(static_cast<uint32_t>(v))); }
void Params::Bytes(absl::string_view v) { Add(std::string(v)); }
void Params::Add(std::string&& encoded) {
  lengths_.push_back(static_cast<int>(encoded.size()));
  formats_.push_back(1);
  values_.push_back(std::move(encoded));
}
const char* const* Params::values() {
  ptrs_.clear();
  for (const std::string& v : values_) ptrs_.push_back(v.data());
  return ptrs_.data();
}

void ArrayParam::Int8(int64_t v) {
  PutBE32(&body_, 8);
  PutBE64(&body_, static_cast<uint64_t>(v));
  ++n_;
}
void ArrayParam::Int4(int32_t v) {
  PutBE32(&body_, 4);
  PutBE32(&body_, static_cast<uint32_t>(v));
  ++n_;
}
void ArrayParam::Int2(int16_t v) {
  PutBE32(&body_, 2);
  const uint16_t be = htobe16(static_cast<uint16_t>(v));
  body_.append(reinterpret_cast<const char*>(&be), 2);
  ++n_;
}
void ArrayParam::Bool(bool v) {
  PutBE32(&body_, 1);
  body_.push_back(v ? 1 : 0);
  ++n_;
}
void ArrayParam::Bytes(absl::string_view v) {
  PutBE32(&body_, static_cast<uint32_t>(v.size()));
  body_.append(v.data(), v.size());
  ++n_;
}
std::string ArrayParam::Finish() {
  // array_recv's layout: dimensions, has-nulls flag, element type, then
  // (size, lower bound) per dimension, then each element as (length, bytes).
  std::string out;
  out.reserve(20 + body_.size());
  PutBE32(&out, n_ == 0 ? 0 : 1);
  PutBE32(&out, 0);
  PutBE32(&out, element_);
  if (n_ > 0) {
    PutBE32(&out, static_cast<uint32_t>(n_));
    PutBE32(&out, 1);
  }
  out += body_;
  body_.clear();
  n_ = 0;
  return out;
}

int64_t GetInt8(const PGresult* r, int row, int col) {
  uint64_t v = 0;
  memcpy(&v, PQgetvalue(r, row, col), 8);
  return static_cast<int64_t>(be64toh(v));
}
int32_t GetInt4(const PGresult* r, int row, int col) {
  uint32_t v = 0;
  memcpy(&v, PQgetvalue(r, row, col), 4);
  return static_cast<int32_t>(be32toh(v));
}
int16_t GetInt2(const PGresult* r, int row, int col) {
  uint16_t v = 0;
  memcpy(&v, PQgetvalue(r, row, col), 2);
  return static_cast<int16_t>(be16toh(v));
}
bool GetBool(const PGresult* r, int row, int col) { return PQgetvalue(r, row, col)[0] != 0; }
absl::string_view GetBytes(const PGresult* r, int row, int col) {
  if (PQgetisnull(r, row, col)) return {};
  return absl::string_view(PQgetvalue(r, row, col), PQgetlength(r, row, col));
}
void Assign(const PGresult* r, int row, int col, std::string* out) {
  const absl::string_view v = GetBytes(r, row, col);
  out->assign(v.data(), v.size());
}

bool SendPrepared(PGconn* conn, const char* name, Params& params) {
  return PQsendQueryPrepared(conn, name, params.size(), params.values(), params.lengths(),
                             params.formats(), /*resultFormat=*/1) == 1;
}

Result ExecParams(PGconn* conn, const char* sql, Params& params) {
  return Result(PQexecParams(conn, sql, params.size(), nullptr, params.values(), params.lengths(),
                             params.formats(), /*resultFormat=*/1));
}

std::string DisplayName(const std::string& url) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(url.c_str(), &err);
  if (err != nullptr) PQfreemem(err);
  if (opts == nullptr) return "postgres://?";
  std::string host, port, db, user;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const absl::string_view k = o->keyword;
    if (k == "host" || (k == "hostaddr" && host.empty())) host = o->val;
    if (k == "port") port = o->val;
    if (k == "dbname") db = o->val;
    if (k == "user") user = o->val;
  }
  PQconninfoFree(opts);
  // libpq's defaults when the URL leaves them out: the local socket, the
  // database named after the user.
  if (host.empty()) host = "localhost";
  if (db.empty()) db = user;
  return absl::StrCat("postgres://", host, port.empty() ? "" : ":", port, "/", db);
}

}  // namespace taskgrid::store::pg
