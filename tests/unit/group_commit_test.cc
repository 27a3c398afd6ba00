#include "scheduler/store/group_commit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "scheduler/store/memory_store.h"
#include "tests/testing/faulty_store.h"

namespace taskgrid::store {
namespace {

core::WriteBatch EventBatch(const std::string& id) {
  static std::atomic<int64_t> revision{0};
  core::WriteBatch b;
  core::EventRow e;
  e.revision = ++revision;
  e.task_id = id;
  b.events.push_back(e);
  return b;
}

TEST(GroupCommitWriter, AnswersNoCallerBeforeItsCommit) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  store.Hold();
  std::atomic<int> answered{0};
  std::promise<absl::Status> first;
  writer.Submit(EventBatch("a"), [&](const absl::Status& s) {
    ++answered;
    first.set_value(s);
  });
  store.WaitUntilHolding();  // the commit is in flight now
  EXPECT_EQ(answered.load(), 0);
  EXPECT_TRUE(mem.ReadEvents(0, 10)->empty());
  store.Release();
  EXPECT_TRUE(first.get_future().get().ok());
  EXPECT_EQ(answered.load(), 1);
  EXPECT_EQ(mem.ReadEvents(0, 10)->size(), 1u);
}

TEST(GroupCommitWriter, MergesQueuedBatchesIntoOneTransaction) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  store.Hold();
  std::promise<void> first_done;
  writer.Submit(EventBatch("first"), [&](const absl::Status&) { first_done.set_value(); });
  store.WaitUntilHolding();
  // While the first commit is held, 50 more queue up...
  std::mutex mu;
  std::vector<std::string> order;
  std::promise<void> all_done;
  for (int i = 0; i < 50; ++i) {
    writer.Submit(EventBatch("b" + std::to_string(i)), [&, i](const absl::Status& s) {
      EXPECT_TRUE(s.ok());
      std::lock_guard<std::mutex> lock(mu);
      order.push_back("b" + std::to_string(i));
      if (order.size() == 50) all_done.set_value();
    });
  }
  store.Release();
  first_done.get_future().wait();
  all_done.get_future().wait();
  // ...and commit together in one more transaction, answered in order.
  EXPECT_EQ(store.applies(), 2);
  EXPECT_EQ(writer.commits(), 2);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], "b" + std::to_string(i));
  auto events = mem.ReadEvents(0, 100);
  ASSERT_EQ(events->size(), 51u);
  EXPECT_EQ((*events)[1].event.task_id, "b0");
}

TEST(GroupCommitWriter, TimesEachCommitAndCountsItsRows) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  FakeClock clock;
  GroupCommitWriter::Options opts;
  opts.clock = &clock;
  GroupCommitWriter writer(&store, opts);
  store.Hold();
  std::promise<void> first_done;
  writer.Submit(EventBatch("first"), [&](const absl::Status&) { first_done.set_value(); });
  store.WaitUntilHolding();
  clock.Advance(absl::Milliseconds(250));  // the first commit takes 250 ms
  std::promise<void> rest_done;
  for (int i = 0; i < 3; ++i) {
    writer.Submit(EventBatch("b" + std::to_string(i)), [&, i](const absl::Status&) {
      if (i == 2) rest_done.set_value();
    });
  }
  writer.Submit(core::WriteBatch{}, [](const absl::Status&) {});  // a barrier: no rows
  store.Release();
  first_done.get_future().wait();
  rest_done.get_future().wait();
  writer.Stop();
  const GroupCommitWriter::Stats st = writer.stats();
  EXPECT_EQ(st.commits, writer.commits());
  ASSERT_EQ(st.commit_rows.count(), 2);  // 1 row, then the 3 queued behind it together
  EXPECT_DOUBLE_EQ(st.commit_rows.sum(), 4);
  EXPECT_EQ(st.commit_rows.CumulativeCount(0), 1);  // le=1
  EXPECT_EQ(st.commit_rows.CumulativeCount(1), 1);  // le=2
  EXPECT_EQ(st.commit_rows.CumulativeCount(2), 2);  // le=4
  ASSERT_EQ(st.commit_seconds.count(), 2);
  EXPECT_DOUBLE_EQ(st.commit_seconds.sum(), 0.25);
}

TEST(GroupCommitWriter, TheNextCommitDoesNotWaitForTheLastOnesCallers) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  store.Hold();
  std::promise<void> first_answering;
  std::promise<void> let_first_return;
  std::shared_future<void> gate = let_first_return.get_future().share();
  writer.Submit(EventBatch("first"), [&](const absl::Status&) {
    first_answering.set_value();
    gate.wait();  // a slow caller (e.g. a full stream)
  });
  store.WaitUntilHolding();
  std::promise<void> second_done;
  writer.Submit(EventBatch("second"), [&](const absl::Status&) { second_done.set_value(); });
  store.Release();
  first_answering.get_future().wait();
  // The first commit's caller is still being answered, yet the second batch
  // commits: its rows are in the store. Only its answer waits, for order.
  for (int i = 0; i < 1'000'000 && store.applies() < 2; ++i) std::this_thread::yield();
  EXPECT_EQ(store.applies(), 2);
  EXPECT_EQ(mem.ReadEvents(0, 10)->size(), 2u);
  auto second = second_done.get_future();
  EXPECT_EQ(second.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  let_first_return.set_value();
  second.wait();
}

TEST(GroupCommitWriter, AFailedCommitAnswersNoOkAndBreaksTheWriter) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  std::promise<absl::Status> first;
  writer.Submit(EventBatch("x"), [&](const absl::Status& s) { first.set_value(s); });
  EXPECT_TRUE(first.get_future().get().ok());

  store.Hold();
  store.FailNext(1);
  std::promise<absl::Status> failing;
  writer.Submit(EventBatch("y"), [&](const absl::Status& s) { failing.set_value(s); });
  store.WaitUntilHolding();
  std::vector<std::promise<absl::Status>> queued(5);
  for (auto& p : queued) {
    writer.Submit(EventBatch("q"), [&p](const absl::Status& s) { p.set_value(s); });
  }
  store.Release();
  absl::Status s = failing.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("injected commit failure"));
  // Batches queued behind the failed one are refused, never committed.
  for (auto& p : queued) EXPECT_FALSE(p.get_future().get().ok());
  std::promise<absl::Status> later;
  writer.Submit(EventBatch("z"), [&](const absl::Status& st) { later.set_value(st); });
  EXPECT_FALSE(later.get_future().get().ok());
  EXPECT_EQ(store.applies(), 2);
  EXPECT_EQ(mem.ReadEvents(0, 100)->size(), 1u);
}

TEST(GroupCommitWriter, EmptyBatchIsABarrier) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  store.Hold();
  std::atomic<bool> barrier_done{false};
  writer.Submit(EventBatch("a"), [](const absl::Status&) {});
  store.WaitUntilHolding();
  std::promise<void> done;
  writer.Submit(core::WriteBatch{}, [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok());
    barrier_done = true;
    done.set_value();
  });
  EXPECT_FALSE(barrier_done.load());
  store.Release();
  done.get_future().wait();
  EXPECT_EQ(mem.ReadEvents(0, 10)->size(), 1u);
}

// Waits (bounded) until the writer thread waits for work with nothing
// queued: only then does a CallerCommit take a Submit on.
void WaitUntilIdle(const GroupCommitWriter& writer) {
  for (int i = 0; i < 10'000'000 && !writer.idle(); ++i) std::this_thread::yield();
  ASSERT_TRUE(writer.idle());
}

TEST(GroupCommitWriter, ACallerCommitsItsOwnBatchAtTheScopesEnd) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  WaitUntilIdle(writer);
  std::thread::id answered_on;
  bool answered = false;
  {
    GroupCommitWriter::CallerCommit here(&writer);
    writer.Submit(EventBatch("mine"), [&](const absl::Status& s) {
      EXPECT_TRUE(s.ok());
      answered = true;
      answered_on = std::this_thread::get_id();
    });
    // Not handed to the writer thread: nothing is committed or answered
    // until the scope ends.
    EXPECT_FALSE(answered);
    EXPECT_EQ(store.applies(), 0);
    EXPECT_FALSE(writer.idle());
  }
  EXPECT_TRUE(answered);
  EXPECT_EQ(answered_on, std::this_thread::get_id());
  EXPECT_EQ(store.applies(), 1);
  EXPECT_EQ(writer.commits(), 1);
  ASSERT_EQ(mem.ReadEvents(0, 10)->size(), 1u);
  // The writer thread takes later submits again.
  std::promise<std::thread::id> later;
  writer.Submit(EventBatch("later"),
                [&](const absl::Status&) { later.set_value(std::this_thread::get_id()); });
  EXPECT_NE(later.get_future().get(), std::this_thread::get_id());
  EXPECT_EQ(store.applies(), 2);
}

TEST(GroupCommitWriter, WithoutAScopeTheWriterThreadCommits) {
  MemoryStore mem;
  GroupCommitWriter writer(&mem);
  WaitUntilIdle(writer);
  std::promise<std::thread::id> on;
  writer.Submit(EventBatch("a"),
                [&](const absl::Status&) { on.set_value(std::this_thread::get_id()); });
  EXPECT_NE(on.get_future().get(), std::this_thread::get_id());
}

TEST(GroupCommitWriter, WithCallerCommitsOffTheScopeChangesNothing) {
  MemoryStore mem;
  GroupCommitWriter::Options opts;
  opts.caller_commits = false;  // as on PostgreSQL
  GroupCommitWriter writer(&mem, opts);
  WaitUntilIdle(writer);
  std::promise<std::thread::id> on;
  {
    GroupCommitWriter::CallerCommit here(&writer);
    writer.Submit(EventBatch("a"),
                  [&](const absl::Status&) { on.set_value(std::this_thread::get_id()); });
    // Committed and answered by the writer thread, without the scope's end.
    EXPECT_NE(on.get_future().get(), std::this_thread::get_id());
  }
}

TEST(GroupCommitWriter, OthersQueuedBeforeTheScopeEndsCommitWithTheCallersBatchInOrder) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  WaitUntilIdle(writer);
  std::vector<std::string> order;  // appended by callbacks, which run in order
  std::mutex mu;
  auto note = [&](const std::string& name) {
    return [&, name](const absl::Status& s) {
      EXPECT_TRUE(s.ok());
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(name);
    };
  };
  {
    GroupCommitWriter::CallerCommit here(&writer);
    writer.Submit(EventBatch("caller"), note("caller"));
    std::thread other([&] {
      writer.Submit(EventBatch("other1"), note("other1"));
      writer.Submit(EventBatch("other2"), note("other2"));
    });
    other.join();
    // The writer thread leaves them to the caller's commit.
    EXPECT_EQ(store.applies(), 0);
  }
  EXPECT_EQ(store.applies(), 1);  // one transaction for all three
  EXPECT_THAT(order, ::testing::ElementsAre("caller", "other1", "other2"));
  auto events = mem.ReadEvents(0, 10);
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].event.task_id, "caller");
  EXPECT_EQ((*events)[2].event.task_id, "other2");
}

// Starts a thread that commits a batch of its own ("caller", under a
// CallerCommit) and returns once that commit is held in `store`; `done`
// gets its status.
std::thread CommitHeldOnACallersThread(GroupCommitWriter& writer, testing::FaultyStore& store,
                                       GroupCommitWriter::Done done) {
  store.Hold();
  std::thread caller([&writer, done = std::move(done)]() mutable {
    GroupCommitWriter::CallerCommit here(&writer);
    writer.Submit(EventBatch("caller"), std::move(done));
  });
  store.WaitUntilHolding();
  return caller;
}

TEST(GroupCommitWriter, WhatIsQueuedDuringACallersCommitGoesToTheWriterThreadAfter) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  WaitUntilIdle(writer);
  std::promise<void> caller_answered;
  // The caller's commit is in flight on its thread.
  std::thread caller = CommitHeldOnACallersThread(writer, store, [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok());
    caller_answered.set_value();
  });
  std::promise<std::thread::id> next;
  writer.Submit(EventBatch("next"), [&](const absl::Status& s) {
    EXPECT_TRUE(s.ok());
    next.set_value(std::this_thread::get_id());
  });
  auto next_future = next.get_future();
  EXPECT_EQ(next_future.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  store.Release();
  caller_answered.get_future().wait();
  const std::thread::id caller_id = caller.get_id();
  caller.join();
  const std::thread::id next_on = next_future.get();
  EXPECT_NE(next_on, caller_id);
  EXPECT_NE(next_on, std::this_thread::get_id());
  EXPECT_EQ(store.applies(), 2);
  auto events = mem.ReadEvents(0, 10);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].event.task_id, "next");
}

TEST(GroupCommitWriter, ACallersFailedCommitBreaksTheWriter) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  WaitUntilIdle(writer);
  store.FailNext(1);
  absl::Status got;
  {
    GroupCommitWriter::CallerCommit here(&writer);
    writer.Submit(EventBatch("x"), [&](const absl::Status& s) { got = s; });
  }
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  std::promise<absl::Status> later;
  writer.Submit(EventBatch("y"), [&](const absl::Status& s) { later.set_value(s); });
  EXPECT_FALSE(later.get_future().get().ok());
  EXPECT_TRUE(mem.ReadEvents(0, 10)->empty());
}

TEST(GroupCommitWriter, StopWaitsForACallersCommit) {
  MemoryStore mem;
  testing::FaultyStore store(&mem);
  GroupCommitWriter writer(&store);
  WaitUntilIdle(writer);
  std::atomic<bool> answered{false};
  std::thread caller =
      CommitHeldOnACallersThread(writer, store, [&](const absl::Status& s) { answered = s.ok(); });
  std::thread stopper([&] { writer.Stop(); });
  store.Release();
  stopper.join();
  caller.join();
  EXPECT_TRUE(answered.load());
  EXPECT_EQ(mem.ReadEvents(0, 10)->size(), 1u);
}

TEST(GroupCommitWriter, StopCommitsWhatIsQueuedThenRefuses) {
  MemoryStore mem;
  GroupCommitWriter writer(&mem);
  std::atomic<int> ok{0};
  for (int i = 0; i < 10; ++i) {
    writer.Submit(EventBatch("e"), [&](const absl::Status& s) { ok += s.ok(); });
  }
  writer.Stop();
  EXPECT_EQ(ok.load(), 10);
  absl::Status after;
  writer.Submit(EventBatch("late"), [&](const absl::Status& s) { after = s; });
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(mem.ReadEvents(0, 100)->size(), 10u);
}

}  // namespace
}  // namespace taskgrid::store
