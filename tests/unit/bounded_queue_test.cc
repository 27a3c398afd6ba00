// BoundedQueue between two threads: order, the bound, and both ways to end
// it. No sleeping: each test's outcome holds whatever the interleaving.
#include "scheduler/engine/bounded_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace taskgrid::engine {
namespace {

TEST(BoundedQueue, HandsOverEveryItemInOrderWithinItsBound) {
  BoundedQueue<int> q(2);
  std::atomic<int> pushed{0};
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(q.Push(i));
      ++pushed;
    }
    q.Close();
  });
  std::vector<int> got;
  while (std::optional<int> v = q.Pop()) {
    got.push_back(*v);
    // At most the capacity ahead of the consumer (+1 pushed and counted
    // between two pops).
    EXPECT_LE(pushed.load(), static_cast<int>(got.size()) + 3);
  }
  producer.join();
  ASSERT_EQ(got.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[i], i);
}

TEST(BoundedQueue, CloseLetsTheConsumerDrainWhatIsQueued) {
  BoundedQueue<int> q(4);
  ASSERT_TRUE(q.Push(1));
  ASSERT_TRUE(q.Push(2));
  q.Close();
  EXPECT_EQ(q.Pop(), 1);
  EXPECT_EQ(q.Pop(), 2);
  EXPECT_EQ(q.Pop(), std::nullopt);
}

TEST(BoundedQueue, CancelReleasesABlockedProducerAndDropsTheRest) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(1));
  // Full: this Push waits until the cancel (or sees it at once).
  std::thread producer([&] { EXPECT_FALSE(q.Push(2)); });
  q.Cancel();
  producer.join();
  EXPECT_EQ(q.Pop(), std::nullopt);
  EXPECT_FALSE(q.Push(3));
}

TEST(BoundedQueue, CancelReleasesAWaitingConsumer) {
  BoundedQueue<int> q(1);
  std::thread consumer([&] { EXPECT_EQ(q.Pop(), std::nullopt); });
  q.Cancel();
  consumer.join();
}

}  // namespace
}  // namespace taskgrid::engine
