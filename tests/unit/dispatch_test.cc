// What dispatching costs: it must not grow with placement classes that no
// agent can take (tasks pinned to agents that are gone, labels nobody
// has), and classes with nothing ready must not linger. Measured by the
// Scheduler's own count of placement attempts, never by a clock.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class DispatchTest : public SchedulerTest {
 protected:
  static v1::TaskSpec Pinned(const std::string& id, const std::string& agent) {
    v1::TaskSpec s = Spec(id);
    s.mutable_placement()->add_agent_ids(agent);
    return s;
  }
  static v1::TaskSpec Labelled(const std::string& id, const std::string& k, const std::string& v) {
    v1::TaskSpec s = Spec(id);
    (*s.mutable_placement()->mutable_required_labels())[k] = v;
    return s;
  }
  // `n` tasks, each pinned to an agent of its own that never connected.
  void SubmitPinnedToAbsentAgents(int n) {
    for (int b = 0; b < n; b += 1000) {
      std::vector<v1::TaskSpec> specs;
      for (int i = b; i < b + 1000 && i < n; ++i) {
        specs.push_back(Pinned("p" + std::to_string(i), "ghost-" + std::to_string(i)));
      }
      ASSERT_TRUE(sched_.Submit(std::move(specs)).ok());
    }
    Check();
  }
};

TEST_F(DispatchTest, ClassesNoAgentCanTakeCostNothingOnLaterTicks) {
  SubmitPinnedToAbsentAgents(10'000);
  const uint64_t conn = Connect("real", 4);
  Advance(absl::Milliseconds(10));
  const int64_t settled = sched_.placement_attempts();
  for (int i = 0; i < 100; ++i) Advance(absl::Milliseconds(10));
  EXPECT_EQ(sched_.placement_attempts(), settled) << "idle ticks looked at unplaceable classes";
  // Work the live agent can take is placed without looking at them either.
  SubmitOk(Spec("plain"));
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("plain"));
  EXPECT_LE(sched_.placement_attempts() - settled, 2);
  Accept(conn, "plain", 1);
  Result(conn, "plain", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_LE(sched_.placement_attempts() - settled, 3);
}

TEST_F(DispatchTest, AnAgentThatConnectsTakesTheTasksPinnedToIt) {
  SubmitPinnedToAbsentAgents(1'000);
  Connect("real", 4);
  Advance(absl::Milliseconds(10));
  const uint64_t g = Connect("ghost-7", 1);
  EXPECT_THAT(Assigned(Take(), g), ElementsAre("p7"));
  EXPECT_EQ(State("p8"), v1::TASK_STATE_PENDING);
}

TEST_F(DispatchTest, ALabelNobodyHasIsPlacedWhenAnAgentWithItConnects) {
  SubmitOk(Labelled("gpu-task", "gpu", "1"));
  const uint64_t cpu = Connect("cpu", 2);
  EXPECT_THAT(Assigned(Take(), cpu), IsEmpty());
  const int64_t settled = sched_.placement_attempts();
  for (int i = 0; i < 10; ++i) Advance(absl::Milliseconds(10));
  EXPECT_EQ(sched_.placement_attempts(), settled);
  const uint64_t gpu = Connect("gpu", 1, {{"gpu", "1"}});
  EXPECT_THAT(Assigned(Take(), gpu), ElementsAre("gpu-task"));
}

TEST_F(DispatchTest, AnAgentThatReconnectsWithoutDrainingTakesWorkAgain) {
  SubmitOk(Pinned("t", "a1"));
  const uint64_t first = Connect("a1", 1);
  ASSERT_THAT(Assigned(Take(), first), ElementsAre("t"));
  Result(first, "t", 1, v1::OUTCOME_SUCCEEDED);
  ASSERT_TRUE(sched_.Drain("a1").ok());
  SubmitOk(Pinned("u", "a1"));
  EXPECT_THAT(Assigned(Take(), first), IsEmpty());
  for (int i = 0; i < 5; ++i) Advance(absl::Milliseconds(10));
  sched_.Disconnect(first);
  const uint64_t again = Connect("a1", 1);
  EXPECT_THAT(Assigned(Take(), again), ElementsAre("u"));
}

TEST_F(DispatchTest, ABusyAgentsClassIsPlacedWhenASlotFrees) {
  SubmitOk(Pinned("t1", "a1"));
  SubmitOk(Pinned("t2", "a1"));
  const uint64_t conn = Connect("a1", 1);
  ASSERT_THAT(Assigned(Take(), conn), ElementsAre("t1"));
  for (int i = 0; i < 5; ++i) Advance(absl::Milliseconds(10));
  Accept(conn, "t1", 1);
  Result(conn, "t1", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("t2"));
}

TEST_F(DispatchTest, ClassesWithNothingReadyAreForgotten) {
  SubmitPinnedToAbsentAgents(1'000);
  EXPECT_EQ(sched_.ready_classes(), 1'000u);
  for (int i = 0; i < 1'000; ++i) ASSERT_TRUE(sched_.Cancel("p" + std::to_string(i)).ok());
  Check();
  EXPECT_EQ(sched_.ready_classes(), 0u);
  // And come back when something is ready again.
  ASSERT_TRUE(sched_.Reset("p3").ok());
  EXPECT_EQ(sched_.ready_classes(), 1u);
  const uint64_t conn = Connect("ghost-3", 1);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("p3"));
  EXPECT_EQ(sched_.ready_classes(), 0u);
}

TEST_F(DispatchTest, RecordsOfOneClassShareItsName) {
  SubmitOk(Spec("a"));
  SubmitOk(Spec("b"));
  SubmitOk(Pinned("c", "a1"));
  ASSERT_NE(Task("a").class_name, nullptr);
  // One string for the class, not one per task.
  EXPECT_EQ(Task("a").class_name.get(), Task("b").class_name.get());
  EXPECT_NE(Task("a").class_name.get(), Task("c").class_name.get());
  EXPECT_NE(Task("a").placement_class(), Task("c").placement_class());
  EXPECT_EQ(sched_.class_names(), 2u);
  // A record read back whole from disk, or restored, joins the same one.
  auto restored = Restarted();
  EXPECT_EQ(restored->Find("a")->class_name.get(), restored->Find("b")->class_name.get());
  EXPECT_EQ(restored->class_names(), 2u);
}

TEST_F(DispatchTest, PriorityOrderHoldsAcrossClasses) {
  SubmitOk(Labelled("low", "zone", "a"));
  SubmitOk(Spec("mid", 5));
  SubmitOk(Labelled("high", "zone", "a"));
  ASSERT_TRUE(sched_.Pause("high").ok());
  ASSERT_TRUE(sched_.Resume("high").ok());
  v1::TaskSpec top = Labelled("top", "zone", "a");
  top.set_priority(9);
  SubmitOk(top);
  const uint64_t conn = Connect("a1", 1, {{"zone", "a"}});
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("top"));
  Result(conn, "top", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("mid"));
  Result(conn, "mid", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("low"));
  Result(conn, "low", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("high"));
}

TEST_F(DispatchTest, AFullFleetLooksOnlyWhereRoomCameBack) {
  // 500 agents of 2 cpus, three queues by weight, tasks of two sizes:
  // more work than room.
  for (const std::string q : {"a", "b", "c"}) {
    v1::SetQueueWeightRequest req;
    req.set_queue(q);
    req.set_weight(1);
    ASSERT_TRUE(sched_.SetQueueWeight(req).ok());
  }
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 1'500; ++i) {
    v1::TaskSpec s = Needs("t" + std::to_string(i), i % 2 == 0 ? "cpu=1" : "cpu=2");
    s.set_queue(i % 3 == 0 ? "a" : i % 3 == 1 ? "b" : "c");
    specs.push_back(std::move(s));
  }
  ASSERT_TRUE(Submit(std::move(specs)).ok());
  constexpr int kAgents = 500;
  for (int i = 0; i < kAgents; ++i) {
    v1::Hello h;
    h.set_agent_id("a" + std::to_string(i));
    h.set_slots(4);
    (*h.mutable_resources())["cpu"] = "2";
    ASSERT_TRUE(sched_.Connect(static_cast<uint64_t>(1000 + i), h).ok());
  }
  Take();
  EXPECT_GT(sched_.Stats("a").front().counts().at("PENDING"), 0);
  // Ticks with nothing new look at nothing.
  Advance(absl::Milliseconds(10));
  const int64_t before = sched_.agents_examined();
  for (int i = 0; i < 20; ++i) Advance(absl::Milliseconds(10));
  EXPECT_EQ(sched_.agents_examined(), before);
  // An attempt that ends gives its room to the next task, and the
  // placement looks at that agent alone: once for each of the six classes
  // and once more per task it starts, not at the 500.
  const AgentRecord& first = Agent("a0");
  ASSERT_FALSE(first.tasks.empty());
  const std::string done = *first.tasks.begin();
  Result(1000, done, 1, v1::OUTCOME_SUCCEEDED);
  const size_t placed = Assigned(Take(), 1000).size();
  EXPECT_GE(placed, 1u);
  EXPECT_LE(sched_.agents_examined() - before, 6 + static_cast<int64_t>(placed));
}

}  // namespace
}  // namespace taskgrid::core
