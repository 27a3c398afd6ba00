#include "common/batching.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>

#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid {
namespace {

v1::SchedulerMessage AckOf(const std::string& id) {
  v1::SchedulerMessage m;
  m.mutable_result_ack()->set_task_id(id);
  return m;
}

v1::SchedulerMessage AssignOf(const std::string& id, size_t payload_bytes) {
  v1::SchedulerMessage m;
  v1::Assignment* a = m.mutable_assign()->add_tasks();
  a->set_task_id(id);
  a->set_payload(std::string(payload_bytes, 'p'));
  return m;
}

TEST(TakeBatch, WithoutBatchesTakesOneAtATime) {
  std::deque<v1::SchedulerMessage> q = {AckOf("a"), AckOf("b")};
  size_t taken = 0;
  v1::SchedulerMessage m = TakeBatch(q, /*batches=*/false, kMaxBatchBytes, nullptr, &taken);
  EXPECT_EQ(m.result_ack().task_id(), "a");
  EXPECT_EQ(taken, AckOf("a").ByteSizeLong());
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q.front().result_ack().task_id(), "b");
}

TEST(TakeBatch, OneQueuedGoesAloneNotAsABatch) {
  std::deque<v1::SchedulerMessage> q = {AckOf("a")};
  v1::SchedulerMessage m = TakeBatch(q, /*batches=*/true);
  EXPECT_TRUE(m.has_result_ack());
  EXPECT_TRUE(q.empty());
}

TEST(TakeBatch, SmallMessagesGoTogetherInOrder) {
  std::deque<v1::SchedulerMessage> q;
  for (int i = 0; i < 100; ++i) q.push_back(AckOf(std::to_string(i)));
  v1::SchedulerMessage m = TakeBatch(q, /*batches=*/true);
  ASSERT_TRUE(m.has_batch());
  ASSERT_EQ(m.batch().msgs_size(), 100);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(m.batch().msgs(i).result_ack().task_id(), std::to_string(i));
  EXPECT_TRUE(q.empty());
}

TEST(TakeBatch, SplitsByBytesAndNeverPassesTheLimit) {
  // 10 Assigns of 1 MiB each: a 4 MiB limit takes 3 at a time (4 would pass
  // it with their framing), and the last write takes the one left.
  std::deque<v1::SchedulerMessage> q;
  for (int i = 0; i < 10; ++i) q.push_back(AssignOf(std::to_string(i), 1 << 20));
  std::vector<int> sizes;
  int next = 0;
  while (!q.empty()) {
    v1::SchedulerMessage m = TakeBatch(q, /*batches=*/true, 4 << 20);
    EXPECT_LE(m.ByteSizeLong(), size_t{4 << 20});
    if (m.has_batch()) {
      sizes.push_back(m.batch().msgs_size());
      for (const auto& inner : m.batch().msgs()) {
        EXPECT_EQ(inner.assign().tasks(0).task_id(), std::to_string(next++));
      }
    } else {
      sizes.push_back(1);
      EXPECT_EQ(m.assign().tasks(0).task_id(), std::to_string(next++));
    }
  }
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 3, 1}));
  EXPECT_EQ(next, 10);
}

TEST(TakeBatch, AMessageOverTheLimitGoesAlone) {
  std::deque<v1::SchedulerMessage> q = {AssignOf("big", 2 << 20), AckOf("after")};
  size_t taken = 0;
  v1::SchedulerMessage m = TakeBatch(q, /*batches=*/true, 1 << 20, nullptr, &taken);
  EXPECT_TRUE(m.has_assign());
  EXPECT_GT(taken, size_t{2 << 20});
  ASSERT_EQ(q.size(), 1u);
  EXPECT_TRUE(TakeBatch(q, true, 1 << 20).has_result_ack());
}

TEST(TakeBatch, KnownSizesAreUsedAndConsumedInStep) {
  std::deque<v1::SchedulerMessage> q = {AckOf("a"), AckOf("b"), AckOf("c")};
  // Sizes that say the first two fill the limit: the batch stops there.
  std::deque<size_t> sizes = {40, 40, 30};
  size_t taken = 0;
  v1::SchedulerMessage m = TakeBatch(q, /*batches=*/true, 100, &sizes, &taken);
  ASSERT_TRUE(m.has_batch());
  EXPECT_EQ(m.batch().msgs_size(), 2);
  EXPECT_EQ(taken, 80u);
  EXPECT_EQ(sizes, std::deque<size_t>{30});
  EXPECT_EQ(q.size(), 1u);
}

TEST(TakeBatch, WorksForAgentMessagesToo) {
  std::deque<v1::AgentMessage> q(3);
  for (int i = 0; i < 3; ++i) {
    q[i].mutable_result()->set_task_id(std::to_string(i));
    q[i].mutable_result()->mutable_result()->set_stdout_tail(std::string(1 << 20, 'o'));
  }
  v1::AgentMessage m = TakeBatch(q, true, (2 << 20) + 100);
  ASSERT_TRUE(m.has_batch());
  EXPECT_EQ(m.batch().msgs_size(), 2);
  EXPECT_EQ(q.size(), 1u);
}

}  // namespace
}  // namespace taskgrid
