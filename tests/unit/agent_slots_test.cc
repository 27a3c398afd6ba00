// The agent's slot and chain rules (agent/slots.h) on their own: TaskRuns
// are made but never run, results are written by the test.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "agent/slots.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::agent::slots_test {
namespace {

v1::Assignment Task(const std::string& id, int32_t slots = 1, int32_t attempt = 1) {
  v1::Assignment a;
  a.set_task_id(id);
  a.set_attempt(attempt);
  a.set_slots(slots);
  a.add_steps()->mutable_builtin()->set_name("noop");
  return a;
}
v1::Assignment After(const std::string& pred, v1::Assignment a) {
  a.set_run_after(pred);
  return a;
}

v1::TaskResult Outcome(v1::Outcome o, const std::string& stdout_tail = "") {
  v1::TaskResult r;
  r.set_outcome(o);
  r.set_stdout_tail(stdout_tail);
  return r;
}

class SlotsTest : public ::testing::Test {
 protected:
  explicit SlotsTest(int32_t capacity = 2)
      : slots_(capacity, [](v1::Assignment a) {
          return std::make_shared<TaskRun>(std::move(a), ExecutorOptions{});
        }) {}

  // Admits one Assign; returns its replies as "accept ID" / "reject ID: reason".
  std::vector<std::string> Admit(const std::vector<v1::Assignment>& tasks, bool draining = false) {
    v1::Assign assign;
    for (const v1::Assignment& a : tasks) *assign.add_tasks() = a;
    std::vector<v1::AgentMessage> replies;
    std::vector<std::shared_ptr<TaskRun>> starts;
    slots_.Admit(assign, draining, &replies, &starts);
    for (auto& run : starts) runs_[run->assignment().task_id()] = run;
    std::vector<std::string> out;
    for (const v1::AgentMessage& m : replies) {
      if (m.has_accept()) out.push_back("accept " + m.accept().task_id());
      if (m.has_reject())
        out.push_back("reject " + m.reject().task_id() + ": " + m.reject().reason());
    }
    return out;
  }

  Slots slots_;
  std::map<std::string, std::shared_ptr<TaskRun>> runs_;
};

using V = std::vector<std::string>;

TEST_F(SlotsTest, TakesWhatFitsAndSaysWhyNot) {
  EXPECT_EQ(Admit({Task("a"), Task("b", 2), Task("c")}),
            (V{"accept a", "reject b: no free slots", "accept c"}));
  EXPECT_EQ(slots_.used(), 2);
  EXPECT_EQ(Admit({Task("a", 1, 2)}),
            (V{"reject a: another attempt of this task is running here"}));
  EXPECT_EQ(Admit({Task("a")}), (V{"accept a"})) << "a repeat of a held attempt is accepted again";
  EXPECT_EQ(Admit({Task("d")}, /*draining=*/true), (V{"reject d: agent is draining"}));
  EXPECT_EQ(slots_.running(), 2);
}

TEST_F(SlotsTest, ChainLinksWaitWithoutASlotAndAreSilent) {
  EXPECT_EQ(Admit({Task("h"), After("h", Task("l1")), After("l1", Task("l2"))}), (V{"accept h"}));
  EXPECT_EQ(slots_.running(), 1);
  EXPECT_EQ(slots_.waiting(), 2);
  EXPECT_EQ(slots_.used(), 1);
  google::protobuf::RepeatedPtrField<v1::AttemptRef> held;
  slots_.ListHeld(&held);
  ASSERT_EQ(held.size(), 3);
  EXPECT_FALSE(held[0].waiting());
  EXPECT_TRUE(held[1].waiting());
  EXPECT_TRUE(held[2].waiting());
  EXPECT_EQ(Admit({Task("l1")}), V{}) << "a repeat of a waiting link stays silent";
}

TEST_F(SlotsTest, RefusesLinksItCannotHonour) {
  EXPECT_EQ(Admit({After("nowhere", Task("x"))}),
            (V{"reject x: run_after \"nowhere\" is not an earlier entry of this Assign"}));
  EXPECT_EQ(Admit({Task("h"), After("h", Task("l", 2))}),
            (V{"accept h",
               "reject l: a chain link needs 2 slot(s), more than the 1 of h that it "
               "runs after"}));
  EXPECT_EQ(Admit({Task("g"), After("g", Task("m")), After("g", Task("n"))}),
            (V{"accept g", "reject n: another chain link already runs after g"}));
  // A link after an entry that was refused is dropped silently: the
  // scheduler ends it with its head.
  EXPECT_EQ(Admit({Task("big", 5), After("big", Task("tail"))}), (V{"reject big: no free slots"}));
  EXPECT_EQ(slots_.waiting(), 1);
}

TEST_F(SlotsTest, ASuccessStartsTheNextLinkInTheFreedSlotWithItsOutput) {
  Admit({Task("h"), After("h", Task("l1")), After("l1", Task("l2"))});
  Slots::Ended e = slots_.Finish(runs_["h"], Outcome(v1::OUTCOME_SUCCEEDED, "out of h"), false);
  EXPECT_EQ(e.report.result().task_id(), "h");
  ASSERT_TRUE(e.link.has_accept());
  EXPECT_EQ(e.link.accept().task_id(), "l1");
  ASSERT_NE(e.next, nullptr);
  EXPECT_EQ(e.next->assignment().inputs().at("h"), "out of h");
  EXPECT_EQ(slots_.used(), 1);
  EXPECT_EQ(slots_.running(), 1);
  EXPECT_EQ(slots_.waiting(), 1);
}

TEST_F(SlotsTest, AFailureDropsTheChainSilently) {
  Admit({Task("h"), After("h", Task("l1")), After("l1", Task("l2"))});
  Slots::Ended e = slots_.Finish(runs_["h"], Outcome(v1::OUTCOME_FAILED), false);
  EXPECT_EQ(e.report.result().result().outcome(), v1::OUTCOME_FAILED);
  EXPECT_FALSE(e.link.has_accept() || e.link.has_release());
  EXPECT_EQ(e.dropped, (V{"l1", "l2"}));
  EXPECT_EQ(slots_.used(), 0);
  EXPECT_EQ(slots_.waiting(), 0);
}

TEST_F(SlotsTest, DrainingReleasesTheNextLinkAndDropsTheRest) {
  Admit({Task("h"), After("h", Task("l1")), After("l1", Task("l2"))});
  Slots::Ended e = slots_.Finish(runs_["h"], Outcome(v1::OUTCOME_SUCCEEDED), /*draining=*/true);
  ASSERT_TRUE(e.link.has_release());
  EXPECT_EQ(e.link.release().task_id(), "l1");
  EXPECT_EQ(e.link.release().reason(), "agent is draining");
  EXPECT_EQ(e.next, nullptr);
  EXPECT_EQ(e.dropped, (V{"l2"}));
}

TEST_F(SlotsTest, WhatTheAgentStoppedIsReportedByItsCause) {
  Admit({Task("fenced"), Task("released")});
  std::vector<std::string> dropped;
  EXPECT_EQ(slots_.StopAll(StopCause::kFenced, "no contact", &dropped), 2);
  EXPECT_FALSE(slots_.AnyUnstopped());
  EXPECT_EQ(slots_.StopAll(StopCause::kReleased, "drained", &dropped), 0)
      << "a stopped run keeps its first cause";
  // Fenced: a Release, which the scheduler does not count as an attempt.
  Slots::Ended f = slots_.Finish(runs_["fenced"], Outcome(v1::OUTCOME_CANCELLED), false);
  ASSERT_TRUE(f.report.has_release());
  EXPECT_EQ(f.report.release().task_id(), "fenced");
  EXPECT_EQ(f.report.release().reason(), "no contact");
  // One that ended on its own just before keeps its real result.
  Slots::Ended r = slots_.Finish(runs_["released"], Outcome(v1::OUTCOME_SUCCEEDED), false);
  EXPECT_EQ(r.report.result().result().outcome(), v1::OUTCOME_SUCCEEDED);

  Admit({Task("late")});
  slots_.StopAll(StopCause::kReleased, "agent drained: 0s passed", &dropped);
  Slots::Ended l = slots_.Finish(runs_["late"], Outcome(v1::OUTCOME_CANCELLED), false);
  ASSERT_TRUE(l.report.has_release());
  EXPECT_EQ(l.report.release().reason(), "agent drained: 0s passed");
}

TEST_F(SlotsTest, CancelOfAWaitingLinkDropsItAndTheLinksAfterIt) {
  Admit({Task("a"), After("a", Task("b")), After("b", Task("c")), After("c", Task("d"))});
  EXPECT_EQ(slots_.Cancel("c", 7), V{}) << "another attempt: nothing";
  EXPECT_EQ(slots_.Cancel("c", 1), (V{"c", "d"}));
  EXPECT_EQ(slots_.waiting(), 1);
  EXPECT_EQ(slots_.Cancel("a", 1), V{}) << "a running task is cancelled, its links go when it ends";
}

}  // namespace
}  // namespace taskgrid::agent::slots_test
