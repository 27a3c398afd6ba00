// A schema of its own on the tests' PostgreSQL server, for one test case.
//
// The server is started once per ctest run by the "postgres" fixture
// (tests/testing/postgres.sh), which writes its URL into the file named by
// $TASKGRID_TEST_POSTGRES. Each TestSchema makes a fresh schema there and
// a URL whose search_path names it, so test cases never see each other's
// tables, and drops it when it goes. Without a server the tests that need
// one skip (skip_reason()), unless TASKGRID_REQUIRE_POSTGRES=1.
//
// Not thread-safe; header-only, for tests.
#pragma once

#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace taskgrid::testing {

class TestSchema {
 public:
  TestSchema() {
    const char* file = std::getenv("TASKGRID_TEST_POSTGRES");
    if (file == nullptr || *file == '\0') {
      skip_ = "no PostgreSQL server: TASKGRID_TEST_POSTGRES is not set (ctest sets it)";
      return;
    }
    std::ifstream in(file);
    std::getline(in, base_url_);
    base_url_ = std::string(absl::StripAsciiWhitespace(base_url_));
    if (base_url_.empty()) {
      skip_ = absl::StrCat("no PostgreSQL server: ", file,
                           " holds no URL (is postgresql-15 installed? tests/testing/postgres.sh)");
      return;
    }
    static std::atomic<int> counter{0};
    name_ = absl::StrCat("test_", getpid(), "_", absl::ToUnixMicros(absl::Now()) % 1'000'000'000,
                         "_", counter++);
    if (std::string err =
            Exec(absl::StrCat("SET client_min_messages = warning; DROP SCHEMA IF EXISTS ", name_,
                              " CASCADE; CREATE SCHEMA ", name_));
        !err.empty()) {
      error_ = absl::StrCat("cannot make schema ", name_, " on ", base_url_, ": ", err);
    }
  }
  ~TestSchema() {
    if (!name_.empty() && error_.empty()) {
      Exec(absl::StrCat("SET client_min_messages = warning; DROP SCHEMA ", name_, " CASCADE"));
    }
  }

  // Why the test cannot run: no server ("" when there is one).
  const std::string& skip_reason() const { return skip_; }
  // Set when there is a server but the schema could not be made.
  const std::string& error() const { return error_; }
  static bool required() {
    const char* r = std::getenv("TASKGRID_REQUIRE_POSTGRES");
    return r != nullptr && std::string(r) == "1";
  }
  const std::string& name() const { return name_; }
  const std::string& base_url() const { return base_url_; }
  // The server's URL with this schema as the search_path.
  std::string url() const { return absl::StrCat(base_url_, "?options=-csearch_path%3D", name_); }

  // Runs SQL on the server as the test's superuser, in this schema; the
  // error message, or "" when it succeeded.
  std::string Exec(const std::string& sql) const {
    PGconn* conn =
        PQconnectdb(name_.empty() || !error_.empty() ? base_url_.c_str() : url().c_str());
    std::string err;
    if (PQstatus(conn) != CONNECTION_OK) {
      err = PQerrorMessage(conn);
    } else {
      PGresult* r = PQexec(conn, sql.c_str());
      if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        err = PQresultErrorMessage(r);
      }
      PQclear(r);
    }
    PQfinish(conn);
    return err;
  }

 private:
  std::string base_url_;
  std::string name_;
  std::string skip_;
  std::string error_;
};

}  // namespace taskgrid::testing

// In a test body or SetUp: skips the test when there is no server (fails
// when TASKGRID_REQUIRE_POSTGRES=1), fails when its schema could not be
// made.
#define TASKGRID_NEED_POSTGRES(schema)                                        \
  do {                                                                        \
    if (!(schema).skip_reason().empty()) {                                    \
      if (::taskgrid::testing::TestSchema::required()) {                      \
        FAIL() << (schema).skip_reason() << " (TASKGRID_REQUIRE_POSTGRES=1)"; \
      }                                                                       \
      GTEST_SKIP() << (schema).skip_reason();                                 \
    }                                                                         \
    ASSERT_TRUE((schema).error().empty()) << (schema).error();                \
  } while (0)
