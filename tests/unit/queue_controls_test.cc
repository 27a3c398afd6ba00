// Queue controls (scheduler/core/queues.cc, queue_controls.cc): a paused
// queue, concurrency and rate limits, for agents and pull workers alike;
// bulk cancel and retry by filter; undraining an agent; unique keys.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using V = std::vector<std::string>;

class QueueControlsTest : public SchedulerTest {
 protected:
  static v1::TaskSpec In(const std::string& queue, const std::string& id) {
    v1::TaskSpec s = Spec(id);
    s.set_queue(queue);
    return s;
  }
  void SubmitIn(const std::string& queue, const V& ids) {
    std::vector<v1::TaskSpec> specs;
    for (const std::string& id : ids) specs.push_back(In(queue, id));
    ASSERT_TRUE(Submit(std::move(specs)).ok());
  }
  absl::StatusOr<v1::QueueStats> Limits(const std::string& queue, int concurrency, double rate,
                                        int burst = 0) {
    v1::SetQueueLimitsRequest req;
    req.set_queue(queue);
    req.set_max_concurrency(concurrency);
    req.set_rate_per_second(rate);
    req.set_burst(burst);
    auto r = sched_.SetQueueLimits(req);
    Check();
    return r;
  }
  absl::StatusOr<v1::QueueStats> Pause(const std::string& queue, bool paused = true) {
    auto r = sched_.PauseQueue(queue, paused);
    Check();
    return r;
  }
  std::vector<QueueRow> QueueRows(const Effects& fx) { return fx.batch.queues; }
};

TEST_F(QueueControlsTest, APausedQueueKeepsItsTasksUntilResumedWhileOthersRun) {
  auto p = Pause("q");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->settings().paused());
  Effects fx = Take();
  ASSERT_EQ(fx.batch.queues.size(), 1u) << "the pause is stored with the change";
  EXPECT_EQ(fx.batch.queues[0].queue, "q");
  v1::QueueSettings stored;
  ASSERT_TRUE(stored.ParseFromString(fx.batch.queues[0].settings));
  EXPECT_TRUE(stored.paused());

  SubmitIn("q", {"q1", "q2"});
  SubmitIn("other", {"o1"});
  const uint64_t a = Connect("a", 10);
  EXPECT_EQ(Assigned(Take(), a), V{"o1"}) << "only the queue that is not paused";
  EXPECT_EQ(State("q1"), v1::TASK_STATE_PENDING);
  EXPECT_TRUE(sched_.Stats("q").front().held());
  EXPECT_FALSE(sched_.Stats("other").front().held());

  ASSERT_TRUE(Pause("q").ok()) << "pausing a paused queue is no error";
  EXPECT_TRUE(Take().batch.queues.empty()) << "and stores nothing";

  auto r = Pause("q", false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->settings().paused());
  EXPECT_FALSE(r->held());
  fx = Take();
  EXPECT_EQ(Assigned(fx, a), (V{"q1", "q2"}));
  ASSERT_EQ(fx.batch.queues.size(), 1u);
  EXPECT_TRUE(fx.batch.queues[0].settings.empty()) << "back to the defaults: the row goes";
  EXPECT_EQ(sched_.QueueSettingsOf("q"), nullptr);
}

TEST_F(QueueControlsTest, AConcurrencyLimitKeepsAtMostThatManyInFlight) {
  ASSERT_TRUE(Limits("q", 2, 0).ok());
  SubmitIn("q", {"t1", "t2", "t3", "t4", "t5"});
  const uint64_t a = Connect("a", 10);
  EXPECT_EQ(Assigned(Take(), a), (V{"t1", "t2"}));
  Accept(a, "t1", 1);
  Result(a, "t1", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Assigned(Take(), a), V{"t3"}) << "one ended: one more";
  Result(a, "t2", 1, v1::OUTCOME_FAILED, 1);  // retried later: it leaves the flight too
  Result(a, "t3", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Assigned(Take(), a), (V{"t4", "t5"}));
  ASSERT_TRUE(Limits("q", 0, 0).ok()) << "0 removes the limit";
  EXPECT_EQ(sched_.QueueSettingsOf("q"), nullptr);
}

TEST_F(QueueControlsTest, ARateLimitStartsABurstThenOnePerToken) {
  ASSERT_TRUE(Limits("q", 0, 2, 3).ok());  // 2 per second, 3 at once
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) ids.push_back("t" + std::to_string(i));
  SubmitIn("q", ids);
  const uint64_t a = Connect("a", 100);
  EXPECT_EQ(Assigned(Take(), a).size(), 3u) << "the burst";
  Advance(absl::Milliseconds(499));
  EXPECT_TRUE(Assigned(Take(), a).empty()) << "not a whole token yet";
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(Assigned(Take(), a).size(), 1u);
  Advance(absl::Seconds(1));
  EXPECT_EQ(Assigned(Take(), a).size(), 2u);
  clock_.Advance(absl::Seconds(60));
  Heartbeat(a);  // not lost meanwhile
  sched_.Tick();
  EXPECT_EQ(Assigned(Take(), a).size(), 3u) << "a quiet spell saves up to the burst, no more";
}

TEST_F(QueueControlsTest, PullWorkersObeyTheSameControls) {
  SubmitIn("q", {"t1", "t2", "t3"});
  google::protobuf::Map<std::string, std::string> none;
  ASSERT_TRUE(Pause("q").ok());
  EXPECT_EQ(sched_.ClaimableCount("q", none), 0) << "WaitForWork must not wake for a paused queue";
  v1::ClaimRequest req;
  req.set_queue("q");
  req.set_owner("w");
  req.set_max(10);
  auto c = sched_.Claim(req);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->empty());
  ASSERT_TRUE(Pause("q", false).ok());
  ASSERT_TRUE(Limits("q", 2, 0).ok());
  c = sched_.Claim(req);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 2u) << "up to the concurrency limit";
  EXPECT_EQ(sched_.ClaimableCount("q", none), 0);
  Check();
}

TEST_F(QueueControlsTest, SettingsSurviveARestart) {
  ASSERT_TRUE(Pause("q").ok());
  ASSERT_TRUE(Limits("q", 3, 1.5, 4).ok());
  ASSERT_TRUE(Limits("r", 1, 0).ok());
  ASSERT_TRUE(Limits("r", 0, 0).ok());      // back to the defaults
  std::map<std::string, std::string> rows;  // what a store keeps: the last row of each queue
  for (QueueRow& q : Take().batch.queues) rows[q.queue] = q.settings;
  std::vector<QueueRow> kept;
  for (const auto& [queue, settings] : rows) {
    if (!settings.empty()) kept.push_back({queue, settings});
  }
  ASSERT_EQ(kept.size(), 1u);
  Scheduler restored(&clock_, Options());
  ASSERT_TRUE(restored.BeginRestore(0).ok());
  ASSERT_TRUE(restored.RestoreQueues(kept).ok());
  ASSERT_TRUE(restored.FinishRestore().ok());
  const v1::QueueSettings* s = restored.QueueSettingsOf("q");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->paused());
  EXPECT_EQ(s->max_concurrency(), 3);
  EXPECT_EQ(s->rate_per_second(), 1.5);
  EXPECT_EQ(s->burst(), 4);
  EXPECT_EQ(restored.QueueSettingsOf("r"), nullptr);
  const std::vector<v1::QueueStats> listed = restored.Stats("");
  EXPECT_TRUE(std::any_of(listed.begin(), listed.end(), [](const v1::QueueStats& q) {
    return q.queue() == "q";
  })) << "a queue with settings is listed without tasks";

  Scheduler broken(&clock_, Options());
  ASSERT_TRUE(broken.BeginRestore(0).ok());
  EXPECT_EQ(broken.RestoreQueues({{"q", "\xff\xff"}}).code(), absl::StatusCode::kDataLoss);
}

TEST_F(QueueControlsTest, BadControlsAreRefusedAndStoreNothing) {
  auto code = [&](absl::StatusOr<v1::QueueStats> r) {
    EXPECT_TRUE(Take().batch.queues.empty());
    return r.status();
  };
  EXPECT_EQ(code(Pause("")).message(),
            "queue is empty: name the queue (\"default\" for tasks submitted without one)");
  EXPECT_EQ(code(Pause("a b")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Pause(std::string(65, 'q'))).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", -1, 0)).message(),
            "max_concurrency: -1 is out of range 0-1000000 (0: no limit)");
  EXPECT_EQ(code(Limits("q", 2'000'000, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", 0, -1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", 0, std::nan(""))).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", 0, 1e300)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", 0, 0.0001)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Limits("q", 0, 0, 5)).message(),
            "burst: needs rate_per_second (a burst of what?)");
  EXPECT_EQ(code(Limits("q", 0, 1, -5)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.QueueSettingsOf("q"), nullptr);
}

TEST_F(QueueControlsTest, BulkCancelGoesPageByPageWithinItsFilter) {
  SubmitIn("q", {"t1", "t2", "t3", "t4", "t5"});
  SubmitIn("other", {"o1"});
  const uint64_t a = Connect("a", 1);
  EXPECT_EQ(Assigned(Take(), a), V{"t1"});
  ListFilter f;
  f.queue = "q";
  f.page_size = 3;
  auto r = sched_.CancelTasks(f);
  Check();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids, (V{"t1", "t2", "t3"}));
  EXPECT_EQ(State("t1"), v1::TASK_STATE_CANCELLING) << "the running one waits for its agent";
  EXPECT_EQ(Cancels(Take(), a), V{"t1"});
  ASSERT_GT(r->next_after_seq, 0);
  f.after_seq = r->next_after_seq;
  r = sched_.CancelTasks(f);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ids, (V{"t4", "t5"}));
  EXPECT_EQ(r->next_after_seq, 0);
  EXPECT_EQ(State("o1"), v1::TASK_STATE_PENDING) << "another queue is not touched";
  EXPECT_EQ(Task("t4").reason, "cancelled by a bulk request");
  Take();

  ListFilter bad;
  EXPECT_EQ(sched_.CancelTasks(bad).status().message(),
            "name a queue or a job_id: a bulk cancel never spans every queue");
  bad.queue = "q";
  bad.states = {v1::TASK_STATE_PENDING, v1::TASK_STATE_SUCCEEDED};
  EXPECT_EQ(sched_.CancelTasks(bad).status().message(),
            "states[1]: a cancel does not apply to SUCCEEDED tasks (only SCHEDULED, BLOCKED, "
            "PENDING, DISPATCHED, RUNNING, PAUSED)");
  EXPECT_TRUE(Take().batch.empty()) << "a refused request changes nothing";
}

TEST_F(QueueControlsTest, BulkRetryRetriesWhatItCanAndSaysWhatItSkipped) {
  v1::TaskSpec once = In("q", "once");
  once.set_max_attempts(1);
  SubmitOk(once);
  const uint64_t a = Connect("a", 1);
  EXPECT_EQ(Assigned(Take(), a), V{"once"});
  Accept(a, "once", 1);
  Result(a, "once", 1, v1::OUTCOME_FAILED, 3);
  ASSERT_EQ(State("once"), v1::TASK_STATE_FAILED);
  ASSERT_TRUE(sched_.Drain("a").ok());  // the rest stays put
  SubmitIn("q", {"c1", "c2", "live"});
  ASSERT_TRUE(sched_.Cancel("c1").ok());
  ASSERT_TRUE(sched_.Cancel("c2").ok());
  Take();
  ListFilter f;
  f.queue = "q";
  f.page_size = 100;
  auto r = sched_.RetryTasks(f);
  Check();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids, (V{"c1", "c2"}));
  EXPECT_EQ(r->skipped, 1);
  EXPECT_EQ(r->skipped_reason,
            "task \"once\" has used all 1 of its attempts; reset it for a fresh budget");
  EXPECT_NE(State("c1"), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(State("live"), v1::TASK_STATE_PENDING) << "not FAILED or CANCELLED: not selected";
  EXPECT_EQ(State("once"), v1::TASK_STATE_FAILED);
}

TEST_F(QueueControlsTest, AnUndrainedAgentTakesWorkAgain) {
  v1::Hello h;
  h.set_agent_id("a");
  h.set_slots(4);
  h.set_undrain(true);
  const uint64_t a = ConnectHello(h);
  ASSERT_TRUE(sched_.Drain("a").ok());
  Take();
  SubmitOk(Spec("t1"));
  EXPECT_TRUE(Assigned(Take(), a).empty());
  auto u = sched_.Undrain("a");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FALSE((*u)->draining);
  Effects fx = Take();
  ASSERT_FALSE(fx.messages.empty());
  EXPECT_TRUE(fx.messages[0].msg.has_undrain()) << "told before its next work";
  EXPECT_EQ(Assigned(fx, a), V{"t1"});
  EXPECT_TRUE(sched_.Undrain("a").ok()) << "undraining an active agent is no error";

  // An agent that drains to stop stays draining.
  v1::AgentMessage m;
  m.mutable_draining()->set_exiting(true);
  sched_.OnAgentMessage(a, m);
  EXPECT_EQ(sched_.Undrain("a").status().message(),
            "agent \"a\" is draining to stop (it was told to exit) and cannot be undrained");
  // An agent that cannot be told.
  const uint64_t old = Connect("old", 1);
  (void)old;
  ASSERT_TRUE(sched_.Drain("old").ok());
  EXPECT_EQ(sched_.Undrain("old").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sched_.Undrain("nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.Undrain("").status().code(), absl::StatusCode::kInvalidArgument);
  Check();
}

class UniqueKeyTest : public SchedulerTest {
 protected:
  static v1::TaskSpec Unique(const std::string& id, const std::string& key,
                             absl::Duration ttl = absl::Seconds(60)) {
    v1::TaskSpec s = Spec(id);
    s.set_unique_key(key);
    *s.mutable_unique_ttl() = ToProto(ttl);
    return s;
  }
};

TEST_F(UniqueKeyTest, ASecondSubmitWithinTheTtlReturnsTheFirstTask) {
  ASSERT_TRUE(Submit({Unique("first", "k")}).ok());
  clock_.Advance(absl::Seconds(30));
  auto r = Submit({Unique("second", "k"), Unique("", "k2")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), "first") << "whatever its id and spec";
  EXPECT_EQ(sched_.Find("second"), nullptr);
  EXPECT_EQ(sched_.task_count(), 2u);
  // Another queue has keys of its own.
  v1::TaskSpec elsewhere = Unique("third", "k");
  elsewhere.set_queue("other");
  ASSERT_TRUE(Submit({elsewhere}).ok());
  EXPECT_NE(sched_.Find("third"), nullptr);
  // Held until its time is up.
  Advance(absl::Seconds(29));
  r = Submit({Unique("fourth", "k")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0]->id(), "first");
  Advance(absl::Seconds(1));
  r = Submit({Unique("fifth", "k")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0]->id(), "fifth") << "60s after the first submit the key is free";
}

TEST_F(UniqueKeyTest, SuccessOrCancelLetsGoOfTheKeyAndAFailureKeepsIt) {
  v1::TaskSpec fails = Unique("fails", "kf");
  fails.set_max_attempts(1);
  ASSERT_TRUE(Submit({Unique("ok", "ko"), fails, Unique("cancelled", "kc")}).ok());
  const uint64_t conn = Connect("a1", 2);
  ASSERT_THAT(Assigned(Take(), conn), ::testing::ElementsAre("ok", "fails"));
  ASSERT_TRUE(sched_.Cancel("cancelled").ok());  // still PENDING: both slots are taken
  Check();
  Accept(conn, "ok", 1);
  Accept(conn, "fails", 1);
  Result(conn, "ok", 1, v1::OUTCOME_SUCCEEDED);
  Result(conn, "fails", 1, v1::OUTCOME_FAILED, 3);
  ASSERT_EQ(State("cancelled"), v1::TASK_STATE_CANCELLED);
  ASSERT_EQ(State("ok"), v1::TASK_STATE_SUCCEEDED);
  ASSERT_EQ(State("fails"), v1::TASK_STATE_FAILED);
  auto r = Submit({Unique("ok2", "ko"), Unique("fails2", "kf"), Unique("cancelled2", "kc")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), "ok2") << "free once its holder succeeded";
  EXPECT_EQ((*r)[1]->id(), "fails") << "a failed task keeps its key for the ttl";
  EXPECT_EQ((*r)[2]->id(), "cancelled2") << "free once its holder was cancelled";
  // A retry of the cancelled task does not take the key back from its new
  // holder; and the release is stored: a restart sees the new holders.
  ASSERT_TRUE(sched_.Retry("cancelled").ok());
  Check();
  std::unique_ptr<Scheduler> restored = Restarted();
  r = restored->Submit({Unique("ok3", "ko"), Unique("cancelled3", "kc")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), "ok2");
  EXPECT_EQ((*r)[1]->id(), "cancelled2");
}

TEST_F(UniqueKeyTest, AtTtlKeepsTheKeyAfterSuccessAndACancelAcrossARestart) {
  v1::TaskSpec kept = Unique("kept", "k");
  kept.set_unique_release(v1::UNIQUE_RELEASE_AT_TTL);
  ASSERT_TRUE(Submit({kept}).ok());
  ASSERT_TRUE(sched_.Cancel("kept").ok());
  Check();
  auto r = Submit({Unique("second", "k")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0]->id(), "kept");
  std::unique_ptr<Scheduler> restored = Restarted();
  r = restored->Submit({Unique("third", "k")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0]->id(), "kept");
}

TEST_F(UniqueKeyTest, TheTtlCountsFromNotBefore) {
  v1::TaskSpec later = Unique("later", "k", absl::Seconds(60));
  SetTimestamp(clock_.Now() + absl::Minutes(10), later.mutable_not_before());
  ASSERT_TRUE(Submit({later}).ok());
  Advance(absl::Minutes(10) + absl::Seconds(59));
  auto r = Submit({Unique("second", "k")});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0]->id(), "later") << "held until not_before + ttl, not submit + ttl";
  EXPECT_EQ(UniqueUntil(Task("later")), FromProto(later.not_before()) + absl::Seconds(60));
}

TEST_F(UniqueKeyTest, RefuseFailsNamingTheHolderAndStoresNothing) {
  ASSERT_TRUE(Submit({Unique("holder", "k")}).ok());
  v1::TaskSpec dup = Unique("dup", "k");
  dup.set_unique_refuse(true);
  const size_t before = sched_.task_count();
  auto r = Submit({Unique("fine", "other"), dup});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(std::string(r.status().message()),
            "tasks[1].unique_key \"k\" is held in queue default by task \"holder\" (PENDING) "
            "until 2023-11-14T22:14:20+00:00");
  EXPECT_EQ(sched_.task_count(), before) << "all or nothing";
  // Resubmitting the holder itself by its id is still idempotent.
  v1::TaskSpec again = Unique("holder", "k");
  ASSERT_TRUE(Submit({again}).ok());
}

TEST_F(UniqueKeyTest, ARestartKeepsTheKeysHeld) {
  ASSERT_TRUE(Submit({Unique("first", "k", absl::Seconds(10))}).ok());
  ASSERT_TRUE(Submit({Unique("old", "gone", absl::Seconds(1))}).ok());
  clock_.Advance(absl::Seconds(5));
  std::unique_ptr<Scheduler> restored = Restarted();
  auto r = restored->Submit({Unique("again", "k"), Unique("new", "gone")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), "first");
  EXPECT_EQ((*r)[1]->id(), "new") << "a key whose time was up before the restart is free";
}

TEST_F(UniqueKeyTest, BadUniqueKeysAreRefused) {
  auto message = [&](std::vector<v1::TaskSpec> specs) {
    const size_t before = sched_.task_count();
    auto r = Submit(std::move(specs));
    EXPECT_EQ(sched_.task_count(), before);
    return std::string(r.status().message());
  };
  EXPECT_EQ(message({Unique("a", "k"), Unique("b", "k")}),
            "tasks[1].unique_key \"k\" repeats tasks[0].unique_key in queue default");
  EXPECT_EQ(message({Unique("a", "k", absl::ZeroDuration())}),
            "tasks[0].unique_ttl is 0; with unique_key it must be 1s to 720h");
  EXPECT_EQ(message({Unique("a", "k", absl::Hours(24 * 31))}),
            "tasks[0].unique_ttl is 744h; with unique_key it must be 1s to 720h");
  EXPECT_EQ(message({Unique("a", "bad key")}).substr(0, 20), "tasks[0].unique_key ");
  v1::TaskSpec ttl_only = Spec("a");
  *ttl_only.mutable_unique_ttl() = ToProto(absl::Seconds(5));
  EXPECT_EQ(message({ttl_only}), "tasks[0].unique_ttl needs unique_key");
  v1::TaskSpec both = Unique("a", "k");
  both.set_merge_key("m");
  EXPECT_EQ(message({both}),
            "tasks[0].unique_key cannot go with merge_key: a merge key already makes one task "
            "of many");
  v1::TaskSpec bad_release = Unique("a", "k");
  bad_release.set_unique_release(static_cast<v1::UniqueRelease>(7));
  EXPECT_EQ(message({bad_release}), "tasks[0].unique_release is unknown (7)");
  v1::TaskSpec release_only = Spec("a");
  release_only.set_unique_release(v1::UNIQUE_RELEASE_AT_TTL);
  EXPECT_EQ(message({release_only}), "tasks[0].unique_release needs unique_key");
  v1::TaskSpec refuse_only = Spec("a");
  refuse_only.set_unique_refuse(true);
  EXPECT_EQ(message({refuse_only}), "tasks[0].unique_refuse needs unique_key");
  EXPECT_EQ(sched_.SubmitJob("j", {Unique("a", "k")}).status().message(),
            "tasks[0].unique_key is set: a job is unique by its id, not its tasks by key");
}

}  // namespace
}  // namespace taskgrid::core
