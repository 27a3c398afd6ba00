// The agent's live output: the ring each running attempt keeps
// (agent/live_output.h) and the decisions of when and how much of it goes
// out (agent/output_watches.h), with times given, never waited for.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/live_output.h"
#include "agent/output_watches.h"

// A namespace of its own: the files of a test binary compile together
// (cmake/TaskgridTest.cmake) and agent_core_test.cc has file-local names too.
namespace taskgrid::agent::agent_output_test {
namespace {

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

// The output messages of `msgs`, as (stream, offset, data).
struct Out {
  v1::OutputStream stream;
  int64_t offset;
  std::string data;
  bool caught_up;
};
std::vector<Out> Outputs(const std::vector<v1::AgentMessage>& msgs) {
  std::vector<Out> out;
  for (const v1::AgentMessage& m : msgs) {
    EXPECT_TRUE(m.has_output());
    out.push_back(
        {m.output().stream(), m.output().offset(), m.output().data(), m.output().caught_up()});
  }
  return out;
}

TEST(LiveOutput, KeepsTheNewestBytesOfEachStreamAndCountsEveryByte) {
  LiveOutput live(10);
  live.Append(LiveOutput::kStdout, "abcdef", 6);
  EXPECT_EQ(live.Read(LiveOutput::kStdout, 0, 100).data, "abcdef");
  EXPECT_EQ(live.Read(LiveOutput::kStderr, 0, 100).data, "");
  // Wraps around the ring: the oldest bytes go.
  live.Append(LiveOutput::kStdout, "ghijkl", 6);
  EXPECT_EQ(live.end(LiveOutput::kStdout), 12);
  LiveOutput::Piece p = live.Read(LiveOutput::kStdout, 0, 100);
  EXPECT_EQ(p.offset, 2) << "bytes 0-1 were overwritten: the offset says so";
  EXPECT_EQ(p.data, "cdefghijkl");
  // From the middle, and bounded.
  p = live.Read(LiveOutput::kStdout, 5, 4);
  EXPECT_EQ(p.offset, 5);
  EXPECT_EQ(p.data, "fghi");
  // At the end: nothing.
  p = live.Read(LiveOutput::kStdout, 12, 4);
  EXPECT_EQ(p.offset, 12);
  EXPECT_EQ(p.data, "");
  // One write larger than the ring keeps its own last bytes.
  live.Append(LiveOutput::kStderr, "0123456789ABCDEF", 16);
  p = live.Read(LiveOutput::kStderr, 0, 100);
  EXPECT_EQ(p.offset, 6);
  EXPECT_EQ(p.data, "6789ABCDEF");
  EXPECT_EQ(live.end(LiveOutput::kStderr), 16);
}

TEST(OutputWatches, StartSendsWhatIsHeldMarkedCaughtUpThenNewOutputAtTheInterval) {
  auto live = std::make_shared<LiveOutput>(1024);
  live->Append(LiveOutput::kStdout, "early\n", 6);
  live->Append(LiveOutput::kStderr, "warn\n", 5);
  OutputWatches w;  // 200 ms, polled every 50 ms
  std::vector<Out> out = Outputs(w.Start("t", 1, live, Ms(1000)));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].stream, v1::OUTPUT_STREAM_STDOUT);
  EXPECT_EQ(out[0].data, "early\n");
  EXPECT_FALSE(out[0].caught_up);
  EXPECT_EQ(out[1].stream, v1::OUTPUT_STREAM_STDERR);
  EXPECT_EQ(out[1].data, "warn\n");
  EXPECT_TRUE(out[1].caught_up) << "the last message of the answer says so";
  EXPECT_EQ(w.NextDue(), Ms(1050));

  live->Append(LiveOutput::kStdout, "x\n", 2);
  for (int64_t t = 1050; t < 1200; t += 50) {
    EXPECT_TRUE(w.Due(Ms(t)).empty()) << "sent " << t - 1000 << " ms after the last: too soon";
  }
  out = Outputs(w.Due(Ms(1200)));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].offset, 6);
  EXPECT_EQ(out[0].data, "x\n");
  EXPECT_FALSE(out[0].caught_up);
  // Nothing new: nothing sent, however long.
  EXPECT_TRUE(w.Due(Ms(2000)).empty());
}

TEST(OutputWatches, AFullChunkGoesAtTheNextPollAndEachMessageIsBounded) {
  auto live = std::make_shared<LiveOutput>(100);
  OutputWatchOptions o;
  o.eager_bytes = 40;
  o.max_chunk = 30;
  OutputWatches w(o);
  std::vector<Out> out = Outputs(w.Start("t", 1, live, Ms(0)));
  ASSERT_EQ(out.size(), 1u) << "nothing held: one empty message, caught up";
  EXPECT_TRUE(out[0].data.empty());
  EXPECT_TRUE(out[0].caught_up);

  live->Append(LiveOutput::kStdout, std::string(39, 'a').data(), 39);
  EXPECT_TRUE(w.Due(Ms(50)).empty()) << "under eager_bytes: waits for the interval";
  live->Append(LiveOutput::kStdout, "b", 1);
  out = Outputs(w.Due(Ms(100)));
  ASSERT_EQ(out.size(), 2u) << "40 bytes in messages of at most 30";
  EXPECT_EQ(out[0].offset, 0);
  EXPECT_EQ(out[0].data.size(), 30u);
  EXPECT_EQ(out[1].offset, 30);
  EXPECT_EQ(out[1].data, std::string(9, 'a') + "b");

  // Outrun: 250 bytes into a ring of 100. The next message starts at the
  // oldest byte kept; the jump from 40 to 190 is what was skipped.
  live->Append(LiveOutput::kStdout, std::string(250, 'c').data(), 250);
  out = Outputs(w.Due(Ms(150)));
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0].offset, 190);
  int64_t total = 0;
  for (const Out& m : out) {
    EXPECT_LE(m.data.size(), 30u);
    total += static_cast<int64_t>(m.data.size());
  }
  EXPECT_EQ(total, 100);
}

TEST(OutputWatches, FinishSendsTheRestAtOnceAndStopAndClearSendNothingMore) {
  auto live = std::make_shared<LiveOutput>(1024);
  OutputWatches w;
  w.Start("t", 1, live, Ms(0));
  w.Start("u", 1, live, Ms(0));
  live->Append(LiveOutput::kStdout, "last\n", 5);
  // The attempt ended 10 ms after the last message: no waiting for the
  // interval, its output must go before its Result.
  std::vector<Out> out = Outputs(w.Finish("t", 1));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "last\n");
  EXPECT_FALSE(w.watching("t", 1));
  EXPECT_TRUE(w.Finish("t", 1).empty()) << "not watched any more";

  w.Stop("u", 1);
  EXPECT_TRUE(w.Due(Ms(1000)).empty()) << "stopped: nothing sent";
  EXPECT_EQ(w.NextDue(), absl::InfiniteDuration());

  w.Start("v", 2, live, Ms(2000));
  live->Append(LiveOutput::kStdout, "more\n", 5);
  w.Clear();
  EXPECT_TRUE(w.Due(Ms(3000)).empty()) << "the stream ended: watches end with it";
  EXPECT_EQ(w.size(), 0u);

  // An attempt not running here: one empty message, caught up, no watch.
  out = Outputs(w.Start("gone", 3, nullptr, Ms(4000)));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].caught_up);
  EXPECT_TRUE(out[0].data.empty());
  EXPECT_FALSE(w.watching("gone", 3));
}

}  // namespace
}  // namespace taskgrid::agent::agent_output_test
