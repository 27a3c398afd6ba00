// StreamTaskOutput over real gRPC on 127.0.0.1, with a real agent running a
// real process: its lines reach a follower while it runs, in order.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/cluster.h"

namespace taskgrid::testing {
namespace {

using ::testing::HasSubstr;
using Response = v1::StreamTaskOutputResponse;

struct Received {
  Response msg;
  absl::Time at;
  v1::TaskState task_state = v1::TASK_STATE_UNSPECIFIED;  // asked right after it came
};

TEST(Output, AFollowerGetsARunningProcesssLinesBeforeItEndsInOrder) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  // Six lines, half a second apart; the sixth on stderr too.
  ASSERT_TRUE(
      c.Submit({ExecSpec("talker", {"/bin/sh", "-c",
                                    "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done; "
                                    "echo done >&2"})})
          .ok());
  c.WaitFor("talker", v1::TASK_STATE_RUNNING);

  v1::StreamTaskOutputRequest req;
  req.set_id("talker");
  req.set_follow(true);
  auto ctx = InProcessCluster::Ctx(absl::Seconds(60));
  auto reader = c.tasks().StreamTaskOutput(ctx.get(), req);
  std::vector<Received> got;
  Response r;
  while (reader->Read(&r)) {
    Received rec{r, absl::Now()};
    // Where the task stood when the first bytes came.
    if (r.kind() == Response::KIND_OUTPUT && !r.data().empty() &&
        std::none_of(got.begin(), got.end(),
                     [](const Received& g) { return g.msg.kind() == Response::KIND_OUTPUT; })) {
      rec.task_state = c.Get("talker").state();
    }
    got.push_back(std::move(rec));
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();

  std::string out;
  std::string err;
  int64_t next_out = 0;
  absl::Time first_data = absl::InfiniteFuture();
  absl::Time end = absl::InfinitePast();
  for (const Received& g : got) {
    const Response& m = g.msg;
    if (m.kind() == Response::KIND_OUTPUT) {
      EXPECT_EQ(m.attempt(), 1);
      if (m.stream() == v1::OUTPUT_STREAM_STDOUT) {
        EXPECT_EQ(m.offset(), next_out) << "a gap or a repeat in the output";
        next_out = m.offset() + static_cast<int64_t>(m.data().size());
        out += m.data();
      } else {
        err += m.data();
      }
      if (!m.data().empty()) first_data = std::min(first_data, g.at);
      if (g.task_state != v1::TASK_STATE_UNSPECIFIED) {
        EXPECT_EQ(g.task_state, v1::TASK_STATE_RUNNING) << "the first line came after the end";
      }
    }
    if (m.kind() == Response::KIND_END) {
      end = g.at;
      EXPECT_EQ(m.state(), v1::TASK_STATE_SUCCEEDED);
    }
  }
  EXPECT_EQ(out, "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\n");
  EXPECT_EQ(err, "done\n");
  ASSERT_NE(end, absl::InfinitePast()) << "no END: the follow did not see the task finish";
  EXPECT_GE(end - first_data, absl::Seconds(1))
      << "the output came only when the task ended, not as it ran";
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front().msg.kind(), Response::KIND_ATTEMPT_STARTED);
  EXPECT_EQ(got.front().msg.agent_id(), "a1");
  EXPECT_EQ(got.back().msg.kind(), Response::KIND_END);
}

TEST(Output, UnknownTasksAndBadRequestsAreRefused) {
  InProcessCluster c;
  for (const auto& [id, stream, code, text] :
       std::vector<std::tuple<std::string, int, grpc::StatusCode, std::string>>{
           {"no-such-task", 0, grpc::StatusCode::NOT_FOUND, "\"no-such-task\""},
           {"", 0, grpc::StatusCode::INVALID_ARGUMENT, "id is empty"},
           {"x", 5, grpc::StatusCode::INVALID_ARGUMENT, "stream is 5"}}) {
    SCOPED_TRACE(id);
    v1::StreamTaskOutputRequest req;
    req.set_id(id);
    req.set_stream(static_cast<v1::OutputStream>(stream));
    auto ctx = InProcessCluster::Ctx();
    auto reader = c.tasks().StreamTaskOutput(ctx.get(), req);
    Response r;
    EXPECT_FALSE(reader->Read(&r));
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(text));
  }
}

}  // namespace
}  // namespace taskgrid::testing
