// Agent: the worker side of AgentService.Connect.
//
// Lifecycle:
//   1. Run() connects and sends Hello (id, slots, labels, chains: true,
//      whether it is draining, and the attempts it holds from an earlier
//      stream: running, waiting in a chain, or finished with the Result or
//      Release not yet acknowledged); on Welcome it resends those messages
//      (and Draining, when draining).
//   2. For each Assign entry it sends Accept and starts a TaskRun on a
//      thread of its own (or Reject when it has no room or is draining).
//      Each attempt runs in a directory of its own under exec.work_dir,
//      with Assignment.inputs as files (agent/executor.h).
//   3. Chains: an entry with run_after (a chain link) names an earlier entry
//      of the same Assign. It waits, using no slot and with no message, in a
//      queue keyed by that predecessor. When the predecessor's run ends
//      SUCCEEDED, its thread sends the Result, then Accept for the link and
//      runs it at once in the slot it freed, with the predecessor's output
//      (result.output, else stdout_tail) added to the link's inputs under
//      the predecessor's id. When the predecessor ends any other way (failed,
//      timed out, cancelled, released, rejected, dropped), the link and every
//      link after it are dropped WITHOUT a message: the scheduler ends their
//      attempts itself. Waiting links are listed in Hello and Heartbeat like
//      running tasks; a Cancel of one drops it and the links after it.
//   4. A timer thread writes Heartbeat every interval from Welcome, and
//      enforces the two deadlines below.
//   5. A finished TaskRun's Result is sent and kept until ResultAck.
//   6. When the stream breaks it reconnects with exponential backoff and
//      jitter; running tasks keep running meanwhile (and chains go on).
//   7. Self-fencing: the agent cancels its running tasks itself, before the
//      scheduler gives them to another agent, and drops the waiting links;
//      the Results (OUTCOME_CANCELLED) wait for the next stream like any
//      other. With a scheduler that sends Welcome.heartbeat_lease: each
//      Welcome or HeartbeatAck answers the oldest unanswered Hello or
//      Heartbeat of the stream (in order), and lets the tasks run until
//      that message's send time + the lease; a stream that ends cuts this
//      to stop_on_lost_after from then. An older scheduler: every message
//      renews contact, and no contact for stop_on_lost_after (connected or
//      not) stops the tasks.
//  7a. Adaptive heartbeats: Hello says adaptive_heartbeat; each
//      HeartbeatAck may change the interval (the scheduler stretches it for
//      a large fleet), and each Heartbeat says the interval in use.
//   8. StopTakingWork() (SIGTSTP, or the scheduler's Drain): sends Draining,
//      rejects every later Assign entry; running tasks finish normally. A
//      link whose predecessor succeeds from now on is not started but sent
//      as Release ("agent is draining"); the links after it are dropped.
//   9. Drain(timeout) (SIGTERM; SIGINT and Stop() with 0): StopTakingWork(),
//      then at the deadline every task still running is cancelled and sent
//      as Release instead of a Result, and the waiting links are dropped;
//      Run() returns once every task ended and every Result/Release is
//      acknowledged, or stop_flush after the tasks ended (plus kill_grace for
//      the cancelled ones).
//
// Thread-safe: StopTakingWork(), Drain() and Stop() from any thread, any
// time (also before Run()). Internally: the Run() thread reads the stream,
// one timer thread, a pooled thread per running chain (a plain task is a chain of
// one: the thread runs each link in turn); writes to the stream are
// serialized by write_mu_. Time for intervals is CLOCK_MONOTONIC.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "agent/executor.h"
#include "agent/lease.h"
#include "common/worker_pool.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"

namespace taskgrid::agent {

struct AgentOptions {
  std::string scheduler = "127.0.0.1:7070";
  // How the channel to the scheduler is secured (common/tls.h
  // ChannelCredentials); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
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
  // exec.work_dir, the base of the per-attempt directories, when empty:
  // DefaultWorkDir(id).
};

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

  // For tests: tasks running now, chain links waiting for their
  // predecessor, Results/Releases awaiting their ack, and whether it takes no
  // more work.
  int running() const;
  int waiting() const;
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
  // Decides every entry under one hold of mu_, so that no task of the Assign
  // can end before the links that follow it are queued.
  void OnAssign(const v1::Assign& assign);
  // One entry: appends its Accept or Reject to `replies` (nothing for a
  // queued or dropped link) and its TaskRun to `starts` when it starts now.
  // `earlier`: the ids of the entries before it in this Assign, true for
  // those held here (running or waiting). Needs mu_.
  void AdmitLocked(const v1::Assignment& a, std::map<std::string, bool>* earlier,
                   std::vector<v1::AgentMessage>* replies,
                   std::vector<std::shared_ptr<TaskRun>>* starts);
  // Makes the TaskRun of `a` and enters it in running_ with its slots. The
  // caller counts the thread that runs it. Needs mu_.
  std::shared_ptr<TaskRun> StartLocked(v1::Assignment a);
  void OnCancel(const v1::Cancel& c);
  // Takes the interval and extends the lease (see 7 and 7a above).
  void OnHeartbeatAck(const v1::HeartbeatAck& ack);
  // Runs `run`, reports it, then each chain link that follows it. With a
  // `sink` (a run inline on the stream's reader, for instant tasks) its
  // messages are appended there for the caller to write, and a link that
  // is not instant moves to a pooled thread.
  void TaskThread(std::shared_ptr<TaskRun> run, std::vector<v1::AgentMessage>* sink = nullptr);
  // Heartbeats, self-fencing and the drain deadline, until Run() ends.
  void TimerLoop();
  // Writes on the current stream, in order after what other threads queued
  // before; dropped when there is no stream (unacknowledged results are
  // resent after the next Welcome). The thread that finds no write in
  // progress writes everything queued until nothing is left, as one
  // AgentBatch when the scheduler reads batches: results of tasks that end
  // while a write is in flight go together.
  // False when there was no stream to queue them on.
  bool Write(v1::AgentMessage msg);
  bool WriteAll(std::vector<v1::AgentMessage> msgs);
  void ResendUnacked();
  // Sets draining_; true when it was not set before. Needs mu_.
  bool StartDrainingLocked();
  // Cancels every running task not already stopped by the agent, as
  // `cause`, and drops every waiting link; returns how many tasks it
  // stopped. Needs mu_.
  int StopRunningLocked(StopCause cause, const std::string& note);
  // Drops the link waiting for `pred` and every link after it, silently;
  // returns their ids. Needs mu_.
  std::vector<std::string> DropChainLocked(std::string pred);
  // The waiting link with this task id, or waiting_.end(). Needs mu_.
  std::map<std::string, v1::Assignment>::iterator FindWaitingLocked(const std::string& task_id);
  // Running and waiting attempts, as listed in Hello and Heartbeat. Needs mu_.
  void ListHeldLocked(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const;
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
  // Guarded by mu_: Goodbye was sent (everything handed over); the stream
  // is cancelled at goodbye_deadline_ if the scheduler has not closed it.
  bool goodbye_sent_ = false;
  absl::Duration goodbye_deadline_ = absl::InfiniteDuration();
  absl::Duration exit_deadline_ = absl::InfiniteDuration();
  bool run_done_ = false;                   // guarded by mu_
  std::map<std::string, Running> running_;  // guarded by mu_; by task id
  // Guarded by mu_: chain links waiting for their predecessor, by the
  // predecessor's task id (run_after); at most one per predecessor.
  std::map<std::string, v1::Assignment> waiting_;
  std::map<Key, v1::AgentMessage> unacked_;               // guarded by mu_; Result or Release
  int threads_ = 0;                                       // guarded by mu_; live task threads
  int used_slots_ = 0;                                    // guarded by mu_
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // guarded by mu_
  int64_t welcome_max_output_bytes_ = 0;                  // guarded by mu_; 0: none
  // Guarded by mu_: when the running tasks must stop (self-fencing), from
  // the Welcome, heartbeats and their acks (monotonic times).
  Lease lease_{opts_.stop_on_lost_after};
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_; the live stream's

  // Held while writing on the stream; Session() takes it to change stream_.
  std::mutex write_mu_;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>* stream_ =
      nullptr;  // guarded by write_mu_
  // Taken inside write_mu_, never the other way round.
  std::mutex out_mu_;
  std::deque<v1::AgentMessage> out_;  // guarded by out_mu_; queued, not yet written
  bool writing_ = false;              // guarded by out_mu_; a thread drains out_
  bool batches_ = false;              // guarded by out_mu_; from this stream's Welcome
  bool connected_ = false;            // guarded by out_mu_; stream_ is set

  // Runs TaskThread; last, so its threads are joined before the rest goes.
  WorkerPool workers_;
};

}  // namespace taskgrid::agent
