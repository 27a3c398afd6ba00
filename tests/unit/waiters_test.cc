// Waiters: each answered once, found by key, by id and by deadline, and
// expiry looks only at the waiters that are due.
#include "scheduler/engine/waiters.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace taskgrid::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TaskWaiters::Reply Noop() {
  return [](absl::StatusOr<v1::WaitTaskResponse>) {};
}

std::vector<uint64_t> Ids(const std::vector<TaskWaiters::Waiter>& ws) {
  std::vector<uint64_t> out;
  for (const TaskWaiters::Waiter& w : ws) out.push_back(w.id);
  return out;
}

TEST(Waiters, TakeTaskTakesOnlyThatTasksWaiters) {
  TaskWaiters w(10, "WaitTask calls", "--max_waits");
  const uint64_t a1 = *w.Add("a", absl::Seconds(5), Noop());
  const uint64_t b = *w.Add("b", absl::Seconds(5), Noop());
  const uint64_t a2 = *w.Add("a", absl::Seconds(9), Noop());
  EXPECT_NE(a1, 0u);
  EXPECT_THAT(Ids(w.TakeKey("a")), ElementsAre(a1, a2));
  EXPECT_TRUE(w.TakeKey("a").empty());
  EXPECT_EQ(w.size(), 1u);
  // Gone from the deadline index too: only b expires.
  EXPECT_THAT(Ids(w.TakeExpired(absl::Seconds(100))), ElementsAre(b));
  EXPECT_EQ(w.size(), 0u);
}

TEST(Waiters, RemoveTakesOneWaiterOnceFromEveryIndex) {
  TaskWaiters w(10, "WaitTask calls", "--max_waits");
  const uint64_t a = *w.Add("a", absl::Seconds(5), Noop());
  const uint64_t a2 = *w.Add("a", absl::Seconds(5), Noop());
  TaskWaiters::Waiter got;
  ASSERT_TRUE(w.Remove(a, &got));
  EXPECT_EQ(got.key, "a");
  EXPECT_FALSE(w.Remove(a, &got)) << "a second cancel finds nothing";
  EXPECT_THAT(Ids(w.TakeKey("a")), ElementsAre(a2));
  EXPECT_TRUE(w.TakeExpired(absl::Seconds(100)).empty());
}

TEST(Waiters, ExpiryLooksOnlyAtTheDueWaiters) {
  TaskWaiters w(100'000, "WaitTask calls", "--max_waits");
  for (int i = 0; i < 10'000; ++i) w.Add("far" + std::to_string(i), absl::Hours(1), Noop()).value();
  const uint64_t soon = *w.Add("soon", absl::Seconds(2), Noop());
  const uint64_t sooner = *w.Add("sooner", absl::Seconds(1), Noop());
  EXPECT_TRUE(w.TakeExpired(absl::Milliseconds(500)).empty());
  EXPECT_EQ(w.deadlines_examined(), 1) << "one look at the earliest deadline, no scan";
  EXPECT_THAT(Ids(w.TakeExpired(absl::Seconds(2))), ElementsAre(sooner, soon));
  EXPECT_EQ(w.deadlines_examined(), 1 + 3) << "the two due, then the first not due";
  EXPECT_EQ(w.size(), 10'000u);
}

TEST(Waiters, IsBoundedNamingTheFlag) {
  TaskWaiters w(2, "WaitTask calls", "--max_waits");
  ASSERT_TRUE(w.Add("a", absl::Seconds(1), Noop()).ok());
  ASSERT_TRUE(w.Add("a", absl::Seconds(1), Noop()).ok());
  absl::StatusOr<uint64_t> third = w.Add("b", absl::Seconds(1), Noop());
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("--max_waits=2"));
  EXPECT_EQ(w.size(), 2u) << "the refused one stores nothing";
  w.TakeKey("a");
  EXPECT_TRUE(w.Add("b", absl::Seconds(1), Noop()).ok()) << "room again";
}

TEST(Waiters, TakeKeyIfTakesOnlyTheWaitersItIsAskedFor) {
  Waiters<v1::WaitForWorkResponse, int> w(10, "WaitForWork calls", "--max_waits");
  auto noop = [](absl::StatusOr<v1::WaitForWorkResponse>) {};
  const uint64_t small = *w.Add("q", absl::Seconds(5), noop, 1);
  const uint64_t big = *w.Add("q", absl::Seconds(5), noop, 7);
  *w.Add("other", absl::Seconds(5), noop, 7);
  std::vector<uint64_t> taken;
  for (const auto& got : w.TakeKeyIf("q", [](const auto& x) { return x.extra > 3; })) {
    taken.push_back(got.id);
  }
  EXPECT_THAT(taken, ElementsAre(big));
  EXPECT_TRUE(w.HasKey("q"));
  EXPECT_EQ(w.size(), 2u);
  decltype(w)::Waiter left;
  ASSERT_TRUE(w.Remove(small, &left));
  EXPECT_EQ(left.extra, 1);
  EXPECT_FALSE(w.HasKey("q"));
}

TEST(Waiters, TakeAllEmptiesEveryIndex) {
  TaskWaiters w(10, "WaitTask calls", "--max_waits");
  w.Add("a", absl::Seconds(1), Noop()).value();
  w.Add("b", absl::Seconds(2), Noop()).value();
  EXPECT_EQ(w.TakeAll().size(), 2u);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_TRUE(w.TakeKey("a").empty());
  EXPECT_TRUE(w.TakeExpired(absl::Hours(1)).empty());
}

}  // namespace
}  // namespace taskgrid::engine
