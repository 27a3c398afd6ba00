// Gang placement (scheduler/core/gangs.h): the replicas of a task with
// `replicas.gang` start in one Dispatch, each on its own agent, or none
// does; while they wait, room is reserved for them on the agents they will
// use, for a bounded time. Every helper step runs the invariant checker,
// which also checks every reservation against the gang holding it.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "scheduler/core/state_machine.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using V = std::vector<std::string>;

class GangTest : public SchedulerTest {
 protected:
  // A task whose `count` replicas start as a gang, each asking for
  // `resources` (none when empty).
  static v1::TaskSpec Gang(const std::string& id, int count, const std::string& resources = "",
                           absl::Duration wait = absl::ZeroDuration(), int priority = 0) {
    v1::TaskSpec s = resources.empty() ? Spec(id) : Needs(id, resources);
    s.set_priority(priority);
    s.mutable_replicas()->set_count(count);
    s.mutable_replicas()->set_gang(true);
    if (wait > absl::ZeroDuration()) {
      s.mutable_replicas()->mutable_gang_wait()->set_seconds(absl::ToInt64Seconds(wait));
    }
    return s;
  }

  // Every replica of `id` dispatched by `fx`, across `conns`, with the
  // agent each went to.
  std::set<std::pair<std::string, uint64_t>> Started(const Effects& fx,
                                                     const std::vector<uint64_t>& conns,
                                                     const std::string& id) {
    std::set<std::pair<std::string, uint64_t>> out;
    for (uint64_t c : conns) {
      for (const std::string& t : Assigned(fx, c)) {
        if (t.rfind(id + ":r", 0) == 0) out.insert({t, c});
      }
    }
    return out;
  }

  std::string Reason(const std::string& id) { return Describe(id).reason(); }

  // An agent offering `resources`, remembered by name for ConnOf.
  uint64_t Offer(const std::string& agent, int slots, const std::string& resources) {
    const uint64_t conn = ConnectOffering(agent, slots, resources);
    conns_[agent] = conn;
    return conn;
  }
  // The stream of the agent holding task `id`.
  uint64_t ConnOf(const std::string& id) { return conns_.at(Task(id).agent_id); }

  std::map<std::string, uint64_t> conns_;

  // Lets `d` pass in steps shorter than the heartbeat timeout, every agent
  // on `conns` heartbeating, the scheduler ticking after each.
  void Pass(absl::Duration d, const std::vector<uint64_t>& conns) {
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Seconds(2));
      clock_.Advance(step);
      for (uint64_t c : conns) Heartbeat(c);
      sched_.Tick();
      Check();
      d -= step;
    }
  }
};

TEST_F(GangTest, StartsTogetherOnceEveryMemberFitsAndNotBefore) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  const uint64_t a2 = Offer("a2", 4, "gpu=1");
  const uint64_t a3 = Offer("a3", 4, "gpu=1");
  // a3's GPU is taken: two of three replicas would fit, so none starts.
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  ASSERT_EQ(State("busy"), v1::TASK_STATE_DISPATCHED);
  SubmitOk(Gang("g", 3, "gpu=1"));
  const Effects none = Take();
  EXPECT_THAT(Started(none, {a1, a2, a3}, "g"), IsEmpty());
  for (const char* id : {"g:r1", "g:r2", "g:r3"}) EXPECT_EQ(State(id), v1::TASK_STATE_PENDING);
  EXPECT_THAT(Reason("g:r1"), HasSubstr("waiting: gang of 3 starts together: 2 of 3 fit now; "
                                        "room reserved on "));
  EXPECT_THAT(Reason("g:r1"), HasSubstr("for 5m more"));
  EXPECT_EQ(Describe("g").replicas(2).reason(), Reason("g:r1")) << "the task's table says so too";
  EXPECT_EQ(Agent("a1").reserved_for, "g");
  EXPECT_EQ(Agent("a2").reserved_for, "g");
  EXPECT_EQ(Agent("a3").reserved_for, "g");
  // The room it reserved is not given to a later task that would fit it.
  SubmitOk(Needs("small", "gpu=1"));
  EXPECT_THAT(Started(Take(), {a1, a2, a3}, "small"), IsEmpty());
  EXPECT_EQ(State("small"), v1::TASK_STATE_PENDING);
  // The blocker ends: all three start in the same Dispatch, one per agent.
  Accept(ConnOf("busy"), "busy", 1);
  Result(ConnOf("busy"), "busy", 1, v1::OUTCOME_SUCCEEDED);
  const Effects fx = Take();
  const auto started = Started(fx, {a1, a2, a3}, "g");
  ASSERT_EQ(started.size(), 3u);
  std::set<uint64_t> on;
  for (const auto& [id, conn] : started) on.insert(conn);
  EXPECT_EQ(on, (std::set<uint64_t>{a1, a2, a3})) << "each replica on its own agent";
  for (const char* id : {"a1", "a2", "a3"}) EXPECT_EQ(Agent(id).reserved_for, "") << id;
  EXPECT_EQ(State("small"), v1::TASK_STATE_PENDING) << "every GPU is the gang's now";
}

TEST_F(GangTest, LowerPriorityWorkBackfillsWhatTheGangDidNotReserve) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1,cpu=4");
  const uint64_t a2 = Offer("a2", 4, "gpu=1,cpu=4");
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  ASSERT_EQ(State("busy"), v1::TASK_STATE_DISPATCHED);
  SubmitOk(Gang("g", 2, "gpu=1,cpu=2", absl::ZeroDuration(), 5));
  Take();
  // cpu=2 is left on each agent beside the reservation: a cpu-only task
  // still runs there.
  SubmitOk(Needs("cpu-only", "cpu=2"));
  const Effects fx = Take();
  EXPECT_EQ(Assigned(fx, a1).size() + Assigned(fx, a2).size(), 1u);
  EXPECT_EQ(State("cpu-only"), v1::TASK_STATE_DISPATCHED);
  // A third cpu=2 task would eat into the room reserved: it waits.
  SubmitOk(Needs("cpu-more", "cpu=2"));
  Take();
  SubmitOk(Needs("cpu-more-2", "cpu=2"));
  Take();
  int dispatched = 0;
  for (const char* id : {"cpu-more", "cpu-more-2"}) {
    dispatched += State(id) == v1::TASK_STATE_DISPATCHED ? 1 : 0;
  }
  EXPECT_EQ(dispatched, 1) << "one agent has cpu=2 unreserved left, the other none";
}

TEST_F(GangTest, ReservationIsBoundedAndComesBackInTurns) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  const uint64_t a2 = Offer("a2", 4, "gpu=1");
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  const std::string other = Task("busy").agent_id == "a1" ? "a2" : "a1";
  Accept(ConnOf("busy"), "busy", 1);
  SubmitOk(Gang("g", 2, "gpu=1", absl::Minutes(1)));
  SubmitOk(Needs("small", "gpu=1"));
  Take();
  EXPECT_EQ(State("small"), v1::TASK_STATE_PENDING) << "the free GPU is reserved for the gang";
  EXPECT_THAT(Reason("g:r2"), HasSubstr("room reserved on "));
  // The blocker runs on past the bound: the gang lets its room go, and
  // the waiting task takes it.
  Pass(absl::Seconds(58), {a1, a2});
  EXPECT_EQ(State("small"), v1::TASK_STATE_PENDING);
  Pass(absl::Seconds(2), {a1, a2});
  EXPECT_EQ(Agent(other).reserved_for, "");
  EXPECT_EQ(State("small"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(Task("small").agent_id, other);
  EXPECT_THAT(Reason("g:r1"),
              HasSubstr("1 of 2 fit now; it held room for 1m without starting, so it reserves "
                        "none for "));
  Accept(ConnOf("small"), "small", 1);
  // A turn later it reserves again (both agents busy now: nothing fits).
  Pass(absl::Seconds(60), {a1, a2});
  EXPECT_THAT(Reason("g:r1"), HasSubstr("0 of 2 fit now; room reserved on "));
  EXPECT_EQ(Agent("a1").reserved_for, "g");
  EXPECT_EQ(Agent("a2").reserved_for, "g");
  Result(ConnOf("busy"), "busy", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_PENDING) << "still one short: small runs";
  Result(ConnOf("small"), "small", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(State("g:r2"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(GangTest, TooFewAgentsParksItUntilEnoughConnect) {
  const uint64_t a1 = Connect("a1", 4);
  SubmitOk(Gang("g", 3));
  EXPECT_THAT(Assigned(Take(), a1), IsEmpty());
  EXPECT_EQ(Reason("g:r1"),
            "waiting: gang of 3 starts together: only 1 connected agent could run one each");
  const uint64_t a2 = Connect("a2", 4);
  EXPECT_THAT(Started(Take(), {a1, a2}, "g"), IsEmpty())
      << "two agents: no replica starts, though two could";
  EXPECT_EQ(Reason("g:r1"),
            "waiting: gang of 3 starts together: only 2 connected agents could run one each");
  EXPECT_EQ(sched_.parked_classes(), 1u);
  const uint64_t a3 = Connect("a3", 4);
  EXPECT_EQ(Started(Take(), {a1, a2, a3}, "g").size(), 3u);
}

TEST_F(GangTest, AMemberThatRunsAgainStopsItsSiblingsAndTheGangStartsAgainWhole) {
  const uint64_t a1 = Connect("a1", 4);
  const uint64_t a2 = Connect("a2", 4);
  v1::TaskSpec spec = Gang("g", 2);
  spec.set_max_attempts(3);
  SubmitOk(spec);
  const Effects fx = Take();
  ASSERT_EQ(Started(fx, {a1, a2}, "g").size(), 2u);
  const uint64_t on1 = Task("g:r1").agent_id == "a1" ? a1 : a2;
  const uint64_t on2 = on1 == a1 ? a2 : a1;
  Accept(on1, "g:r1", 1);
  Accept(on2, "g:r2", 1);
  Result(on1, "g:r1", 1, v1::OUTCOME_FAILED, 1);
  // r1 is to run again: r2 is told to stop, so the two start again together.
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_SCHEDULED);
  EXPECT_THAT(Cancels(Take(), on2), ElementsAre("g:r2"));
  EXPECT_TRUE(Task("g:r2").requeue_requested);
  EXPECT_THAT(Task("g:r2").reason, HasSubstr("stopping: replica g:r1 is to run again"));
  Pass(absl::Seconds(2), {a1, a2});  // past r1's backoff
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_PENDING);
  EXPECT_EQ(State("g:r2"), v1::TASK_STATE_RUNNING);
  EXPECT_THAT(Assigned(Take(), on1), IsEmpty()) << "its sibling still runs: no partial gang";
  EXPECT_EQ(Reason("g:r1"),
            "waiting: gang of 2 starts together: 1 of its replicas has not stopped or are not "
            "ready yet");
  // r2's agent stopped it: not counted, and both start at once.
  Result(on2, "g:r2", 1, v1::OUTCOME_CANCELLED, -1);
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(State("g:r2"), v1::TASK_STATE_DISPATCHED);
  EXPECT_NE(Task("g:r1").agent_id, Task("g:r2").agent_id);
  EXPECT_EQ(Describe("g:r2").attempts_used(), 1) << "the stop is not charged: only the live one";
  EXPECT_EQ(Describe("g:r1").attempts_used(), 2) << "the failure and the live one";
  ASSERT_FALSE(Task("g:r2").attempts.empty());
  EXPECT_TRUE(Task("g:r2").attempts.back().interrupted());
}

TEST_F(GangTest, AStopRequestedBeforeARestartIsSentAgain) {
  const uint64_t a1 = Connect("a1", 4);
  const uint64_t a2 = Connect("a2", 4);
  v1::TaskSpec spec = Gang("g", 2);
  spec.set_max_attempts(3);
  SubmitOk(spec);
  Take();
  const uint64_t on1 = Task("g:r1").agent_id == "a1" ? a1 : a2;
  const uint64_t on2 = on1 == a1 ? a2 : a1;
  Accept(on1, "g:r1", 1);
  Accept(on2, "g:r2", 1);
  Result(on1, "g:r1", 1, v1::OUTCOME_FAILED, 1);
  ASSERT_TRUE(Task("g:r2").requeue_requested);
  std::unique_ptr<Scheduler> restored = Restarted();
  const TaskRecord* r2 = restored->Find("g:r2");
  ASSERT_NE(r2, nullptr);
  EXPECT_TRUE(r2->requeue_requested) << "derived again on restore";
  v1::Hello h;
  h.set_agent_id(r2->agent_id);
  h.set_slots(4);
  v1::AttemptRef* running = h.add_running();
  running->set_task_id("g:r2");
  running->set_attempt(1);
  ASSERT_TRUE(restored->Connect(201, h).ok());
  ASSERT_TRUE(restored->CheckInvariants().ok()) << restored->CheckInvariants();
  EXPECT_THAT(Cancels(restored->TakeEffects(), 201), ElementsAre("g:r2"));
}

TEST_F(GangTest, TwoGangsNeverHoldHalvesOfEachOther) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  const uint64_t a2 = Offer("a2", 4, "gpu=1");
  const uint64_t a3 = Offer("a3", 4, "gpu=1");
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  const std::string busy_on = Task("busy").agent_id;
  const uint64_t busy_conn = busy_on == "a1" ? a1 : busy_on == "a2" ? a2 : a3;
  // g1 (higher priority) reserves all three agents; g2 reserves nothing
  // rather than part of them.
  SubmitOk(Gang("g1", 3, "gpu=1", absl::ZeroDuration(), 5));
  SubmitOk(Gang("g2", 2, "gpu=1"));
  Take();
  EXPECT_THAT(Reason("g1:r1"), HasSubstr("2 of 3 fit now; room reserved on "));
  EXPECT_EQ(Reason("g2:r1"),
            "waiting: gang of 2 starts together: 0 of 2 fit now; the agents it needs hold another "
            "gang's reservation");
  Result(busy_conn, "busy", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Started(Take(), {a1, a2, a3}, "g1").size(), 3u);
  EXPECT_EQ(State("g2:r1"), v1::TASK_STATE_PENDING);
  for (const char* id : {"g1:r1", "g1:r2", "g1:r3"}) {
    const TaskRecord& t = Task(id);
    const uint64_t c = t.agent_id == "a1" ? a1 : t.agent_id == "a2" ? a2 : a3;
    Accept(c, id, 1);
    Result(c, id, 1, v1::OUTCOME_SUCCEEDED);
  }
  EXPECT_EQ(State("g1"), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(State("g2:r1"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(State("g2:r2"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(GangTest, PinnedMembersWaitForEveryNamedAgent) {
  const uint64_t a1 = Connect("a1", 1);
  const uint64_t a2 = Connect("a2", 1);
  SubmitOk(Spec("busy"));
  Take();
  const uint64_t busy_conn = Task("busy").agent_id == "a1" ? a1 : a2;
  v1::TaskSpec spec = Spec("g");
  spec.mutable_replicas()->add_agent_ids("a1");
  spec.mutable_replicas()->add_agent_ids("a2");
  spec.mutable_replicas()->set_gang(true);
  SubmitOk(spec);
  EXPECT_THAT(Started(Take(), {a1, a2}, "g"), IsEmpty());
  Result(busy_conn, "busy", 1, v1::OUTCOME_SUCCEEDED);
  const Effects fx = Take();
  EXPECT_THAT(Assigned(fx, a1), ElementsAre("g:r1"));
  EXPECT_THAT(Assigned(fx, a2), ElementsAre("g:r2"));
}

TEST_F(GangTest, QuotaCountsTheWholeGang) {
  v1::SetQueueLimitsRequest req;
  req.set_queue("train");
  (*req.mutable_quota())["gpu"] = "2";
  ASSERT_TRUE(sched_.SetQueueLimits(req).ok());
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  const uint64_t a2 = Offer("a2", 4, "gpu=1");
  const uint64_t a3 = Offer("a3", 4, "gpu=1");
  v1::TaskSpec spec = Gang("g", 3, "gpu=1");
  spec.set_queue("train");
  SubmitOk(spec);
  EXPECT_THAT(Started(Take(), {a1, a2, a3}, "g"), IsEmpty())
      << "each replica fits the quota, the three together do not";
  EXPECT_EQ(Reason("g:r1"),
            "waiting: gang of 3 starts together: needs gpu=3; the quota of queue train is gpu=2");
  (*req.mutable_quota())["gpu"] = "3";
  ASSERT_TRUE(sched_.SetQueueLimits(req).ok());
  Check();
  Advance(absl::Seconds(1));
  EXPECT_EQ(State("g:r3"), v1::TASK_STATE_DISPATCHED);
}

TEST_F(GangTest, CancellingTheTaskReleasesItsReservation) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  Offer("a2", 4, "gpu=1");
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  SubmitOk(Gang("g", 2, "gpu=1"));
  Take();
  EXPECT_FALSE(Agent("a2").reserved_for.empty());
  ASSERT_TRUE(sched_.Cancel("g").ok());
  Check();
  EXPECT_EQ(Agent("a1").reserved_for, "");
  EXPECT_EQ(Agent("a2").reserved_for, "");
  SubmitOk(Needs("next", "gpu=1"));
  Take();
  EXPECT_EQ(State("next"), v1::TASK_STATE_DISPATCHED);
  (void)a1;
}

TEST_F(GangTest, AReservedAgentForgottenAndBackUnderItsIdIsReservedAfresh) {
  const uint64_t a1 = Offer("a1", 4, "gpu=1");
  const uint64_t a2 = Offer("a2", 4, "gpu=1");
  SubmitOk(Needs("busy", "gpu=1"));
  Take();
  const std::string busy_on = Task("busy").agent_id;
  const std::string other = busy_on == "a1" ? "a2" : "a1";
  Accept(ConnOf("busy"), "busy", 1);
  SubmitOk(Gang("g", 2, "gpu=1"));
  Take();
  ASSERT_EQ(Agent(other).reserved_for, "g");
  // The free agent goes away, is lost, and is forgotten.
  sched_.Disconnect(conns_[other]);
  Check();
  Pass(absl::Seconds(10) + absl::Minutes(10) + absl::Seconds(2), {ConnOf("busy")});
  for (const AgentRecord* a : sched_.Agents()) ASSERT_NE(a->id, other) << "forgotten";
  // Back under the same id: a new record, reserved afresh.
  const uint64_t back = Offer(other, 4, "gpu=1");
  Pass(absl::Seconds(2), {ConnOf("busy"), back});
  EXPECT_EQ(Agent(other).reserved_for, "g");
  Result(ConnOf("busy"), "busy", 1, v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(State("g:r1"), v1::TASK_STATE_DISPATCHED);
  EXPECT_EQ(State("g:r2"), v1::TASK_STATE_DISPATCHED);
  (void)a1;
  (void)a2;
}

TEST_F(GangTest, RestoredGangStartsWholeOnceItsAgentsConnect) {
  SubmitOk(Gang("g", 2, "gpu=1"));
  std::unique_ptr<Scheduler> restored = Restarted();
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(2);
  (*h.mutable_resources())["gpu"] = "1";
  ASSERT_TRUE(restored->Connect(101, h).ok());
  ASSERT_TRUE(restored->CheckInvariants().ok()) << restored->CheckInvariants();
  EXPECT_THAT(Assigned(restored->TakeEffects(), 101), IsEmpty());
  h.set_agent_id("a2");
  ASSERT_TRUE(restored->Connect(102, h).ok());
  ASSERT_TRUE(restored->CheckInvariants().ok()) << restored->CheckInvariants();
  const Effects fx = restored->TakeEffects();
  EXPECT_EQ(Assigned(fx, 101).size() + Assigned(fx, 102).size(), 2u);
}

TEST_F(GangTest, BadGangFieldsAreRefusedAndChangeNothing) {
  v1::TaskSpec no_gang = Spec("t");
  no_gang.mutable_replicas()->set_count(2);
  no_gang.mutable_replicas()->mutable_gang_wait()->set_seconds(60);
  auto r = Submit({no_gang});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("tasks[0].replicas.gang_wait needs gang: it bounds a gang's reservation"));
  v1::TaskSpec too_long = Gang("t", 2, "", absl::Hours(25));
  r = Submit({too_long});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("gang_wait is 25h; the limit is 24h"));
  v1::TaskSpec negative = Gang("t", 2);
  negative.mutable_replicas()->mutable_gang_wait()->set_seconds(-1);
  r = Submit({negative});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_.task_count(), 0u);
}

// Random load on a fake clock: gangs of every size beside ordinary tasks,
// agents finishing, failing and leaving. After every step no gang has a
// member in flight that started without its whole gang: every member
// dispatched at one instant was dispatched together with all its
// siblings that were waiting.
TEST_F(GangTest, NeverPartiallyStartedUnderRandomLoad) {
  std::vector<uint64_t> conns;
  std::vector<std::string> names;
  for (int i = 0; i < 6; ++i) {
    names.push_back("a" + std::to_string(i));
    conns.push_back(Offer(names.back(), 3, "gpu=2,cpu=4"));
  }
  uint64_t seed = 12345;
  auto rnd = [&seed](uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  int gangs = 0, gang_starts = 0;
  for (int step = 0; step < 400; ++step) {
    const uint64_t what = rnd(10);
    if (what < 2) {
      v1::TaskSpec s = Gang("g" + std::to_string(gangs++), 2 + static_cast<int>(rnd(4)), "gpu=1",
                            absl::Minutes(1 + static_cast<int>(rnd(3))));
      s.set_max_attempts(2);
      ASSERT_TRUE(sched_.Submit({s}).ok());
    } else if (what < 4) {
      ASSERT_TRUE(sched_.Submit({Needs("s" + std::to_string(step), "gpu=1")}).ok());
    } else if (what < 8) {
      // Some agent accepts or finishes one of its attempts.
      const size_t i = rnd(conns.size());
      const AgentRecord& a = Agent(names[i]);
      if (!a.tasks.empty()) {
        const std::string id = *a.tasks.begin();
        const TaskRecord& t = Task(id);
        v1::AgentMessage m;
        if (t.state == v1::TASK_STATE_DISPATCHED) {
          m.mutable_accept()->set_task_id(id);
          m.mutable_accept()->set_attempt(t.attempt);
        } else {
          m.mutable_result()->set_task_id(id);
          m.mutable_result()->set_attempt(t.attempt);
          m.mutable_result()->mutable_result()->set_outcome(rnd(4) == 0 ? v1::OUTCOME_FAILED
                                                                        : v1::OUTCOME_SUCCEEDED);
        }
        sched_.OnAgentMessage(conns[i], m);
      }
    } else {
      clock_.Advance(absl::Seconds(static_cast<int64_t>(1 + rnd(40))));
      for (size_t i = 0; i < conns.size(); ++i) {
        v1::AgentMessage m;
        m.mutable_heartbeat();
        sched_.OnAgentMessage(conns[i], m);
      }
      sched_.Tick();
    }
    const Effects fx = sched_.TakeEffects();
    // The members each Dispatch started, by gang; each gang's were all
    // its waiting members.
    std::map<std::string, int> started;
    for (uint64_t c : conns) {
      for (const std::string& id : Assigned(fx, c)) {
        const TaskRecord& t = Task(id);
        if (t.replica_of != nullptr) ++started[t.replica_of->id()];
      }
    }
    for (const auto& [gid, n] : started) {
      ++gang_starts;
      int not_done = 0;
      for (const TaskRecord* r : Task(gid).replicas) {
        if (!IsTerminal(r->state)) {
          ++not_done;
          EXPECT_NE(r->state, v1::TASK_STATE_PENDING) << r->id() << " left behind at step " << step;
        }
      }
      EXPECT_EQ(n, not_done) << "gang " << gid << " at step " << step;
    }
    if (step % 20 == 0) Check();
  }
  Check();
  EXPECT_GT(gangs, 40);
  EXPECT_GT(gang_starts, 20) << "gangs started, some of them again";
}

}  // namespace
}  // namespace taskgrid::core
