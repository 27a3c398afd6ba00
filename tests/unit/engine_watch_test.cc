// Watching and waiting through the Engine, with an in-memory store and a
// fake clock: revisions across a restart, where a watch starts, a replay
// racing commits, waiters cancelled and expired, and the limits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/faulty_store.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::engine::engine_watch_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Generous: only a deadlock or a lost reply ever reaches it.
constexpr auto kBound = std::chrono::seconds(30);

v1::SubmitTasksRequest OneTask(const std::string& id) {
  v1::SubmitTasksRequest req;
  v1::TaskSpec* s = req.add_tasks();
  s->set_id(id);
  s->add_steps()->mutable_builtin()->set_name("noop");
  return req;
}

class EngineWatchTest : public ::testing::Test {
 protected:
  EngineWatchTest() : faulty_(&mem_) {}

  std::unique_ptr<Engine> NewEngine(EngineOptions opts = {}) {
    opts.tick_interval = absl::Hours(1);  // the test drives time with TickNow()
    opts.scheduler.event_retention = absl::Seconds(1);
    auto e = std::make_unique<Engine>(&faulty_, &clock_, opts);
    EXPECT_TRUE(e->Start().ok());
    return e;
  }

  // Submits and waits for the reply (bounded).
  void Submit(Engine& e, const std::string& id) {
    std::promise<absl::Status> p;
    e.SubmitTasks(OneTask(id),
                  [&p](absl::StatusOr<v1::SubmitTasksResponse> r) { p.set_value(r.status()); });
    auto f = p.get_future();
    ASSERT_EQ(f.wait_for(kBound), std::future_status::ready);
    ASSERT_TRUE(f.get().ok());
  }

  // Every event the watch has now, as (revision, task) pairs.
  static std::vector<std::pair<int64_t, std::string>> Drain(Watch& w) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (;;) {
      auto next = w.Next(100);
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || next->empty()) return out;
      for (const v1::TaskEvent& e : *next) out.emplace_back(e.revision(), e.task_id());
    }
  }

  FakeClock clock_;
  store::MemoryStore mem_;
  testing::FaultyStore faulty_;
};

TEST_F(EngineWatchTest, RevisionsGoOnAfterARestartThatFoundEveryEventPruned) {
  {
    auto e = NewEngine();
    Submit(*e, "old1");
    Submit(*e, "old2");  // revisions 1 and 2
    clock_.Advance(absl::Seconds(3));
    e->TickNow();  // retention prunes both
    e->Sync();
    ASSERT_EQ(mem_.GetEventSpan()->oldest, 0) << "every event pruned";
  }
  auto e = NewEngine();
  // A client that saw revision 2 before the restart resumes there.
  v1::WatchTasksRequest req;
  req.set_after_revision(2);
  auto w = e->StartWatch(req, [] {});
  ASSERT_TRUE(w.ok()) << w.status();
  Submit(*e, "new");
  e->Sync();
  EXPECT_THAT(Drain(**w), ElementsAre(std::make_pair(int64_t{3}, std::string("new"))));
  e->StopWatch(*w);
  // History before the restart is gone: asking for it is out of range.
  req.set_after_revision(1);
  auto stale = e->StartWatch(req, [] {});
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("starts at 3"));
}

TEST_F(EngineWatchTest, AWatchFromNowAfterARestartReplaysNothingAndSaysWhereItStarts) {
  {
    auto e = NewEngine();
    Submit(*e, "before1");
    Submit(*e, "before2");
  }
  auto e = NewEngine();
  auto w = e->StartWatch({}, [] {});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->starts_after(), 2);
  EXPECT_TRUE(Drain(**w).empty()) << "the history kept before the restart is not replayed";
  Submit(*e, "after");
  e->Sync();
  EXPECT_THAT(Drain(**w), ElementsAre(std::make_pair(int64_t{3}, std::string("after"))));
  e->StopWatch(*w);
}

TEST_F(EngineWatchTest, ACommitDuringAPausedReplayReadIsNeitherLostNorRepeated) {
  auto e = NewEngine();
  Submit(*e, "a");  // revision 1
  v1::WatchTasksRequest req;
  req.set_after_revision(0);
  auto w = e->StartWatch(req, [] {});
  ASSERT_TRUE(w.ok());
  // The replay has read revision 1 and is held before it files it.
  faulty_.PauseReads();
  std::vector<std::pair<int64_t, std::string>> got;
  std::thread replay([&] { got = Drain(**w); });
  faulty_.WaitUntilReadPaused();
  Submit(*e, "b");  // committed and offered while the read is held
  Submit(*e, "c");
  faulty_.ResumeReads();
  replay.join();
  for (const auto& ev : Drain(**w)) got.push_back(ev);
  EXPECT_THAT(got, ElementsAre(std::make_pair(int64_t{1}, std::string("a")),
                               std::make_pair(int64_t{2}, std::string("b")),
                               std::make_pair(int64_t{3}, std::string("c"))));
  // And live from here, once each.
  Submit(*e, "d");
  e->Sync();
  EXPECT_THAT(Drain(**w), ElementsAre(std::make_pair(int64_t{4}, std::string("d"))));
  e->StopWatch(*w);
}

TEST_F(EngineWatchTest, AWakeThatReadsTheStoreNeverHoldsUpACommit) {
  auto e = NewEngine();
  // A commit in flight as the watch starts: the watch must read it from
  // the store once it lands, so it waits idle in its replay.
  faulty_.Hold();
  std::promise<absl::Status> first;
  // On a thread of its own: the call may commit on its caller's thread.
  std::thread caller([&] {
    e->SubmitTasks(OneTask("x"), [&first](absl::StatusOr<v1::SubmitTasksResponse> r) {
      first.set_value(r.status());
    });
  });
  faulty_.WaitUntilHolding();
  std::promise<std::vector<int64_t>> woken;
  std::shared_ptr<Watch> watch;
  std::mutex watch_mu;
  bool once = false;
  auto w = e->StartWatch({}, [&] {
    // As the gRPC stream does: the wake reads on at once.
    std::lock_guard<std::mutex> lock(watch_mu);
    if (once) return;
    once = true;
    std::vector<int64_t> revs;
    auto next = watch->Next(100);
    if (next.ok()) {
      for (const v1::TaskEvent& ev : *next) revs.push_back(ev.revision());
    }
    woken.set_value(revs);
  });
  ASSERT_TRUE(w.ok());
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    watch = *w;
    auto next = watch->Next(100);
    ASSERT_TRUE(next.ok());
    EXPECT_TRUE(next->empty()) << "revision 1 has not landed";
  }
  // The wake's store read is held: the commit is still answered.
  faulty_.PauseReads();
  faulty_.Release();
  auto answered = first.get_future();
  ASSERT_EQ(answered.wait_for(kBound), std::future_status::ready)
      << "the commit waited for a watch's store read";
  EXPECT_TRUE(answered.get().ok());
  caller.join();
  faulty_.WaitUntilReadPaused();
  faulty_.ResumeReads();
  auto revs = woken.get_future();
  ASSERT_EQ(revs.wait_for(kBound), std::future_status::ready);
  EXPECT_THAT(revs.get(), ElementsAre(1));
  e->StopWatch(*w);
}

TEST_F(EngineWatchTest, WatchesAreBoundedNamingTheFlag) {
  EngineOptions o;
  o.max_watches = 1;
  auto e = NewEngine(o);
  auto first = e->StartWatch({}, [] {});
  ASSERT_TRUE(first.ok());
  auto second = e->StartWatch({}, [] {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("--max_watches=1"));
  e->StopWatch(*first);
  auto third = e->StartWatch({}, [] {});
  EXPECT_TRUE(third.ok()) << "room again once one stopped";
  e->StopWatch(*third);
}

// A WaitTask reply kept for the test to look at.
struct WaitReply {
  std::promise<absl::StatusOr<v1::WaitTaskResponse>> p;
  std::future<absl::StatusOr<v1::WaitTaskResponse>> f = p.get_future();
  Engine::Reply<v1::WaitTaskResponse> reply() {
    return [this](absl::StatusOr<v1::WaitTaskResponse> r) { p.set_value(std::move(r)); };
  }
  bool answered() { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
};

TEST_F(EngineWatchTest, ACancelledWaitIsRemovedAndAnsweredOnce) {
  WaitReply r;
  auto e = NewEngine();
  Submit(*e, "t");
  const uint64_t id = e->WaitTask("t", absl::Hours(1), r.reply());
  ASSERT_NE(id, 0u);
  EXPECT_EQ(e->waiting(), 1u);
  e->CancelWait(id);
  EXPECT_EQ(e->waiting(), 0u);
  ASSERT_TRUE(r.answered());
  EXPECT_EQ(r.f.get().status().code(), absl::StatusCode::kCancelled);
  e->CancelWait(id);  // again: nothing to do, nothing answered twice
  clock_.Advance(absl::Hours(2));
  e->TickNow();
  e->Sync();
  EXPECT_EQ(e->waiting(), 0u);
}

TEST_F(EngineWatchTest, AWaitRunsOutOnTheFakeClock) {
  WaitReply soon, later;  // outlive the engine, which answers them as it stops
  auto e = NewEngine();
  Submit(*e, "t");
  e->WaitTask("t", absl::Seconds(5), soon.reply());
  e->WaitTask("t", absl::Seconds(60), later.reply());
  clock_.Advance(absl::Seconds(5));
  e->TickNow();
  e->Sync();
  ASSERT_TRUE(soon.answered());
  auto resp = soon.f.get();
  ASSERT_TRUE(resp.ok());
  EXPECT_FALSE(resp->done());
  EXPECT_EQ(resp->task().state(), v1::TASK_STATE_PENDING);
  EXPECT_FALSE(later.answered());
  EXPECT_EQ(e->waiting(), 1u);
}

TEST_F(EngineWatchTest, WaitsAreBoundedNamingTheFlag) {
  EngineOptions o;
  o.max_waits = 1;
  WaitReply first, second;
  auto e = NewEngine(o);
  Submit(*e, "t");
  ASSERT_NE(e->WaitTask("t", absl::Hours(1), first.reply()), 0u);
  EXPECT_EQ(e->WaitTask("t", absl::Hours(1), second.reply()), 0u);
  ASSERT_EQ(second.f.wait_for(kBound), std::future_status::ready);
  absl::StatusOr<v1::WaitTaskResponse> refused = second.f.get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--max_waits=1"));
  EXPECT_EQ(e->waiting(), 1u);
}

}  // namespace
}  // namespace taskgrid::engine::engine_watch_test
