// Live output through the Engine (scheduler/engine/follow.cc) and its relay
// (scheduler/engine/output.h), with an in-memory store, fake agent channels
// and a fake clock. The test plays the agents: it reads what the Engine
// asks of them on their channels and sends their output itself. Nothing
// sleeps: Sync() waits for the commits, and the relay is read as the
// stream's reactor would read it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/message_limits.h"
#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/await.h"
#include "tests/testing/fake_agent_channel.h"

namespace taskgrid::engine {
namespace {

using ::testing::HasSubstr;
using Response = v1::StreamTaskOutputResponse;
using FakeChannel = testing::FakeAgentChannel;

using testing::Await;

// One agent on a fake channel.
struct FakeAgent {
  std::shared_ptr<FakeChannel> channel = std::make_shared<FakeChannel>();
  uint64_t conn = 0;

  // The WatchOutput messages it was sent, as "task/attempt:on|off".
  std::vector<std::string> Watches() const {
    std::vector<std::string> out;
    for (const v1::SchedulerMessage& m : channel->sent()) {
      if (!m.has_watch_output()) continue;
      const v1::WatchOutput& w = m.watch_output();
      out.push_back(w.task_id() + "/" + std::to_string(w.attempt()) + (w.watch() ? ":on" : ":off"));
    }
    return out;
  }
};

// A follower as its stream sees it: the wakes it got, and everything it
// read so far.
struct Reader {
  std::shared_ptr<OutputFollower> follower;
  std::shared_ptr<std::atomic<int>> wakes = std::make_shared<std::atomic<int>>(0);
  std::vector<Response> got;
  bool done = false;
  absl::Status error;

  // Reads what the relay has now (as the reactor does after a wake).
  void Drain(Engine& e, size_t max_bytes = 1 << 20) {
    for (int i = 0; i < 1000 && !done && error.ok(); ++i) {
      absl::StatusOr<OutputRelay::Batch> b = e.NextOutput(follower, max_bytes);
      if (!b.ok()) {
        error = b.status();
        return;
      }
      for (Response& r : b->msgs) got.push_back(std::move(r));
      done = b->done;
      if (b->msgs.empty()) return;
    }
  }
  // The output read, per stream, concatenated, with "[gap N]" where offsets
  // jumped.
  std::string Text(v1::OutputStream s = v1::OUTPUT_STREAM_STDOUT) const {
    std::string out;
    int32_t attempt = -1;
    int64_t next = 0;
    for (const Response& r : got) {
      if (r.kind() != Response::KIND_OUTPUT || r.stream() != s) continue;
      if (r.attempt() != attempt) {
        attempt = r.attempt();
        next = 0;
      }
      if (r.offset() > next) out += "[gap " + std::to_string(r.offset() - next) + "]";
      out += r.data();
      next = r.offset() + static_cast<int64_t>(r.data().size());
    }
    return out;
  }
  // The kinds read, as short names: started/1, out, ended/1/SUCCEEDED, end/STATE.
  std::vector<std::string> Kinds() const {
    std::vector<std::string> out;
    for (const Response& r : got) {
      switch (r.kind()) {
        case Response::KIND_ATTEMPT_STARTED:
          out.push_back("started/" + std::to_string(r.attempt()));
          break;
        case Response::KIND_OUTPUT:
          if (out.empty() || out.back() != "out") out.push_back("out");
          break;
        case Response::KIND_ATTEMPT_ENDED:
          out.push_back("ended/" + std::to_string(r.attempt()) + "/" +
                        v1::Outcome_Name(r.outcome()).substr(8));
          break;
        case Response::KIND_END:
          out.push_back("end/" + v1::TaskState_Name(r.state()).substr(11));
          break;
        default:
          out.push_back("?");
      }
    }
    return out;
  }
};

class EngineOutputTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> NewEngine(EngineOptions opts = {}) {
    opts.tick_interval = absl::Hours(1);  // the test drives time with TickNow()
    auto e = std::make_unique<Engine>(&mem_, &clock_, opts);
    EXPECT_TRUE(e->Start().ok());
    return e;
  }

  FakeAgent Connect(Engine& e, const std::string& id, bool live_output = true,
                    std::vector<v1::AttemptRef> running = {}) {
    FakeAgent a;
    a.conn = e.AttachAgent(a.channel);
    v1::Hello h;
    h.set_agent_id(id);
    h.set_slots(4);
    h.set_live_output(live_output);
    for (const v1::AttemptRef& r : running) *h.add_running() = r;
    EXPECT_TRUE(e.AgentHello(a.conn, h).ok());
    e.Sync();
    return a;
  }

  void Submit(Engine& e, const std::string& id, int max_attempts = 1,
              const std::string& agent = "") {
    v1::SubmitTasksRequest req;
    v1::TaskSpec* s = req.add_tasks();
    s->set_id(id);
    s->set_max_attempts(max_attempts);
    s->add_steps()->mutable_builtin()->set_name("noop");
    if (!agent.empty()) s->mutable_placement()->add_agent_ids(agent);
    auto r = Await<v1::SubmitTasksResponse>(
        [&](Engine::Reply<v1::SubmitTasksResponse> d) { e.SubmitTasks(req, d); });
    ASSERT_TRUE(r.ok()) << r.status();
    e.Sync();
  }

  static void Accept(Engine& e, const FakeAgent& a, const std::string& id, int32_t attempt = 1) {
    v1::AgentMessage m;
    m.mutable_accept()->set_task_id(id);
    m.mutable_accept()->set_attempt(attempt);
    e.AgentMessage(a.conn, m);
    e.Sync();
  }

  static void Output(Engine& e, const FakeAgent& a, const std::string& id, int32_t attempt,
                     int64_t offset, const std::string& data, bool caught_up = false,
                     v1::OutputStream s = v1::OUTPUT_STREAM_STDOUT) {
    v1::AgentMessage m;
    v1::TaskOutput* o = m.mutable_output();
    o->set_task_id(id);
    o->set_attempt(attempt);
    o->set_stream(s);
    o->set_offset(offset);
    o->set_data(data);
    o->set_caught_up(caught_up);
    e.AgentMessage(a.conn, m);
  }

  static void Finish(Engine& e, const FakeAgent& a, const std::string& id, int32_t attempt,
                     v1::Outcome outcome, const std::string& tail, int64_t cut = 0) {
    v1::AgentMessage m;
    v1::Result* r = m.mutable_result();
    r->set_task_id(id);
    r->set_attempt(attempt);
    r->mutable_result()->set_outcome(outcome);
    r->mutable_result()->set_exit_code(outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
    r->mutable_result()->set_stdout_tail(tail);
    r->mutable_result()->set_stdout_cut_bytes(cut);
    e.AgentMessage(a.conn, m);
    e.Sync();
  }

  static Reader Follow(Engine& e, const std::string& id, bool follow = true,
                       v1::OutputStream only = v1::OUTPUT_STREAM_UNSPECIFIED) {
    Reader r;
    v1::StreamTaskOutputRequest req;
    req.set_id(id);
    req.set_follow(follow);
    req.set_stream(only);
    auto f = e.StartOutput(req, [w = r.wakes] { ++*w; });
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) r.follower = *f;
    r.Drain(e);  // before the attach: nothing, and it waits for a wake
    e.Sync();    // attached
    return r;
  }

  int64_t Stale(Engine& e) {
    int64_t n = 0;
    e.Inspect([&](const core::Scheduler& s) { n = s.stale_messages(); });
    return n;
  }

  FakeClock clock_;
  store::MemoryStore mem_;
};

TEST_F(EngineOutputTest, TheFirstFollowerAsksTheAgentAndTheLastOneTellsItToStop) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Reader r1 = Follow(*e, "t");
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on"}));
  r1.Drain(*e);
  EXPECT_EQ(r1.Kinds(), (std::vector<std::string>{"started/1"}));
  EXPECT_EQ(r1.got[0].agent_id(), "a1");
  EXPECT_TRUE(r1.got[0].note().empty());

  // It read all there was and waits: output wakes it.
  const int wakes = r1.wakes->load();
  Output(*e, a, "t", 1, 0, "hello\n", /*caught_up=*/true);
  EXPECT_EQ(r1.wakes->load(), wakes + 1);
  r1.Drain(*e);
  EXPECT_EQ(r1.Text(), "hello\n");

  // A second follower reads the backlog; the agent is not asked again.
  Reader r2 = Follow(*e, "t");
  r2.Drain(*e);
  EXPECT_EQ(r2.Text(), "hello\n");
  Output(*e, a, "t", 1, 6, "world\n");
  r1.Drain(*e);
  r2.Drain(*e);
  EXPECT_EQ(r1.Text(), "hello\nworld\n");
  EXPECT_EQ(r2.Text(), "hello\nworld\n");
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on"}));
  EXPECT_EQ(e->Metrics().output_follows, 2);

  e->StopOutput(r1.follower);
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on"})) << "one follower is left";
  e->StopOutput(r2.follower);
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on", "t/1:off"}));
  EXPECT_EQ(e->Metrics().output_follows, 0);
}

TEST_F(EngineOutputTest, OutputFromAStaleAttemptOrAForeignAgentIsDroppedAndCounted) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  FakeAgent other = Connect(*e, "a2");
  Submit(*e, "t", 1, "a1");
  Accept(*e, a, "t");
  Reader r = Follow(*e, "t");
  const int64_t stale = Stale(*e);
  Output(*e, a, "t", 7, 0, "from attempt 7\n");
  Output(*e, other, "t", 1, 0, "from a2\n");
  Output(*e, a, "no-such-task", 1, 0, "nobody's\n");
  EXPECT_EQ(Stale(*e), stale + 3);
  Output(*e, a, "t", 1, 0, "mine\n");
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "mine\n") << "only the holder of the live attempt is relayed";

  // An agent that did not say live_output is never asked, and what it
  // sends anyway is dropped.
  FakeAgent old = Connect(*e, "old", /*live_output=*/false);
  Submit(*e, "u", 1, "old");
  Accept(*e, old, "u");
  Reader ru = Follow(*e, "u");
  ru.Drain(*e);
  EXPECT_TRUE(old.Watches().empty());
  ASSERT_EQ(ru.Kinds(), (std::vector<std::string>{"started/1"}));
  EXPECT_THAT(ru.got[0].note(), HasSubstr("does not send live output"));
  Output(*e, old, "u", 1, 0, "unasked\n");
  ru.Drain(*e);
  EXPECT_EQ(ru.Text(), "");
  // Its result's tail comes when the attempt ends.
  Finish(*e, old, "u", 1, v1::OUTCOME_SUCCEEDED, "from the tail\n");
  ru.Drain(*e);
  EXPECT_EQ(ru.Text(), "from the tail\n");
  EXPECT_EQ(ru.Kinds(),
            (std::vector<std::string>{"started/1", "out", "ended/1/SUCCEEDED", "end/SUCCEEDED"}));
  EXPECT_TRUE(ru.done);
}

TEST_F(EngineOutputTest, AnAttemptsEndSendsWhatItsTailHoldsPastTheLiveOutput) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Reader r = Follow(*e, "t");
  Output(*e, a, "t", 1, 0, "line 1\n", true);
  r.Drain(*e);
  // The result's tail holds the last 14 bytes of 21: line 2 and 3; line 2
  // overlaps nothing sent, line 1 is not sent twice.
  Finish(*e, a, "t", 1, v1::OUTCOME_SUCCEEDED, "line 2\nline 3\n", /*cut=*/7);
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "line 1\nline 2\nline 3\n");
  EXPECT_EQ(r.Kinds(),
            (std::vector<std::string>{"started/1", "out", "ended/1/SUCCEEDED", "end/SUCCEEDED"}));
  EXPECT_TRUE(r.done);
  e->StopOutput(r.follower);
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on"}))
      << "an attempt that ended stops its agent by itself: no stop is sent";
}

TEST_F(EngineOutputTest, AFinishedTaskIsAnsweredFromItsStoredTail) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Finish(*e, a, "t", 1, v1::OUTCOME_FAILED, "the end\n", /*cut=*/1000);
  for (bool follow : {false, true}) {
    SCOPED_TRACE(follow);
    Reader r = Follow(*e, "t", follow);
    r.Drain(*e);
    EXPECT_EQ(r.Text(), "[gap 1000]the end\n") << "the offset says 1000 bytes were not kept";
    EXPECT_EQ(r.Kinds(), (std::vector<std::string>{"out", "end/FAILED"}));
    EXPECT_TRUE(r.done);
    e->StopOutput(r.follower);
  }
  EXPECT_TRUE(a.Watches().empty()) << "no agent is asked about a finished task";
  // Once it lives on disk only, the same: read back from the store.
  clock_.Advance(EngineOptions().scheduler.finished_in_memory);
  e->TickNow();
  bool on_disk = false;
  e->Inspect([&](const core::Scheduler& s) { on_disk = s.FindCold("t") != nullptr; });
  ASSERT_TRUE(on_disk);
  Reader r = Follow(*e, "t", /*follow=*/true);
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "[gap 1000]the end\n");
  EXPECT_EQ(r.Kinds(), (std::vector<std::string>{"out", "end/FAILED"}));
  EXPECT_TRUE(r.done);
  e->StopOutput(r.follower);
}

TEST_F(EngineOutputTest, AFollowGoesOnAcrossAttemptsUntilTheTaskIsFinished) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t", /*max_attempts=*/2);
  Reader r = Follow(*e, "t");  // DISPATCHED: waits for the start
  r.Drain(*e);
  EXPECT_TRUE(r.got.empty());
  EXPECT_FALSE(r.done);
  Accept(*e, a, "t");
  r.Drain(*e);
  EXPECT_EQ(r.Kinds(), (std::vector<std::string>{"started/1"}));
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on"}));
  Output(*e, a, "t", 1, 0, "try 1\n", true);
  Finish(*e, a, "t", 1, v1::OUTCOME_FAILED, "try 1\n");
  r.Drain(*e);
  EXPECT_FALSE(r.done) << "a retry follows";
  // The backoff (1 s at most) passes, within the agent's heartbeat timeout.
  clock_.Advance(absl::Seconds(2));
  e->TickNow();
  e->Sync();
  Accept(*e, a, "t", 2);
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on", "t/2:on"}));
  Output(*e, a, "t", 2, 0, "try 2\n", true);
  Finish(*e, a, "t", 2, v1::OUTCOME_SUCCEEDED, "try 2\n");
  r.Drain(*e);
  EXPECT_EQ(r.Kinds(), (std::vector<std::string>{"started/1", "out", "ended/1/FAILED", "started/2",
                                                 "out", "ended/2/SUCCEEDED", "end/SUCCEEDED"}));
  EXPECT_EQ(r.Text(), "try 1\ntry 2\n");
  EXPECT_TRUE(r.done);
}

TEST_F(EngineOutputTest, AnAttemptStartedAndEndedInOneCommitStillShowsItsTail) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Reader r = Follow(*e, "t");
  // Its Accept and Result in one batch: the follower never saw it run.
  v1::AgentMessage batch;
  v1::AgentMessage* acc = batch.mutable_batch()->add_msgs();
  acc->mutable_accept()->set_task_id("t");
  acc->mutable_accept()->set_attempt(1);
  v1::Result* res = batch.mutable_batch()->add_msgs()->mutable_result();
  res->set_task_id("t");
  res->set_attempt(1);
  res->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  res->mutable_result()->set_stdout_tail("quick\n");
  e->AgentMessage(a.conn, batch);
  e->Sync();
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "quick\n");
  EXPECT_EQ(r.Kinds(),
            (std::vector<std::string>{"started/1", "out", "ended/1/SUCCEEDED", "end/SUCCEEDED"}));
}

TEST_F(EngineOutputTest, WithoutFollowTheStreamEndsWithWhatThereIsNow) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "pending", 1, "nobody");
  Reader p = Follow(*e, "pending", /*follow=*/false);
  p.Drain(*e);
  ASSERT_EQ(p.Kinds(), (std::vector<std::string>{"end/PENDING"}));
  EXPECT_THAT(p.got[0].note(), HasSubstr("not started"));
  EXPECT_TRUE(p.done);

  Submit(*e, "t", 1, "a1");
  Accept(*e, a, "t");
  Reader r = Follow(*e, "t", /*follow=*/false);
  r.Drain(*e);
  EXPECT_FALSE(r.done) << "the agent's answer is not in yet";
  Output(*e, a, "t", 1, 0, "so far\n", /*caught_up=*/true);
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "so far\n");
  EXPECT_EQ(r.Kinds(), (std::vector<std::string>{"started/1", "out", "end/RUNNING"}));
  EXPECT_TRUE(r.done);
  e->StopOutput(r.follower);
  EXPECT_EQ(a.Watches(), (std::vector<std::string>{"t/1:on", "t/1:off"}))
      << "its agent is told to stop once the last follower went";

  // The agent's stream ends before it answered: the follower is not left
  // waiting, and what came before the end still comes first.
  Submit(*e, "u", 1, "a1");
  Accept(*e, a, "u");
  Reader w = Follow(*e, "u", /*follow=*/false);
  Output(*e, a, "u", 1, 0, "partial\n");
  w.Drain(*e);
  EXPECT_FALSE(w.done);
  e->DetachAgent(a.conn);
  e->Sync();
  w.Drain(*e);
  EXPECT_TRUE(w.done);
  EXPECT_EQ(w.Text(), "partial\n");
  EXPECT_EQ(w.Kinds(), (std::vector<std::string>{"started/1", "out", "end/RUNNING"}));
  EXPECT_THAT(w.got.back().note(), HasSubstr("disconnected"));
}

TEST_F(EngineOutputTest, AReconnectedAgentIsAskedAgainOnItsNewStream) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Reader r = Follow(*e, "t");
  Output(*e, a, "t", 1, 0, "before\n", true);
  e->DetachAgent(a.conn);
  e->Sync();
  v1::AttemptRef running;
  running.set_task_id("t");
  running.set_attempt(1);
  FakeAgent back = Connect(*e, "a1", true, {running});
  EXPECT_EQ(back.Watches(), (std::vector<std::string>{"t/1:on"}));
  // It answers with everything it holds again: nothing is shown twice.
  Output(*e, back, "t", 1, 0, "before\nafter\n", true);
  Output(*e, a, "t", 1, 13, "old stream\n");  // the old stream is gone
  r.Drain(*e);
  EXPECT_EQ(r.Text(), "before\nafter\n");
}

TEST_F(EngineOutputTest, ASlowFollowerSkipsAheadAndOversizedOutputIsCut) {
  EngineOptions opts;
  opts.output.backlog_bytes = 1000;
  auto e = NewEngine(opts);
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Reader slow = Follow(*e, "t");
  slow.Drain(*e);
  // It reads nothing while 20 chunks of 100 bytes come: the backlog keeps
  // the newest 1000 bytes; the rest is skipped, and the offsets say so.
  for (int i = 0; i < 20; ++i) {
    Output(*e, a, "t", 1, i * 100, std::string(100, static_cast<char>('a' + i)));
  }
  slow.Drain(*e);
  EXPECT_EQ(slow.Text(), "[gap 1000]" + std::string(100, 'k') + std::string(100, 'l') +
                             std::string(100, 'm') + std::string(100, 'n') + std::string(100, 'o') +
                             std::string(100, 'p') + std::string(100, 'q') + std::string(100, 'r') +
                             std::string(100, 's') + std::string(100, 't'));
  // One message past the bound is cut to it, not relayed whole, and the
  // stream goes on.
  const size_t before = slow.got.size();
  Output(*e, a, "t", 1, 2000, std::string(kMaxOutputChunkBytes + 5000, 'z'));
  slow.Drain(*e);
  ASSERT_EQ(slow.got.size(), before + 1);
  EXPECT_EQ(slow.got.back().offset(), 2000);
  EXPECT_EQ(slow.got.back().data(), std::string(kMaxOutputChunkBytes, 'z'));
  Output(*e, a, "t", 1, 2000 + kMaxOutputChunkBytes + 5000, "next\n");
  slow.Drain(*e);
  EXPECT_THAT(slow.Text(), ::testing::EndsWith("[gap 5000]next\n"));
}

TEST_F(EngineOutputTest, BadRequestsAreRefusedAndFollowersAreBounded) {
  EngineOptions opts;
  opts.output.max_followers = 1;
  auto e = NewEngine(opts);
  Submit(*e, "t", 1, "nobody");
  auto start = [&](const std::string& id, int stream = 0) {
    v1::StreamTaskOutputRequest req;
    req.set_id(id);
    req.set_follow(true);
    req.set_stream(static_cast<v1::OutputStream>(stream));
    return e->StartOutput(req, [] {});
  };
  EXPECT_EQ(start("").status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_stream = start("t", 9);
  EXPECT_EQ(bad_stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_stream.status().message()), HasSubstr("stream is 9"));
  auto unknown = start("nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("\"nope\""));
  auto first = start("t");
  ASSERT_TRUE(first.ok());
  auto second = start("t");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("--max_output_follows=1"));
  e->StopOutput(*first);
  auto third = start("t");
  EXPECT_TRUE(third.ok()) << "a stream that ended frees its place";
  e->StopOutput(*third);
}

TEST_F(EngineOutputTest, OnlyTheStreamAskedForIsSent) {
  auto e = NewEngine();
  FakeAgent a = Connect(*e, "a1");
  Submit(*e, "t");
  Accept(*e, a, "t");
  Reader err = Follow(*e, "t", true, v1::OUTPUT_STREAM_STDERR);
  Output(*e, a, "t", 1, 0, "out\n");
  Output(*e, a, "t", 1, 0, "err\n", true, v1::OUTPUT_STREAM_STDERR);
  err.Drain(*e);
  EXPECT_EQ(err.Text(v1::OUTPUT_STREAM_STDOUT), "");
  EXPECT_EQ(err.Text(v1::OUTPUT_STREAM_STDERR), "err\n");
}

}  // namespace
}  // namespace taskgrid::engine
