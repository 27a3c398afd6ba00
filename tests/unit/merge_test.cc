// Delivery by merge key in the core (scheduler/core/task_keys.h): submits with
// one key gather into one task until it is dispatched; always vs once
// decide its fire time, on the fake clock.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

class MergeTest : public SchedulerTest {
 protected:
  v1::TaskSpec Keyed(const std::string& key, const std::string& payload, absl::Duration delay,
                     v1::MergeUpdate update = v1::MERGE_UPDATE_ALWAYS,
                     const std::string& queue = "hooks") {
    v1::TaskSpec s;
    s.set_queue(queue);
    s.set_merge_key(key);
    s.set_merge_update(update);
    s.set_payload(payload);
    s.add_steps()->mutable_builtin()->set_name("noop");
    if (delay > absl::ZeroDuration()) *s.mutable_not_before() = ToProto(clock_.Now() + delay);
    return s;
  }
  std::string SubmitKeyed(const v1::TaskSpec& s) {
    auto r = Submit({s});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0]->id() : "";
  }
  std::vector<std::string> Payloads(const std::string& id) {
    const v1::Task t = Describe(id);
    return {t.merged().payloads().begin(), t.merged().payloads().end()};
  }
};

using V = std::vector<std::string>;

TEST_F(MergeTest, SubmitsWithOneKeyGatherIntoOneTaskWithEveryPayloadInOrder) {
  const std::string id = SubmitKeyed(Keyed("user-7", "a", absl::Seconds(30)));
  const int64_t revision = sched_.last_revision();
  for (const std::string p : {"b", "c", "d"}) {
    EXPECT_EQ(SubmitKeyed(Keyed("user-7", p, absl::Seconds(30))), id) << "joined, no new task";
  }
  EXPECT_EQ(sched_.task_count(), 1u);
  EXPECT_EQ(Payloads(id), (V{"a", "b", "c", "d"}));
  EXPECT_EQ(sched_.last_revision(), revision + 3) << "each merge is an event for watchers";
  // Another key, another queue: tasks of their own.
  const std::string other = SubmitKeyed(Keyed("user-8", "x", absl::Seconds(30)));
  const std::string elsewhere =
      SubmitKeyed(Keyed("user-7", "y", absl::Seconds(30), v1::MERGE_UPDATE_ALWAYS, "mail"));
  EXPECT_NE(other, id);
  EXPECT_NE(elsewhere, id);
  EXPECT_EQ(sched_.task_count(), 3u);

  // Delivered: the agent gets every payload.
  Advance(absl::Seconds(30));
  const uint64_t conn = Connect("a1", 10);
  const Effects fx = Take();
  bool found = false;
  for (const Outgoing& o : fx.messages) {
    if (!o.msg.has_assign()) continue;
    for (const v1::Assignment& a : o.msg.assign().tasks()) {
      if (a.task_id() != id) continue;
      found = true;
      EXPECT_EQ(V(a.merged_payloads().begin(), a.merged_payloads().end()), (V{"a", "b", "c", "d"}));
      EXPECT_EQ(a.payload(), "a");
    }
  }
  EXPECT_TRUE(found);
  // Dispatched: the next submit with the key starts a new task.
  Accept(conn, id, 1);
  const std::string next = SubmitKeyed(Keyed("user-7", "e", absl::Seconds(30)));
  EXPECT_NE(next, id);
  EXPECT_EQ(Payloads(next), V{"e"});
}

TEST_F(MergeTest, AlwaysMovesTheFireTimeToTheNewestSubmit) {
  const absl::Time t0 = clock_.Now();
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Seconds(10)));
  EXPECT_EQ(State(id), v1::TASK_STATE_SCHEDULED);
  Advance(absl::Seconds(8));
  SubmitKeyed(Keyed("k", "2", absl::Seconds(10)));  // fires at t0 + 18 now
  EXPECT_EQ(FromProto(Describe(id).merged().fire_time()), t0 + absl::Seconds(18));
  Advance(absl::Seconds(8));  // t0 + 16: the first fire time is long past
  EXPECT_EQ(State(id), v1::TASK_STATE_SCHEDULED);
  Advance(absl::Seconds(2));  // t0 + 18
  EXPECT_EQ(State(id), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Payloads(id), (V{"1", "2"}));
}

TEST_F(MergeTest, OnceKeepsTheFirstFireTime) {
  const absl::Time t0 = clock_.Now();
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Seconds(10), v1::MERGE_UPDATE_ONCE));
  Advance(absl::Seconds(8));
  SubmitKeyed(Keyed("k", "2", absl::Seconds(10), v1::MERGE_UPDATE_ONCE));
  EXPECT_EQ(FromProto(Describe(id).merged().fire_time()), t0 + absl::Seconds(10));
  Advance(absl::Seconds(2));  // t0 + 10
  EXPECT_EQ(State(id), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Payloads(id), (V{"1", "2"}));
}

TEST_F(MergeTest, ASubmitWithNoDelayFiresAnAlwaysTaskAtOnce) {
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Hours(1)));
  SubmitKeyed(Keyed("k", "2", absl::ZeroDuration()));
  EXPECT_EQ(State(id), v1::TASK_STATE_PENDING);
  // Due already: later submits still join it, but no longer move it.
  SubmitKeyed(Keyed("k", "3", absl::Hours(1)));
  EXPECT_EQ(State(id), v1::TASK_STATE_PENDING);
  EXPECT_EQ(Payloads(id), (V{"1", "2", "3"}));
}

TEST_F(MergeTest, OneBatchMayMakeAndJoinAKeysTask) {
  auto r = Submit({Keyed("k", "1", absl::Seconds(5)), Keyed("k", "2", absl::Seconds(5)),
                   Keyed("j", "x", absl::Seconds(5))});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0], (*r)[1]);
  EXPECT_NE((*r)[0], (*r)[2]);
  EXPECT_EQ(Payloads((*r)[0]->id()), (V{"1", "2"}));
}

TEST_F(MergeTest, ASubmitWithOtherStepsIsRefusedInsteadOfDeliveredElsewhere) {
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Seconds(5)));
  v1::TaskSpec other = Keyed("k", "2", absl::Seconds(5));
  other.mutable_steps(0)->mutable_builtin()->set_name("echo");
  const int64_t revision = sched_.last_revision();
  auto r = Submit({other});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("tasks[0].steps differ from those of task \"", id,
                         "\", which gathers merge key \"k\" in queue hooks: a merge key "
                         "delivers to one place; use another key for other steps"));
  EXPECT_EQ(Payloads(id), (V{"1"}));
  EXPECT_EQ(sched_.last_revision(), revision) << "nothing changed";
  // Within one batch too, against the spec that makes the key's task.
  r = Submit({Keyed("n", "1", absl::Seconds(5)), Keyed("n", "2", absl::Seconds(5)), other});
  ASSERT_FALSE(r.ok());
  other.set_merge_key("n");
  r = Submit({Keyed("n", "1", absl::Seconds(5)), other});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              ::testing::HasSubstr("tasks[1].steps differ from those of tasks[0]"));
  EXPECT_EQ(sched_.task_count(), 1u);
  // The same steps with other settings (a payload, a delay) still join.
  EXPECT_EQ(SubmitKeyed(Keyed("k", "3", absl::Seconds(50), v1::MERGE_UPDATE_ONCE)), id);
}

TEST_F(MergeTest, LimitsAreCheckedBeforeAnythingChanges) {
  SchedulerOptions o = Options();
  o.max_merged_payloads = 3;
  o.max_merged_payload_bytes = 10;
  Scheduler small(&clock_, o);
  ASSERT_TRUE(small.Submit({Keyed("k", "12345", absl::Seconds(5))}).ok());
  // Over the bytes (5 + 6), and the whole batch is refused.
  auto too_big = small.Submit(
      {Keyed("other", "fine", absl::Seconds(5)), Keyed("k", "123456", absl::Seconds(5))});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("--max_merged_payload_bytes"), std::string::npos);
  EXPECT_EQ(small.task_count(), 1u);
  ASSERT_TRUE(small.Submit({Keyed("k", "1", absl::Seconds(5))}).ok());
  ASSERT_TRUE(small.Submit({Keyed("k", "2", absl::Seconds(5))}).ok());
  auto too_many = small.Submit({Keyed("k", "3", absl::Seconds(5))});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("--max_merged_payloads"), std::string::npos);
  v1::Task t;
  small.Describe(*small.List({}).tasks[0], &t);
  EXPECT_EQ(t.merged().payloads_size(), 3);
  EXPECT_TRUE(small.CheckInvariants().ok()) << small.CheckInvariants();
}

TEST_F(MergeTest, BadMergeKeysAreRefused) {
  v1::TaskSpec bad = Keyed("has space", "x", absl::Seconds(1));
  EXPECT_EQ(Submit({bad}).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TaskSpec with_deps = Keyed("k", "x", absl::Seconds(1));
  with_deps.add_depends_on("something");
  EXPECT_EQ(Submit({with_deps}).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TaskSpec update_only = Spec("u");
  update_only.set_merge_update(v1::MERGE_UPDATE_ONCE);
  EXPECT_EQ(Submit({update_only}).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TaskSpec in_job = Keyed("k", "x", absl::Seconds(1));
  EXPECT_EQ(sched_.SubmitJob("j", {in_job}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.task_count(), 0u);
}

TEST_F(MergeTest, DeleteByMergeKeyCancelsTheWaitingTask) {
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Seconds(30)));
  SubmitKeyed(Keyed("k", "2", absl::Seconds(30)));
  EXPECT_EQ(sched_.DeleteByMergeKey("hooks", "nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.DeleteByMergeKey("hooks", "bad key").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto deleted = sched_.DeleteByMergeKey("hooks", "k");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  Check();
  EXPECT_EQ(State(id), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task(id).reason, "deleted by merge key k");
  EXPECT_EQ(sched_.DeleteByMergeKey("hooks", "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(SubmitKeyed(Keyed("k", "3", absl::Seconds(30))), id) << "a new task for the key";
}

// A first submit without not_before fires at its submit time, to the
// microsecond: what `taskgridctl get` compares to tell whether a later
// submit moved the fire time.
TEST_F(MergeTest, WithoutNotBeforeTheFireTimeIsTheSubmitTime) {
  clock_.Advance(absl::Microseconds(7));
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::ZeroDuration(), v1::MERGE_UPDATE_ONCE));
  v1::Task t;
  sched_.Describe(*sched_.Find(id), &t);
  ASSERT_TRUE(t.has_merged());
  EXPECT_EQ(FromProto(t.merged().fire_time()), FromProto(t.create_time()));
}

TEST_F(MergeTest, AGatheringTaskSurvivesARestartAndKeepsGathering) {
  const absl::Time t0 = clock_.Now();
  const std::string id = SubmitKeyed(Keyed("k", "1", absl::Seconds(10)));
  SubmitKeyed(Keyed("k", "2", absl::Seconds(20)));
  std::unique_ptr<Scheduler> after = Restarted();
  auto r = after->Submit({Keyed("k", "3", absl::Seconds(5), v1::MERGE_UPDATE_ONCE)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0]->id(), id);
  v1::Task t;
  after->Describe(*after->Find(id), &t);
  EXPECT_EQ(V(t.merged().payloads().begin(), t.merged().payloads().end()), (V{"1", "2", "3"}));
  EXPECT_EQ(FromProto(t.merged().fire_time()), t0 + absl::Seconds(20));
  EXPECT_TRUE(after->CheckInvariants().ok()) << after->CheckInvariants();
}

}  // namespace
}  // namespace taskgrid::core
