// The task record's compact members: they must behave as the absl::Time
// and std::vector they stand in for.
#include "scheduler/core/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace taskgrid::core {
namespace {

TEST(CompactTime, KeepsTheInfinitiesAndWholeMicroseconds) {
  CompactTime unset;
  EXPECT_EQ(absl::Time(unset), absl::InfinitePast());
  CompactTime never = absl::InfiniteFuture();
  EXPECT_EQ(absl::Time(never), absl::InfiniteFuture());
  const absl::Time t = absl::FromUnixMicros(1'795'000'000'123'456);
  CompactTime c = t;
  EXPECT_EQ(absl::Time(c), t);
  // Before the epoch too.
  const absl::Time old = absl::FromUnixMicros(-86'400'000'001);
  EXPECT_EQ(absl::Time(CompactTime(old)), old);
  // What is finer than a microsecond is dropped, rounding down.
  EXPECT_EQ(absl::Time(CompactTime(t + absl::Nanoseconds(999))), t);
}

TEST(CompactTime, OrdersAsTheTimesItHolds) {
  const absl::Time t = absl::FromUnixSeconds(1'795'000'000);
  CompactTime a = t, b = t + absl::Microseconds(1);
  CompactTime past, future = absl::InfiniteFuture();
  EXPECT_LT(a, b);
  EXPECT_LT(past, a);
  EXPECT_LT(b, future);
  EXPECT_TRUE(a == t);
  EXPECT_TRUE(t < b);
  EXPECT_TRUE(b > t);
  EXPECT_TRUE(past == absl::InfinitePast());
  EXPECT_TRUE(future != absl::InfinitePast());
  EXPECT_EQ(b - a, absl::Microseconds(1));
  EXPECT_EQ(b - t, absl::Microseconds(1));
  EXPECT_EQ(a + absl::Seconds(2), t + absl::Seconds(2));
  EXPECT_EQ(future - a, absl::InfiniteDuration());
}

TEST(ThinVector, IsOnePointerWhileEmptyAndAVectorOtherwise) {
  static_assert(sizeof(ThinVector<int>) == sizeof(void*));
  ThinVector<std::string> v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.begin(), v.end());
  EXPECT_EQ(v.data(), nullptr);
  const std::vector<std::string>& none = v;
  EXPECT_TRUE(none.empty());
  v.push_back("b");
  v.emplace_back("d");
  v.insert(v.begin(), "a");
  v.insert(v.begin() + 2, "c");
  EXPECT_EQ(static_cast<const std::vector<std::string>&>(v),
            (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(v.front(), "a");
  EXPECT_EQ(v.back(), "d");
  EXPECT_EQ(std::string(*v.rbegin()), "d");
  EXPECT_EQ(*std::find(v.begin(), v.end(), "c"), "c");
  // A copy is deep.
  ThinVector<std::string> copy = v;
  copy[0] = "z";
  EXPECT_EQ(v[0], "a");
  // Erasing returns what follows; erasing everything lets the storage go.
  std::string* next = v.erase(v.begin() + 1);
  EXPECT_EQ(*next, "c");
  EXPECT_EQ(v.size(), 3u);
  v.erase(v.begin(), v.end());
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), nullptr);
  v.push_back("x");
  v.pop_back();
  EXPECT_EQ(v.data(), nullptr);
  copy.clear();
  EXPECT_EQ(copy.data(), nullptr);
  // Assigned from a vector, moved.
  ThinVector<std::string> from = std::vector<std::string>{"p", "q"};
  ThinVector<std::string> moved = std::move(from);
  EXPECT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved[1], "q");
}

TEST(TaskRecord, StaysWithinItsBudget) {
  // A restart holds one record per live task (1,000,000 in the bench's
  // largest table; docs/performance.md). Seven times at 8 bytes, the four
  // graph lists at a pointer each and the result and merge state boxed
  // bring it to 624 bytes (752 before). Something added here costs that
  // table a megabyte per byte: keep rare members boxed.
  static_assert(sizeof(CompactTime) == 8);
  EXPECT_LE(sizeof(TaskRecord), 624u);
  TaskRecord r;
  EXPECT_EQ(r.attempts.data(), nullptr);
  EXPECT_EQ(r.deps.data(), nullptr);
  EXPECT_EQ(r.create_time, absl::InfinitePast());
}

TEST(ColdTask, KeepsItsIdInFiftySixBytesInAll) {
  // A table of 1,000,000 finished tasks holds one per task: 88 bytes with
  // a std::string id, 64 with the characters on their own, 56 with the
  // state in a byte and the two flags in bits.
  EXPECT_LE(sizeof(ColdTask), 56u);
  ColdTask c;
  EXPECT_EQ(c.id(), "");
  EXPECT_FALSE(c.replica);
  EXPECT_FALSE(c.has_replicas);
  const std::string id(40, 'x');
  c.set_id(id);
  EXPECT_EQ(c.id(), id);
  c.set_id("short");
  EXPECT_EQ(c.id(), "short");
  c.set_state(v1::TASK_STATE_CANCELLED);
  c.replica = true;
  ColdTask moved = std::move(c);
  EXPECT_EQ(moved.id(), "short");
  EXPECT_EQ(moved.state(), v1::TASK_STATE_CANCELLED);
  EXPECT_TRUE(moved.replica);
  EXPECT_FALSE(moved.has_replicas);
}

TEST(ColdTask, KeepsAnIdLongerThanItsSizeFieldWhole) {
  // Ids have a limit now, but a table written before it may hold longer
  // ones: their size goes into the buffer instead of the 16-bit field.
  ColdTask c;
  for (size_t n : {size_t{ColdTask::kLongId} - 1, size_t{ColdTask::kLongId},
                   size_t{ColdTask::kLongId} + 1, size_t{70000}}) {
    std::string id(n, 'a');
    id.back() = 'z';
    c.set_id(id);
    EXPECT_EQ(c.id().size(), n);
    EXPECT_EQ(c.id(), id);
  }
}

}  // namespace
}  // namespace taskgrid::core
