// Agent: the worker side of AgentService.Connect.
//
// Lifecycle:
//   1. Run() connects and sends Hello (id, slots, labels, whether it is
//      draining, and the attempts it holds from an earlier stream: running,
//      or finished with the Result or Release not yet acknowledged); on
//      Welcome it resends those messages (and Draining, when draining).
//   2. For each Assign entry it sends Accept and starts a TaskRun on a
//      thread of its own (or Reject when it has no room or is draining).
//   3. A timer thread writes Heartbeat every interval from Welcome, and
//      enforces the two deadlines below.
//   4. A finished TaskRun's Result is sent and kept until ResultAck.
//   5. When the stream breaks it reconnects with exponential backoff and
//      jitter; running tasks keep running meanwhile.
//   6. Self-fencing: every message from the scheduler (a HeartbeatAck at
//      least every heartbeat interval) renews contact. With no contact for
//      stop_on_lost_after (connected or not), it cancels its running tasks
//      itself, before the scheduler gives them to another agent; their
//      Results (OUTCOME_CANCELLED) wait for the next stream like any other.
//   7. StopTakingWork() (SIGTSTP, or the scheduler's Drain): sends Draining,
//      rejects every later Assign entry; running tasks finish normally.
//   8. Drain(timeout) (SIGTERM; SIGINT and Stop() with 0): StopTakingWork(),
//      then at the deadline every task still running is cancelled and sent
//      as Release instead of a Result; Run() returns once every task ended
//      and every Result/Release is acknowledged, or stop_flush after the
//      tasks ended (plus kill_grace for the cancelled ones).
//
// Thread-safe: StopTakingWork(), Drain() and Stop() from any thread, any
// time (also before Run()). Internally: the Run() thread reads the stream,
// one timer thread, one thread per running task; writes to the stream are
// serialized by write_mu_. Time for intervals is CLOCK_MONOTONIC.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "agent/executor.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"

namespace taskgrid::agent {

struct AgentOptions {
  std::string scheduler = "127.0.0.1:7070";
  std::string id;
  int slots = 2;
  std::map<std::string, std::string> labels;
  ExecutorOptions exec;
  absl::Duration reconnect_min = absl::Milliseconds(100);
  // Well inside the scheduler's reconnect grace (5 s by default), so a
  // restarted scheduler gets its agents back before it re-queues their work.
  absl::Duration reconnect_max = absl::Seconds(1);
  // At the end of a drain, how long to wait for the scheduler to
  // acknowledge the last results before exiting.
  absl::Duration stop_flush = absl::Seconds(2);
  // Self-fencing: silence from the scheduler after which running tasks are
  // cancelled. Zero: Welcome.stop_on_lost_after, or kDefaultStopOnLostAfter
  // when the scheduler sends none.
  absl::Duration stop_on_lost_after = absl::ZeroDuration();
};

inline constexpr absl::Duration kDefaultStopOnLostAfter = absl::Seconds(4);

class Agent {
 public:
  explicit Agent(AgentOptions opts);
  // Calls Stop(); the thread in Run() must have returned before the Agent is
  // destroyed.
  ~Agent();

  // Blocks until a drain (Drain() or Stop()) completed. Returns the number of
  // streams it opened.
  int Run();

  // Takes no more work: sends Draining now and says draining in every later
  // Hello; later Assign entries are rejected. Running tasks finish normally.
  // Idempotent; returns at once.
  void StopTakingWork();
  // StopTakingWork(), and Run() returns when the drain is complete: tasks
  // still running `timeout` from now are cancelled and released. A later call
  // may only shorten the deadline. Returns at once.
  void Drain(absl::Duration timeout);
  // Drain(0): releases every running task at once.
  void Stop() { Drain(absl::ZeroDuration()); }

  // For tests: tasks running now, Results/Releases awaiting their ack, and
  // whether it takes no more work.
  int running() const;
  int unacked() const;
  bool draining() const;

 private:
  using Key = std::pair<std::string, int32_t>;  // (task_id, attempt)
  // Why a running task was cancelled by the agent, which decides what its
  // end is reported as.
  enum class StopCause {
    kNone,      // not stopped (or by the scheduler's Cancel): a Result
    kFenced,    // no contact: a Result, OUTCOME_CANCELLED with `note`
    kReleased,  // the drain ran out of time: a Release with `note`
  };
  struct Running {
    std::shared_ptr<TaskRun> run;
    int32_t slots = 1;
    StopCause cause = StopCause::kNone;
    std::string note;
  };

  // One stream: Hello, then read until it breaks.
  void Session();
  void Handle(const v1::SchedulerMessage& msg);
  void OnAssign(const v1::Assignment& a);
  void OnCancel(const v1::Cancel& c);
  void TaskThread(std::shared_ptr<TaskRun> run);
  // Heartbeats, self-fencing and the drain deadline, until Run() ends.
  void TimerLoop();
  // Writes on the current stream; false if there is none or it broke.
  bool Write(const v1::AgentMessage& msg);
  void ResendUnacked();
  // Sets draining_; true when it was not set before. Needs mu_.
  bool StartDrainingLocked();
  // Cancels every running task not already stopped by the agent, as
  // `cause`; returns how many. Needs mu_.
  int StopRunningLocked(StopCause cause, const std::string& note);
  absl::Duration StopOnLostAfterLocked() const;
  // Drain() was called and every task ended and its result is acknowledged,
  // or the exit deadline passed. Needs mu_.
  bool DrainCompleteLocked() const;
  static absl::Duration Now();  // monotonic

  const AgentOptions opts_;
  // Touched only by the Run() thread (Session and the Handle it calls).
  bool welcomed_ = false;
  absl::Duration last_unreachable_log_ = -absl::InfiniteDuration();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool draining_ = false;  // guarded by mu_; takes no more work
  bool exiting_ = false;   // guarded by mu_; Drain() was called
  // Guarded by mu_, monotonic. When the running tasks are released (set by
  // Drain()), and when Run() returns whatever is unacknowledged.
  absl::Duration drain_deadline_ = absl::InfiniteDuration();
  absl::Duration drain_timeout_ = absl::InfiniteDuration();  // for the Release reason
  bool drain_expired_ = false;  // guarded by mu_; the running tasks were released
  absl::Duration exit_deadline_ = absl::InfiniteDuration();
  bool run_done_ = false;                                 // guarded by mu_
  std::map<std::string, Running> running_;                // guarded by mu_; by task id
  std::map<Key, v1::AgentMessage> unacked_;               // guarded by mu_; Result or Release
  int threads_ = 0;                                       // guarded by mu_; live task threads
  int used_slots_ = 0;                                    // guarded by mu_
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // guarded by mu_
  // Guarded by mu_: from the last Welcome (zero: none), and when the last
  // message from the scheduler arrived (monotonic).
  absl::Duration welcome_stop_on_lost_after_ = absl::ZeroDuration();
  int64_t welcome_max_output_bytes_ = 0;  // guarded by mu_; 0: none
  absl::Duration last_heard_ = absl::ZeroDuration();
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_; the live stream's

  std::mutex write_mu_;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>* stream_ =
      nullptr;  // guarded by write_mu_
};

}  // namespace taskgrid::agent
