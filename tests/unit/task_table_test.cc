// The task table alone: submit order, the one door for states (rows,
// events, revisions, counts, the timer), ids, and event retention.
#include "scheduler/core/task_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::core::task_table_test {
namespace {

std::unique_ptr<TaskRecord> Record(const std::string& id, const std::string& queue = "q") {
  auto t = std::make_unique<TaskRecord>();
  t->spec.set_id(id);
  t->spec.set_queue(queue);
  return t;
}

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

TEST(TaskTable, InsertTakesTheNextSeqInSubmitOrder) {
  TaskTable table;
  TaskRecord& a = table.Insert(Record("a"));
  TaskRecord& b = table.Insert(Record("b"));
  EXPECT_EQ(a.seq, 1);
  EXPECT_EQ(b.seq, 2);
  EXPECT_EQ(table.next_seq(), 3);
  EXPECT_EQ(table.Find("b"), &b);
  EXPECT_EQ(table.Find("c"), nullptr);
  ASSERT_EQ(table.by_seq().size(), 2u);
  EXPECT_EQ(table.by_seq().begin()->second, &a);
}

TEST(TaskTable, ApplyWritesTheRowAndAnEventAndKeepsTheCounts) {
  TaskTable table;
  TaskRecord& t = table.Insert(Record("a"));
  WriteBatch batch;
  t.next_run_time = kT0 + absl::Seconds(5);
  EXPECT_EQ(table.Apply(t, v1::TASK_STATE_SCHEDULED, "submitted", kT0, nullptr, &batch),
            v1::TASK_STATE_UNSPECIFIED);
  EXPECT_EQ(table.CountsOf("q")[v1::TASK_STATE_SCHEDULED], 1);
  EXPECT_EQ(table.CountsOf("nowhere")[v1::TASK_STATE_SCHEDULED], 0);
  // The timer gives it back once due.
  EXPECT_EQ(table.NextDue(kT0 + absl::Seconds(4)), nullptr);
  EXPECT_EQ(table.NextDue(kT0 + absl::Seconds(5)), &t);
  const std::string agent = "a1";
  EXPECT_EQ(table.Apply(t, v1::TASK_STATE_PENDING, "due", kT0 + absl::Seconds(5), &agent, &batch),
            v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(table.NextDue(kT0 + absl::Hours(1)), nullptr);
  EXPECT_TRUE(table.scheduled().empty());
  EXPECT_EQ(table.CountsOf("q")[v1::TASK_STATE_SCHEDULED], 0);
  EXPECT_EQ(table.CountsOf("q")[v1::TASK_STATE_PENDING], 1);
  ASSERT_EQ(batch.tasks.size(), 2u);
  EXPECT_TRUE(batch.tasks[0].insert);
  EXPECT_FALSE(batch.tasks[1].insert);
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].revision, 1);
  EXPECT_EQ(batch.events[1].revision, 2);
  EXPECT_EQ(batch.events[1].agent_id, "a1");
  EXPECT_EQ(batch.events[1].from_state, v1::TASK_STATE_SCHEDULED);
  EXPECT_EQ(table.last_revision(), 2);
}

TEST(TaskTable, JobsCountTheirTasksByState) {
  TaskTable table;
  JobRecord& j = table.FindOrAddJob("j", table.next_seq(), kT0);
  EXPECT_EQ(&table.FindOrAddJob("j", 99, kT0), &j);
  TaskRecord& t = table.Insert(Record("a"));
  t.job = &j;
  WriteBatch batch;
  table.Apply(t, v1::TASK_STATE_PENDING, "submitted", kT0 + absl::Seconds(1), nullptr, &batch);
  EXPECT_EQ(j.counts[v1::TASK_STATE_PENDING], 1);
  EXPECT_EQ(j.update_time, kT0 + absl::Seconds(1));
  EXPECT_EQ(table.jobs_by_seq().begin()->second, &j);
}

TEST(TaskTable, AStoredTaskKeepsItsSeqAndATwiceStoredOneIsDataLoss) {
  TaskTable table;
  auto r = Record("a");
  r->seq = 41;
  ASSERT_TRUE(table.Adopt(std::move(r)).ok());
  EXPECT_EQ(table.next_seq(), 42);
  auto again = Record("a");
  again->seq = 50;
  auto s = table.Adopt(std::move(again));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("task a is stored twice"));
}

TEST(TaskTable, GeneratedIdsAreFreeAndSortByTime) {
  TaskTable table;
  const std::string first = table.NewTaskId(kT0);
  table.Insert(Record(first));
  const std::string second = table.NewTaskId(kT0);
  EXPECT_NE(first, second);
  EXPECT_LT(first, table.NewTaskId(kT0 + absl::Seconds(1)));
  EXPECT_EQ(table.NewJobId(kT0)[0], 'j');
}

TEST(TaskTable, RetentionPrunesThroughTheNewestRevisionOlderThanTheCutoff) {
  TaskTable table;
  table.SetRevisions(10, 3, kT0);  // restored: 3..10 kept, as of kT0
  TaskRecord& t = table.Insert(Record("a"));
  WriteBatch batch;
  table.Apply(t, v1::TASK_STATE_PENDING, "x", kT0 + absl::Seconds(2), nullptr, &batch);  // 11
  EXPECT_EQ(table.PruneBefore(kT0), 0);
  EXPECT_EQ(table.PruneBefore(kT0 + absl::Seconds(1)), 10);
  EXPECT_EQ(table.oldest_revision(), 11);
  EXPECT_EQ(table.PruneBefore(kT0 + absl::Seconds(3)), 11);
  EXPECT_EQ(table.oldest_revision(), 12);
}

TEST(TaskTable, TasksOnDiskAreFoundByIdAndSeqAcrossPoolChunksAndFreedSlots) {
  // More tasks than one chunk of the pool holds (4,096), every other one
  // deleted and the freed slots taken again by later tasks: each stays
  // found by id and by seq, and the index by seq keeps submit order.
  TaskTable table;
  WriteBatch batch;
  constexpr int kTasks = 5000;
  auto finish = [&](const std::string& id) {
    TaskRecord& t = table.Insert(Record(id));
    t.spec.mutable_labels()->insert({"n", id});
    table.Apply(t, v1::TASK_STATE_PENDING, "submitted", kT0, nullptr, &batch);
    table.Apply(t, v1::TASK_STATE_CANCELLED, "cancelled", kT0, nullptr, &batch);
    table.Evict(t);
  };
  for (int i = 0; i < kTasks; ++i) finish(absl::StrCat("t", i));
  ASSERT_EQ(table.cold_size(), size_t{kTasks});
  for (int i = 0; i < kTasks; i += 2) {
    const ColdTask* c = table.FindCold(absl::StrCat("t", i));
    ASSERT_NE(c, nullptr);
    table.DeleteCold(*c, &batch);
  }
  EXPECT_EQ(table.FindCold("t0"), nullptr);
  EXPECT_EQ(table.FindColdBySeq(1), nullptr);
  for (int i = 0; i < kTasks / 2; ++i) finish(absl::StrCat("u", i));
  ASSERT_EQ(table.cold_size(), size_t{kTasks});
  int64_t last = 0;
  for (TaskTable::ColdRef r : table.cold_by_seq()) {
    const ColdTask& c = table.cold(r);
    EXPECT_GT(c.seq, last);
    last = c.seq;
    EXPECT_EQ(table.FindColdBySeq(c.seq), &c);
    EXPECT_EQ(table.FindCold(c.id()), &c);
    EXPECT_EQ(c.state(), v1::TASK_STATE_CANCELLED);
    EXPECT_EQ(table.LabelsOf(c), absl::StrCat("\nn=", c.id(), "\n"));
  }
  EXPECT_EQ(last, kTasks + kTasks / 2);
  EXPECT_EQ(table.FindCold("t1")->seq, 2);
  EXPECT_EQ(table.FindCold("u0")->seq, kTasks + 1);
  EXPECT_EQ(table.CountsOf("q")[v1::TASK_STATE_CANCELLED], kTasks);
  EXPECT_EQ(table.CheckLabelSets(), "");
}

}  // namespace
}  // namespace taskgrid::core::task_table_test
