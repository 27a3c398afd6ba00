// One conformance suite for every Store, plus SqliteStore's own promises:
// migration from an empty file, reopen, and the data directory lock. The
// PostgreSQL store's own are in postgres_store_test.cc; its conformance
// cases (StoreConformance/Postgres.*) run on the tests' server, each in a
// schema of its own (tests/testing/postgres.h).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "scheduler/store/memory_store.h"
#include "scheduler/store/postgres_store.h"
#include "scheduler/store/sqlite_store.h"
#include "tests/testing/postgres.h"
#include "tests/testing/temp_dir.h"

namespace taskgrid::store {
namespace {

using ::testing::HasSubstr;

core::TaskRow Row(const std::string& id, int64_t seq, int state = v1::TASK_STATE_PENDING) {
  core::TaskRow r;
  r.insert = true;
  r.id = id;
  r.seq = seq;
  r.queue = "default";
  r.state = state;
  r.create_us = 1'700'000'000'000'000 + seq;
  r.update_us = r.create_us;
  v1::TaskSpec spec;
  spec.set_id(id);
  spec.set_queue("default");
  spec.add_steps()->mutable_builtin()->set_name("noop");
  spec.SerializeToString(&r.spec);
  return r;
}

core::EventRow Event(const std::string& id, int to, int64_t revision = 1) {
  core::EventRow e;
  e.revision = revision;
  e.task_id = id;
  e.queue = "default";
  e.to_state = to;
  return e;
}

// --- The conformance suite. ---

class StoreFactory {
 public:
  virtual ~StoreFactory() = default;
  virtual Store* Get() = 0;
  // Closes the store and opens it again (a restart). A MemoryStore lives
  // on in the same object, as the process it stands in for would.
  virtual void Reopen() {}
  // The server schema a store on a server works in (null: none needed).
  virtual const testing::TestSchema* schema() const { return nullptr; }
};

class MemoryFactory : public StoreFactory {
 public:
  static constexpr char kName[] = "Memory";
  Store* Get() override { return &store_; }

 private:
  MemoryStore store_;
};

class SqliteFactory : public StoreFactory {
 public:
  static constexpr char kName[] = "Sqlite";
  Store* Get() override {
    if (!store_) {
      auto s = SqliteStore::Open({dir_.path(), Durability::kFull});
      EXPECT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    }
    return store_.get();
  }
  void Reopen() override { store_.reset(); }

 private:
  testing::TempDir dir_;
  std::unique_ptr<SqliteStore> store_;
};

// A store on the tests' PostgreSQL server, in a fresh schema; Reopen
// connects again to the same schema.
class PostgresFactory : public StoreFactory {
 public:
  static constexpr char kName[] = "Postgres";
  Store* Get() override {
    if (!store_) {
      auto s = PostgresStore::Open({schema_.url()});
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) store_ = std::move(*s);
    }
    return store_.get();
  }
  void Reopen() override { store_.reset(); }
  const testing::TestSchema* schema() const override { return &schema_; }

 private:
  testing::TestSchema schema_;
  std::unique_ptr<PostgresStore> store_;
};

template <typename F>
class StoreConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const testing::TestSchema* schema = factory_.schema()) TASKGRID_NEED_POSTGRES(*schema);
  }
  Store* store() { return factory_.Get(); }
  void Reopen() { factory_.Reopen(); }
  F factory_;
};

// StoreConformance/Memory.*, /Sqlite.*, /Postgres.*: ctest gives the
// Postgres cases the server (tests/unit/CMakeLists.txt).
struct FactoryName {
  template <typename F>
  static std::string GetName(int) {
    return F::kName;
  }
};
using Factories = ::testing::Types<MemoryFactory, SqliteFactory, PostgresFactory>;
TYPED_TEST_SUITE(StoreConformance, Factories, FactoryName);

TYPED_TEST(StoreConformance, EmptyStoreLoadsNothing) {
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  EXPECT_TRUE(tasks->empty());
}

core::ScheduleRow ScheduleRowOf(const std::string& id, int64_t n) {
  core::ScheduleRow r;
  r.id = id;
  r.definition = std::string(
                     "\x0a\x03"
                     "abc\0",
                     6) +
                 id;  // bytes, NUL included
  r.paused = n % 2 == 1;
  r.next_fire_us = 1'000 + n;
  r.last_fire_us = 2'000 + n;
  r.last_task_id = id + ":20261125T030000Z";
  r.fire_count = 10 + n;
  r.last_error = n == 0 ? "" : "fire at ... refused";
  r.create_us = 3'000 + n;
  r.update_us = 4'000 + n;
  return r;
}

void ExpectSameSchedule(const core::ScheduleRow& got, const core::ScheduleRow& want) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_EQ(got.definition, want.definition);
  EXPECT_EQ(got.paused, want.paused);
  EXPECT_EQ(got.next_fire_us, want.next_fire_us);
  EXPECT_EQ(got.last_fire_us, want.last_fire_us);
  EXPECT_EQ(got.last_task_id, want.last_task_id);
  EXPECT_EQ(got.fire_count, want.fire_count);
  EXPECT_EQ(got.last_error, want.last_error);
  EXPECT_EQ(got.create_us, want.create_us);
  EXPECT_EQ(got.update_us, want.update_us);
  EXPECT_FALSE(got.erase);
}

TYPED_TEST(StoreConformance, SchedulesRoundTripReplaceAndErase) {
  auto none = this->store()->LoadSchedules();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  core::WriteBatch b;
  b.schedules.push_back(ScheduleRowOf("zeta", 1));
  b.schedules.push_back(ScheduleRowOf("alpha", 0));
  b.schedules.push_back(ScheduleRowOf("mid", 2));
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.size(), 3u);
  ASSERT_TRUE(this->store()->Apply(b).ok());
  this->Reopen();
  auto got = this->store()->LoadSchedules();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u);  // by id
  ExpectSameSchedule((*got)[0], ScheduleRowOf("alpha", 0));
  ExpectSameSchedule((*got)[1], ScheduleRowOf("mid", 2));
  ExpectSameSchedule((*got)[2], ScheduleRowOf("zeta", 1));
  // A row is written whole: the later one in a batch wins; erase deletes.
  core::WriteBatch c;
  c.schedules.push_back(ScheduleRowOf("alpha", 5));
  c.schedules.push_back(ScheduleRowOf("alpha", 6));
  core::ScheduleRow gone;
  gone.erase = true;
  gone.id = "mid";
  c.schedules.push_back(gone);
  core::ScheduleRow unknown = gone;
  unknown.id = "never-was";
  c.schedules.push_back(unknown);
  ASSERT_TRUE(this->store()->Apply(c).ok());
  this->Reopen();
  got = this->store()->LoadSchedules();
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 2u);
  ExpectSameSchedule((*got)[0], ScheduleRowOf("alpha", 6));
  ExpectSameSchedule((*got)[1], ScheduleRowOf("zeta", 1));
  // Tasks are untouched by all this.
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  EXPECT_TRUE(tasks->empty());
}

TYPED_TEST(StoreConformance, AScheduleRowCommitsWithItsTaskOrNotAtAll) {
  // A fire: the task and the schedule's row in one batch.
  core::WriteBatch fire;
  fire.tasks.push_back(Row("beat:20261125T030000Z", 1));
  fire.schedules.push_back(ScheduleRowOf("beat", 0));
  ASSERT_TRUE(this->store()->Apply(fire).ok());
  // A batch that fails (its task update names no row) keeps nothing of it.
  core::WriteBatch broken;
  broken.schedules.push_back(ScheduleRowOf("beat", 4));
  core::TaskRow missing = Row("missing", 9);
  missing.insert = false;
  broken.tasks.push_back(missing);
  EXPECT_FALSE(this->store()->Apply(broken).ok());
  this->Reopen();
  auto got = this->store()->LoadSchedules();
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  ExpectSameSchedule((*got)[0], ScheduleRowOf("beat", 0));
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.id, "beat:20261125T030000Z");
}

TYPED_TEST(StoreConformance, RoundTripsEveryColumn) {
  core::WriteBatch b;
  core::TaskRow r = Row("t1", 7);
  r.attempt = 2;
  r.agent_id = "agent-1";
  r.next_run_us = 11;
  r.dispatch_us = 12;
  r.start_us = 13;
  r.reason = "because";
  r.pause_requested = true;
  r.result = std::string("\x08\x01\x10\x00", 4);
  b.tasks.push_back(r);
  ASSERT_TRUE(this->store()->Apply(b).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 1u);
  const core::TaskRow& got = (*tasks)[0].row;
  EXPECT_EQ(got.id, "t1");
  EXPECT_EQ(got.seq, 7);
  EXPECT_EQ(got.queue, "default");
  EXPECT_EQ(got.state, v1::TASK_STATE_PENDING);
  EXPECT_EQ(got.attempt, 2);
  EXPECT_EQ(got.agent_id, "agent-1");
  EXPECT_EQ(got.create_us, r.create_us);
  EXPECT_EQ(got.next_run_us, 11);
  EXPECT_EQ(got.dispatch_us, 12);
  EXPECT_EQ(got.start_us, 13);
  EXPECT_EQ(got.reason, "because");
  EXPECT_TRUE(got.pause_requested);
  EXPECT_EQ(got.result, r.result) << "binary blobs survive, NUL bytes included";
  EXPECT_EQ(got.spec, r.spec);
}

// --- Finished tasks on disk: deletes, reads by seq, light scans. ---

// A finished task with an attempt and a merged payload, a unique key and
// replicas, as the Scheduler writes it (ToRow).
core::TaskRow FinishedRow(const std::string& id, int64_t seq, bool replica = false) {
  core::TaskRow r = Row(id, seq, v1::TASK_STATE_SUCCEEDED);
  r.job_id = "j";
  r.unique_key = "k-" + id;
  r.unique_until_us = 5'000 + seq;
  r.labels = "run=" + id + "\nteam=red";
  r.replica = replica;
  r.has_replicas = !replica;
  r.result = std::string("\x08\x01", 2);
  r.reason = "done";
  r.agent_id = "";
  return r;
}

TYPED_TEST(StoreConformance, DeletesRemoveATaskWithItsAttemptsAndPayloadsOnly) {
  core::WriteBatch b;
  b.tasks.push_back(FinishedRow("gone", 1));
  b.tasks.push_back(FinishedRow("kept", 2));
  for (const char* id : {"gone", "kept"}) {
    b.attempts.push_back({id, 1, std::string("a-") + id});
    b.merged.push_back({id, 0, std::string("p-") + id});
  }
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch d;
  d.deletes.push_back({1, "gone"});
  ASSERT_TRUE(this->store()->Apply(d).ok());
  this->Reopen();
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.id, "kept");
  ASSERT_EQ((*tasks)[0].attempts.size(), 1u);
  ASSERT_EQ((*tasks)[0].merged.size(), 1u);
  auto attempts = this->store()->LoadAttempts();
  ASSERT_EQ(attempts->size(), 1u);
  auto merged = this->store()->LoadMerged();
  ASSERT_EQ(merged->size(), 1u);
  // A delete of a row that is not there fails the batch, which changes
  // nothing.
  core::WriteBatch bad;
  bad.tasks.push_back(Row("new", 3));
  bad.deletes.push_back({1, "gone"});
  EXPECT_FALSE(this->store()->Apply(bad).ok());
  EXPECT_EQ(this->store()->LoadTasks()->size(), 1u);
}

TYPED_TEST(StoreConformance, AnIdDeletedAndSubmittedAgainInOneBatchKeepsTheNewTask) {
  core::WriteBatch b;
  b.tasks.push_back(FinishedRow("x", 1));
  b.attempts.push_back({"x", 1, "old attempt"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  // As the writer merges them: the delete, then a new task under the id.
  core::WriteBatch merged;
  core::WriteBatch del;
  del.deletes.push_back({1, "x"});
  core::WriteBatch again;
  again.tasks.push_back(Row("x", 2));
  again.merged.push_back({"x", 0, "new payload"});
  merged.Append(std::move(del));
  merged.Append(std::move(again));
  ASSERT_TRUE(this->store()->Apply(merged).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.seq, 2);
  EXPECT_TRUE((*tasks)[0].attempts.empty());
  ASSERT_EQ((*tasks)[0].merged.size(), 1u);
  EXPECT_EQ((*tasks)[0].merged[0].payload, "new payload");
  // The other way round: rows of a task written, then deleted in a later
  // batch merged with them, are dropped (the store deletes first).
  core::WriteBatch first;
  core::TaskRow update = Row("x", 2, v1::TASK_STATE_SUCCEEDED);
  update.insert = false;
  first.tasks.push_back(update);
  first.attempts.push_back({"x", 1, "last attempt"});
  core::WriteBatch then;
  then.deletes.push_back({2, "x"});
  first.Append(std::move(then));
  EXPECT_TRUE(first.tasks.empty());
  EXPECT_TRUE(first.attempts.empty());
  ASSERT_TRUE(this->store()->Apply(first).ok());
  EXPECT_TRUE(this->store()->LoadTasks()->empty());
  EXPECT_TRUE(this->store()->LoadAttempts()->empty());
  // A task made and deleted within one merge never reaches the table.
  core::WriteBatch made;
  made.tasks.push_back(Row("y", 3));
  core::WriteBatch unmade;
  unmade.deletes.push_back({3, "y"});
  made.Append(std::move(unmade));
  EXPECT_TRUE(made.empty());
}

TYPED_TEST(StoreConformance, ReadTasksReadsWholeTasksBySeqInTheOrderAsked) {
  core::WriteBatch b;
  b.tasks.push_back(FinishedRow("a", 1));
  b.tasks.push_back(FinishedRow("b", 2));
  b.attempts.push_back({"b", 1, "first"});
  b.attempts.push_back({"b", 2, "second"});
  b.merged.push_back({"b", 0, "payload"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  auto got = this->store()->ReadTasks({2, 7, 1});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u) << "seq 7 is not stored";
  const core::StoredTask& t = (*got)[0];
  EXPECT_EQ(t.row.id, "b");
  EXPECT_FALSE(t.row.light);
  EXPECT_EQ(t.row.spec, FinishedRow("b", 2).spec);
  EXPECT_EQ(t.row.result, FinishedRow("b", 2).result);
  EXPECT_EQ(t.row.reason, "done");
  EXPECT_EQ(t.row.unique_key, "k-b");
  EXPECT_EQ(t.row.unique_until_us, 5'002);
  EXPECT_EQ(t.row.labels, "run=b\nteam=red");
  ASSERT_EQ(t.attempts.size(), 2u);
  EXPECT_EQ(t.attempts[1].data, "second");
  EXPECT_EQ(t.attempts[1].task_id, "b");
  ASSERT_EQ(t.merged.size(), 1u);
  EXPECT_EQ(t.merged[0].payload, "payload");
  EXPECT_EQ((*got)[1].row.id, "a");
  EXPECT_TRUE((*got)[1].attempts.empty());
  EXPECT_TRUE(this->store()->ReadTasks({})->empty());
}

TYPED_TEST(StoreConformance, ALightScanReadsFinishedRowsWithoutTheirBlobs) {
  core::WriteBatch b;
  b.tasks.push_back(Row("open", 1));
  b.tasks.push_back(FinishedRow("done", 2));
  b.tasks.push_back(FinishedRow("done:r1", 3, /*replica=*/true));
  b.attempts.push_back({"open", 1, "open's"});
  b.attempts.push_back({"done", 1, "done's"});
  b.merged.push_back({"open", 0, "x"});
  b.merged.push_back({"done", 0, "y"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  // A later change of status leaves what only an insert writes.
  core::WriteBatch status;
  status.tasks.push_back(FinishedRow("done", 2));
  status.tasks.back().insert = false;
  status.tasks.back().labels.clear();
  ASSERT_TRUE(this->store()->Apply(status).ok());
  this->Reopen();
  std::vector<core::TaskRow> rows;
  ASSERT_TRUE(this->store()
                  ->ScanTasks(
                      [&](std::vector<core::TaskRow>* chunk) {
                        for (core::TaskRow& r : *chunk) rows.push_back(std::move(r));
                        return absl::OkStatus();
                      },
                      /*light_finished=*/true)
                  .ok());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0].light);
  EXPECT_EQ(rows[0].spec, Row("open", 1).spec);
  for (int i : {1, 2}) {
    const core::TaskRow& r = rows[i];
    SCOPED_TRACE(r.id);
    EXPECT_TRUE(r.light);
    EXPECT_TRUE(r.spec.empty());
    EXPECT_TRUE(r.result.empty());
    EXPECT_TRUE(r.reason.empty());
    EXPECT_EQ(r.state, v1::TASK_STATE_SUCCEEDED);
    EXPECT_EQ(r.queue, "default");
    EXPECT_EQ(r.job_id, "j");
    EXPECT_EQ(r.update_us, FinishedRow(r.id, r.seq).update_us);
    EXPECT_EQ(r.unique_key, "k-" + r.id);
    EXPECT_EQ(r.unique_until_us, 5'000 + r.seq);
    EXPECT_EQ(r.labels, "run=" + r.id + "\nteam=red");
    EXPECT_EQ(r.replica, i == 2);
    EXPECT_EQ(r.has_replicas, i == 1);
  }
  // The history of the tasks asked for, each task's together, in the order
  // asked; of no other.
  core::WriteBatch more;
  more.attempts.push_back({"open", 2, "open's second"});
  ASSERT_TRUE(this->store()->Apply(more).ok());
  std::vector<core::AttemptRow> attempts;
  std::vector<core::MergedRow> merged;
  ASSERT_TRUE(this->store()->ReadHistory({"open", "nope"}, &attempts, &merged).ok());
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].task_id, "open");
  EXPECT_EQ(attempts[0].data, "open's");
  EXPECT_EQ(attempts[1].data, "open's second");
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].task_id, "open");
  attempts.clear();
  merged.clear();
  ASSERT_TRUE(this->store()->ReadHistory({"done", "open"}, &attempts, &merged).ok());
  ASSERT_EQ(attempts.size(), 3u);
  EXPECT_EQ(attempts[0].task_id, "done");
  EXPECT_EQ(attempts[2].task_id, "open");
  EXPECT_EQ(merged[0].task_id, "done");
  EXPECT_EQ(this->store()->LoadAttempts()->size(), 3u);
}

TYPED_TEST(StoreConformance, UpdatesKeepTheSpec) {
  core::WriteBatch b;
  b.tasks.push_back(Row("t1", 1));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch u;
  core::TaskRow r = Row("t1", 1, v1::TASK_STATE_RUNNING);
  r.insert = false;
  r.spec.clear();
  r.agent_id = "a";
  u.tasks.push_back(r);
  ASSERT_TRUE(this->store()->Apply(u).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.state, v1::TASK_STATE_RUNNING);
  EXPECT_EQ((*tasks)[0].row.agent_id, "a");
  EXPECT_EQ((*tasks)[0].row.spec, Row("t1", 1).spec);
}

TYPED_TEST(StoreConformance, LoadsInSeqOrderWithAttempts) {
  core::WriteBatch b;
  b.tasks.push_back(Row("zeta", 1));
  b.tasks.push_back(Row("alpha", 2));
  b.attempts.push_back({"alpha", 2, "second"});
  b.attempts.push_back({"alpha", 1, "first"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].row.id, "zeta");
  EXPECT_EQ((*tasks)[1].row.id, "alpha");
  ASSERT_EQ((*tasks)[1].attempts.size(), 2u);
  EXPECT_EQ((*tasks)[1].attempts[0].data, "first");
  EXPECT_EQ((*tasks)[1].attempts[1].data, "second");
}

TYPED_TEST(StoreConformance, ScansInSeqOrderInBoundedChunks) {
  // Ids in another order than seq, and rows inserted out of seq order, over
  // more than two chunks.
  const int n = 2 * static_cast<int>(Store::kScanChunkRows) + 7;
  core::WriteBatch b;
  for (int i = n; i >= 1; --i) {
    core::TaskRow r = Row("t" + std::to_string(i * 7919 % 10007), i);
    r.reason = std::string(static_cast<size_t>(i % 40), 'r');  // some longer than SSO
    b.tasks.push_back(r);
  }
  ASSERT_TRUE(this->store()->Apply(b).ok());
  EXPECT_EQ(*this->store()->CountTasks(), n);

  std::vector<core::TaskRow> seen;
  std::vector<size_t> chunks;
  std::vector<core::TaskRow> spare;
  ASSERT_TRUE(this->store()
                  ->ScanTasks([&](std::vector<core::TaskRow>* rows) {
                    chunks.push_back(rows->size());
                    // Take some rows whole (the store refills a swapped-in
                    // vector) and move the strings out of others.
                    if (chunks.size() % 2 == 1) {
                      for (core::TaskRow& r : *rows) seen.push_back(std::move(r));
                    } else {
                      std::swap(*rows, spare);
                      for (core::TaskRow& r : spare) seen.push_back(r);
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_EQ(seen.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int seq = i + 1;
    EXPECT_EQ(seen[i].seq, seq);
    EXPECT_EQ(seen[i].id, "t" + std::to_string(seq * 7919 % 10007));
    EXPECT_EQ(seen[i].reason, std::string(static_cast<size_t>(seq % 40), 'r'));
    EXPECT_EQ(seen[i].spec, Row(seen[i].id, seq).spec);
    EXPECT_FALSE(seen[i].insert);
  }
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0], Store::kScanChunkRows);
  EXPECT_EQ(chunks[2], 7u);

  // An error from the sink ends the scan and is what the scan returns.
  int calls = 0;
  absl::Status s = this->store()->ScanTasks([&](std::vector<core::TaskRow>*) {
    return ++calls == 2 ? absl::CancelledError("enough") : absl::OkStatus();
  });
  EXPECT_EQ(s, absl::CancelledError("enough"));
  EXPECT_EQ(calls, 2);
}

TYPED_TEST(StoreConformance, LoadsAttemptsByTaskAndNumber) {
  core::WriteBatch b;
  b.tasks.push_back(Row("b", 1));
  b.tasks.push_back(Row("a", 2));
  b.attempts.push_back({"b", 2, "b2"});
  b.attempts.push_back({"a", 1, "a1"});
  b.attempts.push_back({"b", 1, "b1"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  auto attempts = this->store()->LoadAttempts();
  ASSERT_TRUE(attempts.ok()) << attempts.status();
  ASSERT_EQ(attempts->size(), 3u);
  EXPECT_EQ((*attempts)[0].data, "a1");
  EXPECT_EQ((*attempts)[1].data, "b1");
  EXPECT_EQ((*attempts)[2].data, "b2");
  EXPECT_EQ((*attempts)[2].task_id, "b");
  EXPECT_EQ((*attempts)[2].attempt, 2);
}

TYPED_TEST(StoreConformance, ClearAttemptsRemovesHistory) {
  core::WriteBatch b;
  b.tasks.push_back(Row("t", 1));
  b.attempts.push_back({"t", 1, "x"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch c;
  c.clear_attempts.push_back("t");
  c.attempts.push_back({"t", 1, "after reset"});
  ASSERT_TRUE(this->store()->Apply(c).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ((*tasks)[0].attempts.size(), 1u);
  EXPECT_EQ((*tasks)[0].attempts[0].data, "after reset");
}

TYPED_TEST(StoreConformance, TrimmedAttemptsAreGoneAndTheCountsKept) {
  core::WriteBatch b;
  b.tasks.push_back(Row("t", 1));
  b.tasks.push_back(Row("other", 2));
  for (int i = 1; i <= 4; ++i) b.attempts.push_back({"t", i, absl::StrCat("t", i)});
  b.attempts.push_back({"other", 1, "o1"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  // The attempt that passes the bound and the trim in one batch, as the
  // scheduler writes them.
  core::WriteBatch c;
  core::TaskRow r = Row("t", 1);
  r.insert = false;
  r.attempt = 5;
  r.attempts_dropped = 3;
  r.interrupted_dropped = 1;
  c.tasks.push_back(r);
  c.attempts.push_back({"t", 5, "t5"});
  c.trim_attempts.emplace_back("t", 4);
  ASSERT_TRUE(this->store()->Apply(c).ok());
  this->Reopen();
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 2u);
  const core::StoredTask& t = (*tasks)[0];
  ASSERT_EQ(t.attempts.size(), 2u);
  EXPECT_EQ(t.attempts[0].data, "t4");
  EXPECT_EQ(t.attempts[1].data, "t5");
  EXPECT_EQ(t.row.attempts_dropped, 3);
  EXPECT_EQ(t.row.interrupted_dropped, 1);
  ASSERT_EQ((*tasks)[1].attempts.size(), 1u);  // another task's history is left alone
}

TYPED_TEST(StoreConformance, AClaimsEndIsKeptOnInsertAndUpdate) {
  core::WriteBatch b;
  core::TaskRow claimed = Row("claimed", 1);
  claimed.claim_until_us = 1'700'000'123'456'789;
  b.tasks.push_back(claimed);
  b.tasks.push_back(Row("moved", 2));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch c;
  core::TaskRow moved = Row("moved", 2);
  moved.insert = false;
  moved.claim_until_us = 42;
  c.tasks.push_back(moved);
  core::TaskRow released = claimed;
  released.insert = false;
  released.claim_until_us = 0;
  c.tasks.push_back(released);
  ASSERT_TRUE(this->store()->Apply(c).ok());
  this->Reopen();
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].row.claim_until_us, 0);
  EXPECT_EQ((*tasks)[1].row.claim_until_us, 42);
  // And the value an insert carries.
  core::WriteBatch d;
  core::TaskRow fresh = Row("fresh", 3);
  fresh.claim_until_us = 7;
  d.tasks.push_back(fresh);
  ASSERT_TRUE(this->store()->Apply(d).ok());
  this->Reopen();
  tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 3u);
  EXPECT_EQ((*tasks)[2].row.claim_until_us, 7);
}

TYPED_TEST(StoreConformance, AnUpdateMovesTheUniqueHoldAndKeepsTheKey) {
  core::WriteBatch b;
  core::TaskRow held = Row("held", 1);
  held.unique_key = "k";
  held.unique_until_us = 9'000;
  b.tasks.push_back(held);
  core::TaskRow let_go = Row("let-go", 2);
  let_go.unique_key = "k2";
  let_go.unique_until_us = 9'000;
  b.tasks.push_back(let_go);
  ASSERT_TRUE(this->store()->Apply(b).ok());
  // The task succeeded and let go of its key: its row says 0, and the key
  // (written by the insert only) stays.
  core::WriteBatch u;
  core::TaskRow done = Row("let-go", 2, v1::TASK_STATE_SUCCEEDED);
  done.insert = false;
  done.unique_key.clear();
  done.unique_until_us = 0;
  u.tasks.push_back(done);
  // Inserted and updated in one batch: the last row's hold.
  core::TaskRow both = Row("both", 3);
  both.unique_key = "k3";
  both.unique_until_us = 9'000;
  u.tasks.push_back(both);
  both.insert = false;
  both.unique_until_us = 0;
  u.tasks.push_back(both);
  ASSERT_TRUE(this->store()->Apply(u).ok());
  this->Reopen();
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 3u);
  EXPECT_EQ((*tasks)[0].row.unique_until_us, 9'000);
  EXPECT_EQ((*tasks)[1].row.unique_key, "k2");
  EXPECT_EQ((*tasks)[1].row.unique_until_us, 0);
  EXPECT_EQ((*tasks)[2].row.unique_key, "k3");
  EXPECT_EQ((*tasks)[2].row.unique_until_us, 0);
}

TYPED_TEST(StoreConformance, MergedPayloadsAreAppendedAndReadBackInOrder) {
  core::WriteBatch b;
  core::TaskRow r = Row("keyed", 1);
  r.merge_fire_us = 1'700'000'000'000'000;
  b.tasks.push_back(r);
  b.tasks.push_back(Row("plain", 2));
  b.merged.push_back({"keyed", 0, "first"});
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch c;
  core::TaskRow later = r;
  later.insert = false;
  later.merge_fire_us = 1'700'000'000'500'000;
  c.tasks.push_back(later);
  c.merged.push_back({"keyed", 1, std::string("second\0", 7)});
  c.merged.push_back({"keyed", 2, ""});
  ASSERT_TRUE(this->store()->Apply(c).ok());
  this->Reopen();
  auto tasks = this->store()->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 2u);
  const core::StoredTask& keyed = (*tasks)[0];
  EXPECT_EQ(keyed.row.merge_fire_us, 1'700'000'000'500'000);
  ASSERT_EQ(keyed.merged.size(), 3u);
  EXPECT_EQ(keyed.merged[0].payload, "first");
  EXPECT_EQ(keyed.merged[1].payload, std::string("second\0", 7));
  EXPECT_EQ(keyed.merged[2].n, 2);
  EXPECT_TRUE((*tasks)[1].merged.empty());
  EXPECT_EQ((*tasks)[1].row.merge_fire_us, 0);
}

TYPED_TEST(StoreConformance, QueueSettingsAreReplacedAndDeletedByName) {
  core::WriteBatch b;
  b.queues.push_back({"mail", "first"});
  b.queues.push_back({"gone", "x"});
  b.queues.push_back({"mail", std::string("second\0", 7)});  // the later row wins
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch c;
  c.queues.push_back({"gone", ""});  // back to the defaults: deleted
  c.queues.push_back({"never", ""});
  ASSERT_TRUE(this->store()->Apply(c).ok());
  this->Reopen();
  auto queues = this->store()->LoadQueues();
  ASSERT_TRUE(queues.ok()) << queues.status();
  ASSERT_EQ(queues->size(), 1u);
  EXPECT_EQ((*queues)[0].queue, "mail");
  EXPECT_EQ((*queues)[0].settings, std::string("second\0", 7));
}

TYPED_TEST(StoreConformance, AResetMergedAfterAnAttemptClearsThatAttemptToo) {
  core::WriteBatch b;
  b.tasks.push_back(Row("t", 1));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  // The group commit merges an attempt's end and a reset queued right after
  // it into one transaction.
  core::WriteBatch ended;
  ended.attempts.push_back({"t", 1, "finished"});
  core::WriteBatch reset;
  reset.clear_attempts.push_back("t");
  ended.Append(std::move(reset));
  ASSERT_TRUE(this->store()->Apply(ended).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_TRUE((*tasks)[0].attempts.empty());
}

TYPED_TEST(StoreConformance, SeveralChangesOfATaskInOneBatchLeaveTheLast) {
  core::WriteBatch b;
  b.tasks.push_back(Row("old", 1));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch c;
  c.tasks.push_back(Row("new", 2));
  for (const char* id : {"old", "new"}) {
    for (int state :
         {v1::TASK_STATE_DISPATCHED, v1::TASK_STATE_RUNNING, v1::TASK_STATE_SUCCEEDED}) {
      core::TaskRow r = Row(id, id == std::string("old") ? 1 : 2, state);
      r.insert = false;
      r.reason = absl::StrCat("state ", state);
      c.tasks.push_back(r);
    }
  }
  ASSERT_TRUE(this->store()->Apply(c).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 2u);
  for (const core::StoredTask& t : *tasks) {
    EXPECT_EQ(t.row.state, v1::TASK_STATE_SUCCEEDED) << t.row.id;
    EXPECT_EQ(t.row.reason, absl::StrCat("state ", int{v1::TASK_STATE_SUCCEEDED})) << t.row.id;
    EXPECT_EQ(t.row.spec, Row(t.row.id, t.row.seq).spec) << t.row.id;
  }
}

TYPED_TEST(StoreConformance, ABatchIsAllOrNothing) {
  core::WriteBatch b;
  b.tasks.push_back(Row("t1", 1));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch bad;
  bad.tasks.push_back(Row("t2", 2));
  bad.events.push_back(Event("t2", 3, 1));
  bad.tasks.push_back(Row("t1", 1));  // duplicate insert: the whole batch fails
  EXPECT_FALSE(this->store()->Apply(bad).ok());
  auto tasks = this->store()->LoadTasks();
  ASSERT_EQ(tasks->size(), 1u);
  auto events = this->store()->ReadEvents(0, 10);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
}

TYPED_TEST(StoreConformance, UpdateOfAMissingTaskFails) {
  core::WriteBatch b;
  core::TaskRow r = Row("ghost", 1);
  r.insert = false;
  b.tasks.push_back(r);
  EXPECT_FALSE(this->store()->Apply(b).ok());
}

TYPED_TEST(StoreConformance, EventsKeepTheirRevisions) {
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{0, 0, 0}));
  int64_t rev = 0;
  for (int i = 0; i < 3; ++i) {
    core::WriteBatch b;
    b.events.push_back(Event("t" + std::to_string(i), v1::TASK_STATE_PENDING, ++rev));
    b.events.push_back(Event("t" + std::to_string(i), v1::TASK_STATE_DISPATCHED, ++rev));
    ASSERT_TRUE(this->store()->Apply(b).ok());
  }
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{1, 6, 0}));
  auto all = this->store()->ReadEvents(0, 100);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 6u);
  for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*all)[i].revision, int64_t(i) + 1);
  auto tail = this->store()->ReadEvents(4, 100);
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].event.task_id, "t2");
  EXPECT_EQ(this->store()->ReadEvents(0, 2)->size(), 2u);
}

TYPED_TEST(StoreConformance, PruningDropsOldEventsOnly) {
  core::WriteBatch b;
  for (int64_t rev = 1; rev <= 5; ++rev) b.events.push_back(Event("t", 3, rev));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch prune;
  prune.prune_events_through = 3;
  ASSERT_TRUE(this->store()->Apply(prune).ok());
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{4, 5, 3}));
  auto rest = this->store()->ReadEvents(0, 10);
  ASSERT_EQ(rest->size(), 2u);
  EXPECT_EQ((*rest)[0].revision, 4);
}

TYPED_TEST(StoreConformance, PruningEverythingKeepsTheNewestRevisionAcrossAReopen) {
  core::WriteBatch b;
  for (int64_t rev = 1; rev <= 5; ++rev) b.events.push_back(Event("t", 3, rev));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch prune;
  prune.prune_events_through = 5;
  ASSERT_TRUE(this->store()->Apply(prune).ok());
  EXPECT_TRUE(this->store()->ReadEvents(0, 10)->empty());
  // Nothing kept, but revision 5 was handed out: the next one is 6.
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{0, 5, 5}));
  this->Reopen();
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{0, 5, 5}));
  // An older prune (or the same again) never lowers the mark.
  core::WriteBatch again;
  again.prune_events_through = 2;
  again.events.push_back(Event("t", 3, 6));
  ASSERT_TRUE(this->store()->Apply(again).ok());
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{6, 6, 5}));
}

TYPED_TEST(StoreConformance, AFailedBatchDoesNotMoveTheMark) {
  core::WriteBatch b;
  for (int64_t rev = 1; rev <= 3; ++rev) b.events.push_back(Event("t", 3, rev));
  ASSERT_TRUE(this->store()->Apply(b).ok());
  core::WriteBatch bad;
  bad.prune_events_through = 3;
  core::TaskRow missing = Row("missing", 1);
  missing.insert = false;  // an update of a task that is not there
  bad.tasks.push_back(missing);
  EXPECT_FALSE(this->store()->Apply(bad).ok());
  EXPECT_EQ(*this->store()->GetEventSpan(), (EventSpan{1, 3, 0}));
}

// --- SqliteStore only. ---

TEST(SqliteStore, MigratesAnEmptyFileToTheLatestSchema) {
  testing::TempDir dir;
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->schema_version(), SqliteStore::LatestSchemaVersion());
  EXPECT_GE(SqliteStore::LatestSchemaVersion(), 1);
  s->reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/taskgrid.db").c_str(), &db), SQLITE_OK);
  for (const char* table : {"tasks", "attempts", "events", "meta"}) {
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE name = ?1", -1, &st,
                                 nullptr),
              SQLITE_OK);
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(st, 0), 1) << table;
    sqlite3_finalize(st);
  }
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST(SqliteStore, MigratesAVersion1TableKeepingItsRows) {
  testing::TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/taskgrid.db").c_str(), &db), SQLITE_OK);
  // The version-1 schema as released, with one row.
  const char* v1_schema = R"sql(
    CREATE TABLE tasks (id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, queue TEXT NOT NULL,
      state INTEGER NOT NULL, attempt INTEGER NOT NULL, agent_id TEXT NOT NULL,
      create_us INTEGER NOT NULL, update_us INTEGER NOT NULL, next_run_us INTEGER NOT NULL,
      dispatch_us INTEGER NOT NULL, start_us INTEGER NOT NULL, reason TEXT NOT NULL,
      result BLOB NOT NULL, spec BLOB NOT NULL);
    CREATE TABLE attempts (task_id TEXT NOT NULL, attempt INTEGER NOT NULL, data BLOB NOT NULL,
      PRIMARY KEY (task_id, attempt)) WITHOUT ROWID;
    CREATE TABLE events (revision INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
      queue TEXT NOT NULL, from_state INTEGER NOT NULL, to_state INTEGER NOT NULL,
      attempt INTEGER NOT NULL, agent_id TEXT NOT NULL, time_us INTEGER NOT NULL,
      reason TEXT NOT NULL);
    INSERT INTO tasks VALUES ('old', 1, 'default', 3, 0, '', 1, 1, 0, 0, 0, 'submitted', x'', x'');
    INSERT INTO events VALUES (41, 'old', 'default', 0, 3, 0, '', 1, 'submitted');
    PRAGMA user_version = 1;
  )sql";
  ASSERT_EQ(sqlite3_exec(db, v1_schema, nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->schema_version(), SqliteStore::LatestSchemaVersion());
  auto tasks = (*s)->LoadTasks();
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].row.id, "old");
  EXPECT_EQ((*tasks)[0].row.reason, "submitted");
  EXPECT_FALSE((*tasks)[0].row.pause_requested);
  EXPECT_EQ((*tasks)[0].row.seq, 1);
  auto events = (*s)->ReadEvents(0, 10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].revision, 41);
  EXPECT_EQ((*events)[0].event.task_id, "old");
  // History before the oldest kept event counts as pruned.
  EXPECT_EQ(*(*s)->GetEventSpan(), (EventSpan{41, 41, 40}));
  // The migrated table takes updates (keyed by seq) and new rows.
  core::WriteBatch b;
  core::TaskRow r = Row("old", 1, v1::TASK_STATE_CANCELLED);
  r.insert = false;
  b.tasks.push_back(r);
  b.tasks.push_back(Row("new", 2));
  b.events.push_back(Event("new", v1::TASK_STATE_PENDING, 42));
  ASSERT_TRUE((*s)->Apply(b).ok());
  tasks = (*s)->LoadTasks();
  ASSERT_EQ(tasks->size(), 2u);
  EXPECT_EQ((*tasks)[0].row.state, v1::TASK_STATE_CANCELLED);
  EXPECT_EQ((*tasks)[1].row.id, "new");
}

TEST(SqliteStore, MigrationFillsInUniqueKeysAndReplicasFromTheSpecs) {
  testing::TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/taskgrid.db").c_str(), &db), SQLITE_OK);
  v1::TaskSpec unique;
  unique.set_id("u");
  unique.set_unique_key("key");
  unique.mutable_unique_ttl()->set_seconds(60);
  v1::TaskSpec group;
  group.set_id("g");
  group.mutable_replicas()->set_count(2);
  v1::TaskSpec replica;
  replica.set_id("g:r1");
  replica.set_replica_of("g");
  const char* v1_schema = R"sql(
    CREATE TABLE tasks (id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, queue TEXT NOT NULL,
      state INTEGER NOT NULL, attempt INTEGER NOT NULL, agent_id TEXT NOT NULL,
      create_us INTEGER NOT NULL, update_us INTEGER NOT NULL, next_run_us INTEGER NOT NULL,
      dispatch_us INTEGER NOT NULL, start_us INTEGER NOT NULL, reason TEXT NOT NULL,
      result BLOB NOT NULL, spec BLOB NOT NULL);
    CREATE TABLE attempts (task_id TEXT NOT NULL, attempt INTEGER NOT NULL, data BLOB NOT NULL,
      PRIMARY KEY (task_id, attempt)) WITHOUT ROWID;
    CREATE TABLE events (revision INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
      queue TEXT NOT NULL, from_state INTEGER NOT NULL, to_state INTEGER NOT NULL,
      attempt INTEGER NOT NULL, agent_id TEXT NOT NULL, time_us INTEGER NOT NULL,
      reason TEXT NOT NULL);
    PRAGMA user_version = 1;
  )sql";
  ASSERT_EQ(sqlite3_exec(db, v1_schema, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "INSERT INTO tasks VALUES (?1, ?2, 'default', 6, 1, '', 1000000, "
                               "1000000, 0, 0, 0, '', x'', ?3)",
                               -1, &st, nullptr),
            SQLITE_OK);
  int64_t seq = 0;
  for (const v1::TaskSpec* spec : {&unique, &group, &replica}) {
    const std::string blob = spec->SerializeAsString();
    sqlite3_bind_text(st, 1, spec->id().c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, ++seq);
    sqlite3_bind_blob(st, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(st), SQLITE_DONE) << sqlite3_errmsg(db);
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<core::TaskRow> rows;
  ASSERT_TRUE((*s)->ScanTasks(
                      [&](std::vector<core::TaskRow>* chunk) {
                        for (core::TaskRow& r : *chunk) rows.push_back(std::move(r));
                        return absl::OkStatus();
                      },
                      /*light_finished=*/true)
                  .ok());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].unique_key, "key");
  EXPECT_EQ(rows[0].unique_until_us, 1'000'000 + 60'000'000);
  EXPECT_FALSE(rows[0].replica || rows[0].has_replicas);
  EXPECT_TRUE(rows[1].has_replicas);
  EXPECT_FALSE(rows[1].replica);
  EXPECT_TRUE(rows[2].replica);
  EXPECT_TRUE(rows[2].unique_key.empty());
  EXPECT_EQ(rows[2].unique_until_us, 0);
  // Specs written before task labels existed carry none.
  for (const core::TaskRow& r : rows) EXPECT_EQ(r.labels, "") << r.id;
}

TEST(SqliteStore, ReopenReadsWhatWasCommitted) {
  testing::TempDir dir;
  {
    auto s = SqliteStore::Open({dir.path(), Durability::kFull});
    ASSERT_TRUE(s.ok());
    core::WriteBatch b;
    for (int i = 0; i < 100; ++i) b.tasks.push_back(Row("t" + std::to_string(i), i + 1));
    b.attempts.push_back({"t5", 1, "attempt"});
    ASSERT_TRUE((*s)->Apply(b).ok());
  }
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->schema_version(), SqliteStore::LatestSchemaVersion());
  auto tasks = (*s)->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 100u);
  EXPECT_EQ((*tasks)[5].row.id, "t5");
  ASSERT_EQ((*tasks)[5].attempts.size(), 1u);
}

TEST(SqliteStore, CheckpointsRunInTheBackgroundWhileCommitsGoOn) {
  testing::TempDir dir;
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string db = dir.path() + "/taskgrid.db";
  const auto initial = std::filesystem::file_size(db);
  // About 8 MB of rows: well past the 1,000 WAL pages that ask for one.
  int64_t seq = 0;
  for (int b = 0; b < 40; ++b) {
    core::WriteBatch batch;
    for (int i = 0; i < 200; ++i) {
      ++seq;
      core::TaskRow r = Row("t" + std::to_string(seq), seq);
      r.spec.append(1000, 'x');
      batch.tasks.push_back(std::move(r));
    }
    ASSERT_TRUE((*s)->Apply(batch).ok());
  }
  // Bounded wait for the checkpoint thread (no sleep: it needs only to run).
  for (int i = 0; i < 5'000'000 && (*s)->background_checkpoints() == 0; ++i) {
    std::this_thread::yield();
  }
  ASSERT_GE((*s)->background_checkpoints(), 1);
  // Pages were copied back into the database file while the store is open
  // (SQLite's automatic checkpoint is off: only ours could have done it).
  EXPECT_GT(std::filesystem::file_size(db), initial + 1'000'000);
  auto tasks = (*s)->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  EXPECT_EQ(static_cast<int64_t>(tasks->size()), seq);
}

TEST(SqliteStore, SecondOpenOfTheSameDirectoryIsRefused) {
  testing::TempDir dir;
  auto first = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_TRUE(first.ok());
  auto second = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use by another"));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("pid"));
  first->reset();  // the lock goes with the first
  EXPECT_TRUE(SqliteStore::Open({dir.path(), Durability::kFull}).ok());
}

// The task table holds every task's env, payload and output: the data
// directory is made 0700 and its files 0600 whatever the umask (here none
// at all), also files an older version left readable.
TEST(SqliteStore, KeepsItsFilesPrivateWhateverTheUmask) {
  testing::TempDir dir;
  const std::string data = dir.path() + "/data";
  const mode_t old_umask = umask(0);
  {
    auto s = SqliteStore::Open({data, Durability::kFull});
    ASSERT_TRUE(s.ok()) << s.status();
    core::WriteBatch b;
    b.tasks.push_back(Row("private", 1));
    ASSERT_TRUE((*s)->Apply(b).ok());
    auto mode = [](const std::string& path) {
      struct stat st {};
      return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
    };
    EXPECT_EQ(mode(data), 0700);
    for (const char* file : {"/taskgrid.db", "/taskgrid.db-wal", "/taskgrid.db-shm", "/LOCK"}) {
      EXPECT_EQ(mode(data + file), 0600) << file;
    }
  }
  ASSERT_EQ(chmod((data + "/taskgrid.db").c_str(), 0644), 0);
  ASSERT_TRUE(SqliteStore::Open({data, Durability::kFull}).ok());
  struct stat st {};
  ASSERT_EQ(stat((data + "/taskgrid.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  umask(old_umask);
}

TEST(SqliteStore, RefusesADataDirectoryOthersCanWrite) {
  testing::TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0777), 0);
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("can be written by other users (mode 0777)"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/taskgrid.db")) << "nothing made";
  ASSERT_EQ(chmod(dir.path().c_str(), 0700), 0);
  EXPECT_TRUE(SqliteStore::Open({dir.path(), Durability::kFull}).ok());
}

TEST(SqliteStore, RefusesASchemaFromTheFuture) {
  testing::TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() + "/taskgrid.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=999", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("schema version 999"));
}

TEST(SqliteStore, NormalDurabilityAlsoRoundTrips) {
  testing::TempDir dir;
  {
    auto s = SqliteStore::Open({dir.path(), Durability::kNormal});
    ASSERT_TRUE(s.ok());
    core::WriteBatch b;
    b.tasks.push_back(Row("t", 1));
    ASSERT_TRUE((*s)->Apply(b).ok());
  }
  auto s = SqliteStore::Open({dir.path(), Durability::kFull});
  ASSERT_EQ((*s)->LoadTasks()->size(), 1u);
}

}  // namespace
}  // namespace taskgrid::store
