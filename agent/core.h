// AgentCore: everything an agent decides, apart from the gRPC stream that
// carries it (agent/agent.h). It ties together
//   - Slots (agent/slots.h): the attempts held and the rules for more,
//   - Lease (agent/lease.h): when to stop running tasks (self-fencing),
//   - DrainPlan (agent/drain.h): taking no more work, then leaving,
//   - Outbox (agent/outbox.h): what goes out on the stream, in order,
// under one mutex, with time from an injected Clock, and runs each task on
// a pooled thread.
//
// The transport calls StreamStarted() for the Hello of a new stream,
// Handle() for each message read, StreamEnded() when the stream ends, and
// runs TimerLoop() on a thread of its own. Tests drive the same object
// with a FakeClock: they call Tick() after FakeClock::Advance instead of
// running TimerLoop(), read what the Outbox wrote, and never sleep.
//
// What it does with each message and deadline (the protocol in
// docs/architecture.md, "The agent"):
//   - Welcome: the heartbeat interval, the lease, the scheduler's output
//     cap; then Draining (when draining) and every unacknowledged Result or
//     Release again.
//   - Assign: Accept or Reject each entry; a chain link waits for its
//     predecessor. Tasks that never wait (noop, echo, fail) run inline and
//     their Results go out with the Accepts, as one batch.
//   - Cancel, ResultAck, Drain, HeartbeatAck.
//   - WatchOutput: starts or stops sending an attempt's output as its
//     steps write it (OutputWatches decides when; its last output goes
//     before its Result). Watches end with the stream.
//   - Tick: a Heartbeat each interval, the output of watched attempts
//     that is due, self-fencing at the lease's end, or at the end of the
//     restart grace while the scheduler refuses connections (running tasks
//     cancelled and sent as Release: not counted as attempts; waiting
//     links dropped), the drain's release deadline (running tasks
//     cancelled and sent as Release), the Goodbye at the end, and the end
//     of a stream whose Hello or a Heartbeat has had no answer for two
//     heartbeat intervals and a second, or half of StopOnLostAfter() if
//     shorter (a frozen or cut-off scheduler: the Agent goes to the next
//     address while the tasks may still run).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "agent/drain.h"
#include "agent/executor.h"
#include "agent/lease.h"
#include "agent/outbox.h"
#include "agent/output_watches.h"
#include "agent/slots.h"
#include "common/clock.h"
#include "common/worker_pool.h"
#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::agent {

// How long Restart() waits for the scheduler's RestartHold.
inline constexpr absl::Duration kRestartAnswerWait = absl::Seconds(2);

struct CoreOptions {
  std::string id;
  int slots = 2;
  std::map<std::string, std::string> labels;
  // Hello.resources: what it offers, as Placement.resources spells it.
  std::map<std::string, std::string> resources;
  ExecutorOptions exec;
  // At the end of a drain, how long to wait for the scheduler to
  // acknowledge the last results before exiting.
  absl::Duration stop_flush = absl::Seconds(2);
  // Self-fencing: silence from the scheduler after which running tasks are
  // cancelled. Zero: Welcome.stop_on_lost_after, or kDefaultStopOnLostAfter
  // when the scheduler sends none.
  absl::Duration stop_on_lost_after = absl::ZeroDuration();
  // Every interval, lease and deadline is read from it (Monotonic()).
  // Null: RealClock::Get().
  Clock* clock = nullptr;
  // exec.work_dir, the base of the per-attempt directories, when empty:
  // DefaultWorkDir(id).
};

class AgentCore {
 public:
  // `end_stream`: ends the live stream (called without the core's lock, by
  // the timer, once the drain is complete and the Goodbye had its time).
  AgentCore(CoreOptions opts, std::function<void()> end_stream);
  // The task threads must have ended (Finish()) or end now: joins them.
  ~AgentCore() = default;
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // Where messages to the scheduler go; the transport attaches the stream.
  Outbox& outbox() { return outbox_; }

  // A stream opens: returns its Hello (id, slots, labels, what it holds:
  // running, waiting and finished but unacknowledged attempts).
  v1::AgentMessage StreamStarted();
  // One message from the scheduler.
  void Handle(const v1::SchedulerMessage& msg);
  // The stream ended; returns whether it had got its Welcome.
  bool StreamEnded();
  // After a stream that got no Welcome, what the transport learnt of the
  // scheduler's address (agent/lease.h, "a restart of the scheduler"):
  // refused (its host up, nothing listening) returns true when that starts
  // holding the running tasks through a restart (to say so once); or
  // anything that rules a restart out (no answer at all, an answer that
  // is not a Welcome nor a standby's).
  bool SchedulerRefused();
  void SchedulerNotRestarting();
  // While tasks are held through a restart, how long they may still run.
  absl::Duration restart_hold_left() const;

  // One pass of the timer at the clock's now: heartbeat, fencing, drain
  // deadlines, Goodbye. Returns the monotonic time it is due again (a
  // change, such as a new interval or a Drain(), may bring that forward).
  absl::Duration Tick();
  // Tick() until StopTimer(), waiting in between for the next due time or
  // a change. For a real clock only: the waits are in real time.
  void TimerLoop();
  void StopTimer();

  // See Agent: StopTakingWork(), Drain(timeout).
  void StopTakingWork();
  void Drain(absl::Duration timeout);
  // Exits keeping the running steps for the next agent (agent/executor.h,
  // "Keeping steps"): asks the scheduler to hold this agent's attempts for
  // `hold` (Restarting); once it grants a hold (RestartHold), every run
  // that can be kept is kept until then and the others are released, as
  // by Drain(0). No grant within kRestartAnswerWait (no stream, an older
  // scheduler, a grant of zero): Drain(`otherwise`) instead.
  void Restart(absl::Duration hold, absl::Duration otherwise);
  // Before the first stream: takes back the attempts an earlier agent kept
  // in exec.work_dir, running them on, and the results it exited with
  // unacknowledged, to send again. Returns how many attempts it took back.
  int TakeBackKept();
  // Runs kept for the next agent since this one started.
  int kept() const;
  // Drain() was called, and every task ended and its result is
  // acknowledged, or the exit deadline passed.
  bool DrainComplete() const;
  // Waits (real time) up to `timeout` for DrainComplete(); returns it.
  bool WaitDrainComplete(absl::Duration timeout);
  // Waits (real time) up to `timeout` until no task thread is left;
  // returns whether none is. For tests: a task the agent cancelled ends on
  // its own thread.
  bool WaitTasksEnded(absl::Duration timeout);
  // After the last stream: releases whatever still runs and waits for every
  // task thread. Returns the Results/Releases left unacknowledged, which it
  // writes to exec.work_dir (kept/results) for the next agent with this id
  // to send (TakeBackKept()).
  int Finish();

  int running() const;
  int waiting() const;
  int unacked() const;
  bool draining() const;
  bool exiting() const;  // Drain() was called
  // The heartbeat interval in use, from the Welcome or the last ack.
  absl::Duration heartbeat_interval() const;
  // For tests: the live output of (task_id, attempt) while it runs here,
  // else null.
  std::shared_ptr<LiveOutput> live_output(const std::string& task_id, int32_t attempt) const;

 private:
  using Key = std::pair<std::string, int32_t>;  // (task_id, attempt)

  absl::Duration Now() const { return clock_->Monotonic(); }
  void OnWelcome(const v1::Welcome& welcome);
  void OnAssign(const v1::Assign& assign);
  void OnCancel(const v1::Cancel& c);
  void OnResultAck(const v1::ResultAck& ack);
  void OnHeartbeatAck(const v1::HeartbeatAck& ack);
  void OnWatchOutput(const v1::WatchOutput& w);
  // Runs `run`, reports it, then each chain link that follows it. With a
  // `sink` (a run inline on the stream's reader, for instant tasks) its
  // messages are appended there for the caller to write, and a link that
  // is not instant moves to a pooled thread.
  void TaskThread(std::shared_ptr<TaskRun> run, std::vector<v1::AgentMessage>* sink = nullptr);
  std::shared_ptr<TaskRun> MakeRun(v1::Assignment a) const;  // needs mu_
  // Cancels the running tasks as `cause` and drops the waiting links.
  // Needs mu_.
  int StopAllLocked(StopCause cause, const std::string& note);
  // Wakes the timer to look again, because something it decides by
  // changed (and whoever waits on cv_). Needs mu_.
  void WakeTimerLocked();
  // Tells the runs' step supervisors the lease (fence_ns_) when it moved
  // enough to matter. Needs mu_.
  void TellFenceLocked();
  // Wakes whoever waits on cv_ for tasks or acknowledgements; the timer too
  // only when that may end a drain. Needs mu_.
  void NotifyLocked();
  bool HandedOverLocked() const { return threads_ == 0 && unacked_.empty(); }
  void ResendUnacked();
  // Keeps `msg` (a Result or Release) until acknowledged, after those
  // produced before it. Needs mu_.
  void KeepUnackedLocked(v1::AgentMessage msg);
  // Everything this agent holds, as Hello and Heartbeat list it: running
  // and waiting attempts, those kept for the next agent, and finished ones
  // whose message is unacknowledged (`finished`). Needs mu_.
  void ListHeldLocked(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const;
  void SayDraining();
  // The scheduler's Undrain: work again, unless the agent is leaving.
  void OnUndrain();
  void OnRestartHold(const v1::RestartHold& hold);

  const CoreOptions opts_;
  Clock* const clock_;
  const std::function<void()> end_stream_;
  Outbox outbox_;

  mutable std::mutex mu_;
  // Run(), Finish() and the Wait* calls wait on cv_; the timer on timer_cv_,
  // woken only when what it decides by changed (not once per task: that
  // would cost a context switch per task on a busy agent).
  std::condition_variable cv_;
  std::condition_variable timer_cv_;
  Slots slots_;  // guarded by mu_
  Lease lease_;  // guarded by mu_
  // lease_.FenceAt() for the step supervisors (ExecutorOptions::fence_ns):
  // on CLOCK_MONOTONIC, with kSupervisorFenceMargin. Written under mu_.
  const std::shared_ptr<std::atomic<int64_t>> fence_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  DrainPlan drain_;        // guarded by mu_
  OutputWatches watches_;  // guarded by mu_
  // Guarded by mu_: each Result or Release sent and not yet acknowledged,
  // with the order it was produced in (resent in that order: a chain's
  // links after their predecessor).
  struct Unacked {
    uint64_t seq = 0;
    v1::AgentMessage msg;
  };
  std::map<Key, Unacked> unacked_;
  uint64_t next_unacked_seq_ = 0;  // guarded by mu_
  // Guarded by mu_: attempts kept for the next agent (Restart()): still
  // this agent's to list until it exits, and not for it to release.
  std::set<Key> kept_keys_;
  int threads_ = 0;                                       // guarded by mu_; live task threads
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // guarded by mu_
  absl::Duration last_heartbeat_;                         // guarded by mu_
  int64_t welcome_max_output_bytes_ = 0;                  // guarded by mu_; 0: none
  bool stream_open_ = false;                              // guarded by mu_
  bool welcomed_ = false;  // guarded by mu_; the open stream had its Welcome
  // Guarded by mu_: the open stream was ended for an unanswered Hello or
  // Heartbeat (once per stream).
  bool silence_ended_ = false;
  bool timer_stopped_ = false;  // guarded by mu_
  uint64_t changes_ = 0;        // guarded by mu_; bumped by WakeTimerLocked()
  // Guarded by mu_: when the timer's last pass said it is due again.
  absl::Duration timer_due_ = -absl::InfiniteDuration();

  // Restart(): asked at (the core's clock), how long to wait for the grant,
  // and the drain timeout when none comes.
  std::optional<absl::Duration> restart_asked_;  // guarded by mu_
  absl::Duration restart_otherwise_;             // guarded by mu_
  int kept_ = 0;                                 // guarded by mu_

  // Runs TaskThread; last, so its threads are joined before the rest goes.
  WorkerPool workers_;
};

}  // namespace taskgrid::agent
