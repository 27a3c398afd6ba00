// The agent (agent/agent.h) against a fake scheduler: an in-process gRPC
// AgentService on 127.0.0.1 that records every AgentMessage and answers only
// as the test says. Real streams, real time, builtin steps; every wait is
// bounded and none is a sleep that the test's outcome depends on. How long
// the agent waits (heartbeat intervals, leases, drain deadlines) is tested
// to the millisecond with a FakeClock in tests/unit/agent_core_test.cc;
// here, that the same rules hold over a real stream.
#include "agent/agent.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/proto_time.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"

namespace taskgrid::agent {
namespace {

using ::testing::HasSubstr;

absl::Duration Mono() { return RealClock::Get()->Monotonic(); }

// One AgentMessage as the fake received it.
struct Received {
  int session = 0;    // 1 for the first stream, 2 for the next...
  absl::Duration at;  // monotonic
  v1::AgentMessage msg;
  int wire = 0;   // the message on the wire (of all streams), from 1; shared within a batch
  int batch = 0;  // the size of the AgentBatch it came in; 0: it came alone
};
using Log = std::vector<Received>;

// The fake scheduler. Connect (sync API: one handler thread per stream plus
// a reader thread) records what arrives and writes what the test pushes.
// By default it answers Hello with Welcome, every Heartbeat with
// HeartbeatAck, every Result and Release with ResultAck{accepted}.
class FakeScheduler final : public v1::AgentService::Service {
 public:
  FakeScheduler() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port_, 0);
  }
  ~FakeScheduler() override { server_->Shutdown(std::chrono::system_clock::now()); }

  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  // What it answers on its own.
  void set_ack_heartbeats(bool v) { Set(&ack_heartbeats_, v); }
  void set_ack_results(bool v) { Set(&ack_results_, v); }
  // Refuses every new stream (UNAVAILABLE) while set.
  void set_refuse(bool v) { Set(&refuse_, v); }
  // Says Welcome.batches, and unpacks every AgentBatch into the log.
  void set_batches(bool v) { Set(&batches_, v); }
  void set_stop_on_lost_after(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_on_lost_after_ = d;
  }
  // Welcome and every HeartbeatAck give this heartbeat_lease (zero: none,
  // as an older scheduler).
  void set_lease(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = d;
  }
  // Every HeartbeatAck tells this interval (zero: none).
  void set_ack_interval(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    ack_interval_ = d;
  }

  // Writes `m` on the live stream; fails the test when there is none.
  void Push(const v1::SchedulerMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(current_);
    ASSERT_NE(it, streams_.end()) << "no live stream to push to";
    it->second.outbox.push_back(m);
    cv_.notify_all();
  }
  void PushAck(const std::string& task_id, int32_t attempt) {
    v1::SchedulerMessage m;
    m.mutable_result_ack()->set_task_id(task_id);
    m.mutable_result_ack()->set_attempt(attempt);
    m.mutable_result_ack()->set_accepted(true);
    Push(m);
  }
  // Ends the live stream (the agent sees it break).
  void EndStream() {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(current_);
    ASSERT_NE(it, streams_.end()) << "no live stream to end";
    it->second.end = true;
    cv_.notify_all();
  }

  Log log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  int refused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }

  // Polls until pred(log) holds; false after `timeout`.
  bool WaitFor(const std::function<bool(const Log&)>& pred,
               absl::Duration timeout = absl::Seconds(5)) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return pred(log_); });
  }

  grpc::Status Connect(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::SchedulerMessage, v1::AgentMessage>* stream) override {
    int session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (refuse_) {
        ++refused_;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the fake refuses streams");
      }
      session = ++sessions_;
      current_ = session;
      streams_[session];
    }
    std::thread reader([&] {
      v1::AgentMessage wire_msg;
      while (stream->Read(&wire_msg)) {
        std::lock_guard<std::mutex> lock(mu_);
        const int wire = ++wire_count_;
        std::vector<v1::AgentMessage> msgs;
        int batch = 0;
        if (wire_msg.has_batch()) {
          batch = wire_msg.batch().msgs_size();
          msgs.assign(wire_msg.batch().msgs().begin(), wire_msg.batch().msgs().end());
        } else {
          msgs.push_back(wire_msg);
        }
        for (const v1::AgentMessage& m : msgs) {
          log_.push_back({session, Mono(), m, wire, batch});
          std::deque<v1::SchedulerMessage>& out = streams_[session].outbox;
          if (m.has_hello()) {
            v1::Welcome* w = out.emplace_back().mutable_welcome();
            w->set_session_id("s" + std::to_string(session));
            *w->mutable_heartbeat_interval() = ToProto(absl::Milliseconds(100));
            *w->mutable_stop_on_lost_after() = ToProto(stop_on_lost_after_);
            if (lease_ > absl::ZeroDuration()) *w->mutable_heartbeat_lease() = ToProto(lease_);
            w->set_batches(batches_);
          } else if (m.has_heartbeat() && ack_heartbeats_) {
            v1::HeartbeatAck* ack = out.emplace_back().mutable_heartbeat_ack();
            if (ack_interval_ > absl::ZeroDuration()) {
              *ack->mutable_heartbeat_interval() = ToProto(ack_interval_);
            }
            if (lease_ > absl::ZeroDuration()) *ack->mutable_heartbeat_lease() = ToProto(lease_);
          } else if ((m.has_result() || m.has_release()) && ack_results_) {
            v1::ResultAck* ack = out.emplace_back().mutable_result_ack();
            ack->set_task_id(m.has_result() ? m.result().task_id() : m.release().task_id());
            ack->set_attempt(m.has_result() ? m.result().attempt() : m.release().attempt());
            ack->set_accepted(true);
          } else if (m.has_goodbye()) {
            streams_[session].end = true;  // as the scheduler does
          }
        }
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      streams_[session].reader_done = true;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      Stream& s = streams_[session];
      // Bounded, so a server shutdown (ctx cancelled) is noticed.
      cv_.wait_for(lock, std::chrono::milliseconds(20),
                   [&] { return !s.outbox.empty() || s.reader_done || s.end; });
      if (s.reader_done || s.end || ctx->IsCancelled()) break;
      while (!s.outbox.empty()) {
        v1::SchedulerMessage m = std::move(s.outbox.front());
        s.outbox.pop_front();
        lock.unlock();
        stream->Write(m);
        lock.lock();
      }
    }
    if (current_ == session) current_ = 0;
    streams_.erase(session);
    lock.unlock();
    ctx->TryCancel();  // unblocks the reader's Read
    reader.join();
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the fake ended the stream");
  }

 private:
  struct Stream {
    std::deque<v1::SchedulerMessage> outbox;
    bool end = false;
    bool reader_done = false;
  };
  void Set(bool* field, bool v) {
    std::lock_guard<std::mutex> lock(mu_);
    *field = v;
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool ack_heartbeats_ = true;  // guarded by mu_, like everything below
  bool ack_results_ = true;
  bool refuse_ = false;
  bool batches_ = false;
  int wire_count_ = 0;
  absl::Duration stop_on_lost_after_ = absl::Seconds(1);
  absl::Duration lease_ = absl::ZeroDuration();
  absl::Duration ack_interval_ = absl::ZeroDuration();
  int sessions_ = 0;
  int current_ = 0;
  int refused_ = 0;
  std::map<int, Stream> streams_;
  Log log_;
};

// --- Reading the log ---

using Pred = std::function<bool(const Received&)>;

// Index of the first entry at or after `from` matching, or -1.
int Find(const Log& log, const Pred& p, int from = 0) {
  for (int i = from; i < static_cast<int>(log.size()); ++i) {
    if (p(log[i])) return i;
  }
  return -1;
}
int Count(const Log& log, const Pred& p) {
  int n = 0;
  for (const Received& r : log) n += p(r) ? 1 : 0;
  return n;
}
Pred InSession(int session, Pred p) {
  return [session, p](const Received& r) { return r.session == session && p(r); };
}
Pred IsHello() {
  return [](const Received& r) { return r.msg.has_hello(); };
}
Pred IsHeartbeat() {
  return [](const Received& r) { return r.msg.has_heartbeat(); };
}
Pred IsDraining() {
  return [](const Received& r) { return r.msg.has_draining(); };
}
Pred IsAccept(const std::string& id) {
  return [id](const Received& r) { return r.msg.has_accept() && r.msg.accept().task_id() == id; };
}
Pred IsReject(const std::string& id) {
  return [id](const Received& r) { return r.msg.has_reject() && r.msg.reject().task_id() == id; };
}
Pred IsResult(const std::string& id) {
  return [id](const Received& r) { return r.msg.has_result() && r.msg.result().task_id() == id; };
}
Pred IsRelease(const std::string& id) {
  return [id](const Received& r) { return r.msg.has_release() && r.msg.release().task_id() == id; };
}
// Any message about task `id`: Accept, Reject, Result or Release.
Pred About(const std::string& id) {
  return [id](const Received& r) {
    return IsAccept(id)(r) || IsReject(id)(r) || IsResult(id)(r) || IsRelease(id)(r);
  };
}
// The (task id, attempt) pairs a Hello or Heartbeat lists.
std::set<std::pair<std::string, int>> Listed(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& refs) {
  std::set<std::pair<std::string, int>> listed;
  for (const v1::AttemptRef& r : refs) listed.insert({r.task_id(), r.attempt()});
  return listed;
}
// The task ids listed as waiting chain links.
std::set<std::string> ListedWaiting(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& refs) {
  std::set<std::string> waiting;
  for (const v1::AttemptRef& r : refs) {
    if (r.waiting()) waiting.insert(r.task_id());
  }
  return waiting;
}
// Waits for the first match; -1 (and a test failure) after `timeout`.
int WaitFind(const FakeScheduler& fake, const Pred& p, const std::string& what,
             absl::Duration timeout = absl::Seconds(5)) {
  int at = -1;
  const bool ok = fake.WaitFor(
      [&](const Log& log) {
        at = Find(log, p);
        return at >= 0;
      },
      timeout);
  EXPECT_TRUE(ok) << "timed out waiting for " << what;
  return ok ? at : -1;
}

// --- Assignments ---

v1::Assignment Task(const std::string& id, const std::string& builtin,
                    std::vector<std::string> args = {}, int32_t attempt = 1) {
  v1::Assignment a;
  a.set_task_id(id);
  a.set_attempt(attempt);
  a.set_queue("default");
  v1::BuiltinStep* b = a.add_steps()->mutable_builtin();
  b->set_name(builtin);
  for (std::string& s : args) b->add_args(std::move(s));
  return a;
}
v1::Assignment Sleep(const std::string& id, const std::string& seconds) {
  return Task(id, "sleep", {seconds});
}
// An exec step running `script` with /bin/sh.
v1::Assignment Sh(const std::string& id, const std::string& script) {
  v1::Assignment a;
  a.set_task_id(id);
  a.set_attempt(1);
  a.set_queue("default");
  v1::ExecStep* e = a.add_steps()->mutable_exec();
  for (const char* arg : {"/bin/sh", "-c"}) e->add_argv(arg);
  e->add_argv(script);
  return a;
}
// `a` as a chain link that runs after `pred`.
v1::Assignment After(const std::string& pred, v1::Assignment a) {
  a.set_run_after(pred);
  return a;
}
v1::SchedulerMessage CancelMsg(const std::string& id, int32_t attempt) {
  v1::SchedulerMessage m;
  m.mutable_cancel()->set_task_id(id);
  m.mutable_cancel()->set_attempt(attempt);
  return m;
}

// A directory of the test's own, removed at the end. Gates live in it: a
// task made by Gated() runs until Open() makes its file, so a test decides
// when it ends without guessing at durations.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/agent_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Gate(const std::string& name) const { return path_ + "/gate-" + name; }

 private:
  std::string path_;
};
v1::Assignment Gated(const std::string& id, const std::string& gate) {
  return Sh(id, "while [ ! -e '" + gate + "' ]; do sleep 0.01; done");
}
void Open(const std::string& gate) { std::ofstream(gate).flush(); }

v1::SchedulerMessage Assign(std::vector<v1::Assignment> tasks) {
  v1::SchedulerMessage m;
  for (v1::Assignment& a : tasks) *m.mutable_assign()->add_tasks() = std::move(a);
  return m;
}
v1::SchedulerMessage DrainMsg() {
  v1::SchedulerMessage m;
  m.mutable_drain();
  return m;
}

// --- The agent under test ---

AgentOptions Options(const std::string& addr) {
  AgentOptions o;
  o.scheduler = addr;
  o.id = "a1";
  o.slots = 2;
  o.exec.kill_grace = absl::Milliseconds(200);
  o.reconnect_min = absl::Milliseconds(20);
  o.reconnect_max = absl::Milliseconds(100);
  o.stop_flush = absl::Milliseconds(500);
  return o;
}

// An Agent with its Run() on a thread. The destructor stops it and fails
// (then aborts, rather than hang) if Run() does not return in time.
class RunningAgent {
 public:
  // An agent without a work directory of its own gets one for this test:
  // what it keeps for the next agent (kept/) must not reach another test's.
  explicit RunningAgent(AgentOptions o)
      : agent_(WithWorkDir(std::move(o), work_.path())), thread_([this] {
          agent_.Run();
          returned_at_ = Mono();
          returned_ = true;
        }) {}
  ~RunningAgent() {
    agent_.Stop();
    if (!WaitReturned(absl::Seconds(10))) {
      ADD_FAILURE() << "Agent::Run() did not return 10 s after Stop()";
      std::abort();
    }
    thread_.join();
  }
  Agent& operator*() { return agent_; }
  Agent* operator->() { return &agent_; }

  bool returned() const { return returned_; }
  // Once returned() is true.
  absl::Duration returned_at() const { return returned_at_; }
  bool WaitReturned(absl::Duration timeout) const {
    return Eventually([this] { return returned_.load(); }, timeout);
  }

  static AgentOptions WithWorkDir(AgentOptions o, const std::string& dir) {
    if (o.exec.work_dir.empty()) o.exec.work_dir = dir;
    return o;
  }

  static bool Eventually(const std::function<bool()>& pred, absl::Duration timeout) {
    const absl::Duration deadline = Mono() + timeout;
    while (Mono() < deadline) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return pred();
  }

 private:
  TempDir work_;  // before agent_: it is made first and removed last
  Agent agent_;
  std::atomic<bool> returned_{false};
  absl::Duration returned_at_;  // written before returned_ is set
  std::thread thread_;
};

// Waits until the agent's stream `session` said Hello (the fake has queued
// its Welcome, so pushes after this follow the Welcome).
void WaitHello(const FakeScheduler& fake, int session) {
  WaitFind(fake, InSession(session, IsHello()), "hello on stream " + std::to_string(session));
}

// --- Tests ---

TEST(Agent, AcceptPrecedesResultAndUnackedResultIsResent) {
  FakeScheduler fake;
  fake.set_ack_results(false);
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Task("quick", "noop"), Sleep("short", "0.2")}));
  for (const std::string id : {"quick", "short"}) {
    const int result = WaitFind(fake, IsResult(id), "result of " + id);
    const int accept = Find(fake.log(), IsAccept(id));
    ASSERT_GE(accept, 0) << id;
    EXPECT_LT(accept, result) << id << ": Accept must precede Result";
    EXPECT_EQ(fake.log()[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  }
  EXPECT_EQ(agent->unacked(), 2);

  fake.EndStream();
  WaitHello(fake, 2);
  const Log log = fake.log();
  const v1::Hello& hello = log[Find(log, InSession(2, IsHello()))].msg.hello();
  std::set<std::pair<std::string, int>> listed;
  for (const v1::AttemptRef& r : hello.running()) listed.insert({r.task_id(), r.attempt()});
  EXPECT_EQ(listed, (std::set<std::pair<std::string, int>>{{"quick", 1}, {"short", 1}}));
  EXPECT_FALSE(hello.draining());
  for (const std::string id : {"quick", "short"}) {
    WaitFind(fake, InSession(2, IsResult(id)), "resent result of " + id);
    fake.PushAck(id, 1);
  }
  EXPECT_TRUE(RunningAgent::Eventually([&] { return agent->unacked() == 0; }, absl::Seconds(5)));
  EXPECT_FALSE(agent.returned());
}

TEST(Agent, LeavesASchedulerThatStopsAnsweringAndSelfFencesWhenNoneTakesItBack) {
  FakeScheduler fake;
  fake.set_ack_heartbeats(false);  // stop_on_lost_after is 1 s in Welcome
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  // From now on nothing answers: no heartbeat ack, no new stream.
  fake.set_refuse(true);
  const absl::Duration assigned = Mono();
  ASSERT_TRUE(RunningAgent::Eventually(
      [&] { return agent->running() == 0 && agent->unacked() == 1; }, absl::Seconds(4)))
      << "the agent did not stop its task";
  EXPECT_GE(Mono() - assigned, absl::Milliseconds(900));
  EXPECT_LT(Mono() - assigned, absl::Seconds(3));
  // It left the silent stream (half of stop_on_lost_after without an
  // ack) and tried to connect again.
  EXPECT_TRUE(RunningAgent::Eventually([&] { return fake.refused() > 0; }, absl::Seconds(4)));
  EXPECT_GE(Count(fake.log(), IsHeartbeat()), 3) << "heartbeats went out meanwhile";

  fake.set_refuse(false);
  WaitHello(fake, 2);
  // Handed back as a Release: not counted as an attempt.
  const int result = WaitFind(fake, InSession(2, IsRelease("long")), "the self-fenced release");
  ASSERT_GE(result, 0);
  const Log log = fake.log();
  EXPECT_EQ(log[result].msg.release().reason(), "stopped: no contact with the scheduler for 1s");
  EXPECT_TRUE(RunningAgent::Eventually([&] { return agent->unacked() == 0; }, absl::Seconds(5)));
}

TEST(Agent, AWelcomeOnANewStreamIsContactEvenWhenHeartbeatsGoUnanswered) {
  FakeScheduler fake;
  fake.set_ack_heartbeats(false);
  fake.set_stop_on_lost_after(absl::Seconds(2));
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  // Each silent stream is left after 1 s; the next one's Welcome answers
  // the Hello that listed the task, so it runs on past stop_on_lost_after.
  EXPECT_FALSE(
      RunningAgent::Eventually([&] { return agent->running() == 0; }, absl::Milliseconds(2500)))
      << "stopped although each new stream's Welcome was contact";
  EXPECT_GE(Count(fake.log(), IsHello()), 2) << "it left the silent stream";
  EXPECT_EQ(Find(fake.log(), IsResult("long")), -1);
  EXPECT_EQ(Find(fake.log(), IsRelease("long")), -1);
}

TEST(Agent, StreamEndCutsTheLease) {
  FakeScheduler fake;
  fake.set_stop_on_lost_after(absl::Seconds(1));
  fake.set_lease(absl::Seconds(30));
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  fake.set_refuse(true);
  const absl::Duration cut = Mono();
  fake.EndStream();
  ASSERT_TRUE(RunningAgent::Eventually(
      [&] { return agent->running() == 0 && agent->unacked() == 1; }, absl::Seconds(4)))
      << "the agent kept its task for the lease after its stream ended";
  EXPECT_LT(Mono() - cut, absl::Seconds(2));
}

TEST(Agent, SelfFencesWhileDisconnected) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  fake.set_refuse(true);
  const absl::Duration cut = Mono();
  fake.EndStream();
  ASSERT_TRUE(RunningAgent::Eventually(
      [&] { return agent->running() == 0 && agent->unacked() == 1; }, absl::Seconds(4)))
      << "the agent did not stop its task while cut off";
  EXPECT_LT(Mono() - cut, absl::Seconds(2));
  EXPECT_GT(fake.refused(), 0) << "it kept trying to reconnect";

  fake.set_refuse(false);
  WaitHello(fake, 2);
  const int result = WaitFind(fake, InSession(2, IsRelease("long")), "the resent release");
  ASSERT_GE(result, 0);
  const Log log = fake.log();
  const v1::Hello& hello = log[Find(log, InSession(2, IsHello()))].msg.hello();
  ASSERT_EQ(hello.running_size(), 1);
  EXPECT_EQ(hello.running(0).task_id(), "long");
  EXPECT_EQ(log[result].msg.release().reason(), "stopped: no contact with the scheduler for 1s");
  EXPECT_TRUE(RunningAgent::Eventually([&] { return agent->unacked() == 0; }, absl::Seconds(5)));
}

TEST(Agent, DrainMessageStopsTakingWorkAndRunningTasksFinish) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("running", "0.5")}));
  WaitFind(fake, IsAccept("running"), "accept");
  fake.Push(DrainMsg());
  WaitFind(fake, IsDraining(), "draining");
  EXPECT_TRUE(agent->draining());
  fake.Push(Assign({Task("later", "noop")}));
  const int reject = WaitFind(fake, IsReject("later"), "reject");
  ASSERT_GE(reject, 0);
  EXPECT_THAT(fake.log()[reject].msg.reject().reason(), HasSubstr("draining"));
  const int result = WaitFind(fake, IsResult("running"), "result");
  ASSERT_GE(result, 0);
  EXPECT_EQ(fake.log()[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(Find(fake.log(), IsAccept("later")), -1);

  fake.EndStream();
  WaitHello(fake, 2);
  const Log log = fake.log();
  EXPECT_TRUE(log[Find(log, InSession(2, IsHello()))].msg.hello().draining());
  WaitFind(fake, InSession(2, IsDraining()), "draining again after the reconnect");
  EXPECT_FALSE(agent.returned()) << "a Drain message does not make the agent exit";
}

TEST(Agent, DrainWaitsForTasksThenReleasesTheRest) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("short", "0.3"), Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  const absl::Duration start = Mono();
  agent->Drain(absl::Seconds(1));
  const int draining = WaitFind(fake, IsDraining(), "draining");
  const int result = WaitFind(fake, IsResult("short"), "result of the short task");
  const int release = WaitFind(fake, IsRelease("long"), "release of the long task");
  ASSERT_GE(draining, 0);
  ASSERT_GE(result, 0);
  ASSERT_GE(release, 0);
  const Log log = fake.log();
  EXPECT_LT(draining, release);
  EXPECT_EQ(log[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_EQ(log[release].msg.release().attempt(), 1);
  EXPECT_EQ(log[release].msg.release().reason(), "agent drained: 1s passed");
  EXPECT_GE(log[release].at - start, absl::Milliseconds(950));
  EXPECT_LT(log[release].at - start, absl::Seconds(2));
  EXPECT_EQ(Find(log, IsResult("long")), -1) << "released, not reported as a result";
  ASSERT_TRUE(agent.WaitReturned(absl::Seconds(3)));
  EXPECT_EQ(agent->unacked(), 0);
  EXPECT_EQ(agent->running(), 0);
}

TEST(Agent, DrainZeroReleasesEverythingAtOnce) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("one", "60"), Sleep("two", "60")}));
  WaitFind(fake, IsAccept("two"), "accept");
  const absl::Duration start = Mono();
  agent->Stop();  // Drain(0)
  for (const std::string id : {"one", "two"}) {
    const int release = WaitFind(fake, IsRelease(id), "release of " + id, absl::Seconds(2));
    ASSERT_GE(release, 0);
    const Received r = fake.log()[release];
    EXPECT_EQ(r.msg.release().reason(), "agent drained: 0s passed");
    EXPECT_LT(r.at - start, absl::Milliseconds(500));
  }
  ASSERT_TRUE(agent.WaitReturned(absl::Seconds(2)));
  EXPECT_EQ(agent->unacked(), 0);
  // Everything handed over: it said Goodbye (and the fake, like the
  // scheduler, ended the stream, or Run() would still wait for it).
  const Log log = fake.log();
  const int bye = Find(log, [](const Received& r) { return r.msg.has_goodbye(); });
  ASSERT_GE(bye, 0);
  EXPECT_GT(bye, Find(log, IsRelease("one")));
  EXPECT_GT(bye, Find(log, IsRelease("two")));
}

TEST(Agent, LaterDrainShortensTheTimeout) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  agent->Drain(absl::Seconds(30));
  WaitFind(fake, IsDraining(), "draining");
  agent->Drain(absl::Seconds(60));  // cannot lengthen it
  agent->Drain(absl::ZeroDuration());
  const int release = WaitFind(fake, IsRelease("long"), "release", absl::Seconds(2));
  ASSERT_GE(release, 0);
  EXPECT_EQ(fake.log()[release].msg.release().reason(), "agent drained: 0s passed");
  EXPECT_EQ(Count(fake.log(), IsDraining()), 1);
  ASSERT_TRUE(agent.WaitReturned(absl::Seconds(2)));
}

TEST(Agent, UnackedReleaseIsResentAfterAReconnectAndRunWaitsForItsAck) {
  FakeScheduler fake;
  fake.set_ack_results(false);
  AgentOptions o = Options(fake.addr());
  o.stop_flush = absl::Seconds(4);
  RunningAgent agent(o);
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  agent->Drain(absl::ZeroDuration());
  WaitFind(fake, InSession(1, IsRelease("long")), "release");
  fake.EndStream();
  WaitHello(fake, 2);
  const int release = WaitFind(fake, InSession(2, IsRelease("long")), "resent release");
  ASSERT_GE(release, 0);
  const Log log = fake.log();
  const v1::Hello& hello = log[Find(log, InSession(2, IsHello()))].msg.hello();
  EXPECT_TRUE(hello.draining());
  ASSERT_EQ(hello.running_size(), 1);
  EXPECT_EQ(hello.running(0).task_id(), "long");
  EXPECT_FALSE(agent.returned()) << "its release is not acknowledged yet";
  const absl::Duration acked = Mono();
  fake.PushAck("long", 1);
  ASSERT_TRUE(agent.WaitReturned(absl::Seconds(2)));
  EXPECT_LT(agent.returned_at() - acked, absl::Seconds(1));
  EXPECT_EQ(agent->unacked(), 0);
}

TEST(Agent, DrainEndsWithinItsBoundsWhenTheSchedulerIsGone) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));  // kill_grace 200 ms, stop_flush 500 ms
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("long", "60")}));
  WaitFind(fake, IsAccept("long"), "accept");
  fake.set_refuse(true);
  fake.EndStream();
  const absl::Duration start = Mono();
  agent->Drain(absl::ZeroDuration());
  ASSERT_TRUE(agent.WaitReturned(absl::Seconds(3)));
  EXPECT_LT(agent.returned_at() - start, absl::Milliseconds(1500));
  EXPECT_EQ(agent->unacked(), 1) << "the release could not be handed over";
}

// --- Chains ---

// Stops the agent and waits for Run() to return. Every Result and Release
// it sent is acknowledged (so received) by then: the log is final.
Log StopAndLog(RunningAgent& agent, const FakeScheduler& fake) {
  agent->Stop();
  EXPECT_TRUE(agent.WaitReturned(absl::Seconds(5))) << "Run() did not return";
  return fake.log();
}

bool Idle(RunningAgent& agent) {
  return RunningAgent::Eventually(
      [&] { return agent->running() == 0 && agent->waiting() == 0 && agent->unacked() == 0; },
      absl::Seconds(5));
}

TEST(Agent, HelloSaysItHonoursChains) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  const Log log = fake.log();
  EXPECT_TRUE(log[Find(log, IsHello())].msg.hello().chains());
}

TEST(Agent, RunsAChainOneLinkAtATimeInOneSlot) {
  FakeScheduler fake;
  TempDir tmp;
  AgentOptions o = Options(fake.addr());
  o.slots = 1;
  RunningAgent agent(o);
  WaitHello(fake, 1);
  const std::vector<std::string> ids = {"c1", "c2", "c3", "c4", "c5"};
  fake.Push(Assign({Gated("c1", tmp.Gate("c1")), After("c1", Task("c2", "noop")),
                    After("c2", Sleep("c3", "0.05")), After("c3", Task("c4", "echo", {"four"})),
                    After("c4", Task("c5", "noop"))}));
  WaitFind(fake, IsAccept("c1"), "accept of c1");
  EXPECT_EQ(agent->running(), 1);
  EXPECT_EQ(agent->waiting(), 4);
  // The one slot is c1's; the waiting links took none, and are not accepted.
  fake.Push(Assign({Task("other", "noop")}));
  const int reject = WaitFind(fake, IsReject("other"), "reject of other");
  ASSERT_GE(reject, 0);
  EXPECT_EQ(fake.log()[reject].msg.reject().reason(), "no free slots");
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(Find(fake.log(), About(ids[i])), -1) << ids[i];

  Open(tmp.Gate("c1"));
  WaitFind(fake, IsResult("c5"), "result of c5");
  ASSERT_TRUE(Idle(agent));
  const Log log = StopAndLog(agent, fake);
  int previous_result = -1;
  for (const std::string& id : ids) {
    SCOPED_TRACE(id);
    EXPECT_EQ(Count(log, IsAccept(id)), 1);
    EXPECT_EQ(Count(log, IsResult(id)), 1);
    EXPECT_EQ(Count(log, IsReject(id)), 0);
    const int accept = Find(log, IsAccept(id));
    const int result = Find(log, IsResult(id));
    ASSERT_GE(accept, 0);
    ASSERT_GE(result, 0);
    // Each link starts once the one before it has ended.
    EXPECT_LT(previous_result, accept);
    EXPECT_LT(accept, result);
    if (previous_result >= 0) {
      EXPECT_LE(log[previous_result].at, log[accept].at);
    }
    EXPECT_EQ(log[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
    previous_result = result;
  }
}

TEST(Agent, WaitingLinksUseNoSlot) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));  // 2 slots
  WaitHello(fake, 1);
  fake.Push(Assign({Gated("head", tmp.Gate("head")), After("head", Task("link1", "noop")),
                    After("link1", Task("link2", "noop"))}));
  WaitFind(fake, IsAccept("head"), "accept of head");
  fake.Push(Assign({Gated("plain", tmp.Gate("plain")), Task("third", "noop")}));
  WaitFind(fake, IsAccept("plain"), "accept of plain: the waiting links hold no slot");
  const int reject = WaitFind(fake, IsReject("third"), "reject of third");
  ASSERT_GE(reject, 0);
  EXPECT_EQ(fake.log()[reject].msg.reject().reason(), "no free slots");
  Open(tmp.Gate("head"));
  Open(tmp.Gate("plain"));
  WaitFind(fake, IsResult("link2"), "result of link2");
  WaitFind(fake, IsResult("plain"), "result of plain");
  EXPECT_TRUE(Idle(agent));
}

TEST(Agent, ChainEndsSilentlyAtTheFirstFailedLink) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Task("l1", "noop"), After("l1", Task("l2", "fail", {"3"})),
                    After("l2", Task("l3", "noop")), After("l3", Task("l4", "noop")),
                    After("l4", Task("l5", "noop"))}));
  const int failed = WaitFind(fake, IsResult("l2"), "result of l2");
  ASSERT_GE(failed, 0);
  EXPECT_EQ(fake.log()[failed].msg.result().result().outcome(), v1::OUTCOME_FAILED);
  ASSERT_TRUE(Idle(agent));
  const Log log = StopAndLog(agent, fake);
  EXPECT_EQ(log[Find(log, IsResult("l1"))].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_GE(Find(log, IsAccept("l2")), 0);
  for (const std::string id : {"l3", "l4", "l5"}) {
    EXPECT_EQ(Find(log, About(id)), -1) << id << " was mentioned";
  }
}

TEST(Agent, HelloAndHeartbeatsListWaitingLinks) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  v1::Assignment second = After("head", Task("second", "noop"));
  second.set_attempt(2);
  fake.Push(
      Assign({Gated("head", tmp.Gate("head")), second, After("second", Task("third", "noop"))}));
  const int accept = WaitFind(fake, IsAccept("head"), "accept of head");
  const std::set<std::pair<std::string, int>> held = {{"head", 1}, {"second", 2}, {"third", 1}};
  const Pred lists_all = [&](const Received& r) {
    return r.msg.has_heartbeat() && Listed(r.msg.heartbeat().running()) == held;
  };
  EXPECT_TRUE(fake.WaitFor([&](const Log& log) { return Find(log, lists_all, accept) >= 0; }))
      << "no heartbeat listed the running task and both waiting links";

  fake.EndStream();
  WaitHello(fake, 2);
  Log log = fake.log();
  const v1::Hello& hello = log[Find(log, InSession(2, IsHello()))].msg.hello();
  EXPECT_EQ(Listed(hello.running()), held);
  EXPECT_EQ(ListedWaiting(hello.running()), (std::set<std::string>{"second", "third"}));
  EXPECT_TRUE(hello.chains());

  // The chain goes on over the new stream.
  Open(tmp.Gate("head"));
  const int third = WaitFind(fake, InSession(2, IsResult("third")), "result of third");
  ASSERT_GE(third, 0);
  log = fake.log();
  EXPECT_EQ(log[third].msg.result().attempt(), 1);
  const int accept_second = Find(log, InSession(2, IsAccept("second")));
  ASSERT_GE(accept_second, 0);
  EXPECT_EQ(log[accept_second].msg.accept().attempt(), 2);
}

TEST(Agent, CancelOfAWaitingLinkDropsItAndTheLinksAfterIt) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Gated("a", tmp.Gate("a")), After("a", Task("b", "noop")),
                    After("b", Task("c", "noop")), After("c", Task("d", "noop"))}));
  WaitFind(fake, IsAccept("a"), "accept of a");
  ASSERT_EQ(agent->waiting(), 3);
  fake.Push(CancelMsg("b", 7));  // another attempt: ignored
  fake.Push(CancelMsg("c", 1));
  ASSERT_TRUE(RunningAgent::Eventually([&] { return agent->waiting() == 1; }, absl::Seconds(5)));
  Open(tmp.Gate("a"));
  const int b = WaitFind(fake, IsResult("b"), "result of b");
  ASSERT_GE(b, 0);
  EXPECT_EQ(fake.log()[b].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  ASSERT_TRUE(Idle(agent));
  const Log log = StopAndLog(agent, fake);
  EXPECT_EQ(log[Find(log, IsResult("a"))].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  // Each Cancel is answered: the link cancelled by a Release (the links
  // after it go with it, and the scheduler ends those itself), an attempt
  // not held here by a Release saying so.
  const int c = Find(log, About("c"));
  ASSERT_GE(c, 0);
  ASSERT_TRUE(log[c].msg.has_release());
  EXPECT_EQ(log[c].msg.release().attempt(), 1);
  EXPECT_FALSE(log[c].msg.release().not_held());
  EXPECT_EQ(Find(log, About("d")), -1);
  const int b7 = Find(log, [](const Received& r) {
    return r.msg.has_release() && r.msg.release().task_id() == "b" &&
           r.msg.release().attempt() == 7;
  });
  ASSERT_GE(b7, 0);
  EXPECT_TRUE(log[b7].msg.release().not_held());
}

TEST(Agent, CancelOfARunningLinkDropsTheLinksAfterIt) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Gated("a", tmp.Gate("a")), After("a", Task("b", "noop"))}));
  WaitFind(fake, IsAccept("a"), "accept of a");
  fake.Push(CancelMsg("a", 1));
  const int a = WaitFind(fake, IsResult("a"), "result of a");
  ASSERT_GE(a, 0);
  EXPECT_EQ(fake.log()[a].msg.result().result().outcome(), v1::OUTCOME_CANCELLED);
  ASSERT_TRUE(Idle(agent));
  EXPECT_EQ(Find(StopAndLog(agent, fake), About("b")), -1);
}

TEST(Agent, DrainingReleasesTheNextLinkAndDropsTheRest) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign(
      {Gated("a", tmp.Gate("a")), After("a", Task("b", "noop")), After("b", Task("c", "noop"))}));
  WaitFind(fake, IsAccept("a"), "accept of a");
  fake.Push(DrainMsg());
  WaitFind(fake, IsDraining(), "draining");
  Open(tmp.Gate("a"));
  const int release = WaitFind(fake, IsRelease("b"), "release of b");
  ASSERT_GE(release, 0);
  ASSERT_TRUE(Idle(agent));
  EXPECT_FALSE(agent.returned()) << "a Drain message does not make the agent exit";
  const Log log = StopAndLog(agent, fake);
  const int a = Find(log, IsResult("a"));
  ASSERT_GE(a, 0);
  EXPECT_EQ(log[a].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED);
  EXPECT_LT(a, release);
  EXPECT_EQ(log[release].msg.release().attempt(), 1);
  EXPECT_EQ(log[release].msg.release().reason(), "agent is draining");
  EXPECT_EQ(Count(log, About("b")), 1) << "b is only released, never accepted";
  EXPECT_EQ(Find(log, About("c")), -1);
}

TEST(Agent, DrainDeadlineDropsWaitingLinks) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("a", "60"), After("a", Task("b", "noop"))}));
  WaitFind(fake, IsAccept("a"), "accept of a");
  const Log log = StopAndLog(agent, fake);  // Drain(0)
  const int release = Find(log, IsRelease("a"));
  ASSERT_GE(release, 0);
  EXPECT_EQ(log[release].msg.release().reason(), "agent drained: 0s passed");
  EXPECT_EQ(Find(log, About("b")), -1);
  EXPECT_EQ(agent->waiting(), 0);
}

TEST(Agent, SelfFencingDropsWaitingLinks) {
  FakeScheduler fake;
  fake.set_ack_heartbeats(false);  // stop_on_lost_after is 1 s in Welcome
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  fake.Push(Assign({Sleep("a", "60"), After("a", Task("b", "noop"))}));
  WaitFind(fake, IsAccept("a"), "accept of a");
  fake.set_refuse(true);  // and nothing takes the agent back
  ASSERT_TRUE(RunningAgent::Eventually([&] { return agent->running() == 0; }, absl::Seconds(4)));
  fake.set_refuse(false);
  const int result = WaitFind(fake, IsRelease("a"), "the self-fenced release of a");
  ASSERT_GE(result, 0);
  EXPECT_EQ(fake.log()[result].msg.release().attempt(), 1);
  ASSERT_TRUE(Idle(agent));
  EXPECT_EQ(Find(StopAndLog(agent, fake), About("b")), -1);
}

TEST(Agent, InputsAndThePredecessorsOutputAreFiles) {
  FakeScheduler fake;
  TempDir tmp;
  AgentOptions o = Options(fake.addr());
  o.exec.work_dir = tmp.path() + "/work";
  RunningAgent agent(o);
  WaitHello(fake, 1);
  // A plain task with inputs.
  v1::Assignment plain = Sh("plain", "cat \"$TASKGRID_INPUTS_DIR/parent\"");
  (*plain.mutable_inputs())["parent"] = std::string("from\0parent", 11);
  // p's stdout reaches q; r's output file (not its stdout) reaches s.
  v1::Assignment q = After("p", Sh("q",
                                   "cat \"$TASKGRID_INPUTS_DIR/p\" \"$TASKGRID_INPUTS_DIR/up\"; ls "
                                   "\"$TASKGRID_INPUTS_DIR\""));
  (*q.mutable_inputs())["up"] = "given\n";
  fake.Push(Assign({plain, Sh("p", "echo from-stdout"), q,
                    After("q", Sh("r", "printf file-out > \"$TASKGRID_OUTPUT\"; echo ignored")),
                    After("r", Sh("s",
                                  "cat \"$TASKGRID_INPUTS_DIR/r\"; echo; ls "
                                  "\"$TASKGRID_INPUTS_DIR\""))}));
  WaitFind(fake, IsResult("plain"), "result of plain");
  WaitFind(fake, IsResult("s"), "result of s");
  const Log log = fake.log();
  const auto result = [&](const std::string& id) {
    return log[Find(log, IsResult(id))].msg.result().result();
  };
  EXPECT_EQ(result("plain").stdout_tail(), std::string("from\0parent", 11));
  EXPECT_EQ(result("q").stdout_tail(), "from-stdout\ngiven\np\nup\n");
  EXPECT_FALSE(result("q").has_output());
  EXPECT_EQ(result("r").output(), "file-out");
  EXPECT_EQ(result("s").stdout_tail(), "file-out\nr\n");
  for (const std::string id : {"plain", "p", "q", "r", "s"}) {
    EXPECT_EQ(result(id).outcome(), v1::OUTCOME_SUCCEEDED) << id << ": " << result(id).error();
  }
  // Every attempt's directory is gone.
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::is_empty(o.exec.work_dir, ec)) << ec.message();
}

TEST(Agent, RejectsChainLinksItCannotHonour) {
  FakeScheduler fake;
  TempDir tmp;
  RunningAgent agent(Options(fake.addr()));  // 2 slots
  WaitHello(fake, 1);
  v1::Assignment big = Task("big", "noop");
  big.set_slots(3);
  v1::Assignment wide = After("l1", Task("wide", "noop"));
  wide.set_slots(2);
  fake.Push(Assign({
      Gated("g", tmp.Gate("g")),
      big,                                      // no room: rejected
      After("big", Task("after-big", "noop")),  // its predecessor was rejected: dropped
      After("g", Task("l1", "noop")),
      After("g", Task("twin", "noop")),  // g already has a link
      wide,                              // needs more slots than l1 frees
      After("wide", Task("after-wide", "noop")),
      After("nope", Task("unknown", "noop")),  // not an entry of this Assign
      After("later", Task("early", "noop")),   // names a later entry
      Task("later", "noop"),
      After("self", Task("self", "noop")),
  }));
  // The agent's own state (no slot now) does not count against the task;
  // an Assign it cannot follow does.
  const std::map<std::string, std::pair<std::string, v1::RejectCode>> rejected = {
      {"big", {"no free slots", v1::REJECT_CODE_NO_SLOTS}},
      {"twin", {"another chain link already runs after g", v1::REJECT_CODE_INVALID}},
      {"wide",
       {"a chain link needs 2 slot(s), more than the 1 of l1 that it runs after",
        v1::REJECT_CODE_INVALID}},
      {"unknown",
       {"run_after \"nope\" is not an earlier entry of this Assign", v1::REJECT_CODE_INVALID}},
      {"early",
       {"run_after \"later\" is not an earlier entry of this Assign", v1::REJECT_CODE_INVALID}},
      {"self",
       {"run_after \"self\" is not an earlier entry of this Assign", v1::REJECT_CODE_INVALID}},
  };
  for (const auto& [id, why] : rejected) {
    const int reject = WaitFind(fake, IsReject(id), "reject of " + id);
    ASSERT_GE(reject, 0);
    EXPECT_EQ(fake.log()[reject].msg.reject().reason(), why.first);
    EXPECT_EQ(fake.log()[reject].msg.reject().code(), why.second) << id;
  }
  Open(tmp.Gate("g"));
  WaitFind(fake, IsResult("l1"), "result of l1");
  WaitFind(fake, IsResult("later"), "result of later");
  ASSERT_TRUE(Idle(agent));
  const Log log = StopAndLog(agent, fake);
  EXPECT_EQ(Find(log, About("after-big")), -1);
  EXPECT_EQ(Find(log, About("after-wide")), -1);
  for (const auto& [id, why] : rejected) EXPECT_EQ(Count(log, About(id)), 1) << id;
}

TEST(Agent, DrainingAgentRejectsTheHeadAndDropsItsLinks) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  agent->StopTakingWork();
  WaitFind(fake, IsDraining(), "draining");
  fake.Push(Assign({Task("a", "noop"), After("a", Task("b", "noop"))}));
  const int reject = WaitFind(fake, IsReject("a"), "reject of a");
  ASSERT_GE(reject, 0);
  EXPECT_EQ(fake.log()[reject].msg.reject().reason(), "agent is draining");
  EXPECT_EQ(fake.log()[reject].msg.reject().code(), v1::REJECT_CODE_DRAINING);
  EXPECT_EQ(agent->waiting(), 0);
  EXPECT_EQ(Find(StopAndLog(agent, fake), About("b")), -1);
}

// --- Batches ---

TEST(Agent, HelloSaysItReadsBatches) {
  FakeScheduler fake;
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  const Log log = fake.log();
  EXPECT_TRUE(log[Find(log, IsHello())].msg.hello().batches());
}

TEST(Agent, SendsNoBatchUnlessTheWelcomeSaysTheSchedulerReadsThem) {
  FakeScheduler fake;  // Welcome.batches is false
  AgentOptions opts = Options(fake.addr());
  opts.slots = 4;
  RunningAgent agent(opts);
  WaitHello(fake, 1);
  fake.Push(Assign({Task("a", "noop"), Task("b", "noop"), Task("c", "noop")}));
  for (const std::string id : {"a", "b", "c"}) WaitFind(fake, IsResult(id), "result of " + id);
  EXPECT_EQ(Count(fake.log(), [](const Received& r) { return r.batch > 0; }), 0);
}

TEST(Agent, AcceptsOfOneAssignGoAsOneBatch) {
  FakeScheduler fake;
  fake.set_batches(true);
  AgentOptions opts = Options(fake.addr());
  opts.slots = 8;
  RunningAgent agent(opts);
  WaitHello(fake, 1);
  std::vector<v1::Assignment> tasks;
  for (int i = 0; i < 6; ++i) tasks.push_back(Task("t" + std::to_string(i), "noop"));
  fake.Push(Assign(tasks));
  for (int i = 0; i < 6; ++i) {
    WaitFind(fake, IsResult("t" + std::to_string(i)), "result of t" + std::to_string(i));
  }
  const Log log = fake.log();
  const Received& first = log[Find(log, IsAccept("t0"))];
  EXPECT_GE(first.batch, 6);
  for (int i = 0; i < 6; ++i) {
    const std::string id = "t" + std::to_string(i);
    const int accept = Find(log, IsAccept(id));
    ASSERT_GE(accept, 0) << id;
    EXPECT_EQ(log[accept].wire, first.wire) << id << " was accepted in another message";
    EXPECT_LT(accept, Find(log, IsResult(id))) << id << ": Accept must precede Result";
  }
  // Every result was acknowledged, however it was packed.
  EXPECT_TRUE(RunningAgent::Eventually([&] { return agent->unacked() == 0; }, absl::Seconds(5)));
}

TEST(Agent, RunsWhatASchedulerBatchHolds) {
  FakeScheduler fake;
  fake.set_batches(true);
  RunningAgent agent(Options(fake.addr()));
  WaitHello(fake, 1);
  v1::SchedulerMessage batch;
  *batch.mutable_batch()->add_msgs() = Assign({Task("x", "noop")});
  *batch.mutable_batch()->add_msgs() = Assign({Task("y", "noop")});
  fake.Push(batch);
  for (const std::string id : {"x", "y"}) {
    const int result = WaitFind(fake, IsResult(id), "result of " + id);
    ASSERT_GE(result, 0);
    EXPECT_EQ(fake.log()[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED) << id;
  }
}

TEST(Agent, AnInstantTaskRunsInlineButALinkThatWaitsDoesNotHoldTheStream) {
  FakeScheduler fake;
  fake.set_batches(true);
  AgentOptions opts = Options(fake.addr());
  opts.slots = 2;
  RunningAgent agent(opts);
  WaitHello(fake, 1);
  fake.Push(Assign({Task("head", "noop"), After("head", Sleep("slow", "0.5")),
                    After("slow", Task("tail", "echo", {"t"}))}));
  WaitFind(fake, IsAccept("slow"), "accept of slow");
  // The stream is read while `slow` sleeps: another task runs and reports.
  fake.Push(Assign({Task("other", "noop")}));
  const int other = WaitFind(fake, IsResult("other"), "result of other");
  const int tail = WaitFind(fake, IsResult("tail"), "result of tail");
  ASSERT_GE(other, 0);
  ASSERT_GE(tail, 0);
  const Log log = fake.log();
  EXPECT_LT(other, Find(log, IsResult("slow")));
  int previous_result = -1;
  for (const std::string id : {"head", "slow", "tail"}) {
    const int accept = Find(log, IsAccept(id));
    const int result = Find(log, IsResult(id));
    ASSERT_GE(accept, 0) << id;
    EXPECT_LT(previous_result, accept) << id;
    EXPECT_LT(accept, result) << id;
    EXPECT_EQ(log[result].msg.result().result().outcome(), v1::OUTCOME_SUCCEEDED) << id;
    previous_result = result;
  }
}

}  // namespace
}  // namespace taskgrid::agent
