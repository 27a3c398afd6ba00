// The PostgreSQL store's schema: its migrations, version by version, and
// the code that reads the version and moves a schema forward. Not for code
// outside the store (and its tests).
#pragma once

#include <libpq-fe.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace taskgrid::store::pg {

// Entry i moves the schema from version i to i + 1. Append only: a
// released migration is never edited.
const std::vector<std::string>& Migrations();

// The version of the tables in the connection's current schema (0 when
// there are none), after moving them forward through `migrations`, each
// step in a transaction of its own. FAILED_PRECONDITION when the stored
// version is newer than the last of `migrations` (a newer scheduler wrote
// it) or when the search_path names no schema to create tables in.
// `where` names the database in messages.
absl::StatusOr<int> Migrate(PGconn* conn, const std::vector<std::string>& migrations,
                            const std::string& where);

}  // namespace taskgrid::store::pg
