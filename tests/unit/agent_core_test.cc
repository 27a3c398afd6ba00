// The agent's decisions (agent/core.h) with time from a FakeClock and no
// stream: the test plays the scheduler by calling Handle() and Tick(), and
// reads what the Outbox wrote. Nothing sleeps: the clock moves only when
// the test advances it. Tasks are builtins: `sleep 3600` runs until the
// agent cancels it (a wake, not a wait), noop/echo/fail end at once. The
// only waits are for a task's pooled thread to hand over its message, each
// bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/core.h"
#include "common/clock.h"
#include "common/message_limits.h"
#include "common/proto_time.h"

namespace taskgrid::agent {
namespace {

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

struct Sent {
  absl::Duration at;  // the fake clock's monotonic time when it was written
  v1::AgentMessage msg;
};
using Pred = std::function<bool(const v1::AgentMessage&)>;

Pred IsHeartbeat() {
  return [](const v1::AgentMessage& m) { return m.has_heartbeat(); };
}
Pred IsAccept(const std::string& id) {
  return [id](const v1::AgentMessage& m) { return m.has_accept() && m.accept().task_id() == id; };
}
Pred IsResult(const std::string& id) {
  return [id](const v1::AgentMessage& m) { return m.has_result() && m.result().task_id() == id; };
}
Pred IsRelease(const std::string& id) {
  return [id](const v1::AgentMessage& m) { return m.has_release() && m.release().task_id() == id; };
}
// The end of task `id`'s attempt, reported either way.
Pred IsEnd(const std::string& id) {
  return [id](const v1::AgentMessage& m) { return IsResult(id)(m) || IsRelease(id)(m); };
}
Pred IsDraining() {
  return [](const v1::AgentMessage& m) { return m.has_draining(); };
}
Pred IsGoodbye() {
  return [](const v1::AgentMessage& m) { return m.has_goodbye(); };
}
// Any message about task `id`.
Pred About(const std::string& id) {
  return [id](const v1::AgentMessage& m) {
    return IsAccept(id)(m) || IsResult(id)(m) || IsRelease(id)(m) ||
           (m.has_reject() && m.reject().task_id() == id);
  };
}

v1::Assignment Task(const std::string& id, const std::string& builtin,
                    std::vector<std::string> args = {}) {
  v1::Assignment a;
  a.set_task_id(id);
  a.set_attempt(1);
  v1::BuiltinStep* b = a.add_steps()->mutable_builtin();
  b->set_name(builtin);
  for (const std::string& arg : args) b->add_args(arg);
  return a;
}
// Runs until the agent (or the scheduler) cancels it.
v1::Assignment Long(const std::string& id) { return Task(id, "sleep", {"3600"}); }
v1::Assignment After(const std::string& pred, v1::Assignment a) {
  a.set_run_after(pred);
  return a;
}

v1::SchedulerMessage Assign(const std::vector<v1::Assignment>& tasks) {
  v1::SchedulerMessage m;
  for (const v1::Assignment& a : tasks) *m.mutable_assign()->add_tasks() = a;
  return m;
}

// What the scheduler's Welcome says.
struct WelcomeOpts {
  absl::Duration interval = Ms(100);
  absl::Duration stop_on_lost_after = absl::Seconds(1);
  absl::Duration lease = absl::ZeroDuration();          // zero: none (an older scheduler)
  absl::Duration restart_grace = absl::ZeroDuration();  // zero: none
};
WelcomeOpts WithLease(absl::Duration stop_on_lost_after, absl::Duration lease) {
  WelcomeOpts w;
  w.stop_on_lost_after = stop_on_lost_after;
  w.lease = lease;
  return w;
}

// One AgentCore on a FakeClock, its Outbox written into a log.
class Harness {
 public:
  // `dir`: the work directory, kept after this harness (another agent
  // after it finds what it kept); empty: one of its own, removed with it.
  explicit Harness(CoreOptions o = {}, const std::string& dir = "")
      : dir_(dir.empty() ? MakeDir() : dir), own_dir_(dir.empty()) {
    o.id = "a1";
    o.exec.work_dir = dir_;
    o.exec.kill_grace = Ms(200);
    o.stop_flush = Ms(500);
    o.clock = &clock_;
    core_ = std::make_unique<AgentCore>(o, [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++ended_streams_;
    });
  }
  ~Harness() {
    core_->Drain(absl::ZeroDuration());
    core_->Finish();
    core_.reset();
    if (own_dir_) std::filesystem::remove_all(dir_);
  }

  AgentCore& core() { return *core_; }
  FakeClock& clock() { return clock_; }
  absl::Duration now() const { return clock_.Monotonic(); }

  // A stream opens: the Hello, then the scheduler's Welcome.
  v1::Hello Connect(WelcomeOpts w = {}) {
    v1::AgentMessage hello = core_->StreamStarted();
    core_->outbox().Attach([this](const v1::AgentMessage& m) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back({clock_.Monotonic(), m});
      cv_.notify_all();
      return true;
    });
    v1::SchedulerMessage welcome;
    *welcome.mutable_welcome()->mutable_heartbeat_interval() = ToProto(w.interval);
    *welcome.mutable_welcome()->mutable_stop_on_lost_after() = ToProto(w.stop_on_lost_after);
    if (w.lease > absl::ZeroDuration()) {
      *welcome.mutable_welcome()->mutable_heartbeat_lease() = ToProto(w.lease);
    }
    if (w.restart_grace > absl::ZeroDuration()) {
      *welcome.mutable_welcome()->mutable_restart_grace() = ToProto(w.restart_grace);
    }
    lease_ = w.lease;
    core_->Handle(welcome);
    return hello.hello();
  }
  // The stream breaks; returns whether it had its Welcome.
  bool Disconnect() {
    core_->outbox().Detach();
    return core_->StreamEnded();
  }

  void Push(const v1::SchedulerMessage& m) { core_->Handle(m); }
  void AckResult(const std::string& id, int32_t attempt = 1) {
    v1::SchedulerMessage m;
    m.mutable_result_ack()->set_task_id(id);
    m.mutable_result_ack()->set_attempt(attempt);
    m.mutable_result_ack()->set_accepted(true);
    core_->Handle(m);
  }
  void AckHeartbeat(absl::Duration interval = absl::ZeroDuration()) {
    v1::SchedulerMessage m;
    m.mutable_heartbeat_ack();
    if (interval > absl::ZeroDuration()) {
      *m.mutable_heartbeat_ack()->mutable_heartbeat_interval() = ToProto(interval);
    }
    if (lease_ > absl::ZeroDuration()) {
      *m.mutable_heartbeat_ack()->mutable_heartbeat_lease() = ToProto(lease_);
    }
    core_->Handle(m);
  }

  // Plays the timer for `d` of fake time, from due time to due time as
  // TimerLoop() does. Each Heartbeat is acked at once while ack_heartbeats
  // is on, with `ack_interval` when set.
  void RunFor(absl::Duration d) {
    const absl::Duration end = now() + d;
    for (int passes = 0; passes < 100'000; ++passes) {
      const absl::Duration due = core_->Tick();
      // A task thread may be writing, and the timer's messages with it.
      core_->outbox().WaitIdle();
      const size_t written = size();
      for (size_t i = scanned_; i < written; ++i) {
        if (ack_heartbeats && at(i).msg.has_heartbeat()) AckHeartbeat(ack_interval);
      }
      scanned_ = written;
      const absl::Duration step = std::max(due - now(), Ms(1));
      if (now() + step > end) {
        clock_.Advance(end - now());
        core_->Tick();
        return;
      }
      clock_.Advance(step);
    }
    ADD_FAILURE() << "the timer did not settle";
  }

  // Waits (bounded, for a task thread) until a message matching `p` was
  // written at index >= from; returns its index, or -1.
  int WaitFor(const Pred& p, size_t from = 0) {
    std::unique_lock<std::mutex> lock(mu_);
    int found = -1;
    cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      found = FindLocked(p, from);
      return found >= 0;
    });
    EXPECT_GE(found, 0) << "no such message was written";
    return found;
  }
  int Find(const Pred& p, size_t from = 0) const {
    std::lock_guard<std::mutex> lock(mu_);
    return FindLocked(p, from);
  }
  int Count(const Pred& p) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const Sent& s : log_) n += p(s.msg) ? 1 : 0;
    return n;
  }
  Sent at(size_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_.at(i);
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_.size();
  }
  int ended_streams() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_streams_;
  }

  bool ack_heartbeats = true;
  absl::Duration ack_interval = absl::ZeroDuration();

  const std::string& dir() const { return dir_; }
  static std::string MakeDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "taskgrid-core-test.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    return tmpl;
  }

 private:
  int FindLocked(const Pred& p, size_t from) const {
    for (size_t i = from; i < log_.size(); ++i) {
      if (p(log_[i].msg)) return static_cast<int>(i);
    }
    return -1;
  }

  const std::string dir_;
  const bool own_dir_;
  FakeClock clock_;
  size_t scanned_ = 0;  // RunFor() looked at the log up to here
  absl::Duration lease_ = absl::ZeroDuration();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Sent> log_;  // guarded by mu_
  int ended_streams_ = 0;  // guarded by mu_
  std::unique_ptr<AgentCore> core_;
};

std::set<std::string> HeldIds(const google::protobuf::RepeatedPtrField<v1::AttemptRef>& refs) {
  std::set<std::string> ids;
  for (const v1::AttemptRef& r : refs) ids.insert(r.task_id());
  return ids;
}

// --- Heartbeats ---

TEST(AgentCore, HeartbeatsEveryIntervalAndAdoptsTheIntervalAnAckGives) {
  Harness h;
  const v1::Hello hello = h.Connect();  // 100 ms
  EXPECT_TRUE(hello.adaptive_heartbeat());
  h.RunFor(Ms(1000));
  EXPECT_EQ(h.Count(IsHeartbeat()), 10);
  for (size_t i = 0, prev = 0, seen = 0; i < h.size(); ++i) {
    if (!h.at(i).msg.has_heartbeat()) continue;
    if (seen++ > 0) {
      EXPECT_EQ(h.at(i).at - h.at(prev).at, Ms(100));
    }
    EXPECT_EQ(FromProto(h.at(i).msg.heartbeat().heartbeat_interval()), Ms(100));
    prev = i;
  }

  // The scheduler stretches it: one more at the old pace, then every 400 ms.
  h.ack_interval = Ms(400);
  const size_t from = h.size();
  h.RunFor(Ms(2000));
  std::vector<absl::Duration> times;
  for (size_t i = from; i < h.size(); ++i) {
    if (h.at(i).msg.has_heartbeat()) times.push_back(h.at(i).at);
  }
  ASSERT_GE(times.size(), 4u);
  for (size_t i = 2; i < times.size(); ++i) EXPECT_EQ(times[i] - times[i - 1], Ms(400)) << i;
  EXPECT_EQ(h.core().heartbeat_interval(), Ms(400));

  // And back to a shorter one.
  h.ack_interval = Ms(100);
  const size_t later = h.size();
  h.RunFor(Ms(1000));
  int fast = 0;
  for (size_t i = later; i < h.size(); ++i) {
    const v1::AgentMessage& m = h.at(i).msg;
    fast += m.has_heartbeat() && FromProto(m.heartbeat().heartbeat_interval()) == Ms(100);
  }
  EXPECT_GE(fast, 6);
}

TEST(AgentCore, HeartbeatsListRunningTasksAndWaitingLinks) {
  Harness h;
  h.Connect();
  v1::Assignment second = After("head", Task("second", "noop"));
  second.set_attempt(2);
  h.Push(Assign({Long("head"), second, After("second", Task("third", "noop"))}));
  h.WaitFor(IsAccept("head"));
  EXPECT_EQ(h.core().running(), 1);
  EXPECT_EQ(h.core().waiting(), 2);
  const size_t from = h.size();
  h.RunFor(Ms(100));
  const int hb = h.Find(IsHeartbeat(), from);
  ASSERT_GE(hb, 0);
  const v1::Heartbeat beat = h.at(hb).msg.heartbeat();
  EXPECT_EQ(HeldIds(beat.running()), (std::set<std::string>{"head", "second", "third"}));
  for (const v1::AttemptRef& r : beat.running()) {
    EXPECT_EQ(r.waiting(), r.task_id() != "head") << r.task_id();
    EXPECT_EQ(r.attempt(), r.task_id() == "second" ? 2 : 1) << r.task_id();
  }
}

// --- Self-fencing ---

// --- Every stop reported, every result kept until acknowledged ---

// The (task id, attempt, finished) entries a Hello or Heartbeat lists.
std::set<std::tuple<std::string, int, bool>> Listed(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& refs) {
  std::set<std::tuple<std::string, int, bool>> out;
  for (const v1::AttemptRef& r : refs) out.insert({r.task_id(), r.attempt(), r.finished()});
  return out;
}

// The task ids of the Results and Releases written from `from` on, in order.
std::vector<std::string> Ends(const Harness& h, size_t from) {
  std::vector<std::string> ids;
  for (size_t i = from; i < h.size(); ++i) {
    const v1::AgentMessage& m = h.at(i).msg;
    if (m.has_result()) ids.push_back(m.result().task_id());
    if (m.has_release()) ids.push_back(m.release().task_id());
  }
  return ids;
}

TEST(AgentCore, ResultsAreListedAsFinishedAndResentInTheOrderTheyWereProduced) {
  Harness h;
  EXPECT_TRUE(h.Connect().reports_stops());
  // "z-first" ends before "a-second": sorted by id they would go the
  // other way round (a chain's link before its predecessor).
  h.Push(Assign({Task("z-first", "noop")}));
  h.WaitFor(IsResult("z-first"));
  h.Push(Assign({Task("a-second", "noop")}));
  h.WaitFor(IsResult("a-second"));
  h.Push(Assign({Long("running")}));
  h.WaitFor(IsAccept("running"));
  const size_t from = h.size();
  h.RunFor(Ms(100));
  const int hb = h.Find(IsHeartbeat(), from);
  ASSERT_GE(hb, 0);
  using L = std::set<std::tuple<std::string, int, bool>>;
  EXPECT_EQ(Listed(h.at(hb).msg.heartbeat().running()),
            (L{{"z-first", 1, true}, {"a-second", 1, true}, {"running", 1, false}}));

  h.Disconnect();
  const size_t again = h.size();
  const v1::Hello hello = h.Connect();
  EXPECT_EQ(Listed(hello.running()),
            (L{{"z-first", 1, true}, {"a-second", 1, true}, {"running", 1, false}}));
  h.core().outbox().WaitIdle();
  EXPECT_EQ(Ends(h, again), (std::vector<std::string>{"z-first", "a-second"}));

  // Acknowledged: no longer listed.
  h.AckResult("z-first");
  h.AckResult("a-second");
  const size_t later = h.size();
  h.RunFor(Ms(100));
  const int next = h.Find(IsHeartbeat(), later);
  ASSERT_GE(next, 0);
  EXPECT_EQ(Listed(h.at(next).msg.heartbeat().running()), (L{{"running", 1, false}}));
}

v1::SchedulerMessage CancelOf(const std::string& id, int32_t attempt) {
  v1::SchedulerMessage m;
  m.mutable_cancel()->set_task_id(id);
  m.mutable_cancel()->set_attempt(attempt);
  return m;
}

TEST(AgentCore, EveryCancelIsAnsweredOnceNothingOfItRuns) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("head"), After("head", Task("link", "noop")), Task("done", "noop")}));
  h.WaitFor(IsResult("done"));
  // Not held here at all: said so at once.
  h.Push(CancelOf("stranger", 4));
  const int stranger = h.WaitFor(IsRelease("stranger"));
  EXPECT_TRUE(h.at(stranger).msg.release().not_held());
  EXPECT_EQ(h.at(stranger).msg.release().attempt(), 4);
  // Finished, its result unacknowledged: the result is the answer.
  const size_t before = h.size();
  h.Push(CancelOf("done", 1));
  h.core().outbox().WaitIdle();
  EXPECT_EQ(h.Find(About("done"), before), -1);
  // A waiting link: dropped, and released (it never started).
  h.Push(CancelOf("link", 1));
  const int link = h.WaitFor(IsRelease("link"));
  EXPECT_FALSE(h.at(link).msg.release().not_held());
  // Running: its Result once it is gone.
  h.Push(CancelOf("head", 1));
  const int head = h.WaitFor(IsResult("head"));
  EXPECT_EQ(h.at(head).msg.result().result().outcome(), v1::OUTCOME_CANCELLED);
}

TEST(AgentCore, ResultsNotAcknowledgedAtExitGoToTheNextAgentWithTheId) {
  const std::string dir = Harness::MakeDir();
  {
    Harness first({}, dir);
    first.Connect();
    first.Push(Assign({Task("b-first", "noop")}));
    first.WaitFor(IsResult("b-first"));
    first.Push(Assign({Task("a-then", "fail", {"3"})}));
    first.WaitFor(IsResult("a-then"));
    first.Disconnect();  // the scheduler is away; the agent exits
    first.core().Drain(absl::ZeroDuration());
    EXPECT_EQ(first.core().Finish(), 2);
  }
  {
    Harness second({}, dir);
    second.core().TakeBackKept();
    using L = std::set<std::tuple<std::string, int, bool>>;
    const v1::Hello hello = second.Connect();
    EXPECT_EQ(Listed(hello.running()), (L{{"b-first", 1, true}, {"a-then", 1, true}}));
    second.core().outbox().WaitIdle();
    EXPECT_EQ(Ends(second, 0), (std::vector<std::string>{"b-first", "a-then"}));
    const int failed = second.Find(IsResult("a-then"));
    ASSERT_GE(failed, 0);
    EXPECT_EQ(second.at(failed).msg.result().result().exit_code(), 3);
    second.AckResult("b-first");
    second.AckResult("a-then");
    EXPECT_EQ(second.core().unacked(), 0);
  }
  {
    // Read once: a third agent finds nothing more.
    Harness third({}, dir);
    third.core().TakeBackKept();
    EXPECT_EQ(third.core().unacked(), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST(AgentCore, SelfFencesWhenNothingAnswersForStopOnLostAfter) {
  Harness h;
  h.ack_heartbeats = false;
  h.Connect();  // stop_on_lost_after 1 s, no lease
  const absl::Duration assigned = h.now();
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(Ms(999));
  EXPECT_EQ(h.core().running(), 1) << "stopped before a second of silence";
  EXPECT_EQ(h.Find(IsEnd("long")), -1);
  h.RunFor(Ms(1));
  // A Release: the scheduler does not count an attempt its own silence
  // stopped.
  const int result = h.WaitFor(IsRelease("long"));
  ASSERT_GE(result, 0);
  const Sent r = h.at(result);
  EXPECT_EQ(r.at - assigned, absl::Seconds(1));
  EXPECT_EQ(r.msg.release().attempt(), 1);
  EXPECT_EQ(r.msg.release().reason(), "stopped: no contact with the scheduler for 1s");
  EXPECT_EQ(h.Find(IsResult("long")), -1);
  EXPECT_EQ(h.Count(IsHeartbeat()), 10) << "heartbeats went out meanwhile";
  EXPECT_EQ(h.core().unacked(), 1);
  h.AckResult("long");
  EXPECT_EQ(h.core().unacked(), 0);
}

TEST(AgentCore, EndsAStreamWhoseSchedulerStopsAnsweringOnceAtHalfStopOnLostAfter) {
  Harness h;
  h.Connect();  // stop_on_lost_after 1 s, heartbeats every 100 ms
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(5));
  EXPECT_EQ(h.ended_streams(), 0) << "answered heartbeats end nothing";
  h.ack_heartbeats = false;
  const size_t from = h.size();
  h.RunFor(Ms(100));
  const int first = h.Find(IsHeartbeat(), from);
  ASSERT_GE(first, 0);
  const absl::Duration asked = h.at(first).at;
  h.RunFor(asked + Ms(500) - h.now() - Ms(1));
  EXPECT_EQ(h.ended_streams(), 0) << "ended before half of stop_on_lost_after";
  h.RunFor(Ms(1));
  EXPECT_EQ(h.ended_streams(), 1);
  EXPECT_EQ(h.core().running(), 1) << "the task runs on while the agent looks elsewhere";
  h.RunFor(Ms(300));
  EXPECT_EQ(h.ended_streams(), 1) << "once per stream";
}

TEST(AgentCore, ALongStopOnLostAfterEndsASilentStreamAfterTwoHeartbeatsAndASecond) {
  Harness h;
  WelcomeOpts w;
  w.interval = absl::Seconds(1);
  w.stop_on_lost_after = absl::Seconds(11);  // a failover's grace
  h.Connect(w);
  h.ack_heartbeats = false;
  h.RunFor(absl::Seconds(1));  // the first heartbeat goes out unanswered
  const int first = h.Find(IsHeartbeat());
  ASSERT_GE(first, 0);
  h.RunFor(h.at(first).at + absl::Seconds(3) - h.now() - Ms(1));
  EXPECT_EQ(h.ended_streams(), 0);
  h.RunFor(Ms(1));
  EXPECT_EQ(h.ended_streams(), 1) << "3 s of silence, not 5.5";
}

TEST(AgentCore, EndsAStreamWhoseHelloIsNeverWelcomed) {
  Harness h;
  h.core().StreamStarted();  // stop_on_lost_after: the default 4 s until a Welcome
  h.RunFor(kDefaultStopOnLostAfter / 2 - Ms(1));
  EXPECT_EQ(h.ended_streams(), 0);
  h.RunFor(Ms(1));
  EXPECT_EQ(h.ended_streams(), 1);
}

TEST(AgentCore, KeepsRunningWhileHeartbeatsAreAcked) {
  Harness h;
  h.Connect();  // stop_on_lost_after 1 s
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(60));
  EXPECT_EQ(h.Find(IsEnd("long")), -1);
  EXPECT_EQ(h.core().running(), 1);
  EXPECT_EQ(h.Count(IsHeartbeat()), 600);
}

TEST(AgentCore, ALeaseKeepsTasksRunningBetweenSparseAcksThenEnds) {
  Harness h;
  h.ack_interval = absl::Seconds(1);
  // stop_on_lost_after shorter than the interval: the lease decides.
  h.Connect(WithLease(Ms(300), absl::Seconds(2)));
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(10));
  EXPECT_EQ(h.core().running(), 1);
  EXPECT_EQ(h.Find(IsEnd("long")), -1);

  // The acks stop. The last heartbeat answered went out at most one
  // interval ago; the tasks run until it + the lease.
  h.ack_heartbeats = false;
  const int last = [&] {
    int i = -1;
    for (int j = 0; j < static_cast<int>(h.size()); ++j) i = h.at(j).msg.has_heartbeat() ? j : i;
    return i;
  }();
  ASSERT_GE(last, 0);
  const absl::Duration answered = h.at(last).at;
  h.RunFor(answered + absl::Seconds(2) - h.now() - Ms(1));
  EXPECT_EQ(h.core().running(), 1) << "stopped before the lease ran out";
  h.RunFor(Ms(1));
  const int result = h.WaitFor(IsRelease("long"));
  ASSERT_GE(result, 0);
  EXPECT_EQ(h.at(result).at, answered + absl::Seconds(2));
  EXPECT_EQ(h.at(result).msg.release().reason(), "stopped: no contact with the scheduler for 2s");
}

TEST(AgentCore, AStreamThatEndsCutsTheLeaseToStopOnLostAfter) {
  Harness h;
  h.Connect(WithLease(absl::Seconds(1), absl::Seconds(30)));
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(5));
  EXPECT_TRUE(h.Disconnect());
  h.RunFor(Ms(999));
  EXPECT_EQ(h.core().running(), 1) << "stopped before stop_on_lost_after";
  h.RunFor(Ms(1));  // a second after the cut, 30 s before the lease would end
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  // No stream: the Result waits, unacknowledged, for the next one.
  EXPECT_EQ(h.core().running(), 0);
  EXPECT_EQ(h.core().unacked(), 1);
}

TEST(AgentCore, AResultFencedWhileDisconnectedIsListedAndResentOnTheNextStream) {
  Harness h;
  h.Connect();  // no lease: silence decides
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.Disconnect();
  h.RunFor(Ms(999));
  EXPECT_EQ(h.core().running(), 1);
  h.RunFor(Ms(1));  // a second after the last message from the scheduler
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_EQ(h.core().running(), 0);
  EXPECT_EQ(h.core().unacked(), 1);

  const size_t from = h.size();
  const v1::Hello hello = h.Connect();
  EXPECT_EQ(HeldIds(hello.running()), (std::set<std::string>{"long"}));
  const int result = h.Find(IsRelease("long"), from);
  ASSERT_GE(result, 0) << "the Welcome brings the unacknowledged release again";
  EXPECT_EQ(h.at(result).msg.release().reason(), "stopped: no contact with the scheduler for 1s");
  h.AckResult("long");
  EXPECT_EQ(h.core().unacked(), 0);
}

// --- Held through a restart of the scheduler ---

WelcomeOpts WithRestartGrace(absl::Duration grace) {
  WelcomeOpts w = WithLease(absl::Seconds(1), absl::Seconds(2));
  w.restart_grace = grace;
  return w;
}

TEST(AgentCore, TasksRunThroughARestartThatRefusesConnectionsUntilTheRestartGrace) {
  Harness h;
  h.Connect(WithRestartGrace(absl::Seconds(60)));
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(5));
  ASSERT_TRUE(h.Disconnect());
  const absl::Duration ended = h.now();
  h.RunFor(Ms(200));
  EXPECT_TRUE(h.core().SchedulerRefused()) << "the first refusal starts the hold";
  EXPECT_FALSE(h.core().SchedulerRefused()) << "and says so once";
  EXPECT_EQ(h.core().restart_hold_left(), ended + absl::Seconds(59) - h.now());
  h.RunFor(ended + absl::Seconds(59) - h.now() - Ms(1));
  EXPECT_EQ(h.core().running(), 1) << "stopped before the restart grace, less a second";
  EXPECT_EQ(h.Find(IsEnd("long")), -1);
  h.RunFor(Ms(1));
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_EQ(h.core().running(), 0);
  EXPECT_EQ(h.core().unacked(), 1);
  // Handed in as a Release (not counted) once a scheduler answers.
  const size_t from = h.size();
  h.Connect(WithRestartGrace(absl::Seconds(60)));
  const int release = h.Find(IsRelease("long"), from);
  ASSERT_GE(release, 0);
  EXPECT_EQ(h.at(release).msg.release().reason(),
            "stopped: the scheduler refused connections for longer than its restart grace "
            "(1m)");
}

TEST(AgentCore, SilenceDuringARestartHoldStopsTheTasksAtOnce) {
  Harness h;
  h.Connect(WithRestartGrace(absl::Seconds(60)));
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  ASSERT_TRUE(h.Disconnect());
  h.RunFor(Ms(100));
  h.core().SchedulerRefused();
  h.RunFor(absl::Seconds(10));
  EXPECT_EQ(h.core().running(), 1);
  // The host stops answering at all (down, or the network cut): no
  // restart explains that, and the scheduler may have moved the tasks.
  h.core().SchedulerNotRestarting();
  h.RunFor(Ms(1));
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_EQ(h.core().running(), 0);
  EXPECT_EQ(h.core().restart_hold_left(), absl::ZeroDuration());
}

TEST(AgentCore, WithoutARefusalAnEndedStreamStopsTasksAsBeforeWhateverTheRestartGrace) {
  Harness h;
  h.Connect(WithRestartGrace(absl::Seconds(60)));
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.RunFor(absl::Seconds(3));
  ASSERT_TRUE(h.Disconnect());
  h.RunFor(Ms(999));
  EXPECT_EQ(h.core().running(), 1);
  h.RunFor(Ms(1));  // stop_on_lost_after after the stream ended
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_EQ(h.core().running(), 0);
}

TEST(AgentCore, SelfFencingDropsWaitingLinks) {
  Harness h;
  h.ack_heartbeats = false;
  h.Connect();
  h.Push(Assign({Long("a"), After("a", Task("b", "noop"))}));
  h.WaitFor(IsAccept("a"));
  EXPECT_EQ(h.core().waiting(), 1);
  h.RunFor(absl::Seconds(1));
  EXPECT_EQ(h.core().waiting(), 0);
  h.WaitFor(IsRelease("a"));
  EXPECT_EQ(h.Find(About("b")), -1);
}

// --- Drain ---

TEST(AgentCore, DrainLetsTasksFinishThenReleasesTheRestAtItsDeadline) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("long"), Long("other")}));
  h.WaitFor(IsAccept("other"));
  const absl::Duration start = h.now();
  h.core().Drain(absl::Seconds(1));
  const int draining = h.WaitFor(IsDraining());
  // One ends by itself meanwhile (the scheduler cancelled it).
  v1::SchedulerMessage cancel;
  cancel.mutable_cancel()->set_task_id("other");
  cancel.mutable_cancel()->set_attempt(1);
  h.Push(cancel);
  const int other = h.WaitFor(IsResult("other"));
  ASSERT_GE(other, 0);
  h.AckResult("other");
  h.RunFor(Ms(999));
  EXPECT_EQ(h.core().running(), 1);
  h.RunFor(Ms(1));
  const int release = h.WaitFor(IsRelease("long"));
  ASSERT_GE(release, 0);
  EXPECT_LT(draining, release);
  EXPECT_EQ(h.at(release).at - start, absl::Seconds(1));
  EXPECT_EQ(h.at(release).msg.release().reason(), "agent drained: 1s passed");
  EXPECT_EQ(h.Find(IsResult("long")), -1) << "released, not reported as a result";
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_FALSE(h.core().DrainComplete()) << "the release is not acknowledged yet";
  h.AckResult("long");
  EXPECT_TRUE(h.core().DrainComplete());
  // Everything handed over: Goodbye, and once the scheduler had its time
  // to close the stream, the agent ends it.
  h.RunFor(Ms(1));
  ASSERT_GE(h.Find(IsGoodbye()), 0);
  EXPECT_EQ(h.ended_streams(), 0);
  h.RunFor(kGoodbyeWait);
  EXPECT_GE(h.ended_streams(), 1);
}

TEST(AgentCore, DrainZeroReleasesEverythingAtOnce) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("one"), Long("two"), After("two", Task("three", "noop"))}));
  h.WaitFor(IsAccept("two"));
  const absl::Duration start = h.now();
  h.core().Drain(absl::ZeroDuration());
  for (const std::string id : {"one", "two"}) {
    const int release = h.WaitFor(IsRelease(id));
    ASSERT_GE(release, 0);
    EXPECT_EQ(h.at(release).at, start);
    EXPECT_EQ(h.at(release).msg.release().reason(), "agent drained: 0s passed");
  }
  EXPECT_EQ(h.core().waiting(), 0);
  EXPECT_EQ(h.Find(About("three")), -1);
}

Pred IsRestarting() {
  return [](const v1::AgentMessage& m) { return m.has_restarting(); };
}

v1::SchedulerMessage RestartHold(absl::Duration hold) {
  v1::SchedulerMessage m;
  *m.mutable_restart_hold()->mutable_hold() = ToProto(hold);
  return m;
}

TEST(AgentCore, ARestartWithoutAnAnswerBecomesADrain) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.core().Restart(absl::Minutes(5), absl::Seconds(1));
  const int ask = h.WaitFor(IsRestarting());
  ASSERT_GE(ask, 0);
  EXPECT_EQ(FromProto(h.at(ask).msg.restarting().hold()), absl::Minutes(5));
  EXPECT_TRUE(h.core().draining()) << "it takes no more work while it asks";
  // No RestartHold: after kRestartAnswerWait it drains (1 s) instead.
  h.RunFor(kRestartAnswerWait - Ms(1));
  EXPECT_FALSE(h.core().exiting());
  h.RunFor(Ms(1));
  EXPECT_TRUE(h.core().exiting());
  h.RunFor(absl::Seconds(1));
  const int release = h.WaitFor(IsRelease("long"));
  ASSERT_GE(release, 0);
  EXPECT_EQ(h.at(release).msg.release().reason(), "agent drained: 1s passed");
}

TEST(AgentCore, ARestartGrantedNothingDrains) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.core().Restart(absl::Minutes(5), absl::Seconds(30));
  h.WaitFor(IsRestarting());
  h.Push(RestartHold(absl::ZeroDuration()));
  EXPECT_TRUE(h.core().exiting());
  h.RunFor(absl::Seconds(30) - Ms(1));
  EXPECT_EQ(h.core().running(), 1) << "a drain of 30 s, as without --keep_steps";
  h.RunFor(Ms(1));
  EXPECT_GE(h.WaitFor(IsRelease("long")), 0);
}

TEST(AgentCore, ARestartGrantedReleasesWhatCannotBeKeptAndSaysGoodbyeWhenNothingWasKept) {
  Harness h;
  h.Connect();
  // A builtin runs inside the agent: it cannot outlive it.
  h.Push(Assign({Long("builtin")}));
  h.WaitFor(IsAccept("builtin"));
  h.core().Restart(absl::Minutes(5), absl::Seconds(30));
  h.WaitFor(IsRestarting());
  const absl::Duration granted_at = h.now();
  h.Push(RestartHold(absl::Minutes(5)));
  const int release = h.WaitFor(IsRelease("builtin"));
  ASSERT_GE(release, 0);
  EXPECT_EQ(h.at(release).at, granted_at) << "released at once";
  EXPECT_THAT(h.at(release).msg.release().reason(), ::testing::HasSubstr("could not keep"));
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_EQ(h.core().kept(), 0);
  h.AckResult("builtin");
  h.RunFor(Ms(1));
  EXPECT_GE(h.Find(IsGoodbye()), 0) << "everything was handed over";
}

TEST(AgentCore, ALaterDrainMayOnlyShortenTheDeadline) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.core().Drain(absl::Seconds(30));
  h.RunFor(absl::Seconds(10));
  h.core().Drain(absl::Seconds(60));  // cannot lengthen it
  h.RunFor(absl::Seconds(20) - Ms(1));
  EXPECT_EQ(h.core().running(), 1);
  h.RunFor(Ms(1));
  const int release = h.WaitFor(IsRelease("long"));
  ASSERT_GE(release, 0);
  EXPECT_EQ(h.at(release).msg.release().reason(), "agent drained: 30s passed");
  EXPECT_EQ(h.Count(IsDraining()), 1);
}

TEST(AgentCore, ADrainEndsWithinItsBoundsWhenTheSchedulerIsGone) {
  Harness h;  // kill_grace 200 ms, stop_flush 500 ms
  h.Connect();
  h.Push(Assign({Long("long")}));
  h.WaitFor(IsAccept("long"));
  h.Disconnect();
  h.core().Drain(absl::ZeroDuration());
  // The task ends at once (cancelled); its Release cannot be handed over.
  ASSERT_TRUE(h.core().WaitTasksEnded(absl::Seconds(10)));
  EXPECT_FALSE(h.core().DrainComplete());
  h.RunFor(Ms(499));
  EXPECT_FALSE(h.core().DrainComplete());
  h.RunFor(Ms(1));
  EXPECT_TRUE(h.core().DrainComplete()) << "stop_flush after the last task ended";
  EXPECT_EQ(h.core().unacked(), 1);
  EXPECT_EQ(h.Find(IsGoodbye()), -1) << "nothing was handed over: no Goodbye";
}

TEST(AgentCore, ADrainingAgentRejectsWorkAndSaysSoInHelloAndAfterWelcome) {
  Harness h;
  h.Connect();
  v1::SchedulerMessage drain;
  drain.mutable_drain();
  h.Push(drain);
  h.WaitFor(IsDraining());
  EXPECT_TRUE(h.core().draining());
  EXPECT_FALSE(h.core().exiting()) << "a Drain message does not make the agent exit";
  h.Push(Assign({Task("later", "noop")}));
  const int reject = h.WaitFor([](const v1::AgentMessage& m) { return m.has_reject(); });
  ASSERT_GE(reject, 0);
  EXPECT_EQ(h.at(reject).msg.reject().code(), v1::REJECT_CODE_DRAINING);
  h.Disconnect();
  const size_t from = h.size();
  EXPECT_TRUE(h.Connect().draining());
  EXPECT_GE(h.Find(IsDraining(), from), 0);
}

// --- Live output ---

v1::SchedulerMessage Watch(const std::string& id, bool watch) {
  v1::SchedulerMessage m;
  m.mutable_watch_output()->set_task_id(id);
  m.mutable_watch_output()->set_attempt(1);
  m.mutable_watch_output()->set_watch(watch);
  return m;
}
Pred IsOutput(const std::string& id) {
  return [id](const v1::AgentMessage& m) { return m.has_output() && m.output().task_id() == id; };
}
// The output messages about `id` written at index >= from.
std::vector<Sent> OutputsOf(const Harness& h, const std::string& id, size_t from = 0) {
  std::vector<Sent> out;
  for (size_t i = from; i < h.size(); ++i) {
    if (IsOutput(id)(h.at(i).msg)) out.push_back(h.at(i));
  }
  return out;
}
void Write(LiveOutput& live, LiveOutput::Stream s, const std::string& text) {
  live.Append(s, text.data(), text.size());
}

TEST(AgentCore, LiveOutputGoesOnlyWhileWatchedAtMostEveryIntervalAndLastBeforeItsResult) {
  Harness h;
  EXPECT_TRUE(h.Connect().live_output());
  h.Push(Assign({Long("t")}));
  h.WaitFor(IsAccept("t"));
  std::shared_ptr<LiveOutput> live = h.core().live_output("t", 1);
  ASSERT_NE(live, nullptr);
  Write(*live, LiveOutput::kStdout, "before\n");
  h.RunFor(Ms(1000));
  EXPECT_TRUE(OutputsOf(h, "t").empty()) << "nobody watches: nothing is sent";

  // Watched: what it holds goes at once, marked caught up.
  h.Push(Watch("t", true));
  const absl::Duration watched = h.now();
  std::vector<Sent> out = OutputsOf(h, "t");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].at, watched);
  EXPECT_EQ(out[0].msg.output().data(), "before\n");
  EXPECT_EQ(out[0].msg.output().offset(), 0);
  EXPECT_EQ(out[0].msg.output().stream(), v1::OUTPUT_STREAM_STDOUT);
  EXPECT_TRUE(out[0].msg.output().caught_up());

  // New output: at most every 200 ms.
  Write(*live, LiveOutput::kStdout, "a\n");
  h.RunFor(Ms(199));
  EXPECT_EQ(OutputsOf(h, "t").size(), 1u) << "sent before the interval";
  h.RunFor(Ms(1));
  out = OutputsOf(h, "t");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].at, watched + Ms(200));
  EXPECT_EQ(out[1].msg.output().offset(), 7);
  EXPECT_EQ(out[1].msg.output().data(), "a\n");
  EXPECT_FALSE(out[1].msg.output().caught_up());
  Write(*live, LiveOutput::kStderr, "oops\n");
  h.RunFor(Ms(200));
  out = OutputsOf(h, "t");
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].at, watched + Ms(400));
  EXPECT_EQ(out[2].msg.output().stream(), v1::OUTPUT_STREAM_STDERR);
  EXPECT_EQ(out[2].msg.output().data(), "oops\n");

  // Unwatched: nothing more.
  h.Push(Watch("t", false));
  Write(*live, LiveOutput::kStdout, "unseen\n");
  h.RunFor(Ms(1000));
  EXPECT_EQ(OutputsOf(h, "t").size(), 3u) << "sent after the scheduler said stop";

  // Watched again, then the attempt ends: its last output goes at once,
  // before its Result, and nothing after.
  h.Push(Watch("t", true));
  const size_t rewatched = h.size();
  Write(*live, LiveOutput::kStdout, "last words\n");
  v1::SchedulerMessage cancel;
  cancel.mutable_cancel()->set_task_id("t");
  cancel.mutable_cancel()->set_attempt(1);
  h.Push(cancel);
  const int result = h.WaitFor(IsResult("t"), rewatched);
  out = OutputsOf(h, "t", rewatched);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back().msg.output().data(), "last words\n");
  EXPECT_LT(h.Find([](const v1::AgentMessage& m) {
    return m.has_output() && m.output().data() == "last words\n";
  }),
            result)
      << "the last output must precede the Result";
  const size_t ended = h.size();
  Write(*live, LiveOutput::kStdout, "after the end\n");
  h.RunFor(Ms(1000));
  EXPECT_TRUE(OutputsOf(h, "t", ended).empty()) << "output sent after the attempt ended";
}

TEST(AgentCore, LiveOutputSkipsAheadWhenItsWriterOutrunsTheWatcher) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("fast")}));
  h.WaitFor(IsAccept("fast"));
  std::shared_ptr<LiveOutput> live = h.core().live_output("fast", 1);
  ASSERT_NE(live, nullptr);
  h.Push(Watch("fast", true));
  const absl::Duration watched = h.now();
  ASSERT_EQ(OutputsOf(h, "fast").size(), 1u) << "the empty answer, caught up";
  // 200 KiB between two looks: more than the 64 KiB the agent keeps. A
  // full chunk goes at the next poll, without waiting for the interval.
  Write(*live, LiveOutput::kStdout, std::string(200 << 10, 'x'));
  h.RunFor(Ms(50));
  std::vector<Sent> out = OutputsOf(h, "fast");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].at, watched + Ms(50));
  EXPECT_EQ(out[1].msg.output().offset(), (200 << 10) - (64 << 10))
      << "the skipped bytes show as a jump in the offset";
  EXPECT_EQ(out[1].msg.output().data().size(), static_cast<size_t>(64 << 10));
  EXPECT_LE(out[1].msg.output().data().size(), static_cast<size_t>(kMaxOutputChunkBytes));
}

TEST(AgentCore, WatchesEndWithTheStreamAndAnAttemptNotHereIsAnsweredEmpty) {
  Harness h;
  h.Connect();
  h.Push(Assign({Long("t")}));
  h.WaitFor(IsAccept("t"));
  std::shared_ptr<LiveOutput> live = h.core().live_output("t", 1);
  ASSERT_NE(live, nullptr);
  h.Push(Watch("t", true));
  h.Disconnect();
  h.Connect();
  const size_t reconnected = h.size();
  Write(*live, LiveOutput::kStdout, "news\n");
  h.RunFor(Ms(1000));
  EXPECT_TRUE(OutputsOf(h, "t", reconnected).empty())
      << "a watch from the last stream went on: the scheduler asks again on a new one";

  v1::SchedulerMessage other = Watch("not-here", true);
  h.Push(other);
  std::vector<Sent> out = OutputsOf(h, "not-here");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].msg.output().caught_up());
  EXPECT_TRUE(out[0].msg.output().data().empty());
}

}  // namespace
}  // namespace taskgrid::agent
