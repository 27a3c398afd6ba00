#include "scheduler/store/sqlite_util.h"

#include "absl/strings/str_cat.h"

namespace taskgrid::store::sqlite {

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", db ? sqlite3_errmsg(db) : "no database"));
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", err ? err : "?", " in: ", sql));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

void BindText(sqlite3_stmt* st, int i, const std::string& v) {
  sqlite3_bind_text(st, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
}
void BindBlob(sqlite3_stmt* st, int i, const std::string& v) {
  sqlite3_bind_blob(st, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
}
std::string ColumnString(sqlite3_stmt* st, int i) {
  const void* p = sqlite3_column_blob(st, i);
  const int n = sqlite3_column_bytes(st, i);
  return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
}

// Like ColumnString, into an existing string (keeping its buffer).
void AssignColumn(sqlite3_stmt* st, int i, std::string* out) {
  const void* p = sqlite3_column_blob(st, i);
  const int n = sqlite3_column_bytes(st, i);
  if (p == nullptr) {
    out->clear();
  } else {
    out->assign(static_cast<const char*>(p), n);
  }
}

absl::StatusOr<Statement> Prepare(sqlite3* db, const char* sql, absl::string_view what) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) return SqlError(db, what);
  return Statement(st, sqlite3_finalize);
}

absl::Status Step(sqlite3* db, sqlite3_stmt* st, absl::string_view what) {
  const int rc = sqlite3_step(st);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) return SqlError(db, what);
  return absl::OkStatus();
}

}  // namespace taskgrid::store::sqlite
