// Watch: history from the store, then live offers, with no gap or
// duplicate at the switch; a full queue ends the watch. Runs under TSan.
#include "scheduler/engine/watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <utility>

#include "scheduler/store/memory_store.h"

namespace taskgrid::engine {
namespace {

using ::testing::HasSubstr;

core::EventRow Row(int64_t revision, const std::string& task = "t",
                   v1::TaskState to = v1::TASK_STATE_PENDING) {
  core::EventRow e;
  e.revision = revision;
  e.task_id = task;
  e.queue = "default";
  e.to_state = to;
  return e;
}

// Commits events to the store, then offers them, as the Engine does.
// Revisions from..to land in the store (not offered to any watch).
void Land(store::MemoryStore& store, int64_t from, int64_t to) {
  core::WriteBatch b;
  for (int64_t r = from; r <= to; ++r) b.events.push_back(Row(r));
  ASSERT_TRUE(store.Apply(b).ok());
}

void Commit(store::MemoryStore& store, Watch& w, int64_t from, int64_t to) {
  Land(store, from, to);
  std::vector<v1::TaskEvent> offered;
  for (int64_t r = from; r <= to; ++r) offered.push_back(Watch::ToEvent({r, Row(r)}));
  w.Offer(offered);
}

std::vector<int64_t> Drain(Watch& w) {
  std::vector<int64_t> revs;
  for (;;) {
    auto next = w.Next(100);
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || next->empty()) return revs;
    for (const v1::TaskEvent& e : *next) revs.push_back(e.revision());
  }
}

TEST(Watch, ReplaysHistoryThenLiveEventsInOrder) {
  store::MemoryStore store;
  int wakes = 0;
  Watch w({}, 0, &store, 1000, [&] { ++wakes; });
  Commit(store, w, 1, 600);  // more than one replay chunk
  std::vector<int64_t> got = Drain(w);
  ASSERT_EQ(got.size(), 600u);
  for (int64_t i = 0; i < 600; ++i) EXPECT_EQ(got[i], i + 1);
  EXPECT_EQ(wakes, 0);
  Commit(store, w, 601, 605);  // live now: the idle watcher is woken
  EXPECT_EQ(wakes, 1);
  got = Drain(w);
  EXPECT_THAT(got, ::testing::ElementsAre(601, 602, 603, 604, 605));
}

TEST(Watch, StartsAfterTheGivenRevisionAndFilters) {
  store::MemoryStore store;
  core::WriteBatch b;
  b.events = {Row(1, "a"), Row(2, "b", v1::TASK_STATE_RUNNING), Row(3, "b")};
  ASSERT_TRUE(store.Apply(b).ok());
  v1::WatchTasksRequest filter;
  filter.add_task_ids("b");
  filter.add_states(v1::TASK_STATE_PENDING);
  Watch w(filter, 1, &store, 1000, [] {});
  EXPECT_THAT(Drain(w), ::testing::ElementsAre(3));
}

TEST(Watch, NoGapOrDuplicateWhileCommitsRaceTheSwitchToLive) {
  store::MemoryStore store;
  std::atomic<bool> woken{false};
  Watch w({}, 0, &store, 1'000'000, [&] { woken = true; });
  constexpr int64_t kTotal = 20'000;
  std::thread writer([&] {
    for (int64_t r = 1; r <= kTotal; r += 7) Commit(store, w, r, std::min(r + 6, kTotal));
  });
  std::vector<int64_t> got;
  while (got.empty() || got.back() < kTotal) {
    auto next = w.Next(64);
    ASSERT_TRUE(next.ok());
    for (const v1::TaskEvent& e : *next) got.push_back(e.revision());
    if (next->empty()) std::this_thread::yield();
  }
  writer.join();
  ASSERT_EQ(got.size(), static_cast<size_t>(kTotal));
  for (int64_t i = 0; i < kTotal; ++i) ASSERT_EQ(got[i], i + 1);
}

TEST(Watch, AFullQueueEndsTheWatchNamingWhereToResume) {
  store::MemoryStore store;
  Watch w({}, 0, &store, 10, [] {});
  Commit(store, w, 1, 3);
  ASSERT_EQ(Drain(w).size(), 3u);
  w.Sent(3);
  Commit(store, w, 4, 20);  // 17 > 10 queued, nobody reading
  auto next = w.Next(100);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("after_revision=3"));
}

TEST(Watch, ACommitQueuedBeforeTheWatchStartedIsReadOnceItLands) {
  // Revisions 1-2 are stored; 3-4 were assigned in a commit queued before
  // the watch existed, so they are never offered as events, only as "landed
  // through 4". The watch must wait for them, not go live without them.
  store::MemoryStore store;
  Land(store, 1, 2);
  int wakes = 0;
  Watch w(
      {}, 0, &store, 1000, [&] { ++wakes; }, /*must_replay_through=*/4);
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{1, 2}));
  Land(store, 3, 4);
  w.Offer({}, 4);
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{3, 4}));
  Commit(store, w, 5, 5);  // live from here
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{5}));
}

// A store that, once armed, runs `after_read` right after a read: a commit
// that lands and is offered while a replay reads.
class RacingStore : public store::MemoryStore {
 public:
  std::function<void()> after_read;
  absl::StatusOr<std::vector<store::StoredEvent>> ReadEvents(int64_t after, int limit) override {
    auto out = MemoryStore::ReadEvents(after, limit);
    if (after_read) std::exchange(after_read, nullptr)();
    return out;
  }
};

TEST(Watch, ACommitOfferedWhileTheReplayReadsIsNotMissed) {
  // Revision 3 is in flight when the watch starts. Its commit lands and is
  // offered just after a read found nothing: that offer woke nobody (the
  // watch was not idle yet), so the watch must not go idle waiting for it.
  RacingStore store;
  Land(store, 1, 2);
  int wakes = 0;
  Watch w(
      {}, 0, &store, 1000, [&] { ++wakes; }, /*must_replay_through=*/3);
  auto next = w.Next(100);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->size(), 2u);
  store.after_read = [&] {
    Land(store, 3, 3);
    w.Offer({Watch::ToEvent({3, Row(3)})}, 3);
  };
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{3}));
  EXPECT_EQ(wakes, 0);
  Commit(store, w, 4, 4);  // live from here
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{4}));
}

void Prune(store::MemoryStore& store, int64_t through) {
  core::WriteBatch b;
  b.prune_events_through = through;
  ASSERT_TRUE(store.Apply(b).ok());
}

TEST(Watch, HistoryPrunedBeforeTheFirstReadIsOutOfRangeNamingTheOldestKept) {
  store::MemoryStore store;
  Watch w({}, 2, &store, 1000, [] {});
  Commit(store, w, 1, 10);
  Prune(store, 5);  // between the watch's start and its first read
  auto next = w.Next(100);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("oldest revision still kept is 6"));
  EXPECT_EQ(w.Next(100).status().code(), absl::StatusCode::kOutOfRange) << "it stays ended";
}

TEST(Watch, HistoryPrunedBetweenTwoReadsIsOutOfRange) {
  store::MemoryStore store;
  Watch w({}, 0, &store, 100'000, [] {});
  Commit(store, w, 1, 2000);  // several replay chunks
  auto first = w.Next(100);
  ASSERT_TRUE(first.ok());
  ASSERT_FALSE(first->empty());
  const int64_t read = first->back().revision();
  ASSERT_LT(read, 1000);
  Prune(store, 1500);
  auto next = w.Next(100);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("still kept is 1501"));
}

TEST(Watch, EverythingAfterTheCursorPrunedIsOutOfRangeToo) {
  store::MemoryStore store;
  Watch w({}, 3, &store, 1000, [] {});
  Commit(store, w, 1, 10);
  Prune(store, 10);  // nothing left to read: not a quiet wait either
  auto next = w.Next(100);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("still kept is 11"));
}

TEST(Watch, AfterZeroMeansAllTheKeptHistory) {
  store::MemoryStore store;
  Watch w({}, 0, &store, 1000, [] {});
  Commit(store, w, 1, 10);
  Prune(store, 7);
  EXPECT_EQ(Drain(w), (std::vector<int64_t>{8, 9, 10}));
  // With nothing kept at all, it waits for what comes next.
  store::MemoryStore empty;
  Watch from_nothing({}, 0, &empty, 1000, [] {});
  Commit(empty, from_nothing, 1, 4);
  Prune(empty, 4);
  EXPECT_TRUE(Drain(from_nothing).empty());
  Commit(empty, from_nothing, 5, 6);
  EXPECT_EQ(Drain(from_nothing), (std::vector<int64_t>{5, 6}));
}

}  // namespace
}  // namespace taskgrid::engine
