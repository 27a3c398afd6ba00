// PostgresLease and the store's fence: taking a free lease, a standby
// seeing the leader, renewal only while the epoch is ours, expiry and
// takeover by the server's clock, release, and a superseded leader's
// Apply refused with nothing written. Expiry is made by moving the row's
// expires_at on the server (never by sleeping). Each case in a schema of
// its own on the tests' server (tests/testing/postgres.h). Last, the
// Engine over a fenced store: a refused commit is a failed commit, fatal.
#include "scheduler/store/postgres_lease.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "scheduler/engine/engine.h"
#include "scheduler/store/postgres_store.h"
#include "tests/testing/await.h"
#include "tests/testing/postgres.h"

namespace taskgrid::store::lease_test {
namespace {

using ::testing::HasSubstr;

class PostgresLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TASKGRID_NEED_POSTGRES(schema_);
    auto s = PostgresStore::Open({schema_.url()});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  std::unique_ptr<PostgresLease> Lease(const std::string& holder,
                                       absl::Duration ttl = absl::Seconds(6)) {
    auto l = PostgresLease::Open({schema_.url(), holder, holder + ":7070", ttl});
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::move(*l) : nullptr;
  }
  // The lease expires now, by the server's clock: what waiting out the
  // TTL would do.
  void Expire() {
    ASSERT_EQ(schema_.Exec("UPDATE lease SET expires_at = now() - interval '1 ms'"), "");
  }
  core::WriteBatch Insert(const std::string& id, int64_t seq) {
    core::WriteBatch b;
    core::TaskRow& r = b.tasks.emplace_back();
    r.insert = true;
    r.id = id;
    r.seq = seq;
    r.queue = "default";
    r.state = v1::TASK_STATE_PENDING;
    r.spec = "spec";
    return b;
  }
  testing::TestSchema schema_;
  std::unique_ptr<PostgresStore> store_;
};

TEST_F(PostgresLeaseTest, TheFirstTakesAFreeLeaseAndAStandbySeesWhoLeads) {
  auto a = Lease("a");
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  auto got = a->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->ours);
  EXPECT_EQ(got->epoch, 1);
  EXPECT_EQ(a->epoch(), 1);
  auto seen = b->TryAcquire();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_FALSE(seen->ours);
  EXPECT_EQ(seen->holder, "a");
  EXPECT_EQ(seen->address, "a:7070");
  EXPECT_EQ(seen->epoch, 1);
  EXPECT_GT(seen->remaining, absl::Seconds(4));
  EXPECT_LE(seen->remaining, absl::Seconds(6));
  EXPECT_EQ(b->epoch(), 0);
}

TEST_F(PostgresLeaseTest, AnExpiredLeaseIsTakenWithANewEpochAndTheOldHolderCannotRenew) {
  auto a = Lease("a");
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TryAcquire()->ours);
  Expire();
  auto got = b->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->ours);
  EXPECT_EQ(got->epoch, 2);
  absl::Status s = a->Renew();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("epoch 1 was superseded by epoch 2 (b)"));
  auto back = a->TryAcquire();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->ours);
  EXPECT_EQ(back->holder, "b");
}

TEST_F(PostgresLeaseTest, RenewingExtendsByTheTtlFromTheServersNowAndWritesTheAddress) {
  auto a = Lease("a", absl::Hours(1));
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TryAcquire()->ours);
  Expire();
  // Expired but nobody took it: the epoch is still ours, so it renews.
  a->set_address("10.0.0.7:7070");
  ASSERT_TRUE(a->Renew().ok());
  auto seen = b->TryAcquire();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_FALSE(seen->ours);
  EXPECT_EQ(seen->epoch, 1);
  EXPECT_EQ(seen->address, "10.0.0.7:7070");
  EXPECT_GT(seen->remaining, absl::Minutes(59));
}

TEST_F(PostgresLeaseTest, AReleasedLeaseIsTakenAtOnce) {
  auto a = Lease("a");
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TryAcquire()->ours);
  EXPECT_FALSE(b->TryAcquire()->ours);
  ASSERT_TRUE(a->Release().ok());
  auto got = b->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->ours);
  EXPECT_EQ(got->epoch, 2);
  // A release of an epoch no longer ours changes nothing.
  ASSERT_TRUE(a->Release().ok());
  EXPECT_FALSE(a->TryAcquire()->ours);
}

TEST_F(PostgresLeaseTest, TakingWaitsOnlyBrieflyForACommitInFlight) {
  auto a = Lease("a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->TryAcquire()->ours);
  Expire();
  // A leader's transaction between its fence and its COMMIT holds the row.
  PGconn* leader = PQconnectdb(schema_.url().c_str());
  ASSERT_EQ(PQstatus(leader), CONNECTION_OK) << PQerrorMessage(leader);
  PQclear(PQexec(leader, "BEGIN"));
  PGresult* r = PQexec(leader, kLeaseFenceSql);
  ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQresultErrorMessage(r);
  PQclear(r);
  auto b =
      PostgresLease::Open({schema_.url(), "b", "b:1", absl::Seconds(6), absl::Milliseconds(50)});
  ASSERT_TRUE(b.ok()) << b.status();
  auto got = (*b)->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->ours);
  EXPECT_EQ(got->epoch, 0);  // not known: the row was busy
  PQclear(PQexec(leader, "COMMIT"));
  PQfinish(leader);
  got = (*b)->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->ours);
  EXPECT_EQ(got->epoch, 2);
}

TEST_F(PostgresLeaseTest, RenewingNeverWaitsForTheLeadersOwnCommit) {
  // A commit of the leader's that takes long (a slow fsync, a stalled
  // synchronous replica) holds its fence across several renewal times;
  // the renewals must not wait for it (their lock wait is 50 ms here).
  auto a =
      PostgresLease::Open({schema_.url(), "a", "a:1", absl::Seconds(6), absl::Milliseconds(50)});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->TryAcquire()->ours);
  PGconn* commit = PQconnectdb(schema_.url().c_str());
  ASSERT_EQ(PQstatus(commit), CONNECTION_OK) << PQerrorMessage(commit);
  PQclear(PQexec(commit, "BEGIN"));
  PGresult* r = PQexec(commit, kLeaseFenceSql);
  ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQresultErrorMessage(r);
  PQclear(r);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*a)->Renew().ok()) << "renewal " << i;
  // A standby still cannot take it meanwhile (nor could it after expiry:
  // the commit in flight comes first).
  Expire();
  auto b =
      PostgresLease::Open({schema_.url(), "b", "b:1", absl::Seconds(6), absl::Milliseconds(50)});
  ASSERT_TRUE(b.ok()) << b.status();
  auto got = (*b)->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->ours) << "taken while the leader's commit was in flight";
  PQclear(PQexec(commit, "COMMIT"));
  PQfinish(commit);
  got = (*b)->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->ours);
}

// A leader's writer cut off mid-batch: its session is named as a fenced
// writer's (kTagWriterSql, epoch 1), it sent BEGIN and `sql` with no Sync
// (so no server timeout applies), and the server ran both: their locks are
// held. Asked to flush, the server says so; the results are read here.
PGconn* CutOffMidBatch(const std::string& url, const char* sql) {
  PGconn* c = PQconnectdb(url.c_str());
  EXPECT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  const char* one[] = {"1"};
  PGresult* tag = PQexecParams(c, kTagWriterSql, 1, nullptr, one, nullptr, nullptr, 0);
  EXPECT_EQ(PQresultStatus(tag), PGRES_TUPLES_OK) << PQresultErrorMessage(tag);
  PQclear(tag);
  EXPECT_EQ(PQenterPipelineMode(c), 1);
  EXPECT_EQ(PQsendQueryParams(c, "BEGIN", 0, nullptr, nullptr, nullptr, nullptr, 0), 1);
  EXPECT_EQ(PQsendQueryParams(c, sql, 0, nullptr, nullptr, nullptr, nullptr, 0), 1);
  EXPECT_EQ(PQsendFlushRequest(c), 1);
  EXPECT_EQ(PQflush(c), 0);
  for (ExecStatusType want : {PGRES_COMMAND_OK, PGRES_TUPLES_OK}) {
    PGresult* r = PQgetResult(c);
    EXPECT_EQ(PQresultStatus(r), want) << PQresultErrorMessage(r);
    PQclear(r);
    EXPECT_EQ(PQgetResult(c), nullptr);  // the end of that statement's results
  }
  return c;
}

// The writer's session is gone: sending the rest finds it ended.
bool SessionEnded(PGconn* c) {
  if (PQpipelineSync(c) != 1) return true;
  for (;;) {
    PGresult* r = PQgetResult(c);
    if (r == nullptr) {
      if (PQstatus(c) == CONNECTION_BAD) return true;
      continue;
    }
    const ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    if (st == PGRES_FATAL_ERROR) return true;
    if (st == PGRES_PIPELINE_SYNC) return false;
  }
}

TEST_F(PostgresLeaseTest, ATakeoverEndsALeaderCutOffMidBatchWithTheLeaseRowLocked) {
  auto a = Lease("a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->TryAcquire()->ours);
  PGconn* cut = CutOffMidBatch(schema_.url(), kLeaseFenceSql);
  Expire();
  auto b =
      PostgresLease::Open({schema_.url(), "b", "b:1", absl::Seconds(6), absl::Milliseconds(200)});
  ASSERT_TRUE(b.ok()) << b.status();
  // Without its session ended, no try would ever take the lease. With it,
  // the first does (the lock wait covering the session's end), or, under
  // load, one of the next few.
  absl::StatusOr<LeaseState> got;
  int64_t ended = 0;
  for (int i = 0; i < 10; ++i) {
    got = (*b)->TryAcquire();
    ASSERT_TRUE(got.ok()) << got.status();
    ended += got->writers_ended;
    EXPECT_EQ(got->reap_error, "");
    if (got->ours) break;
  }
  EXPECT_TRUE(got->ours) << "the lease was never taken";
  EXPECT_EQ(got->epoch, 2);
  EXPECT_EQ(ended, 1);
  EXPECT_TRUE(SessionEnded(cut));
  PQfinish(cut);
}

TEST_F(PostgresLeaseTest, ATakeoverEndsEveryEarlierWriterSoNoneOfItsRowLocksOutlivesIt) {
  auto a = Lease("a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->TryAcquire()->ours);
  // Cut off before its fence (the fence goes last): it holds rows of the
  // tables, not the lease row.
  PGconn* cut = CutOffMidBatch(schema_.url(), "SELECT key FROM meta FOR UPDATE");
  // A writer of a live leader, or an unfenced one, is not a former
  // leader's: left alone.
  PGconn* later = PQconnectdb(schema_.url().c_str());
  ASSERT_EQ(PQstatus(later), CONNECTION_OK) << PQerrorMessage(later);
  const char* three[] = {"3"};
  PQclear(PQexecParams(later, kTagWriterSql, 1, nullptr, three, nullptr, nullptr, 0));
  Expire();
  auto b = Lease("b");
  ASSERT_TRUE(b);
  auto got = b->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->ours);
  EXPECT_EQ(got->epoch, 2);
  EXPECT_EQ(got->writers_ended, 1);
  EXPECT_TRUE(SessionEnded(cut));
  PQfinish(cut);
  // Its row locks went with it: the next leader's writes do not wait.
  EXPECT_EQ(schema_.Exec("SET lock_timeout = '30s'; SELECT key FROM meta FOR UPDATE"), "");
  PGresult* alive = PQexec(later, "SELECT 1");
  EXPECT_EQ(PQresultStatus(alive), PGRES_TUPLES_OK) << PQresultErrorMessage(alive);
  PQclear(alive);
  PQfinish(later);
}

TEST_F(PostgresLeaseTest, AFencedWritersSessionIsEndedByTheNextLeaderAndSaysWhy) {
  auto a = Lease("a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->TryAcquire()->ours);
  store_->SetFence(a->epoch());
  ASSERT_TRUE(store_->Apply(Insert("named", 1)).ok());
  // The session is findable as epoch 1's writer; b's taking ends it. The
  // next write finds it gone and says why.
  Expire();
  auto b = Lease("b");
  ASSERT_TRUE(b);
  auto got = b->TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->ours);
  EXPECT_EQ(got->writers_ended, 1);
  absl::Status s = store_->Apply(Insert("after", 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("superseded by epoch 2: another scheduler leads " + schema_.name() +
                        " (and ended this one's database session)"));
  auto n = store_->CountTasks();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
}

TEST_F(PostgresLeaseTest, ASupersededLeadersApplyIsRefusedAndWritesNothing) {
  auto a = Lease("a");
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TryAcquire()->ours);
  store_->SetFence(a->epoch());
  ASSERT_TRUE(store_->Apply(Insert("before", 1)).ok());
  Expire();
  ASSERT_TRUE(b->TryAcquire()->ours);
  // A second scheduler opens the same schema (no lock keeps it out) and
  // writes under its epoch.
  auto s2 = PostgresStore::Open({schema_.url(), absl::Milliseconds(100)});
  ASSERT_TRUE(s2.ok()) << s2.status();
  (*s2)->SetFence(b->epoch());
  ASSERT_TRUE((*s2)->Apply(Insert("by-b", 2)).ok());
  absl::Status s = store_->Apply(Insert("after", 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("lease epoch 1 was superseded by epoch 2"));
  auto n = store_->CountTasks();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  auto rows = store_->ReadTasks({1, 2, 3});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  for (const core::StoredTask& t : *rows) EXPECT_NE(t.row.id, "after");
  // The store stays usable for reads and stays refused for writes.
  EXPECT_EQ(store_->Apply(Insert("again", 4)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(PostgresLeaseTest, AnEngineWhoseCommitIsFencedAnswersAnErrorAndIsFatal) {
  auto a = Lease("a");
  auto b = Lease("b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->TryAcquire()->ours);
  store_->SetFence(a->epoch());
  FakeClock clock;
  engine::EngineOptions opts;
  opts.tick_interval = absl::Hours(1);
  engine::Engine e(store_.get(), &clock, opts);
  std::atomic<int> fatal{0};
  absl::Status why;
  e.set_on_fatal([&](const absl::Status& s) {
    why = s;
    ++fatal;
  });
  ASSERT_TRUE(e.Start().ok());
  auto submit = [&](const std::string& id) {
    v1::SubmitTasksRequest req;
    v1::TaskSpec* spec = req.add_tasks();
    spec->set_id(id);
    spec->add_steps()->mutable_builtin()->set_name("noop");
    return testing::Await<v1::SubmitTasksResponse>(
        [&](engine::Engine::Reply<v1::SubmitTasksResponse> r) { e.SubmitTasks(req, r); });
  };
  ASSERT_TRUE(submit("while-leading").ok());
  Expire();
  ASSERT_TRUE(b->TryAcquire()->ours);
  auto r = submit("after-takeover");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(fatal.load(), 1);
  // The Engine's fatal status says the commit failed, and why.
  EXPECT_THAT(std::string(why.message()), HasSubstr("lease epoch 1 was superseded by epoch 2"));
  e.Stop();
  auto n = store_->CountTasks();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
}

}  // namespace
}  // namespace taskgrid::store::lease_test
