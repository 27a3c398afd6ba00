// Agent: the worker side of AgentService.Connect.
//
// Lifecycle:
//   1. Run() connects and sends Hello (id, slots, labels, and the attempts
//      it holds from an earlier stream: running, or finished with the
//      result not yet acknowledged); on Welcome it resends those results.
//   2. For each Assign entry it sends Accept and starts a TaskRun on a
//      thread of its own (or Reject when it has no room).
//   3. A heartbeat thread writes Heartbeat every interval from Welcome.
//   4. A finished TaskRun's Result is sent and kept until ResultAck.
//   5. When the stream breaks it reconnects with exponential backoff and
//      jitter; running tasks keep running meanwhile.
//   6. Stop() (SIGINT/SIGTERM) cancels running tasks; Run() returns once
//      their results are acknowledged, or after kill_grace + stop_flush.
//
// Thread-safe: Stop() from any thread. Internally: the Run() thread reads
// the stream, one heartbeat thread, one thread per running task; writes to
// the stream are serialized by write_mu_.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
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
  // On Stop(), how long to wait for the scheduler to acknowledge the last
  // results before exiting.
  absl::Duration stop_flush = absl::Seconds(2);
};

class Agent {
 public:
  explicit Agent(AgentOptions opts);
  ~Agent();

  // Blocks until Stop(). Returns the number of streams it opened.
  int Run();
  void Stop();

  // For tests: tasks running now, and results awaiting their ack.
  int running() const;
  int unacked() const;

 private:
  using Key = std::pair<std::string, int32_t>;  // (task_id, attempt)
  struct Running {
    std::shared_ptr<TaskRun> run;
    int32_t slots = 1;
  };

  // One stream: Hello, then read until it breaks.
  void Session();
  void Handle(const v1::SchedulerMessage& msg);
  void OnAssign(const v1::Assignment& a);
  void OnCancel(const v1::Cancel& c);
  void TaskThread(std::shared_ptr<TaskRun> run);
  void HeartbeatLoop();
  // Writes on the current stream; false if there is none or it broke.
  bool Write(const v1::AgentMessage& msg);
  void ResendUnacked();
  // Stopping, and every task ended and its result acknowledged (or the
  // deadline passed). Needs mu_.
  bool StopCompleteLocked() const;

  const AgentOptions opts_;
  // Touched only by the Run() thread (Session and the Handle it calls).
  bool welcomed_ = false;
  absl::Time last_unreachable_log_ = absl::InfinitePast();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                                 // guarded by mu_
  absl::Time stop_deadline_;                              // guarded by mu_; set by Stop()
  bool run_done_ = false;                                 // guarded by mu_
  std::map<std::string, Running> running_;                // guarded by mu_; by task id
  std::map<Key, v1::Result> unacked_;                     // guarded by mu_
  int threads_ = 0;                                       // guarded by mu_; live task threads
  int used_slots_ = 0;                                    // guarded by mu_
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // guarded by mu_
  grpc::ClientContext* ctx_ = nullptr;                    // guarded by mu_; the live stream's

  std::mutex write_mu_;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>* stream_ =
      nullptr;  // guarded by write_mu_
};

}  // namespace taskgrid::agent
