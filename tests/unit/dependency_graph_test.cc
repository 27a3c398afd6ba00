// The dependency rules on their own: records linked by hand, no scheduler.
#include "scheduler/core/dependency_graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <memory>

namespace taskgrid::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DependencyGraphTest : public ::testing::Test {
 protected:
  TaskRecord& Task(const std::string& id, v1::TaskState state) {
    auto t = std::make_unique<TaskRecord>();
    t->spec.set_id(id);
    t->state = state;
    t->class_name = std::make_shared<const std::string>("p");
    owned_.push_back(std::move(t));
    return *owned_.back();
  }
  std::vector<std::unique_ptr<TaskRecord>> owned_;
};

TEST_F(DependencyGraphTest, CountersFollowTheDependenciesStates) {
  TaskRecord& a = Task("a", v1::TASK_STATE_RUNNING);
  TaskRecord& b = Task("b", v1::TASK_STATE_SUCCEEDED);
  TaskRecord& d = Task("d", v1::TASK_STATE_BLOCKED);
  LinkDependency(d, a);
  LinkDependency(d, b);
  EXPECT_FALSE(DepsMet(d));
  EXPECT_EQ(BlockedReason(d), "waiting for a");
  std::deque<TaskRecord*> settle;
  NoteStateChange(a, v1::TASK_STATE_RUNNING, v1::TASK_STATE_FAILED, &settle);
  a.state = v1::TASK_STATE_FAILED;
  EXPECT_THAT(settle, ElementsAre(&d));
  EXPECT_TRUE(DepFailed(d));
  EXPECT_FALSE(DepsMet(d));  // cancels on upstream failure by default
  d.spec.set_on_upstream_failure(v1::UPSTREAM_FAILURE_RUN);
  EXPECT_TRUE(DepsMet(d));  // every dependency finished
  // A change within the same class (RUNNING -> DISPATCHED) touches nothing.
  settle.clear();
  NoteStateChange(a, v1::TASK_STATE_RUNNING, v1::TASK_STATE_DISPATCHED, &settle);
  EXPECT_TRUE(settle.empty());
}

TEST_F(DependencyGraphTest, ABlockedReasonNamesThreeAndCountsTheRest) {
  TaskRecord& d = Task("d", v1::TASK_STATE_BLOCKED);
  for (const char* id : {"a", "b", "c", "e", "f"})
    LinkDependency(d, Task(id, v1::TASK_STATE_PENDING));
  EXPECT_EQ(BlockedReason(d), "waiting for a, b, c and 2 more");
}

TEST_F(DependencyGraphTest, AChainGoesOnlyToASoleDueDependentOfTheSamePlacement) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  TaskRecord& a = Task("a", v1::TASK_STATE_PENDING);
  TaskRecord& b = Task("b", v1::TASK_STATE_BLOCKED);
  LinkDependency(b, a);
  EXPECT_EQ(ChainSuccessor(a, now), &b);
  b.next_run_time = now + absl::Seconds(1);  // not due
  EXPECT_EQ(ChainSuccessor(a, now), nullptr);
  b.next_run_time = absl::InfinitePast();
  b.class_name = std::make_shared<const std::string>("gpu");
  EXPECT_EQ(ChainSuccessor(a, now), nullptr);
  b.class_name = std::make_shared<const std::string>("p");
  LinkDependency(Task("c", v1::TASK_STATE_BLOCKED), a);  // a branches
  EXPECT_EQ(ChainSuccessor(a, now), nullptr);
}

TEST_F(DependencyGraphTest, ARequestWithACycleOrAnUnknownNameIsRefused) {
  std::vector<v1::TaskSpec> specs(3);
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < 3; ++i) {
    specs[i].set_id("t" + std::to_string(i));
    index[specs[i].id()] = i;
  }
  specs[0].add_depends_on("t2");
  specs[1].add_depends_on("t0");
  specs[2].add_depends_on("t1");
  auto nothing = [](const std::string&) { return false; };
  absl::Status s = CheckDependencies(specs, {0, 1, 2}, index, nothing);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cycle of 3 tasks"));
  specs[2].clear_depends_on();
  specs[2].add_depends_on("old");
  s = CheckDependencies(specs, {0, 1, 2}, index, nothing);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tasks[2].depends_on[0] names task \"old\""));
  EXPECT_TRUE(CheckDependencies(specs, {0, 1, 2}, index, [](const std::string& id) {
                return id == "old";
              }).ok());
}

}  // namespace
}  // namespace taskgrid::core
