// PostgresStore's own promises, beside the conformance suite
// (store_test.cc): migrations (an older schema moved forward, a newer one
// refused), two stores on one schema, connection loss and recovery, a bad
// or unreachable URL, bytes that PostgreSQL's text would refuse, and a
// start-up name without the password. Each case in a schema of its own on
// the tests' server (tests/testing/postgres.h).
#include "scheduler/store/postgres_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "scheduler/store/postgres_schema.h"
#include "scheduler/store/postgres_util.h"
#include "scheduler/store/redact.h"
#include "tests/testing/postgres.h"

namespace taskgrid::store::postgres_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

core::TaskRow NewRow(const std::string& id, int64_t seq) {
  core::TaskRow r;
  r.insert = true;
  r.id = id;
  r.seq = seq;
  r.queue = "default";
  r.state = v1::TASK_STATE_PENDING;
  r.spec = "spec of " + id;
  return r;
}

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { TASKGRID_NEED_POSTGRES(schema_); }
  // The schema's URL, its connections named `app` (to find them in
  // pg_stat_activity).
  std::string Url(const std::string& app) const {
    return absl::StrCat(schema_.url(), "&application_name=", app);
  }
  testing::TestSchema schema_;
};

TEST_F(PostgresStoreTest, OpensAnEmptySchemaAtTheLatestVersionAndNamesItWithoutThePassword) {
  auto s = PostgresStore::Open({schema_.url()});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->schema_version(), PostgresStore::LatestSchemaVersion());
  EXPECT_EQ((*s)->schema(), schema_.name());
  EXPECT_THAT((*s)->display_name(), StartsWith("postgres://127.0.0.1:"));
  EXPECT_THAT((*s)->display_name(), ::testing::EndsWith("/taskgrid"));
  EXPECT_EQ(schema_.Exec("SELECT 1 FROM tasks, attempts, merged, events, queues, schedules"), "");
  EXPECT_EQ(pg::DisplayName("postgresql://ann:s3cret@db.example.com:6543/tasks?sslmode=require"),
            "postgres://db.example.com:6543/tasks");
  EXPECT_THAT(pg::DisplayName("host=db user=ann password=s3cret dbname=tasks"),
              Not(HasSubstr("s3cret")));
}

// No password reaches a message, in any form of --store, parsed or not.
TEST(PostgresRedact, HidesEveryPasswordInAnyForm) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"postgres://tg:PW1x@db:5432/tg", "postgres://tg:***@db:5432/tg"},
      {"postgres://tg:PW1x@[bad/tg", "postgres://tg:***@[bad/tg"},
      {"missing \"]\" in URI: \"postgresql://tg:p@ss/w0rd@[::1/tg\"",
       "missing \"]\" in URI: \"postgresql://tg:***@[::1/tg\""},
      {"host=db password=PW1x user=tg", "host=db password=*** user=tg"},
      {"host=db password = 'P W\\'1x' user=tg", "host=db password = *** user=tg"},
      {"postgres://db/tg?sslmode=require&password=PW1x&x=1",
       "postgres://db/tg?sslmode=require&password=***&x=1"},
      {"PASSWORD=PW1x", "PASSWORD=***"},
      {"postgres://tg@db/tg", "postgres://tg@db/tg"},
      {"no secrets here", "no secrets here"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(RedactPasswords(in), want) << in;
}

// libpq quotes a URL it cannot parse, whole, in its error: the message
// taskgrid gives names neither the password nor the URL's secret.
TEST(PostgresRedact, AMalformedUrlsErrorHoldsNoPassword) {
  for (const std::string url :
       {"postgres://tg:PW1xsecret@[bad/tg", "postgres://tg:PW1xsecret@db:notaport/tg",
        "host=127.0.0.1 port=1 password=PW1xsecret connect_timeout=2 bogus_key=1"}) {
    pg::Conn conn(url, "writer");
    absl::Status s = conn.Ensure();
    ASSERT_FALSE(s.ok()) << url;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("PW1xsecret"))) << s;
    auto store = PostgresStore::Open({url});
    ASSERT_FALSE(store.ok()) << url;
    EXPECT_THAT(std::string(store.status().message()), Not(HasSubstr("PW1xsecret")))
        << store.status();
  }
}

TEST_F(PostgresStoreTest, MakesTheSchemaTheUrlNamesWhenItIsNotThereYet) {
  const std::string name = schema_.name() + "_made";
  auto s = PostgresStore::Open(
      {absl::StrCat(schema_.base_url(), "?options=-csearch_path%3D", name, ",public")});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->schema(), name);
  s->reset();
  EXPECT_EQ(schema_.Exec(absl::StrCat("SELECT 1 FROM ", name, ".tasks")), "");
  EXPECT_EQ(schema_.Exec(absl::StrCat("DROP SCHEMA ", name, " CASCADE")), "");
}

TEST_F(PostgresStoreTest, MigratesAnOlderSchemaKeepingItsRowsAndRefusesANewerOne) {
  {
    auto s = PostgresStore::Open({schema_.url()});
    ASSERT_TRUE(s.ok()) << s.status();
    core::WriteBatch b;
    b.tasks.push_back(NewRow("kept", 1));
    ASSERT_TRUE((*s)->Apply(b).ok());
  }
  // A build that knows one more version moves this one forward.
  std::vector<std::string> next = pg::Migrations();
  next.push_back("ALTER TABLE tasks ADD COLUMN epoch bigint NOT NULL DEFAULT 7");
  PGconn* conn = PQconnectdb(schema_.url().c_str());
  ASSERT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  absl::StatusOr<int> v = pg::Migrate(conn, next, "test");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, PostgresStore::LatestSchemaVersion() + 1);
  PGresult* r = PQexec(conn, "SELECT id, epoch FROM tasks");
  ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQresultErrorMessage(r);
  ASSERT_EQ(PQntuples(r), 1);
  EXPECT_STREQ(PQgetvalue(r, 0, 0), "kept");
  EXPECT_STREQ(PQgetvalue(r, 0, 1), "7");
  PQclear(r);
  // Once there, it stays: the same migrations again change nothing.
  v = pg::Migrate(conn, next, "test");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, PostgresStore::LatestSchemaVersion() + 1);
  PQfinish(conn);
  // This build knows fewer versions: it refuses to touch the table.
  auto old = PostgresStore::Open({schema_.url()});
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(old.status().message()),
      HasSubstr(absl::StrCat("has schema version ", PostgresStore::LatestSchemaVersion() + 1,
                             "; this build knows up to ", PostgresStore::LatestSchemaVersion())));
  EXPECT_THAT(std::string(old.status().message()), HasSubstr(schema_.name()));
}

TEST_F(PostgresStoreTest, TwoStoresOpenOneSchemaOnceItIsMigrated) {
  // The advisory lock is held only while migrating: the lease, not the
  // session, says who writes (postgres_lease_test.cc).
  auto first = PostgresStore::Open({schema_.url()});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = PostgresStore::Open({schema_.url(), absl::Milliseconds(100)});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(schema_.Exec("SELECT epoch FROM lease WHERE id = 1 AND epoch = 0"), "");
}

TEST_F(PostgresStoreTest, ApplyAfterTheServerDroppedTheConnectionIsUnavailableThenRecovers) {
  const std::string app = "lost_" + schema_.name();
  auto s = PostgresStore::Open({Url(app)});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(schema_.Exec("UPDATE lease SET epoch = 5"), "");
  (*s)->SetFence(5);
  core::WriteBatch first;
  first.tasks.push_back(NewRow("before", 1));
  ASSERT_TRUE((*s)->Apply(first).ok());
  ASSERT_TRUE((*s)->ReadEvents(0, 10).ok());  // the reader is connected too
  // What a server restart or failover does to every session of the store
  // (the fenced writer's name starts with its tag: kTagWriterSql).
  const std::string kill = absl::StrCat(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '", app,
      "' OR application_name LIKE 'taskgrid writer ' || '", schema_.name(),
      "'::regnamespace::oid || ' epoch 5%'");
  ASSERT_EQ(schema_.Exec(kill), "");
  core::WriteBatch lost;
  lost.tasks.push_back(NewRow("lost", 2));
  absl::Status st = (*s)->Apply(lost);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("connection to PostgreSQL"));
  // The next call connects again and writes (still fenced); the failed
  // batch left nothing.
  core::WriteBatch after;
  after.tasks.push_back(NewRow("after", 3));
  ASSERT_TRUE((*s)->Apply(after).ok());
  // A read on a dropped connection is read again on a new one.
  auto events = (*s)->ReadEvents(0, 10);
  EXPECT_TRUE(events.ok()) << events.status();
  auto tasks = (*s)->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].row.id, "before");
  EXPECT_EQ((*tasks)[1].row.id, "after");
  // The writer's new session is fenced as the first was.
  ASSERT_EQ(schema_.Exec("UPDATE lease SET epoch = 6"), "");
  core::WriteBatch stale;
  stale.tasks.push_back(NewRow("stale", 4));
  EXPECT_EQ((*s)->Apply(stale).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PostgresStoreTest, ACommitTheServerNeverAnswersEndsWhenInterrupted) {
  const std::string app = "stuck_" + schema_.name();
  auto s = PostgresStore::Open({Url(app)});
  ASSERT_TRUE(s.ok()) << s.status();
  core::WriteBatch first;
  first.tasks.push_back(NewRow("before", 1));
  ASSERT_TRUE((*s)->Apply(first).ok());
  EXPECT_EQ((*s)->CommitInFlightFor(), absl::ZeroDuration());
  // Another session holds the table: the next commit waits with no end.
  PGconn* holder = PQconnectdb(schema_.url().c_str());
  ASSERT_EQ(PQstatus(holder), CONNECTION_OK) << PQerrorMessage(holder);
  PQclear(PQexec(holder, "BEGIN"));
  PGresult* locked = PQexec(holder, "LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE");
  ASSERT_EQ(PQresultStatus(locked), PGRES_COMMAND_OK) << PQresultErrorMessage(locked);
  PQclear(locked);
  absl::Status stuck;
  std::thread commit([&] {
    core::WriteBatch b;
    b.tasks.push_back(NewRow("stuck", 2));
    stuck = (*s)->Apply(b);
  });
  // Until the server says the writer waits on the lock (asked at most
  // 100,000 times, a round trip each).
  const std::string waiting = absl::StrCat(
      "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
      "AND application_name LIKE '%",
      app, "'");
  bool waits = false;
  for (int i = 0; i < 100'000 && !waits; ++i) {
    PGresult* r = PQexec(holder, waiting.c_str());
    waits = PQresultStatus(r) == PGRES_TUPLES_OK && std::string(PQgetvalue(r, 0, 0)) == "1";
    PQclear(r);
  }
  EXPECT_TRUE(waits) << "the commit never waited on the lock";
  EXPECT_GT((*s)->CommitInFlightFor(), absl::ZeroDuration());
  (*s)->InterruptCommit();
  commit.join();
  EXPECT_EQ(stuck.code(), absl::StatusCode::kUnavailable) << stuck;
  EXPECT_EQ((*s)->CommitInFlightFor(), absl::ZeroDuration());
  PQclear(PQexec(holder, "ROLLBACK"));
  PQfinish(holder);
  // The next commit connects again; the interrupted one left nothing.
  core::WriteBatch after;
  after.tasks.push_back(NewRow("after", 3));
  ASSERT_TRUE((*s)->Apply(after).ok());
  auto n = (*s)->CountTasks();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
}

TEST_F(PostgresStoreTest, ABadOrUnreachableUrlIsAClearError) {
  auto bad = PostgresStore::Open({"host=localhost port"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not a PostgreSQL connection URL"));
  // A port nobody listens on (bound, then closed).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  auto down = PostgresStore::Open(
      {absl::StrCat("postgres://nobody:pw@127.0.0.1:", ntohs(addr.sin_port), "/none")});
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(down.status().message()),
              HasSubstr(absl::StrCat("cannot connect to PostgreSQL at postgres://127.0.0.1:",
                                     ntohs(addr.sin_port), "/none")));
  EXPECT_THAT(std::string(down.status().message()), Not(HasSubstr(":pw@")));
}

TEST_F(PostgresStoreTest, ReasonsAndErrorsKeepBytesThatTextWouldRefuse) {
  auto s = PostgresStore::Open({schema_.url()});
  ASSERT_TRUE(s.ok()) << s.status();
  // A NUL, and UTF-8 cut in the middle of a character.
  const std::string odd("agent said \0 then \xe2\x82", 20);
  core::WriteBatch b;
  core::TaskRow r = NewRow("t", 1);
  r.reason = odd;
  b.tasks.push_back(r);
  core::EventRow e;
  e.revision = 1;
  e.task_id = "t";
  e.reason = odd;
  b.events.push_back(e);
  core::ScheduleRow sched;
  sched.id = "s";
  sched.last_error = odd;
  b.schedules.push_back(sched);
  ASSERT_TRUE((*s)->Apply(b).ok());
  auto tasks = (*s)->ReadTasks({1});
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.reason, odd);
  auto events = (*s)->ReadEvents(0, 10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].event.reason, odd);
  auto schedules = (*s)->LoadSchedules();
  ASSERT_TRUE(schedules.ok()) << schedules.status();
  ASSERT_EQ(schedules->size(), 1u);
  EXPECT_EQ((*schedules)[0].last_error, odd);
}

TEST_F(PostgresStoreTest, AFailedUpdateNamesTheTaskAndLeavesNothing) {
  auto s = PostgresStore::Open({schema_.url()});
  ASSERT_TRUE(s.ok()) << s.status();
  core::WriteBatch b;
  b.tasks.push_back(NewRow("here", 1));
  core::TaskRow ghost = NewRow("ghost", 9);
  ghost.insert = false;
  b.tasks.push_back(ghost);
  absl::Status st = (*s)->Apply(b);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("updating task ghost: no such row"));
  EXPECT_EQ(*(*s)->CountTasks(), 0);
  // The connection is fine afterwards.
  core::WriteBatch ok;
  ok.tasks.push_back(NewRow("here", 1));
  EXPECT_TRUE((*s)->Apply(ok).ok());
  EXPECT_EQ(*(*s)->CountTasks(), 1);
}

}  // namespace
}  // namespace taskgrid::store::postgres_test
