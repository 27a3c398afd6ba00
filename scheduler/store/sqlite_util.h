// Small helpers over SQLite's C API shared by the SQLite store's files
// (sqlite_store.cc, sqlite_schema.cc). Not for code outside the store.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace taskgrid::store::sqlite {

// INTERNAL naming `what` and SQLite's last error on `db`.
absl::Status SqlError(sqlite3* db, absl::string_view what);
// Runs statements that return no rows.
absl::Status Exec(sqlite3* db, const char* sql);
// Binds without copying: `v` must outlive the statement's step.
void BindText(sqlite3_stmt* st, int i, const std::string& v);
void BindBlob(sqlite3_stmt* st, int i, const std::string& v);
std::string ColumnString(sqlite3_stmt* st, int i);
// Like ColumnString, into an existing string (keeping its buffer).
void AssignColumn(sqlite3_stmt* st, int i, std::string* out);
// A prepared statement, finalized when it goes.
using Statement = std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)>;
// Prepares `sql` on `db`; an error names `what`.
absl::StatusOr<Statement> Prepare(sqlite3* db, const char* sql, absl::string_view what);
// Steps a statement that returns no rows, then resets it and clears its
// bindings.
absl::Status Step(sqlite3* db, sqlite3_stmt* st, absl::string_view what);

}  // namespace taskgrid::store::sqlite
