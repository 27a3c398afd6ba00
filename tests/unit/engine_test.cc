// The Engine with an in-memory store, fake agent channels and a fake clock:
// replies and agent messages leave only after their commit.
#include "scheduler/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "scheduler/store/memory_store.h"
#include "tests/testing/await.h"
#include "tests/testing/fake_agent_channel.h"
#include "tests/testing/faulty_store.h"

namespace taskgrid::engine {
namespace {

using ::testing::HasSubstr;

using FakeChannel = testing::FakeAgentChannel;

v1::SubmitTasksRequest OneTask(const std::string& id) {
  v1::SubmitTasksRequest req;
  v1::TaskSpec* s = req.add_tasks();
  s->set_id(id);
  s->add_steps()->mutable_builtin()->set_name("noop");
  return req;
}

using testing::Await;

class EngineTest : public ::testing::Test {
 protected:
  EngineTest() : faulty_(&mem_) {}

  std::unique_ptr<Engine> NewEngine(EngineOptions opts = {}) {
    opts.tick_interval = absl::Hours(1);  // the test drives time with TickNow()
    auto e = std::make_unique<Engine>(&faulty_, &clock_, opts);
    e->set_on_fatal([this](const absl::Status&) { ++fatal_; });
    EXPECT_TRUE(e->Start().ok());
    return e;
  }

  absl::StatusOr<v1::SubmitTasksResponse> Submit(Engine& e, const std::string& id) {
    return Await<v1::SubmitTasksResponse>(
        [&](Engine::Reply<v1::SubmitTasksResponse> r) { e.SubmitTasks(OneTask(id), r); });
  }

  absl::StatusOr<v1::Task> Get(Engine& e, const std::string& id) {
    v1::GetTaskRequest req;
    req.set_id(id);
    return Await<v1::Task>([&](Engine::Reply<v1::Task> r) { e.GetTask(req, r); });
  }

  FakeClock clock_;
  store::MemoryStore mem_;
  testing::FaultyStore faulty_;
  std::atomic<int> fatal_{0};
};

TEST_F(EngineTest, SubmitIsAnsweredOnlyAfterItsCommit) {
  auto e = NewEngine();
  faulty_.Hold();
  std::promise<absl::StatusOr<v1::SubmitTasksResponse>> reply;
  // On a thread of its own: with nothing else being written, the call
  // commits on its caller's thread, which waits for the store.
  std::thread caller(
      [&] { e->SubmitTasks(OneTask("t"), [&](auto r) { reply.set_value(std::move(r)); }); });
  faulty_.WaitUntilHolding();
  auto fut = reply.get_future();
  EXPECT_EQ(fut.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  faulty_.Release();
  caller.join();
  auto r = fut.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tasks(0).state(), v1::TASK_STATE_PENDING);
  EXPECT_EQ(mem_.LoadTasks()->size(), 1u);
}

TEST_F(EngineTest, AssignLeavesOnlyAfterTheDispatchIsDurable) {
  auto e = NewEngine();
  auto ch = std::make_shared<FakeChannel>();
  const uint64_t conn = e->AttachAgent(ch);
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  ASSERT_TRUE(e->AgentHello(conn, h).ok());
  e->Sync();
  ASSERT_EQ(ch->sent().size(), 1u);
  EXPECT_TRUE(ch->sent()[0].has_welcome());

  faulty_.Hold();
  std::promise<void> replied;
  std::thread caller(  // as above: the caller's thread may commit
      [&] { e->SubmitTasks(OneTask("t"), [&](auto) { replied.set_value(); }); });
  faulty_.WaitUntilHolding();
  EXPECT_EQ(ch->assigns(), 0) << "the agent must not see a dispatch that is not durable";
  faulty_.Release();
  caller.join();
  replied.get_future().wait();
  EXPECT_EQ(ch->assigns(), 1);
  auto stored = mem_.LoadTasks();
  EXPECT_EQ((*stored)[0].row.state, v1::TASK_STATE_DISPATCHED);
}

TEST_F(EngineTest, AFailedCommitAnswersAnErrorAndIsFatal) {
  auto e = NewEngine();
  faulty_.FailNext(1);
  auto r = Submit(*e, "t");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fatal_.load(), 1);
  EXPECT_TRUE(mem_.LoadTasks()->empty());
  // Memory may be ahead of disk now: nothing more is acknowledged.
  EXPECT_FALSE(Submit(*e, "u").ok());
  EXPECT_FALSE(Get(*e, "t").ok());
}

TEST_F(EngineTest, RestartRecoversTasksFromTheStore) {
  {
    auto e = NewEngine();
    ASSERT_TRUE(Submit(*e, "a").ok());
    ASSERT_TRUE(Submit(*e, "b").ok());
    e->Stop();
  }
  auto e = NewEngine();
  auto a = Get(*e, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->state(), v1::TASK_STATE_PENDING);
  auto dup = Submit(*e, "a");
  ASSERT_TRUE(dup.ok()) << "identical resubmit after restart is still idempotent";
  EXPECT_EQ(mem_.LoadTasks()->size(), 2u);
}

TEST_F(EngineTest, ListValidatesItsArguments) {
  auto e = NewEngine();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Submit(*e, "t" + std::to_string(i)).ok());
  auto list = [&](v1::ListTasksRequest req) {
    return Await<v1::ListTasksResponse>(
        [&](Engine::Reply<v1::ListTasksResponse> r) { e->ListTasks(req, r); });
  };
  v1::ListTasksRequest req;
  req.set_page_size(2);
  auto page = list(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->tasks_size(), 2);
  req.set_page_token(page->next_page_token());
  page = list(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->tasks_size(), 1);
  EXPECT_TRUE(page->next_page_token().empty());

  v1::ListTasksRequest bad;
  bad.set_page_token("garbage");
  EXPECT_THAT(std::string(list(bad).status().message()), HasSubstr("page_token"));
  bad.Clear();
  bad.add_states(static_cast<v1::TaskState>(77));
  EXPECT_THAT(std::string(list(bad).status().message()), HasSubstr("states"));
  bad.Clear();
  bad.set_page_size(-1);
  EXPECT_EQ(list(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, ListPagesStopBeforeTheirByteLimitAndMissNothing) {
  EngineOptions opts;
  opts.max_page_bytes = 100 << 10;
  auto e = NewEngine(opts);
  // 40 KiB each: two fit in a page, three do not; "big" alone passes it.
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) {
    v1::SubmitTasksRequest req = OneTask(i == 3 ? "big" : "t" + std::to_string(i));
    req.mutable_tasks(0)->set_payload(std::string(i == 3 ? 150 << 10 : 40 << 10, 'p'));
    ids.push_back(req.tasks(0).id());
    ASSERT_TRUE(Await<v1::SubmitTasksResponse>([&](Engine::Reply<v1::SubmitTasksResponse> r) {
                  e->SubmitTasks(req, r);
                }).ok());
  }
  auto list = [&](v1::ListTasksRequest req) {
    return Await<v1::ListTasksResponse>(
        [&](Engine::Reply<v1::ListTasksResponse> r) { e->ListTasks(req, r); });
  };
  v1::ListTasksRequest req;
  req.set_page_size(1000);
  std::vector<std::string> seen;
  std::vector<int> sizes;
  for (int pages = 0; pages < 20; ++pages) {
    auto page = list(req);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_TRUE(page->tasks_size() == 1 || page->ByteSizeLong() <= opts.max_page_bytes)
        << page->ByteSizeLong();
    sizes.push_back(page->tasks_size());
    for (const v1::Task& t : page->tasks()) seen.push_back(t.spec().id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen, ids);  // each once, in submit order
  EXPECT_EQ(sizes, (std::vector<int>{2, 1, 1, 2, 1}));
}

TEST_F(EngineTest, TickDrivesDeadlines) {
  auto e = NewEngine();
  auto ch = std::make_shared<FakeChannel>();
  const uint64_t conn = e->AttachAgent(ch);
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(1);
  ASSERT_TRUE(e->AgentHello(conn, h).ok());
  v1::SubmitTasksRequest req = OneTask("t");
  req.mutable_tasks(0)->mutable_ack_timeout()->set_seconds(2);
  req.mutable_tasks(0)->set_max_attempts(1);
  ASSERT_TRUE((Await<v1::SubmitTasksResponse>([&](Engine::Reply<v1::SubmitTasksResponse> r) {
                e->SubmitTasks(req, r);
              })).ok());
  clock_.Advance(absl::Seconds(3));
  e->TickNow();
  auto t = Get(*e, "t");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->state(), v1::TASK_STATE_FAILED);
  EXPECT_THAT(t->result().error(), HasSubstr("did not accept"));
}

}  // namespace
}  // namespace taskgrid::engine
