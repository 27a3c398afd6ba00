// Finished tasks on disk and retention, through the Engine on an in-memory
// store with a fake clock and fake agents: finished tasks leave memory once
// committed and old enough, every read and operation still sees them as
// they were, retention and deletes remove them for good, and a restart
// keeps them on disk. No sleeping: time moves by FakeClock::Advance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/proto_time.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/await.h"
#include "tests/testing/fake_agent_channel.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::engine::retention_test {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::Await;

v1::TaskSpec Spec(const std::string& id, const std::string& queue = "") {
  v1::TaskSpec s;
  s.set_id(id);
  s.set_queue(queue);
  s.add_steps()->mutable_builtin()->set_name("noop");
  return s;
}

constexpr absl::Duration kInMemory = absl::Seconds(5);

class RetentionTest : public ::testing::Test {
 protected:
  static EngineOptions Options() {
    EngineOptions opts;
    opts.tick_interval = absl::Hours(1);  // the test drives time with TickNow()
    opts.scheduler.finished_in_memory = kInMemory;
    opts.scheduler.retention = absl::Hours(1);
    opts.scheduler.failed_retention = absl::Hours(2);
    opts.scheduler.default_max_attempts = 1;
    return opts;
  }

  void Start(EngineOptions opts = Options()) {
    e_ = std::make_unique<Engine>(&mem_, &clock_, opts);
    ASSERT_TRUE(e_->Start().ok());
  }

  // An agent with `slots` slots; what it is sent lands in `channel_`.
  void Connect(int slots = 100) {
    channel_ = std::make_shared<testing::FakeAgentChannel>();
    conn_ = e_->AttachAgent(channel_);
    v1::Hello h;
    h.set_agent_id("a1");
    h.set_slots(slots);
    ASSERT_TRUE(e_->AgentHello(conn_, h).ok());
    e_->Sync();
  }

  absl::StatusOr<v1::SubmitTasksResponse> Submit(std::vector<v1::TaskSpec> specs) {
    v1::SubmitTasksRequest req;
    for (v1::TaskSpec& s : specs) *req.add_tasks() = std::move(s);
    auto r = Await<v1::SubmitTasksResponse>(
        [&](Engine::Reply<v1::SubmitTasksResponse> done) { e_->SubmitTasks(req, done); });
    e_->Sync();
    return r;
  }

  // The latest attempt assigned to the agent for `id` (0: none).
  int32_t Assigned(const std::string& id) {
    int32_t attempt = 0;
    for (const v1::SchedulerMessage& m : channel_->sent()) {
      for (const v1::Assignment& a : m.assign().tasks()) {
        if (a.task_id() == id) attempt = a.attempt();
      }
    }
    return attempt;
  }
  // The inputs the latest Assign of `id` carried.
  std::map<std::string, std::string> InputsOf(const std::string& id) {
    std::map<std::string, std::string> inputs;
    for (const v1::SchedulerMessage& m : channel_->sent()) {
      for (const v1::Assignment& a : m.assign().tasks()) {
        if (a.task_id() != id) continue;
        inputs.clear();
        for (const auto& [k, v] : a.inputs()) inputs[k] = v;
      }
    }
    return inputs;
  }

  // The agent reports the live attempt of `id`.
  void Finish(const std::string& id, v1::Outcome outcome = v1::OUTCOME_SUCCEEDED) {
    const int32_t attempt = Assigned(id);
    ASSERT_GT(attempt, 0) << id << " was never assigned";
    v1::AgentMessage m;
    v1::Result* r = m.mutable_result();
    r->set_task_id(id);
    r->set_attempt(attempt);
    r->mutable_result()->set_outcome(outcome);
    r->mutable_result()->set_exit_code(outcome == v1::OUTCOME_SUCCEEDED ? 0 : 7);
    r->mutable_result()->set_stdout_tail("out of " + id + "\n");
    e_->AgentMessage(conn_, m);
    e_->Sync();
  }

  // Time passes (the agent, if any, heartbeats meanwhile); the ticker's
  // work runs, and what it queued commits.
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    if (conn_ != 0) {
      v1::AgentMessage hb;
      hb.mutable_heartbeat();
      e_->AgentMessage(conn_, hb);
    }
    e_->TickNow();
    e_->Sync();
  }

  absl::StatusOr<v1::Task> Get(const std::string& id) {
    v1::GetTaskRequest req;
    req.set_id(id);
    return Await<v1::Task>([&](Engine::Reply<v1::Task> done) { e_->GetTask(req, done); });
  }
  absl::StatusOr<v1::ListTasksResponse> List(v1::ListTasksRequest req) {
    return Await<v1::ListTasksResponse>(
        [&](Engine::Reply<v1::ListTasksResponse> done) { e_->ListTasks(req, done); });
  }
  absl::StatusOr<v1::Task> Retry(const std::string& id) {
    auto r = Await<v1::Task>([&](Engine::Reply<v1::Task> done) { e_->RetryTask(id, done); });
    e_->Sync();
    return r;
  }
  absl::StatusOr<v1::DeleteTaskResponse> Delete(const std::string& id) {
    return Await<v1::DeleteTaskResponse>(
        [&](Engine::Reply<v1::DeleteTaskResponse> done) { e_->DeleteTask(id, done); });
  }

  // Where the scheduler keeps `id` now.
  enum class Where { kMemory, kDisk, kNowhere };
  Where WhereIs(const std::string& id) {
    Where w = Where::kNowhere;
    e_->Inspect([&](const core::Scheduler& s) {
      ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants();
      if (s.Find(id) != nullptr) {
        w = Where::kMemory;
      } else if (s.FindCold(id) != nullptr) {
        w = Where::kDisk;
      }
    });
    return w;
  }
  bool Stored(const std::string& id) {
    const auto tasks = mem_.LoadTasks();
    for (const core::StoredTask& t : *tasks) {
      if (t.row.id == id) return true;
    }
    return false;
  }
  size_t StoredAttempts(const std::string& id) {
    const auto attempts = mem_.LoadAttempts();
    size_t n = 0;
    for (const core::AttemptRow& a : *attempts) n += a.task_id == id;
    return n;
  }

  FakeClock clock_;
  store::MemoryStore mem_;
  std::unique_ptr<Engine> e_;
  std::shared_ptr<testing::FakeAgentChannel> channel_;
  uint64_t conn_ = 0;
};

TEST_F(RetentionTest, AFinishedTaskLeavesMemoryOnceOldEnoughAndReadsTheSame) {
  Start();
  Connect();
  ASSERT_TRUE(Submit({Spec("done")}).ok());
  Finish("done");
  auto in_memory = Get("done");
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  ASSERT_EQ(in_memory->state(), v1::TASK_STATE_SUCCEEDED);
  Advance(kInMemory - absl::Seconds(1));
  EXPECT_EQ(WhereIs("done"), Where::kMemory) << "finished moments ago";
  Advance(absl::Seconds(1));
  ASSERT_EQ(WhereIs("done"), Where::kDisk);

  // Every read sees it as it was.
  auto on_disk = Get("done");
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*on_disk, *in_memory))
      << on_disk->DebugString() << "\nwas\n"
      << in_memory->DebugString();
  auto listed = List({});
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->tasks_size(), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(listed->tasks(0), *in_memory));
  auto waited = Await<v1::WaitTaskResponse>([&](Engine::Reply<v1::WaitTaskResponse> done) {
    e_->WaitTask("done", absl::Seconds(10), done);
  });
  ASSERT_TRUE(waited.ok());
  EXPECT_TRUE(waited->done());
  EXPECT_TRUE(MessageDifferencer::Equals(waited->task(), *in_memory));
  EXPECT_EQ(e_->Metrics().scheduler.tasks_on_disk, 1);
  EXPECT_EQ(e_->Metrics().scheduler.tasks_in_memory, 0);
  // Counts still count it.
  auto stats = Await<v1::GetQueueStatsResponse>(
      [&](Engine::Reply<v1::GetQueueStatsResponse> done) { e_->GetQueueStats({}, done); });
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->queues(0).counts().at("SUCCEEDED"), 1);
}

TEST_F(RetentionTest, ListsMixTasksInMemoryAndOnDiskInSubmitOrderAcrossPages) {
  Start();
  Connect(1);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Submit({Spec("t" + std::to_string(i))}).ok());
  // t0, t2 and t4 finish and go to disk; the others wait behind one slot.
  Finish("t0");
  Finish("t1");
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("t0"), Where::kDisk);
  ASSERT_EQ(WhereIs("t1"), Where::kDisk);
  ASSERT_EQ(WhereIs("t2"), Where::kMemory);
  v1::ListTasksRequest req;
  req.set_page_size(4);
  std::vector<std::string> ids;
  for (;;) {
    auto page = List(req);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Task& t : page->tasks()) ids.push_back(t.spec().id());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_THAT(ids, ElementsAre("t0", "t1", "t2", "t3", "t4", "t5"));
  // A filter of finished states reads only what matches; of unfinished ones
  // never the disk.
  v1::ListTasksRequest done;
  done.add_states(v1::TASK_STATE_SUCCEEDED);
  auto page = List(done);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->tasks_size(), 2);
  EXPECT_EQ(page->tasks(1).spec().id(), "t1");
  v1::ListTasksRequest pending;
  pending.add_states(v1::TASK_STATE_PENDING);
  page = List(pending);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->tasks_size(), 4 - 1);  // t2 is DISPATCHED
}

TEST_F(RetentionTest, ListsNewestFirstByIdPrefixWithTotalsAcrossMemoryAndDisk) {
  Start();
  Connect(1);
  for (const char* id : {"a0", "b0", "a1", "b1", "a2", "b2"}) ASSERT_TRUE(Submit({Spec(id)}).ok());
  Finish("a0");
  Finish("b0");
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("a0"), Where::kDisk);
  ASSERT_EQ(WhereIs("b0"), Where::kDisk);
  ASSERT_EQ(WhereIs("a1"), Where::kMemory);
  // Every page of a listing: its ids, and the total each page said.
  auto pages = [&](v1::ListTasksRequest req) {
    std::vector<std::vector<std::string>> ids;
    std::vector<int64_t> totals;
    for (;;) {
      auto page = List(req);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      ids.emplace_back();
      for (const v1::Task& t : page->tasks()) ids.back().push_back(t.spec().id());
      totals.push_back(page->total_size());
      if (page->next_page_token().empty()) break;
      req.set_page_token(page->next_page_token());
    }
    return std::make_pair(ids, totals);
  };
  using Ids = std::vector<std::vector<std::string>>;
  v1::ListTasksRequest newest;
  newest.set_newest_first(true);
  newest.set_page_size(4);
  auto [ids, totals] = pages(newest);
  EXPECT_EQ(ids, (Ids{{"b2", "a2", "b1", "a1"}, {"b0", "a0"}}));
  EXPECT_THAT(totals, ElementsAre(6, 6));

  v1::ListTasksRequest prefix = newest;
  prefix.set_id_prefix("a");
  prefix.set_page_size(2);
  std::tie(ids, totals) = pages(prefix);
  EXPECT_EQ(ids, (Ids{{"a2", "a1"}, {"a0"}}));
  EXPECT_THAT(totals, ElementsAre(3, 3));
  prefix.set_newest_first(false);
  std::tie(ids, totals) = pages(prefix);
  EXPECT_EQ(ids, (Ids{{"a0", "a1"}, {"a2"}}));
  EXPECT_THAT(totals, ElementsAre(3, 3));

  // Totals from the counts by state: finished ones on disk count.
  v1::ListTasksRequest done = newest;
  done.add_states(v1::TASK_STATE_SUCCEEDED);
  done.add_states(v1::TASK_STATE_DISPATCHED);
  std::tie(ids, totals) = pages(done);
  EXPECT_EQ(ids, (Ids{{"a1", "b0", "a0"}}));
  EXPECT_THAT(totals, ElementsAre(3));
  v1::ListTasksRequest none;
  none.set_id_prefix("zzz");
  std::tie(ids, totals) = pages(none);
  EXPECT_EQ(ids, (Ids{{}}));
  EXPECT_THAT(totals, ElementsAre(0));

  v1::ListTasksRequest too_long;
  too_long.set_id_prefix(std::string(129, 'a'));
  auto refused = List(too_long);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("id_prefix is 129 bytes"));
}

TEST_F(RetentionTest, ListsByLabelAcrossMemoryDiskAndARestart) {
  using Labels = std::map<std::string, std::string>;
  auto labelled = [](const std::string& id, const Labels& labels) {
    v1::TaskSpec s = Spec(id);
    for (const auto& [k, v] : labels) (*s.mutable_labels())[k] = v;
    return s;
  };
  Start();
  Connect(1);
  ASSERT_TRUE(
      Submit({labelled("r0", {{"team", "red"}, {"env", "prod"}}),
              labelled("b0", {{"team", "blue"}, {"env", "prod"}}),
              labelled("r1", {{"team", "red"}}), labelled("eq", {{"expr", "a=b"}}), Spec("plain")})
          .ok());
  Finish("r0");
  Finish("b0");
  Finish("r1", v1::OUTCOME_FAILED);
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("r0"), Where::kDisk);
  ASSERT_EQ(WhereIs("b0"), Where::kDisk);
  ASSERT_EQ(WhereIs("r1"), Where::kDisk);
  ASSERT_EQ(WhereIs("eq"), Where::kMemory);
  // The ids a label search finds (one page of 2 at a time, newest first
  // or not) and the total the first page said.
  auto find = [&](const Labels& want, bool newest_first = false) {
    v1::ListTasksRequest req;
    for (const auto& [k, v] : want) (*req.mutable_labels())[k] = v;
    req.set_page_size(2);
    req.set_newest_first(newest_first);
    std::vector<std::string> ids;
    int64_t total = -1;
    for (int pages = 0; pages < 10; ++pages) {
      auto page = List(req);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      for (const v1::Task& t : page->tasks()) ids.push_back(t.spec().id());
      if (total < 0) total = page->total_size();
      if (page->next_page_token().empty()) break;
      req.set_page_token(page->next_page_token());
    }
    return std::make_pair(ids, total);
  };
  using Found = std::pair<std::vector<std::string>, int64_t>;
  auto check = [&] {
    EXPECT_EQ(find({{"team", "red"}}), (Found{{"r0", "r1"}, 2}));
    EXPECT_EQ(find({{"team", "red"}}, true), (Found{{"r1", "r0"}, 2}));
    EXPECT_EQ(find({{"env", "prod"}}), (Found{{"r0", "b0"}, 2}));
    EXPECT_EQ(find({{"env", "prod"}, {"team", "red"}}), (Found{{"r0"}, 1}));
    // Keys and values match whole, wherever the task is.
    EXPECT_EQ(find({{"team", "re"}}), (Found{{}, 0}));
    EXPECT_EQ(find({{"tea", "red"}}), (Found{{}, 0}));
    EXPECT_EQ(find({{"expr", "a=b"}}), (Found{{"eq"}, 1}));
    EXPECT_EQ(find({{"expr", "a"}}), (Found{{}, 0}));
    EXPECT_EQ(find({}).second, 5);
  };
  check();
  // A restart reads the tasks on disk back light: their labels come with them.
  e_->Stop();
  conn_ = 0;
  Start();
  ASSERT_EQ(WhereIs("r0"), Where::kDisk);
  check();
  // A task read back into memory and one deleted let go of their sets.
  auto reset = Await<v1::Task>([&](Engine::Reply<v1::Task> done) { e_->ResetTask("r1", done); });
  ASSERT_TRUE(reset.ok()) << reset.status();
  ASSERT_TRUE(Delete("b0").ok());
  e_->Sync();
  EXPECT_EQ(WhereIs("b0"), Where::kNowhere);  // checks the label sets' counts too
  EXPECT_EQ(find({{"env", "prod"}}), (Found{{"r0"}, 1}));
  EXPECT_EQ(find({{"team", "red"}}), (Found{{"r0", "r1"}, 2}));

  auto refused = [&](const Labels& want) {
    v1::ListTasksRequest req;
    for (const auto& [k, v] : want) (*req.mutable_labels())[k] = v;
    auto r = List(req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  Labels many;
  for (int i = 0; i < 17; ++i) many["k" + std::to_string(i)] = "v";
  EXPECT_THAT(refused(many), HasSubstr("labels has 17 entries; the limit is 16"));
  EXPECT_THAT(refused({{"bad key", "v"}}), HasSubstr("labels.key"));
  EXPECT_THAT(refused({{"k", std::string(257, 'v')}}), HasSubstr("labels[k] is 257 bytes"));
}

TEST_F(RetentionTest, RetryAndResetReadATaskBackFromDisk) {
  Start();
  Connect();
  v1::TaskSpec spec = Spec("flaky");
  spec.set_max_attempts(3);
  ASSERT_TRUE(Submit({spec}).ok());
  Finish("flaky", v1::OUTCOME_FAILED);  // retried after its backoff
  Advance(absl::Seconds(2));
  Finish("flaky", v1::OUTCOME_FAILED);
  Advance(absl::Seconds(4));
  Finish("flaky", v1::OUTCOME_FAILED);
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("flaky"), Where::kDisk);
  // Out of attempts: retry says so (the history came back with it).
  auto r = Retry("flaky");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("used all 3"));
  auto reset = Await<v1::Task>([&](Engine::Reply<v1::Task> done) { e_->ResetTask("flaky", done); });
  ASSERT_TRUE(reset.ok()) << reset.status();
  e_->Sync();
  EXPECT_EQ(WhereIs("flaky"), Where::kMemory);
  EXPECT_EQ(Assigned("flaky"), 4) << "attempt numbers never repeat";
  Finish("flaky");
  EXPECT_EQ(Get("flaky")->state(), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(RetentionTest, SubmitsSeeTasksOnDiskForIdsDependenciesAndUniqueKeys) {
  Start();
  Connect();
  v1::TaskSpec once = Spec("once");
  once.set_unique_key("k");
  *once.mutable_unique_ttl() = ToProto(absl::Hours(1));
  once.set_unique_release(v1::UNIQUE_RELEASE_AT_TTL);  // held after it succeeds
  v1::TaskSpec freed = Spec("freed");
  freed.set_unique_key("k2");
  *freed.mutable_unique_ttl() = ToProto(absl::Hours(1));
  ASSERT_TRUE(Submit({Spec("dep"), once, freed}).ok());
  Finish("dep");
  Finish("once");
  Finish("freed");
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("dep"), Where::kDisk);
  ASSERT_EQ(WhereIs("once"), Where::kDisk);
  ASSERT_EQ(WhereIs("freed"), Where::kDisk);

  // The same id and spec again: the task as it is.
  auto again = Submit({Spec("dep")});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tasks(0).state(), v1::TASK_STATE_SUCCEEDED);
  // Another spec under it: refused.
  v1::TaskSpec other = Spec("dep");
  other.set_priority(3);
  EXPECT_EQ(Submit({other}).status().code(), absl::StatusCode::kAlreadyExists);
  // The unique key's holder is on disk: the submit returns it.
  v1::TaskSpec dup = Spec("twice");
  dup.set_unique_key("k");
  *dup.mutable_unique_ttl() = ToProto(absl::Hours(1));
  auto held = Submit({dup});
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->tasks(0).spec().id(), "once");
  EXPECT_EQ(WhereIs("twice"), Where::kNowhere);
  // A holder that succeeded let go of its key (the default), on disk too.
  v1::TaskSpec next = Spec("next");
  next.set_unique_key("k2");
  *next.mutable_unique_ttl() = ToProto(absl::Hours(1));
  auto made = Submit({next});
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->tasks(0).spec().id(), "next");
  // A new task depending on it: the dependency comes back, its output is
  // the new task's input, and it stays in memory while needed.
  v1::TaskSpec after = Spec("after");
  after.add_depends_on("dep");
  ASSERT_TRUE(Submit({after}).ok());
  EXPECT_THAT(InputsOf("after"),
              ElementsAre(std::pair<const std::string, std::string>("dep", "out of dep\n")));
  Advance(kInMemory * 3);
  EXPECT_EQ(WhereIs("dep"), Where::kMemory) << "an unfinished task depends on it";
  Finish("after");
  Advance(kInMemory);
  EXPECT_EQ(WhereIs("dep"), Where::kDisk);
  EXPECT_EQ(WhereIs("after"), Where::kDisk);
}

TEST_F(RetentionTest, AJobGoesToDiskWholeAndComesBackWhole) {
  Start();
  Connect();
  v1::SubmitJobRequest job;
  job.set_job_id("etl");
  *job.add_tasks() = Spec("extract");
  v1::TaskSpec load = Spec("load");
  load.add_depends_on("extract");
  *job.add_tasks() = load;
  *job.add_tasks() = Spec("side");
  ASSERT_TRUE(Await<v1::Job>([&](Engine::Reply<v1::Job> done) { e_->SubmitJob(job, done); }).ok());
  e_->Sync();
  Finish("extract");
  Finish("side");
  Advance(kInMemory * 2);
  EXPECT_EQ(WhereIs("side"), Where::kMemory) << "its job has not finished";
  Finish("load", v1::OUTCOME_FAILED);
  Advance(kInMemory);
  for (const char* id : {"extract", "load", "side"}) EXPECT_EQ(WhereIs(id), Where::kDisk) << id;
  auto got = Await<v1::Job>([&](Engine::Reply<v1::Job> done) { e_->GetJob("etl", done); });
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(got->task_count(), 3);
  v1::ListTasksRequest of_job;
  of_job.set_job_id("etl");
  EXPECT_EQ(List(of_job)->tasks_size(), 3);
  // A page at a time from disk, either way, each page counting the job.
  for (const bool newest_first : {false, true}) {
    SCOPED_TRACE(newest_first ? "newest first" : "oldest first");
    v1::ListTasksRequest paged = of_job;
    paged.set_page_size(2);
    paged.set_newest_first(newest_first);
    std::vector<std::string> ids;
    for (int pages = 0; pages < 3; ++pages) {
      auto page = List(paged);
      ASSERT_TRUE(page.ok()) << page.status();
      EXPECT_EQ(page->total_size(), 3);
      for (const v1::Task& t : page->tasks()) ids.push_back(t.spec().id());
      if (page->next_page_token().empty()) break;
      paged.set_page_token(page->next_page_token());
    }
    const std::vector<std::string> want = newest_first
                                              ? std::vector<std::string>{"side", "load", "extract"}
                                              : std::vector<std::string>{"extract", "load", "side"};
    EXPECT_EQ(ids, want);
  }

  auto retried = Await<v1::Job>([&](Engine::Reply<v1::Job> done) { e_->RetryJob("etl", done); });
  ASSERT_TRUE(retried.ok()) << retried.status();
  e_->Sync();
  for (const char* id : {"extract", "load", "side"}) EXPECT_EQ(WhereIs(id), Where::kMemory) << id;
  EXPECT_EQ(Assigned("load"), 2);
  EXPECT_THAT(InputsOf("load"), ElementsAre(std::pair<const std::string, std::string>(
                                    "extract", "out of extract\n")));
}

TEST_F(RetentionTest, RetentionDeletesFinishedTasksForGoodByQueueAndKind) {
  EngineOptions opts = Options();
  opts.scheduler.max_deletes_per_tick = 2;
  Start(opts);
  Connect();
  ASSERT_TRUE(Submit({Spec("ok1"), Spec("ok2"), Spec("ok3"), Spec("bad"), Spec("keep", "forever"),
                      Spec("short", "brief")})
                  .ok());
  auto keep_forever = [&](const std::string& queue, absl::Duration d) {
    v1::SetQueueRetentionRequest req;
    req.set_queue(queue);
    *req.mutable_retention() = ToProto(d);
    auto r = Await<v1::QueueStats>(
        [&](Engine::Reply<v1::QueueStats> done) { e_->SetQueueRetention(req, done); });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->settings().has_retention());
  };
  keep_forever("forever", absl::ZeroDuration());
  keep_forever("brief", absl::Minutes(10));
  for (const char* id : {"ok1", "ok2", "ok3", "keep", "short"}) Finish(id);
  Finish("bad", v1::OUTCOME_FAILED);
  Advance(kInMemory);
  Advance(absl::Minutes(10));
  EXPECT_EQ(WhereIs("short"), Where::kNowhere) << "its queue keeps 10 minutes";
  EXPECT_EQ(WhereIs("ok1"), Where::kDisk);
  Advance(absl::Minutes(50));
  // Two per tick.
  EXPECT_EQ(e_->Metrics().scheduler.tasks_deleted, 1 + 2);
  Advance(absl::Seconds(1));
  EXPECT_EQ(e_->Metrics().scheduler.tasks_deleted, 1 + 3);
  for (const char* id : {"ok1", "ok2", "ok3"}) {
    EXPECT_EQ(WhereIs(id), Where::kNowhere) << id;
    EXPECT_FALSE(Stored(id)) << id;
    EXPECT_EQ(StoredAttempts(id), 0u) << id;
    EXPECT_EQ(Get(id).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(WhereIs("bad"), Where::kDisk) << "the dead letter is kept longer";
  Advance(absl::Hours(1));
  EXPECT_EQ(WhereIs("bad"), Where::kNowhere);
  Advance(absl::Hours(24 * 365));
  EXPECT_EQ(WhereIs("keep"), Where::kDisk) << "a retention of 0 keeps it";
  // The counts went with them; the id is free again.
  auto stats = Await<v1::GetQueueStatsResponse>(
      [&](Engine::Reply<v1::GetQueueStatsResponse> done) { e_->GetQueueStats({}, done); });
  ASSERT_TRUE(stats.ok());
  for (const v1::QueueStats& q : stats->queues()) {
    EXPECT_EQ(q.counts().count("SUCCEEDED"), q.queue() == "forever" ? 1u : 0u) << q.queue();
  }
  auto again = Submit({Spec("ok1")});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tasks(0).state(), v1::TASK_STATE_DISPATCHED);
}

TEST_F(RetentionTest, ADependencyIsKeptWhileAnUnfinishedTaskNeedsIt) {
  Start();
  Connect();
  v1::TaskSpec later = Spec("later");
  later.add_depends_on("base");
  *later.mutable_not_before() = ToProto(clock_.Now() + absl::Hours(3));
  ASSERT_TRUE(Submit({Spec("base"), later}).ok());
  Finish("base");
  Advance(absl::Hours(2));  // past retention: "later" still waits for not_before
  EXPECT_EQ(WhereIs("base"), Where::kMemory);
  EXPECT_EQ(Delete("base").status().code(), absl::StatusCode::kFailedPrecondition);
  Advance(absl::Hours(1));
  EXPECT_THAT(InputsOf("later"),
              ElementsAre(std::pair<const std::string, std::string>("base", "out of base\n")));
}

TEST_F(RetentionTest, DeleteTaskRefusesWhatItMustNotDeleteAndChangesNothing) {
  Start();
  Connect();
  v1::SubmitJobRequest job;
  job.set_job_id("j");
  *job.add_tasks() = Spec("in-job");
  ASSERT_TRUE(Await<v1::Job>([&](Engine::Reply<v1::Job> done) { e_->SubmitJob(job, done); }).ok());
  v1::TaskSpec group = Spec("group");
  group.mutable_replicas()->set_count(2);
  // One agent here: the first replica to succeed decides, the other is
  // cancelled.
  group.mutable_replicas()->set_success(v1::SUCCESS_POLICY_ANY);
  ASSERT_TRUE(Submit({Spec("running"), Spec("done"), group}).ok());
  Finish("done");
  Finish("in-job");
  Finish("group:r1");
  ASSERT_EQ(Get("group")->state(), v1::TASK_STATE_SUCCEEDED);

  struct Case {
    std::string id;
    absl::StatusCode code;
    std::string says;
  };
  const Case cases[] = {
      {"", absl::StatusCode::kInvalidArgument, "id is empty"},
      {"nope", absl::StatusCode::kNotFound, "does not exist"},
      {"running", absl::StatusCode::kFailedPrecondition, "cancel it first"},
      {"in-job", absl::StatusCode::kFailedPrecondition, "job \"j\""},
      {"group:r1", absl::StatusCode::kFailedPrecondition, "replica of \"group\""},
  };
  const size_t stored = mem_.LoadTasks()->size();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    auto r = Delete(c.id);
    EXPECT_EQ(r.status().code(), c.code);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.says));
  }
  e_->Sync();
  EXPECT_EQ(mem_.LoadTasks()->size(), stored);

  // In memory or on disk, a finished task goes, with its replicas.
  auto d = Delete("done");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->ids(), ElementsAre("done"));
  Advance(kInMemory);
  ASSERT_EQ(WhereIs("group"), Where::kDisk);
  d = Delete("group");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->ids(), ElementsAre("group", "group:r1", "group:r2"));
  e_->Sync();
  for (const char* id : {"done", "group", "group:r1", "group:r2"}) {
    EXPECT_FALSE(Stored(id)) << id;
    EXPECT_EQ(WhereIs(id), Where::kNowhere) << id;
  }
  auto gone = Await<v1::DeleteJobResponse>(
      [&](Engine::Reply<v1::DeleteJobResponse> done) { e_->DeleteJob("j", done); });
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->tasks_deleted(), 1);
  e_->Sync();
  EXPECT_FALSE(Stored("in-job"));
  EXPECT_EQ(
      Await<v1::Job>([&](Engine::Reply<v1::Job> done) { e_->GetJob("j", done); }).status().code(),
      absl::StatusCode::kNotFound);
}

TEST_F(RetentionTest, BulkDeleteGoesByQueueAndStatePageByPage) {
  Start();
  Connect();
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 7; ++i) specs.push_back(Spec("b" + std::to_string(i), "bulk"));
  specs.push_back(Spec("other"));
  ASSERT_TRUE(Submit(specs).ok());
  for (int i = 0; i < 7; ++i) {
    Finish("b" + std::to_string(i), i == 3 ? v1::OUTCOME_FAILED : v1::OUTCOME_SUCCEEDED);
  }
  Finish("other");
  Advance(kInMemory);  // some on disk, and the ones below in memory
  v1::BulkTasksRequest req;
  req.set_queue("bulk");
  req.add_states(v1::TASK_STATE_SUCCEEDED);
  req.set_limit(4);
  std::vector<std::string> deleted;
  for (int calls = 0; calls < 5; ++calls) {
    auto r = Await<v1::BulkTasksResponse>(
        [&](Engine::Reply<v1::BulkTasksResponse> done) { e_->DeleteTasks(req, done); });
    ASSERT_TRUE(r.ok()) << r.status();
    deleted.insert(deleted.end(), r->ids().begin(), r->ids().end());
    if (r->next_page_token().empty()) break;
    req.set_page_token(r->next_page_token());
  }
  EXPECT_THAT(deleted, ElementsAre("b0", "b1", "b2", "b4", "b5", "b6"));
  EXPECT_EQ(WhereIs("b3"), Where::kDisk) << "FAILED was not asked for";
  EXPECT_EQ(WhereIs("other"), Where::kDisk);
  // Refusals: no queue or job; a state that is not finished.
  v1::BulkTasksRequest bad;
  EXPECT_EQ(Await<v1::BulkTasksResponse>(
                [&](Engine::Reply<v1::BulkTasksResponse> done) { e_->DeleteTasks(bad, done); })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  bad.set_queue("bulk");
  bad.add_states(v1::TASK_STATE_RUNNING);
  auto r = Await<v1::BulkTasksResponse>(
      [&](Engine::Reply<v1::BulkTasksResponse> done) { e_->DeleteTasks(bad, done); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("RUNNING"));
}

TEST_F(RetentionTest, SetQueueRetentionNamesWhatIsWrongAndSurvivesARestart) {
  Start();
  auto set = [&](v1::SetQueueRetentionRequest req) {
    return Await<v1::QueueStats>(
        [&](Engine::Reply<v1::QueueStats> done) { e_->SetQueueRetention(req, done); });
  };
  v1::SetQueueRetentionRequest req;
  req.set_queue("q");
  req.mutable_retention()->set_seconds(-1);
  auto r = set(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("retention is negative"));
  req.mutable_retention()->set_seconds(0);
  req.mutable_failed_retention()->set_seconds(11LL * 365 * 24 * 3600);
  r = set(req);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("failed_retention is longer than 10"));
  req.clear_queue();
  EXPECT_EQ(set(req).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(mem_.LoadQueues()->empty()) << "nothing stored for refused calls";

  req.set_queue("q");
  *req.mutable_failed_retention() = ToProto(absl::Hours(48));
  ASSERT_TRUE(set(req).ok());
  e_->Stop();
  Start();
  e_->Inspect([](const core::Scheduler& s) {
    EXPECT_EQ(s.RetentionOf("q", false), absl::ZeroDuration());
    EXPECT_EQ(s.RetentionOf("q", true), absl::Hours(48));
    EXPECT_EQ(s.RetentionOf("other", false), absl::Hours(1));
  });
  // Unset again: back to the defaults, and nothing stored.
  v1::SetQueueRetentionRequest clear;
  clear.set_queue("q");
  ASSERT_TRUE(set(clear).ok());
  e_->Sync();
  EXPECT_TRUE(mem_.LoadQueues()->empty());
}

TEST_F(RetentionTest, ARestartKeepsFinishedTasksOnDiskAndWhatIsNeededInMemory) {
  Start();
  Connect();
  v1::TaskSpec later = Spec("later");
  later.add_depends_on("base");
  *later.mutable_not_before() = ToProto(clock_.Now() + absl::Hours(3));
  ASSERT_TRUE(Submit({Spec("base"), later, Spec("alone"), Spec("open")}).ok());
  Finish("base");
  Finish("alone");
  e_->Stop();
  conn_ = 0;
  Start();
  EXPECT_EQ(WhereIs("alone"), Where::kDisk);
  EXPECT_EQ(WhereIs("base"), Where::kMemory) << "\"later\" needs it";
  EXPECT_EQ(WhereIs("open"), Where::kMemory);
  auto alone = Get("alone");
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->result().stdout_tail(), "out of alone\n");
  // Retention goes on from the stored finish times.
  Advance(absl::Hours(1));
  EXPECT_EQ(WhereIs("alone"), Where::kNowhere);
  EXPECT_EQ(WhereIs("base"), Where::kMemory);
}

}  // namespace
}  // namespace taskgrid::engine::retention_test
