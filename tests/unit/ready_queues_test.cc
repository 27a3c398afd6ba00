// ReadyQueues alone, without the Scheduler: a host that stands in for it
// (it starts a task by taking it out of the ready queues and holding its
// slot, as the Scheduler's transition does), real QueueControls and an
// AgentRegistry of agents the test connects. The invariants are checked
// after every step against what the test itself counts.
#include "scheduler/core/ready_queues.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/resources.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class ReadyQueuesTest : public ::testing::Test, public ReadyQueues::Host {
 protected:
  // --- The host. ---
  QueueControls::Gate GateOf(const std::string& queue) const override {
    return controls_.Check(queue, 0, absl::ZeroDuration());
  }
  absl::flat_hash_set<std::string> ReplicaAgents(const TaskRecord&) const override { return {}; }
  void DispatchGang(TaskRecord&, const std::vector<AgentRecord*>&,
                    std::vector<std::string>*) override {
    ADD_FAILURE() << "no gang here";
  }
  void StartOn(TaskRecord& t, const Resources& need, AgentRecord& a) override {
    // `need` is the class's: taken before the class may go with its task.
    rq_.TakeResources(a, t.queue(), SlotsOf(t.spec.placement()), need);
    rq_.Remove(t);
    started_.push_back(t.id() + "@" + a.id);
    on_agent_[t.id()] = a.id;
  }

  // A PENDING task: priority, queue, resources ("cpu=2"), a required label.
  TaskRecord& Add(const std::string& id, const std::string& queue, int32_t priority = 0,
                  const std::string& resources = "", const std::string& label = "") {
    auto t = std::make_unique<TaskRecord>();
    t->spec.set_id(id);
    t->spec.set_queue(queue);
    t->spec.set_priority(priority);
    if (!resources.empty()) {
      const auto eq = resources.find('=');
      (*t->spec.mutable_placement()->mutable_resources())[resources.substr(0, eq)] =
          resources.substr(eq + 1);
    }
    if (!label.empty()) (*t->spec.mutable_placement()->mutable_required_labels())[label] = "1";
    t->seq = ++seq_;
    rq_.SetClass(*t);
    rq_.Add(*t);
    tasks_.push_back(std::move(t));
    return *tasks_.back();
  }

  AgentRecord& Connect(const std::string& id, int32_t slots, const std::string& cpu = "",
                       const std::string& label = "") {
    AgentRecord& a = agents_.FindOrAdd(id);
    agents_.Bind(a, ++conn_);
    a.slots = slots;
    if (!cpu.empty()) a.resources["cpu"] = ParseResourceAmount("cpu", cpu).value();
    if (!label.empty()) a.labels[label] = "1";
    rq_.Grew(a);
    rq_.UnparkFor(a);
    return a;
  }

  // The attempt of task `id` ends: its agent gets its room back.
  void Finish(const std::string& id) {
    const TaskRecord& t = Task(id);
    AgentRecord* a = agents_.Find(on_agent_.at(id));
    rq_.GiveBackResources(*a, t.queue(), SlotsOf(t.spec.placement()), NeedOf(t.spec.placement()));
    on_agent_.erase(id);
  }

  const TaskRecord& Task(const std::string& id) const {
    for (const auto& t : tasks_) {
      if (t->id() == id) return *t;
    }
    ADD_FAILURE() << "no task " << id;
    return *tasks_.front();
  }

  void SetQueue(const std::string& queue, const v1::QueueSettings& s) {
    controls_.Set(queue, s, absl::ZeroDuration());
    rq_.IndexHeadsByQueue();
    rq_.ReleaseHeld(queue);
    rq_.ReleaseOverQuota(queue);
    rq_.LookAgain();
  }

  // The invariants, against what the test counts: the tasks not started
  // are PENDING, and what the started ones hold by queue.
  std::string Check() const {
    absl::flat_hash_map<std::string, Resources> held;
    absl::flat_hash_map<std::string, int64_t> slots;
    for (const auto& [id, agent] : on_agent_) {
      const TaskRecord& t = Task(id);
      slots[t.queue()] += SlotsOf(t.spec.placement());
      const Resources need = NeedOf(t.spec.placement());
      if (!need.empty()) AddResources(need, &held[t.queue()]);
    }
    size_t pending = 0;
    for (const auto& t : tasks_) {
      bool started = false;
      for (const std::string& s : started_) started |= s.rfind(t->id() + "@", 0) == 0;
      if (!started) ++pending;
    }
    return rq_.CheckInvariants(pending, held, slots, [&](const ReadyClass& c) -> std::string {
      if (c.where == ReadyClass::Where::kParked && rq_.AnyAgentCouldTake(c.placement)) {
        return "parked class " + c.key + " could be taken";
      }
      if (c.where == ReadyClass::Where::kOverQuota && rq_.WithinQuota(c.queue, c.need)) {
        return "class " + c.key + " over quota fits it";
      }
      return "";
    });
  }

  void Dispatch() {
    rq_.Dispatch(*this);
    ASSERT_EQ(Check(), "");
  }

  SchedulerOptions opts_;
  QueueControls controls_;
  AgentRegistry agents_{&opts_};
  ReadyQueues rq_{&controls_, &agents_};
  std::vector<std::unique_ptr<TaskRecord>> tasks_;
  std::vector<std::string> started_;
  std::map<std::string, std::string> on_agent_;
  int64_t seq_ = 0;
  uint64_t conn_ = 0;
};

TEST_F(ReadyQueuesTest, TheBestHeadGoesFirstAndTheRestWaitUntilAnAgentGetsRoomBack) {
  Add("low", "q", 0);
  Add("high", "q", 5, "cpu=1");  // another class, better priority
  Add("low2", "q", 0);
  ASSERT_EQ(Check(), "");
  EXPECT_EQ(rq_.classes(), 2u);
  Connect("a", 1, "4");
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("high@a"));
  // No room anywhere: the next Dispatch looks at nothing.
  EXPECT_TRUE(rq_.Idle());
  const int64_t looks = rq_.placement_attempts();
  Dispatch();
  EXPECT_EQ(rq_.placement_attempts(), looks);
  Finish("high");
  EXPECT_FALSE(rq_.Idle());
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("high@a", "low@a"));
  Finish("low");
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("high@a", "low@a", "low2@a"));
  EXPECT_EQ(rq_.classes(), 0u);
}

TEST_F(ReadyQueuesTest, APausedQueueHoldsItsClassUntilItOpens) {
  Add("t1", "billing");
  Add("t2", "other");
  v1::QueueSettings paused;
  paused.set_paused(true);
  SetQueue("billing", paused);
  Connect("a", 4);
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("t2@a"));
  EXPECT_TRUE(rq_.QueueHeld("billing"));
  EXPECT_FALSE(rq_.QueueHeld("other"));
  SetQueue("billing", v1::QueueSettings());
  EXPECT_FALSE(rq_.QueueHeld("billing"));
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("t2@a", "t1@a"));
}

TEST_F(ReadyQueuesTest, AClassOverItsQueuesQuotaWaitsForTheQueueToGiveBack) {
  v1::QueueSettings quota;
  (*quota.mutable_quota())["cpu"] = "2";
  SetQueue("q", quota);
  Add("t1", "q", 0, "cpu=2");
  Add("t2", "q", 0, "cpu=2");
  Connect("a", 4, "8");
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("t1@a"));
  ASSERT_NE(rq_.HeldBy("q"), nullptr);
  EXPECT_EQ(FormatResources(*rq_.HeldBy("q")), "cpu=2");
  EXPECT_TRUE(rq_.QueueHeld("q"));
  EXPECT_THAT(rq_.QuotaReason("q", NeedOf(Task("t2").spec.placement())),
              ::testing::HasSubstr("queue q is at its quota of cpu=2"));
  Finish("t1");
  EXPECT_EQ(rq_.HeldBy("q"), nullptr);
  EXPECT_FALSE(rq_.QueueHeld("q"));
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("t1@a", "t2@a"));
}

TEST_F(ReadyQueuesTest, AClassNoAgentCouldTakeIsParkedUntilOneThatCanConnects) {
  Add("gpu-task", "q", 0, "", "gpu");
  Connect("plain", 4);
  Dispatch();
  EXPECT_THAT(started_, IsEmpty());
  EXPECT_EQ(rq_.parked(), 1u);
  // A parked class costs no look while nothing that could take it comes.
  EXPECT_TRUE(rq_.Idle());
  Connect("gpu-box", 1, "", "gpu");
  EXPECT_EQ(rq_.parked(), 0u);
  Dispatch();
  EXPECT_THAT(started_, ElementsAre("gpu-task@gpu-box"));
}

TEST_F(ReadyQueuesTest, RecordsOfOneClassShareItsName) {
  TaskRecord& a = Add("a", "q");
  TaskRecord& b = Add("b", "q");
  TaskRecord& c = Add("c", "r");
  EXPECT_EQ(a.class_name.get(), b.class_name.get());
  EXPECT_NE(a.class_name.get(), c.class_name.get());
  EXPECT_EQ(rq_.class_names(), 2u);
  EXPECT_TRUE(rq_.Holds(a));
  rq_.Remove(a);
  EXPECT_FALSE(rq_.Holds(a));
  EXPECT_TRUE(rq_.Holds(b));
}

}  // namespace
}  // namespace taskgrid::core
