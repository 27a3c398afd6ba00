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
//      When the scheduler refused it (UNAUTHENTICATED, PERMISSION_DENIED)
//      it waits far longer (refused_retry_min doubling to
//      refused_retry_max), logs the reason once, and makes its credentials
//      again from the files before each retry.
//      Given several scheduler addresses (a leader and its standbys), it
//      reconnects to the same one after a stream that was welcomed, to
//      the leader a standby named after its UNAVAILABLE answer, and to the
//      next address after any other failure; with more than one address,
//      one that does not finish connecting within 2 s (a frozen process)
//      counts as failed.
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
//  10. Restart(hold) (SIGTERM with --keep_steps): the steps run on without
//      the agent, and the next one takes them back (AgentCore::Restart,
//      TakeBackKept() at the start of Run()).
//
// Where each part lives: this class is the transport (the stream, its
// channel, reconnects with backoff, the timer thread); what the agent
// decides is AgentCore (agent/core.h), built from Slots (slots and chains,
// agent/slots.h), Lease (self-fencing, agent/lease.h), DrainPlan (agent/
// drain.h) and Outbox (the write queue and batches, agent/outbox.h).
//
// Thread-safe: StopTakingWork(), Drain() and Stop() from any thread, any
// time (also before Run()). Internally: the Run() thread reads the stream,
// one timer thread, a pooled thread per running chain (a plain task is a
// chain of one: the thread runs each link in turn); writes to the stream go
// through the Outbox. Time comes from AgentOptions::clock (CLOCK_MONOTONIC).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/core.h"
#include "common/address.h"
#include "common/connect_probe.h"

namespace taskgrid::agent {

// What AgentCore takes (id, slots, labels, exec, stop_flush,
// stop_on_lost_after, clock), and how to reach the scheduler.
struct AgentOptions : CoreOptions {
  // The scheduler, or the list of a leader and its standbys
  // ("a:7070,b:7070", see SchedulerAddresses): a standby's answer names
  // the leader, which is tried next; any other failure moves on to the
  // next address. Must parse (main() checks the flag).
  std::string scheduler = "127.0.0.1:7070";
  // How the channel to the scheduler is secured (common/tls.h
  // ChannelCredentials); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration reconnect_min = absl::Milliseconds(100);
  // Well inside the scheduler's reconnect grace (5 s by default), so a
  // restarted scheduler gets its agents back before it re-queues their work.
  absl::Duration reconnect_max = absl::Seconds(1);
  // After the scheduler refused the agent (UNAUTHENTICATED or
  // PERMISSION_DENIED: no token, an unknown one, a role or agent id it
  // lacks): waits from refused_retry_min, doubling up to refused_retry_max
  // (with jitter), since retrying at once cannot help until someone fixes
  // a file. One error line says what was refused, again only when the
  // reason changes.
  absl::Duration refused_retry_min = absl::Seconds(1);
  absl::Duration refused_retry_max = absl::Seconds(30);
  // What the agent presented, named in that error line, and the files a
  // failed connection is probed with (common/connect_probe.h): its
  // --token_file and TLS files ("" when none).
  std::string token_file;
  ProbeFiles tls_files;
  // Makes the credentials again (reading the token and certificate files
  // anew) before a retry after a refusal, so a fixed file applies without
  // a restart. Null: `credentials` stay. An error is logged, and the
  // credentials from before stay.
  std::function<absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>()> reload_credentials;
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
  void StopTakingWork() { core_.StopTakingWork(); }
  // StopTakingWork(), and Run() returns when the drain is complete: tasks
  // still running `timeout` from now are cancelled and released. A later call
  // may only shorten the deadline. Returns at once.
  void Drain(absl::Duration timeout) { core_.Drain(timeout); }
  // Exits keeping the running steps for an agent started with the same id
  // and work dir within `hold` (AgentCore::Restart); Drain(otherwise) when
  // the scheduler grants no hold. Returns at once.
  void Restart(absl::Duration hold, absl::Duration otherwise) { core_.Restart(hold, otherwise); }
  // Drain(0): releases every running task at once.
  void Stop() { Drain(absl::ZeroDuration()); }

  // For tests: tasks running now, chain links waiting for their
  // predecessor, Results/Releases awaiting their ack, and whether it takes no
  // more work.
  int running() const { return core_.running(); }
  int waiting() const { return core_.waiting(); }
  int unacked() const { return core_.unacked(); }
  bool draining() const { return core_.draining(); }

 private:
  // One stream: Hello, then read until it breaks.
  void Session();
  // Cancels the live stream, if any (the drain is complete).
  void EndStream();
  // After a stream to `target` that got no Welcome ended with `st`: tells
  // the core whether the scheduler looks like it is restarting (its host
  // refuses the connection) or not (agent/lease.h).
  void Classify(const std::string& target, const grpc::Status& st, bool standby);
  // Logs a refusal by the scheduler at `target` as one error line saying
  // what was refused and what to fix, unless it is the one logged last.
  void LogRefusal(const std::string& target, const grpc::Status& st, absl::Duration retry);
  absl::Duration Now() const { return clock_->Monotonic(); }

  const AgentOptions opts_;
  Clock* const clock_;
  // Touched only by the Run() thread.
  SchedulerAddresses addresses_;
  absl::Duration last_unreachable_log_ = -absl::InfiniteDuration();
  // The credentials in use: opts_.credentials, or the last reload's.
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  // The last stream's refusal (UNAUTHENTICATED, PERMISSION_DENIED before a
  // Welcome), else OK; and the refusal last logged ("" since a Welcome).
  grpc::Status refused_;
  std::string refused_by_;  // the address that refused
  std::string logged_refusal_;
  std::string logged_reload_error_;
  std::mutex ctx_mu_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by ctx_mu_; the live stream's
  // Last: its task threads are joined before the rest goes.
  AgentCore core_;
};

}  // namespace taskgrid::agent
