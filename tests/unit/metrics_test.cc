// Metrics through the Engine: submit, dispatch and complete tasks with a
// fake agent channel and a fake clock, then read Engine::Metrics() and the
// /metrics page written from it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/engine/engine.h"
#include "scheduler/http/metrics_page.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/fake_agent_channel.h"

namespace taskgrid::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions opts;
    opts.tick_interval = absl::Hours(1);  // time moves only with the fake clock
    engine_ = std::make_unique<Engine>(&store_, &clock_, opts);
    ASSERT_TRUE(engine_->Start().ok());
    conn_ = engine_->AttachAgent(channel_);
    v1::Hello h;
    h.set_agent_id("a1");
    h.set_slots(2);
    ASSERT_TRUE(engine_->AgentHello(conn_, h).ok());
    engine_->Sync();
  }

  void Submit(const std::string& queue, const std::vector<std::string>& ids) {
    v1::SubmitTasksRequest req;
    for (const std::string& id : ids) {
      v1::TaskSpec* s = req.add_tasks();
      s->set_id(id);
      s->set_queue(queue);
      s->set_max_attempts(1);
      s->add_steps()->mutable_builtin()->set_name("noop");
    }
    std::promise<absl::Status> done;
    engine_->SubmitTasks(
        req, [&](absl::StatusOr<v1::SubmitTasksResponse> r) { done.set_value(r.status()); });
    ASSERT_TRUE(done.get_future().get().ok());
  }

  void Send(const v1::AgentMessage& m) {
    engine_->AgentMessage(conn_, m);
    engine_->Sync();
  }
  void Accept(const std::string& id, int32_t attempt) {
    v1::AgentMessage m;
    m.mutable_accept()->set_task_id(id);
    m.mutable_accept()->set_attempt(attempt);
    Send(m);
  }
  void Finish(const std::string& id, int32_t attempt, v1::Outcome outcome) {
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(outcome);
    m.mutable_result()->mutable_result()->set_exit_code(outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
    Send(m);
  }

  static int64_t Tasks(const core::SchedulerMetrics& m, const std::string& queue,
                       const std::string& state) {
    for (const v1::QueueStats& q : m.queues) {
      if (q.queue() != queue) continue;
      auto it = q.counts().find(state);
      return it == q.counts().end() ? 0 : it->second;
    }
    return -1;
  }
  static double OldestAge(const core::SchedulerMetrics& m, const std::string& queue) {
    for (size_t i = 0; i < m.queues.size(); ++i) {
      if (m.queues[i].queue() == queue) return m.oldest_pending_seconds[i];
    }
    return -1;
  }

  FakeClock clock_;
  store::MemoryStore store_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<testing::FakeAgentChannel> channel_ =
      std::make_shared<testing::FakeAgentChannel>();
  uint64_t conn_ = 0;
};

TEST(TaskCountersTest, QueuesPastTheCapCountTogether) {
  core::TaskCounters c;
  core::TaskRecord t;
  constexpr size_t kMax = core::TaskCounters::kMaxQueues;
  for (size_t i = 0; i < kMax + 5; ++i) {
    t.spec.set_queue("q" + std::to_string(i));
    c.CountTransition(t, v1::TASK_STATE_UNSPECIFIED, v1::TASK_STATE_PENDING, absl::UnixEpoch());
  }
  // A queue counted before the cap keeps its own series; a new one joins
  // the others.
  t.spec.set_queue("q0");
  c.CountTransition(t, v1::TASK_STATE_PENDING, v1::TASK_STATE_CANCELLED, absl::UnixEpoch());
  t.spec.set_queue("late");
  c.CountTransition(t, v1::TASK_STATE_PENDING, v1::TASK_STATE_CANCELLED, absl::UnixEpoch());
  EXPECT_EQ(c.by_queue.size(), kMax);
  EXPECT_EQ(c.submitted, static_cast<int64_t>(kMax + 5));
  EXPECT_EQ(c.other.submitted, 5);
  EXPECT_EQ(c.by_queue.at("q0").ended[v1::TASK_STATE_CANCELLED], 1);
  EXPECT_EQ(c.other.ended[v1::TASK_STATE_CANCELLED], 1);
  EXPECT_FALSE(c.by_queue.contains("late"));

  EngineMetrics m;
  m.scheduler.counters = c;
  const std::string page = http::MetricsPage(m, http::ProcessInfo());
  EXPECT_THAT(page, HasSubstr("taskgrid_tasks_submitted_total{queue=\"q0\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_tasks_submitted_total{queue=\"(other)\"} 5\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_tasks_completed_total{queue=\"(other)\",outcome=\"CANCELLED\"} 1\n"));
  EXPECT_THAT(page, Not(HasSubstr("queue=\"late\"")));
}

// The share families are always on the page (a dashboard finds them);
// their samples only while queues share by weight.
TEST(QueueHistoryTest, MinuteByMinuteForTheLastHourOnly) {
  core::TaskCounters c;
  core::QueueHistory h;
  core::TaskRecord t;
  t.spec.set_queue("q");
  auto count = [&](v1::TaskState from, v1::TaskState to, int n) {
    for (int i = 0; i < n; ++i) c.CountTransition(t, from, to, absl::UnixEpoch());
  };
  const absl::Time start = absl::FromUnixSeconds(1'700'000'000);  // 22:13:20
  const absl::Time minute0 = absl::FromUnixSeconds(1'700'000'000 / 60 * 60);
  h.Sample(c, start);
  count(v1::TASK_STATE_UNSPECIFIED, v1::TASK_STATE_PENDING, 3);
  count(v1::TASK_STATE_PENDING, v1::TASK_STATE_DISPATCHED, 2);
  h.Sample(c, start + absl::Seconds(30));  // the same minute: no snapshot
  count(v1::TASK_STATE_RUNNING, v1::TASK_STATE_SUCCEEDED, 1);
  h.Sample(c, minute0 + absl::Minutes(1));
  count(v1::TASK_STATE_RUNNING, v1::TASK_STATE_FAILED, 1);
  count(v1::TASK_STATE_PENDING, v1::TASK_STATE_CANCELLED, 1);

  google::protobuf::RepeatedPtrField<v1::QueueMinute> out;
  h.Describe("q", c, minute0 + absl::Minutes(1) + absl::Seconds(5), &out);
  ASSERT_EQ(out.size(), 2);
  EXPECT_EQ(out[0].start_time().seconds(), absl::ToUnixSeconds(minute0));
  EXPECT_EQ(out[0].submitted(), 3);
  EXPECT_EQ(out[0].dispatched(), 2);
  EXPECT_EQ(out[0].succeeded(), 1);
  EXPECT_EQ(out[0].failed(), 0);
  // The current minute, counted up to now.
  EXPECT_EQ(out[1].start_time().seconds(), absl::ToUnixSeconds(minute0 + absl::Minutes(1)));
  EXPECT_EQ(out[1].submitted(), 0);
  EXPECT_EQ(out[1].failed(), 1);
  EXPECT_EQ(out[1].cancelled(), 1);
  // A queue without counters has no history.
  out.Clear();
  h.Describe("other", c, minute0 + absl::Minutes(1), &out);
  EXPECT_EQ(out.size(), 0);

  // Two hours on, a sample each minute: an hour of minutes is kept and
  // shown, the oldest dropped.
  for (int m = 2; m <= 120; ++m) {
    count(v1::TASK_STATE_UNSPECIFIED, v1::TASK_STATE_PENDING, m);
    h.Sample(c, minute0 + absl::Minutes(m) + absl::Seconds(1));
  }
  out.Clear();
  h.Describe("q", c, minute0 + absl::Minutes(120) + absl::Seconds(2), &out);
  ASSERT_EQ(out.size(), core::QueueHistory::kMinutes);
  EXPECT_EQ(out[0].start_time().seconds(), absl::ToUnixSeconds(minute0 + absl::Minutes(61)));
  EXPECT_EQ(out[0].submitted(), 62);  // counted before the sample of minute 62
  EXPECT_EQ(out[58].submitted(), 120);
  EXPECT_EQ(out[59].submitted(), 0);  // minute 120 so far
}

TEST_F(MetricsTest, QueueStatsCarryTheHistoryWhenAsked) {
  Submit("emails", {"h1", "h2"});
  engine_->TickNow();
  auto stats = [&](bool history) {
    v1::GetQueueStatsRequest req;
    req.set_queue("emails");
    req.set_with_history(history);
    std::promise<absl::StatusOr<v1::GetQueueStatsResponse>> done;
    engine_->GetQueueStats(
        req, [&](absl::StatusOr<v1::GetQueueStatsResponse> r) { done.set_value(std::move(r)); });
    return done.get_future().get();
  };
  auto without = stats(false);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->queues(0).history_size(), 0);
  auto with = stats(true);
  ASSERT_TRUE(with.ok());
  ASSERT_EQ(with->queues(0).history_size(), 1);  // the current minute
  Accept("h1", 1);
  Finish("h1", 1, v1::OUTCOME_FAILED);
  clock_.Advance(absl::Minutes(1));
  engine_->TickNow();
  Submit("emails", {"h3"});
  with = stats(true);
  ASSERT_TRUE(with.ok());
  ASSERT_EQ(with->queues(0).history_size(), 2);
  EXPECT_EQ(with->queues(0).history(0).failed(), 1);  // h1
  EXPECT_EQ(with->queues(0).history(1).submitted(), 1);
  // The minutes add up to the counters (h2, never accepted, may have run
  // out of time in the second minute).
  const core::TaskCounters c = engine_->Metrics().scheduler.counters;
  EXPECT_EQ(with->queues(0).history(0).failed() + with->queues(0).history(1).failed(),
            c.by_queue.at("emails").ended[v1::TASK_STATE_FAILED]);
}

TEST(MetricsPageTest, QueueSharesShowWhileQueuesShareByWeight) {
  EngineMetrics m;
  for (const char* name : {"a", "b"}) {
    m.scheduler.queues.emplace_back().set_queue(name);
    m.scheduler.oldest_pending_seconds.push_back(0);
  }
  std::string page = http::MetricsPage(m, http::ProcessInfo());
  EXPECT_THAT(page,
              HasSubstr("# TYPE taskgrid_queue_share gauge\n# HELP taskgrid_queue_fair_share"));
  EXPECT_THAT(page, Not(HasSubstr("taskgrid_queue_share{")));
  m.scheduler.queues[0].set_share(0.5);
  m.scheduler.queues[0].set_fair_share(0.25);
  m.scheduler.queues[1].set_fair_share(0.75);
  page = http::MetricsPage(m, http::ProcessInfo());
  EXPECT_THAT(page, HasSubstr("taskgrid_queue_share{queue=\"a\"} 0.5\n"
                              "taskgrid_queue_share{queue=\"b\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_queue_fair_share{queue=\"a\"} 0.25\n"
                              "taskgrid_queue_fair_share{queue=\"b\"} 0.75\n"));
}

TEST_F(MetricsTest, CountersAndGaugesFollowTasksThroughTheEngine) {
  Submit("emails", {"e1", "e2", "e3"});
  Submit("reports", {"r1"});
  EngineMetrics m = engine_->Metrics();
  // Two slots: e1 and e2 went out, e3 and r1 wait.
  EXPECT_EQ(m.scheduler.counters.submitted, 4);
  EXPECT_EQ(m.scheduler.counters.dispatched, 2);
  EXPECT_EQ(Tasks(m.scheduler, "emails", "DISPATCHED"), 2);
  EXPECT_EQ(Tasks(m.scheduler, "emails", "PENDING"), 1);
  EXPECT_EQ(Tasks(m.scheduler, "reports", "PENDING"), 1);
  EXPECT_EQ(m.scheduler.cluster.agents_active(), 1);
  EXPECT_EQ(m.scheduler.cluster.slots_total(), 2);
  EXPECT_EQ(m.scheduler.cluster.slots_used(), 2);
  EXPECT_EQ(OldestAge(m.scheduler, "emails"), 0);
  EXPECT_GE(m.writer.commit_rows.count(), 2);                 // the Hello, the submits
  EXPECT_GE(m.writer.commits, m.writer.commit_rows.count());  // barriers too

  clock_.Advance(absl::Seconds(2));
  m = engine_->Metrics();
  EXPECT_DOUBLE_EQ(OldestAge(m.scheduler, "emails"), 2);
  EXPECT_DOUBLE_EQ(OldestAge(m.scheduler, "reports"), 2);

  // e1 starts after 2 s in the queue, runs 3 s and succeeds; e2 fails.
  Accept("e1", 1);
  Accept("e2", 1);
  clock_.Advance(absl::Seconds(3));
  Finish("e1", 1, v1::OUTCOME_SUCCEEDED);
  Finish("e2", 1, v1::OUTCOME_FAILED);
  // A result for an attempt that is over is refused by fencing.
  Finish("e1", 7, v1::OUTCOME_SUCCEEDED);

  m = engine_->Metrics();
  const core::TaskCounters& c = m.scheduler.counters;
  EXPECT_EQ(c.ended[v1::TASK_STATE_SUCCEEDED], 1);
  EXPECT_EQ(c.ended[v1::TASK_STATE_FAILED], 1);
  EXPECT_EQ(c.ended[v1::TASK_STATE_CANCELLED], 0);
  EXPECT_EQ(c.dispatched, 4);  // the freed slots took e3 and r1
  EXPECT_EQ(c.by_queue.at("emails").dispatched, 3);
  EXPECT_EQ(c.by_queue.at("emails").ended[v1::TASK_STATE_FAILED], 1);
  EXPECT_EQ(c.by_queue.at("reports").dispatched, 1);
  EXPECT_EQ(c.by_queue.at("reports").ended[v1::TASK_STATE_SUCCEEDED], 0);
  EXPECT_EQ(Tasks(m.scheduler, "emails", "PENDING"), 0);
  EXPECT_EQ(OldestAge(m.scheduler, "emails"), 0);
  EXPECT_EQ(Tasks(m.scheduler, "emails", "SUCCEEDED"), 1);
  EXPECT_EQ(c.start_latency.count(), 2);
  EXPECT_DOUBLE_EQ(c.start_latency.sum(), 4);    // e1 and e2 waited 2 s each
  EXPECT_DOUBLE_EQ(c.submit_to_start.sum(), 4);  // ready when submitted
  EXPECT_EQ(c.run_time.count(), 2);
  EXPECT_DOUBLE_EQ(c.run_time.sum(), 6);  // 3 s each
  EXPECT_EQ(m.scheduler.cluster.stale_messages(), 1);

  // The page shows the same numbers.
  http::ProcessInfo process;
  process.start_time = absl::FromUnixSeconds(1'700'000'000);
  process.refused["grpc"] = {{"UNAUTHENTICATED", 7}, {"ALREADY_EXISTS", 1}};
  process.grpc_requests["/taskgrid.v1.TaskService/GetTask"] = {{"OK", 5}, {"NOT_FOUND", 2}};
  // cpu seconds, resident and virtual bytes, open and most fds.
  process.stats = prometheus::ProcessStats{1.5, 4096, 8192, 12, 1024};
  const std::string page = http::MetricsPage(m, process);
  EXPECT_THAT(page, HasSubstr("# TYPE taskgrid_refused_requests_total counter\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_refused_requests_total{port=\"grpc\",code=\"UNAUTHENTICATED\"} 7\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_refused_requests_total{port=\"grpc\",code=\"ALREADY_EXISTS\"} 1\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_refused_requests_total{port=\"http\",code=\"PERMISSION_DENIED\"} 0\n"));
  // The task counters by queue.
  EXPECT_THAT(page, HasSubstr("# TYPE taskgrid_tasks_submitted_total counter\n"
                              "taskgrid_tasks_submitted_total{queue=\"emails\"} 3\n"
                              "taskgrid_tasks_submitted_total{queue=\"reports\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_tasks_dispatched_total{queue=\"emails\"} 3\n"
                              "taskgrid_tasks_dispatched_total{queue=\"reports\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("# TYPE taskgrid_schedule_fires_skipped_total counter\n"
                              "taskgrid_schedule_fires_skipped_total 0\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_tasks_completed_total{queue=\"emails\",outcome=\"SUCCEEDED\"} 1\n"));
  EXPECT_THAT(page,
              HasSubstr("taskgrid_tasks_completed_total{queue=\"emails\",outcome=\"FAILED\"} 1\n"));
  EXPECT_THAT(
      page,
      HasSubstr("taskgrid_tasks_completed_total{queue=\"reports\",outcome=\"SUCCEEDED\"} 0\n"));
  EXPECT_THAT(page, Not(HasSubstr("(other)")));
  EXPECT_THAT(page, HasSubstr("taskgrid_tasks{queue=\"emails\",state=\"DISPATCHED\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_tasks{queue=\"reports\",state=\"PENDING\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_queue_backlog_tasks{queue=\"emails\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_stale_messages_total 1\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_agents{state=\"ACTIVE\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("\ntaskgrid_agent_slots 2\n"));
  EXPECT_THAT(page, HasSubstr("\ntaskgrid_agent_slots_free 0\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_task_start_latency_seconds_bucket{le=\"+Inf\"} 2\n"
                              "taskgrid_task_start_latency_seconds_sum 4\n"
                              "taskgrid_task_start_latency_seconds_count 2\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_attempt_run_seconds_sum 6\n"));
  EXPECT_THAT(page, HasSubstr("\nprocess_start_time_seconds 1700000000\n"));
  EXPECT_THAT(page, HasSubstr("\nprocess_cpu_seconds_total 1.5\n"));
  EXPECT_THAT(page, HasSubstr("\nprocess_resident_memory_bytes 4096\n"));
  EXPECT_THAT(page, HasSubstr("\nprocess_open_fds 12\n"));
  EXPECT_THAT(page, HasSubstr("\nprocess_max_fds 1024\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_grpc_requests_total{service=\"taskgrid.v1.TaskService\","
                              "method=\"GetTask\",code=\"NOT_FOUND\"} 2\n"
                              "taskgrid_grpc_requests_total{service=\"taskgrid.v1.TaskService\","
                              "method=\"GetTask\",code=\"OK\"} 5\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_task_submit_to_start_seconds_count 2\n"));
  EXPECT_THAT(page, HasSubstr("\ntaskgrid_schedule_fires_total 0\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_waiters{call=\"WaitTask\"} 0\n"));
  EXPECT_THAT(page, Not(HasSubstr("\n\n")));
}

TEST_F(MetricsTest, ResourcesOfferedAndHeldByAgentsAndQueues) {
  const uint64_t big = engine_->AttachAgent(std::make_shared<testing::FakeAgentChannel>());
  v1::Hello h;
  h.set_agent_id("big");
  h.set_slots(4);
  (*h.mutable_resources())["cpu"] = "4";
  (*h.mutable_resources())["memory"] = "8GiB";
  ASSERT_TRUE(engine_->AgentHello(big, h).ok());
  v1::SetQueueLimitsRequest limits;
  limits.set_queue("train");
  (*limits.mutable_quota())["cpu"] = "2";
  std::promise<absl::Status> set;
  engine_->SetQueueLimits(limits,
                          [&](absl::StatusOr<v1::QueueStats> r) { set.set_value(r.status()); });
  ASSERT_TRUE(set.get_future().get().ok());
  v1::SubmitTasksRequest req;
  v1::TaskSpec* s = req.add_tasks();
  s->set_id("t1");
  s->set_queue("train");
  s->add_steps()->mutable_builtin()->set_name("noop");
  (*s->mutable_placement()->mutable_resources())["cpu"] = "1500m";
  (*s->mutable_placement()->mutable_resources())["memory"] = "1GiB";
  std::promise<absl::Status> done;
  engine_->SubmitTasks(
      req, [&](absl::StatusOr<v1::SubmitTasksResponse> r) { done.set_value(r.status()); });
  ASSERT_TRUE(done.get_future().get().ok());
  engine_->Sync();

  const std::string page = http::MetricsPage(engine_->Metrics(), http::ProcessInfo());
  EXPECT_THAT(page, HasSubstr("taskgrid_agent_resources{resource=\"cpu\"} 4\n"
                              "taskgrid_agent_resources{resource=\"memory\"} 8589934592\n"));
  EXPECT_THAT(page, HasSubstr("taskgrid_agent_resources_held{resource=\"cpu\"} 1.5\n"
                              "taskgrid_agent_resources_held{resource=\"memory\"} 1073741824\n"));
  EXPECT_THAT(page,
              HasSubstr("taskgrid_queue_resources_held{queue=\"train\",resource=\"cpu\"} 1.5\n"));
  EXPECT_THAT(page,
              HasSubstr("taskgrid_queue_resource_quota{queue=\"train\",resource=\"cpu\"} 2\n"));
  EXPECT_THAT(page, Not(HasSubstr("\n\n")));
}

TEST_F(MetricsTest, TheOldestPendingTaskIsTheFirstSubmittedStillWaiting) {
  v1::AgentMessage drain;
  drain.mutable_draining();
  Send(drain);  // no dispatching: everything stays PENDING
  Submit("q", {"t1"});
  clock_.Advance(absl::Seconds(10));
  Submit("q", {"t2"});
  clock_.Advance(absl::Seconds(5));
  EXPECT_DOUBLE_EQ(OldestAge(engine_->Metrics().scheduler, "q"), 15);
  std::promise<void> cancelled;
  engine_->CancelTask("t1", [&](absl::StatusOr<v1::Task>) { cancelled.set_value(); });
  cancelled.get_future().wait();
  const EngineMetrics m = engine_->Metrics();
  EXPECT_DOUBLE_EQ(OldestAge(m.scheduler, "q"), 5);  // t2's age now
  EXPECT_EQ(m.scheduler.counters.ended[v1::TASK_STATE_CANCELLED], 1);
  EXPECT_EQ(m.scheduler.cluster.agents_draining(), 1);
}

TEST_F(MetricsTest, WaitersAreCounted) {
  Submit("q", {"w"});
  const uint64_t id =
      engine_->WaitTask("w", absl::Hours(1), [](absl::StatusOr<v1::WaitTaskResponse>) {});
  ASSERT_NE(id, 0u);
  EXPECT_EQ(engine_->Metrics().task_waits, 1);
  engine_->CancelWait(id);
  EXPECT_EQ(engine_->Metrics().task_waits, 0);
}

}  // namespace
}  // namespace taskgrid::engine
