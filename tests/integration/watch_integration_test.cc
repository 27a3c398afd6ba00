// WatchTasks and WaitTask over real gRPC on 127.0.0.1.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/numbers.h"
#include "common/grpc_status.h"
#include "tests/integration/cluster.h"

namespace taskgrid::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Watcher {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReader<v1::TaskEvent>> reader;
};

Watcher StartWatch(InProcessCluster& c, v1::WatchTasksRequest req,
                   absl::Duration deadline = absl::Seconds(30)) {
  Watcher w;
  w.ctx = InProcessCluster::Ctx(deadline);
  w.reader = c.tasks().WatchTasks(w.ctx.get(), req);
  // The server sends its metadata once the watch is registered: from then
  // on every commit reaches it.
  w.reader->WaitForInitialMetadata();
  return w;
}

// Reads until `n` events arrived (or the stream ends).
std::vector<v1::TaskEvent> Read(Watcher& w, size_t n) {
  std::vector<v1::TaskEvent> out;
  v1::TaskEvent e;
  while (out.size() < n && w.reader->Read(&e)) out.push_back(e);
  return out;
}

std::vector<v1::TaskState> States(const std::vector<v1::TaskEvent>& events) {
  std::vector<v1::TaskState> out;
  for (const v1::TaskEvent& e : events) out.push_back(e.to_state());
  return out;
}

TEST(Watch, SeesEveryTransitionInOrderWithNoGaps) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  v1::WatchTasksRequest req;
  Watcher w = StartWatch(c, req);
  ASSERT_TRUE(c.Submit({BuiltinSpec("t", "noop")}).ok());
  std::vector<v1::TaskEvent> events = Read(w, 4);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_THAT(States(events), ElementsAre(v1::TASK_STATE_PENDING, v1::TASK_STATE_DISPATCHED,
                                          v1::TASK_STATE_RUNNING, v1::TASK_STATE_SUCCEEDED));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].task_id(), "t");
    if (i == 0) continue;
    EXPECT_EQ(events[i].revision(), events[i - 1].revision() + 1) << i;
    EXPECT_EQ(events[i].from_state(), events[i - 1].to_state()) << i;
  }
  // Every event of the attempt names its agent, the one that ends it too.
  EXPECT_EQ(events[0].agent_id(), "");
  EXPECT_EQ(events[1].agent_id(), "a1");
  EXPECT_EQ(events[2].agent_id(), "a1");
  EXPECT_EQ(events[3].agent_id(), "a1");
  EXPECT_EQ(events[2].attempt(), 1);
  w.ctx->TryCancel();
}

TEST(Watch, ResumeReplaysExactlyWhatFollowedThenGoesLive) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  ASSERT_TRUE(c.Submit({BuiltinSpec("first", "noop")}).ok());
  c.WaitFor("first", v1::TASK_STATE_SUCCEEDED);
  // Everything so far, after revision 1.
  v1::WatchTasksRequest from_start;
  from_start.set_after_revision(1);
  Watcher w = StartWatch(c, from_start);
  std::vector<v1::TaskEvent> replay = Read(w, 3);
  ASSERT_EQ(replay.size(), 3u);
  EXPECT_EQ(replay[0].revision(), 2);
  EXPECT_THAT(States(replay), ElementsAre(v1::TASK_STATE_DISPATCHED, v1::TASK_STATE_RUNNING,
                                          v1::TASK_STATE_SUCCEEDED));
  // Then live, with no gap between history and live.
  ASSERT_TRUE(c.Submit({BuiltinSpec("second", "noop")}).ok());
  std::vector<v1::TaskEvent> live = Read(w, 4);
  ASSERT_EQ(live.size(), 4u);
  EXPECT_EQ(live[0].revision(), 5);
  EXPECT_EQ(live[0].task_id(), "second");
  w.ctx->TryCancel();
}

TEST(Watch, FiltersByTaskQueueAndState) {
  InProcessCluster c;
  c.AddAgent("a1", 2);
  v1::WatchTasksRequest req;
  req.add_task_ids("b");
  req.add_states(v1::TASK_STATE_SUCCEEDED);
  Watcher only_b_done = StartWatch(c, req);
  v1::WatchTasksRequest qreq;
  qreq.set_queue("other");
  Watcher other_queue = StartWatch(c, qreq);
  v1::TaskSpec b = BuiltinSpec("b", "noop");
  b.set_queue("other");
  ASSERT_TRUE(c.Submit({BuiltinSpec("a", "noop"), b}).ok());
  std::vector<v1::TaskEvent> events = Read(only_b_done, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].task_id(), "b");
  EXPECT_EQ(events[0].to_state(), v1::TASK_STATE_SUCCEEDED);
  for (const v1::TaskEvent& e : Read(other_queue, 4)) EXPECT_EQ(e.task_id(), "b");
  only_b_done.ctx->TryCancel();
  other_queue.ctx->TryCancel();
}

TEST(Watch, ASlowWatcherIsEndedWhileTheSchedulerKeepsDispatching) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.watch_queue = 50;
  InProcessCluster c(o);
  c.AddAgent("a1", 8);
  // A client that does not read, with a small receive window (no BDP
  // probing), so the server's writes really back up.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 * 1024);
  auto slow_stub = v1::TaskService::NewStub(
      grpc::CreateCustomChannel(c.addr(), grpc::InsecureChannelCredentials(), args));
  Watcher slow;
  slow.ctx = InProcessCluster::Ctx(absl::Seconds(60));
  slow.reader = slow_stub->WatchTasks(slow.ctx.get(), v1::WatchTasksRequest());
  slow.reader->WaitForInitialMetadata();
  for (int b = 0; b < 100; ++b) {  // small commits: the watcher could keep up if it read
    std::vector<v1::TaskSpec> specs;
    for (int i = 0; i < 10; ++i)
      specs.push_back(BuiltinSpec("s" + std::to_string(b * 10 + i), "noop"));
    ASSERT_TRUE(c.Submit(specs).ok());
  }
  // The scheduler is not held up by the watcher that does not read.
  for (int i = 0; i < 1000; i += 111) c.WaitFor("s" + std::to_string(i), v1::TASK_STATE_SUCCEEDED);
  c.WaitFor("s999", v1::TASK_STATE_SUCCEEDED);
  v1::TaskEvent e;
  int64_t last = 0;
  int read = 0;
  while (slow.reader->Read(&e)) {
    last = e.revision();
    ++read;
  }
  grpc::Status s = slow.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("resume with after_revision="));
  EXPECT_GT(read, 0);
  EXPECT_LT(read, 4000) << "it did not get every event";
  auto md = slow.ctx->GetServerTrailingMetadata().find("taskgrid-resume-after");
  ASSERT_NE(md, slow.ctx->GetServerTrailingMetadata().end());
  const int64_t resume = std::stoll(std::string(md->second.data(), md->second.size()));
  EXPECT_LE(resume, last);
  // Resuming from there continues without a gap.
  v1::WatchTasksRequest again;
  again.set_after_revision(resume);
  Watcher w = StartWatch(c, again);
  std::vector<v1::TaskEvent> next = Read(w, 1);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].revision(), resume + 1);
  w.ctx->TryCancel();
}

TEST(Watch, AfterRevisionZeroReplaysTheWholeHistory) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("x", "noop"), BuiltinSpec("y", "noop")}).ok());
  v1::WatchTasksRequest req;
  req.set_after_revision(0);
  Watcher w = StartWatch(c, req);
  std::vector<v1::TaskEvent> events = Read(w, 2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].revision(), 1);
  EXPECT_EQ(events[0].task_id(), "x");
  EXPECT_EQ(events[1].task_id(), "y");
  w.ctx->TryCancel();
}

TEST(Watch, RevisionsOutsideTheHistoryAreOutOfRange) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.scheduler.event_retention = absl::Milliseconds(100);
  InProcessCluster c(o);
  ASSERT_TRUE(c.Submit({BuiltinSpec("old", "noop")}).ok());
  v1::WatchTasksRequest ahead;
  ahead.set_after_revision(1'000'000);
  Watcher w = StartWatch(c, ahead);
  v1::TaskEvent e;
  EXPECT_FALSE(w.reader->Read(&e));
  EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // Where to resume comes as metadata, not only in the message: the newest.
  auto resume_after = [](const grpc::ClientContext& ctx) -> int64_t {
    auto md = ctx.GetServerTrailingMetadata().find("taskgrid-resume-after");
    int64_t revision = -1;
    if (md == ctx.GetServerTrailingMetadata().end() ||
        !absl::SimpleAtoi(absl::string_view(md->second.data(), md->second.size()), &revision)) {
      return -1;
    }
    return revision;
  };
  const int64_t newest = resume_after(*w.ctx);
  EXPECT_GE(newest, 1);
  EXPECT_LT(newest, 1'000'000);
  // Once the history of "old" is pruned, resuming before it is refused,
  // naming the revision before the oldest kept.
  int64_t skip_to = -1;
  ASSERT_TRUE(InProcessCluster::Eventually(
      [&] {
        c.Submit({BuiltinSpec("new" + std::to_string(absl::ToUnixMicros(absl::Now())), "noop")});
        v1::WatchTasksRequest stale;
        stale.set_after_revision(1);
        Watcher w2 = StartWatch(c, stale, absl::Seconds(2));
        const bool got = w2.reader->Read(&e);
        if (got) w2.ctx->TryCancel();
        grpc::Status s = w2.reader->Finish();
        if (got || s.error_code() != grpc::StatusCode::OUT_OF_RANGE) return false;
        skip_to = resume_after(*w2.ctx);
        return true;
      },
      absl::Seconds(10)));
  EXPECT_GE(skip_to, 1);  // revision 1 is gone: the oldest kept is 2 or later
}

TEST(Wait, ReturnsWhenTheTaskFinishesAndWhenTheWaitEnds) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("w", "sleep", {"0.5"})}).ok());
  v1::WaitTaskRequest req;
  req.set_id("w");
  req.mutable_timeout()->set_nanos(300'000'000);
  v1::WaitTaskResponse resp;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(c.tasks().WaitTask(InProcessCluster::Ctx().get(), req, &resp).ok());
  EXPECT_FALSE(resp.done()) << "no agent yet: the wait ends after its timeout";
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_EQ(resp.task().state(), v1::TASK_STATE_PENDING);

  c.AddAgent("a1", 1);
  req.mutable_timeout()->set_seconds(20);
  ASSERT_TRUE(c.tasks().WaitTask(InProcessCluster::Ctx().get(), req, &resp).ok());
  EXPECT_TRUE(resp.done());
  EXPECT_EQ(resp.task().state(), v1::TASK_STATE_SUCCEEDED);

  // Already finished: at once.
  ASSERT_TRUE(c.tasks().WaitTask(InProcessCluster::Ctx().get(), req, &resp).ok());
  EXPECT_TRUE(resp.done());

  // The call's own deadline bounds the wait: OK with done=false, not an error.
  ASSERT_TRUE(c.Submit({BuiltinSpec("long", "sleep", {"30"})}).ok());
  req.set_id("long");
  req.clear_timeout();
  grpc::Status s = c.tasks().WaitTask(InProcessCluster::Ctx(absl::Seconds(1)).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.done());

  req.set_id("missing");
  s = c.tasks().WaitTask(InProcessCluster::Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(Wait, ACancelledWaitLeavesNoWaiterBehind) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("never-runs", "noop")}).ok());  // no agent
  v1::WaitTaskRequest req;
  req.set_id("never-runs");
  req.mutable_timeout()->set_seconds(3600);
  auto ctx = InProcessCluster::Ctx(absl::Seconds(60));
  grpc::Status status;
  std::thread call([&] {
    v1::WaitTaskResponse resp;
    status = c.tasks().WaitTask(ctx.get(), req, &resp);
  });
  ASSERT_TRUE(
      InProcessCluster::Eventually([&] { return c.engine().waiting() == 1; }, absl::Seconds(30)));
  ctx->TryCancel();
  call.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  // The server notices the client went away and drops the waiter, long
  // before its hour is up.
  EXPECT_TRUE(
      InProcessCluster::Eventually([&] { return c.engine().waiting() == 0; }, absl::Seconds(30)));
}

TEST(Wait, TooManyWaitsAreRefusedNamingTheFlag) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.max_waits = 1;
  InProcessCluster c(o);
  ASSERT_TRUE(c.Submit({BuiltinSpec("pending", "noop")}).ok());  // no agent
  v1::WaitTaskRequest req;
  req.set_id("pending");
  req.mutable_timeout()->set_seconds(3600);
  auto ctx = InProcessCluster::Ctx(absl::Seconds(60));
  std::thread first([&] {
    v1::WaitTaskResponse resp;
    c.tasks().WaitTask(ctx.get(), req, &resp);
  });
  ASSERT_TRUE(
      InProcessCluster::Eventually([&] { return c.engine().waiting() == 1; }, absl::Seconds(30)));
  v1::WaitTaskResponse resp;
  grpc::Status s = c.tasks().WaitTask(InProcessCluster::Ctx().get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max_waits=1"));
  ctx->TryCancel();
  first.join();
}

TEST(Watch, EveryStreamSaysWhereItStarts) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("x", "noop"), BuiltinSpec("y", "noop")}).ok());
  auto starts_after = [](Watcher& w) {
    const auto& md = w.ctx->GetServerInitialMetadata();
    auto it = md.find(kWatchStartsAfterKey);
    EXPECT_NE(it, md.end());
    return it == md.end() ? int64_t{-1}
                          : std::stoll(std::string(it->second.data(), it->second.size()));
  };
  Watcher now = StartWatch(c, {});
  EXPECT_EQ(starts_after(now), 2) << "from now: after the newest revision";
  v1::WatchTasksRequest from_one;
  from_one.set_after_revision(1);
  Watcher resumed = StartWatch(c, from_one);
  EXPECT_EQ(starts_after(resumed), 1);
  now.ctx->TryCancel();
  resumed.ctx->TryCancel();
}

TEST(Watch, TooManyWatchesAreRefusedNamingTheFlag) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.max_watches = 1;
  InProcessCluster c(o);
  Watcher first = StartWatch(c, {});
  Watcher second = StartWatch(c, {});
  v1::TaskEvent e;
  EXPECT_FALSE(second.reader->Read(&e));
  grpc::Status s = second.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max_watches=1"));
  first.ctx->TryCancel();
  first.reader->Finish();
}

}  // namespace
}  // namespace taskgrid::testing
