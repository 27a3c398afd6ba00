// Watching through the Engine, with an in-memory store and a fake clock:
// revisions across a restart, and where a watch starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/faulty_store.h"

namespace taskgrid::engine {
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

}  // namespace
}  // namespace taskgrid::engine
