// Fair share between queues: once a queue has a weight, the next task
// comes from the queue holding the least of the agents' capacity for its
// weight (dominant share over slots and resources). Every step runs the
// invariant checker (slots and resources held by queue included).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/resources.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class FairShareTest : public SchedulerTest {
 protected:
  void SetWeight(const std::string& queue, int weight) {
    v1::SetQueueWeightRequest req;
    req.set_queue(queue);
    req.set_weight(weight);
    ASSERT_TRUE(sched_.SetQueueWeight(req).ok());
    Check();
  }

  static v1::TaskSpec In(const std::string& queue, const std::string& id,
                         const std::string& resources = "", int priority = 0) {
    v1::TaskSpec s = resources.empty() ? Spec(id) : Needs(id, resources);
    s.set_priority(priority);
    s.set_queue(queue);
    return s;
  }

  // Runs the cluster for `finishes` results on `conn`, the oldest running
  // attempt finishing first; returns, per queue, the running attempts
  // summed over every step after `warmup` finishes.
  std::map<std::string, double> Run(uint64_t conn, int warmup, int finishes) {
    std::map<std::string, double> sum;
    for (int i = 0; i < warmup + finishes; ++i) {
      // The invariant checker every 50 steps: after each one it would cost
      // O(tasks) per step.
      if (i % 50 == 0) Check();
      for (const std::string& id : Assigned(sched_.TakeEffects(), conn)) running_.push_back(id);
      if (i >= warmup) {
        for (const std::string& id : running_) sum[Task(id).queue()] += 1;
      }
      if (running_.empty()) break;
      const std::string id = running_.front();
      running_.pop_front();
      v1::AgentMessage m;
      m.mutable_result()->set_task_id(id);
      m.mutable_result()->set_attempt(Task(id).attempt);
      m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
      sched_.OnAgentMessage(conn, m);
    }
    Check();
    return sum;
  }

  std::deque<std::string> running_;
};

TEST_F(FairShareTest, ThreeQueuesOfWeights123ShareASaturatedPool) {
  SetWeight("w1", 1);
  SetWeight("w2", 2);
  SetWeight("w3", 3);
  // w1 submits first and floods: without weights it would take every slot.
  for (const std::string q : {"w1", "w2", "w3"}) {
    std::vector<v1::TaskSpec> specs;
    for (int i = 0; i < 400; ++i) specs.push_back(In(q, q + "-" + std::to_string(i)));
    ASSERT_TRUE(Submit(std::move(specs)).ok());
  }
  const uint64_t conn = Connect("pool", 30);
  std::map<std::string, double> held = Run(conn, /*warmup=*/150, /*finishes=*/600);
  const double total = held["w1"] + held["w2"] + held["w3"];
  ASSERT_GT(total, 0);
  EXPECT_NEAR(held["w1"] / total, 1.0 / 6, 0.05 / 6);
  EXPECT_NEAR(held["w2"] / total, 2.0 / 6, 0.05 * 2 / 6);
  EXPECT_NEAR(held["w3"] / total, 3.0 / 6, 0.05 * 3 / 6);

  // Stats say the same: each queue's share of the pool against its fair share.
  for (const auto& [q, fair] :
       std::map<std::string, double>{{"w1", 1.0 / 6}, {"w2", 2.0 / 6}, {"w3", 3.0 / 6}}) {
    const v1::QueueStats st = sched_.Stats(q).front();
    EXPECT_DOUBLE_EQ(st.fair_share(), fair) << q;
    EXPECT_NEAR(st.share(), fair, 1.5 / 30) << q;
    EXPECT_EQ(st.settings().weight(), q == "w1" ? 1 : q == "w2" ? 2 : 3);
  }
}

TEST_F(FairShareTest, DominantSharesOfDifferentResourcesComeOutEven) {
  SetWeight("cpu-heavy", 1);
  SetWeight("mem-heavy", 1);
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 400; ++i) {
    specs.push_back(In("cpu-heavy", "c" + std::to_string(i), "cpu=2,memory=1GiB"));
    specs.push_back(In("mem-heavy", "m" + std::to_string(i), "cpu=1,memory=3GiB"));
  }
  ASSERT_TRUE(Submit(std::move(specs)).ok());
  const uint64_t conn = ConnectOffering("big", 1000, "cpu=60,memory=60GiB");
  std::map<std::string, double> held = Run(conn, /*warmup=*/100, /*finishes=*/400);
  // Averaged over the run: cpu-heavy's cpu share against mem-heavy's
  // memory share.
  const double cpu_share = held["cpu-heavy"] * 2 / 60;
  const double mem_share = held["mem-heavy"] * 3 / 60;
  EXPECT_NEAR(cpu_share / (cpu_share + mem_share), 0.5, 0.025);
}

TEST_F(FairShareTest, PriorityOrdersTasksWithinAQueueOnly) {
  // Without weights, priority orders every queue's tasks together.
  SubmitOk(In("a", "a-low", "", 0));
  SubmitOk(In("b", "b-high", "", 10));
  uint64_t conn = Connect("one", 1);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("b-high"));
  Result(conn, "b-high", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("a-low"));
  Result(conn, "a-low", 1, v1::OUTCOME_SUCCEEDED);

  // With weights, a queue holding its share waits for the others, however
  // high its tasks' priority.
  SetWeight("a", 1);
  SetWeight("b", 1);
  const uint64_t two = Connect("two", 1);
  ASSERT_TRUE(Submit({In("b", "b-1", "", 10), In("b", "b-2", "", 10), In("a", "a-1", "", 0)}).ok());
  Effects fx = Take();
  std::vector<std::string> started = Assigned(fx, conn);
  for (const std::string& id : Assigned(fx, two)) started.push_back(id);
  // Two slots: one each, b's best first.
  EXPECT_THAT(started, testing::UnorderedElementsAre("b-1", "a-1"));
  EXPECT_EQ(State("b-2"), v1::TASK_STATE_PENDING);
}

TEST_F(FairShareTest, AQueueOfWeight0RunsOnlyWhenNoOtherWaits) {
  SetWeight("backfill", 0);
  for (int i = 0; i < 4; ++i) SubmitOk(In("backfill", "f" + std::to_string(i)));
  const uint64_t conn = Connect("a", 2);
  // Nothing else waits: backfill takes the pool.
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("f0", "f1"));
  SubmitOk(In("main", "m0"));
  SubmitOk(In("main", "m1"));
  EXPECT_THAT(Assigned(Take(), conn), IsEmpty());
  // Each freed slot goes to main while main waits, older backfill or not.
  Result(conn, "f0", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("m0"));
  Result(conn, "f1", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("m1"));
  Result(conn, "m0", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_THAT(Assigned(Take(), conn), ElementsAre("f2"));
}

TEST_F(FairShareTest, WeightsAreCheckedStoredAndRemoved) {
  v1::SetQueueWeightRequest req;
  req.set_queue("q");
  req.set_weight(-1);
  EXPECT_EQ(sched_.SetQueueWeight(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_weight(10'001);
  absl::StatusOr<v1::QueueStats> st = sched_.SetQueueWeight(req);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), testing::HasSubstr("weight: 10001"));
  EXPECT_FALSE(sched_.Stats("q").front().has_settings());
  SetWeight("q", 3);
  EXPECT_EQ(sched_.Stats("q").front().settings().weight(), 3);
  EXPECT_EQ(Take().batch.queues.size(), 1u);  // stored
  v1::SetQueueWeightRequest clear;
  clear.set_queue("q");
  st = sched_.SetQueueWeight(clear);
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->has_settings());
  EXPECT_EQ(st->fair_share(), 0);  // no queue has a weight: no sharing
}

}  // namespace
}  // namespace taskgrid::core
