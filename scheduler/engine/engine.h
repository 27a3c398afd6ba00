// Engine: the thread-safe owner of the Scheduler. gRPC handlers and agent
// streams call it from any thread; it runs each call under one mutex, hands
// the resulting rows to the GroupCommitWriter, and only after the commit
// sends the resulting agent messages and answers the caller. A ticker thread
// drives the Scheduler's time-based work.
//
// gRPC-free: agents are reached through AgentChannel, so the Engine is tested
// with fake channels (and under ThreadSanitizer).
//
// Lifecycle: construct, Start() (recovery, then threads), calls, Stop().
// The Store and Clock are borrowed and must outlive the Engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/engine/output.h"
#include "scheduler/engine/waiters.h"
#include "scheduler/engine/watch.h"
#include "scheduler/store/group_commit.h"
#include "scheduler/store/store.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/schedule_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::engine {

// One agent stream as the Engine sees it. Implementations must not block
// and must not call back into the Engine.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  // Queues a message; dropped once the stream has ended.
  virtual void Send(v1::SchedulerMessage msg) = 0;
  // Ends the stream with an error (the agent went silent).
  virtual void Close(const absl::Status& why) = 0;
};

// What /metrics shows, taken at one moment (Engine::Metrics).
struct EngineMetrics {
  core::SchedulerMetrics scheduler;
  store::GroupCommitWriter::Stats writer;
  int64_t watches = 0;         // WatchTasks streams open
  int64_t output_follows = 0;  // StreamTaskOutput streams open
  int64_t task_waits = 0;      // WaitTask calls waiting
  int64_t work_waits = 0;      // WaitForWork calls waiting
};

struct EngineOptions {
  core::SchedulerOptions scheduler;
  // Live events a watcher may have queued before it is ended as too slow.
  // (Well above the events of one commit: a 10,000-task submit makes 20,000.)
  size_t watch_queue = 100'000;
  // Most WatchTasks streams and WaitTask calls open at once; past them a
  // new one is RESOURCE_EXHAUSTED, naming the flag.
  size_t max_watches = 10'000;
  size_t max_waits = 100'000;
  // StreamTaskOutput: most streams open at once (--max_output_follows)
  // and what each may hold (OutputRelay).
  OutputRelay::Options output;
  absl::Duration tick_interval = absl::Milliseconds(10);
  // A list page ends before it would pass this many bytes (a single larger
  // task or job comes alone), so it stays below gRPC's default 4 MiB
  // receive limit whatever the tasks hold.
  size_t max_page_bytes = 3 << 20;
  store::GroupCommitWriter::Options writer;
  // Check every invariant of the Scheduler after each operation and abort
  // on the first broken one. O(tasks) per operation: on in the engines that
  // tests build (builds without NDEBUG), off in taskgrid-scheduler unless
  // --check_invariants.
#ifdef NDEBUG
  bool check_invariants = false;
#else
  bool check_invariants = true;
#endif
};

class Engine {
 public:
  template <typename T>
  using Reply = std::function<void(absl::StatusOr<T>)>;

  Engine(store::Store* store, const Clock* clock, EngineOptions opts);
  ~Engine();  // Stop()s

  // Reads the store back into the Scheduler and starts the threads.
  absl::Status Start();
  // Stops the ticker and commits what is queued; later calls fail UNAVAILABLE.
  void Stop();
  // Runs once if a commit fails: memory is then ahead of disk and the
  // process must restart (main() exits). Set before Start().
  void set_on_fatal(std::function<void(const absl::Status&)> f) { on_fatal_ = std::move(f); }

  // --- TaskService. Each reply runs once, after the change is durable. ---
  void SubmitTasks(v1::SubmitTasksRequest req, Reply<v1::SubmitTasksResponse> done);
  void GetTask(const v1::GetTaskRequest& req, Reply<v1::Task> done);
  void ListTasks(const v1::ListTasksRequest& req, Reply<v1::ListTasksResponse> done);
  void CancelTask(const std::string& id, Reply<v1::Task> done);
  void RetryTask(const std::string& id, Reply<v1::Task> done);
  void ResetTask(const std::string& id, Reply<v1::Task> done);
  void PauseTask(const std::string& id, Reply<v1::Task> done);
  void ResumeTask(const std::string& id, Reply<v1::Task> done);
  void GetQueueStats(const v1::GetQueueStatsRequest& req, Reply<v1::GetQueueStatsResponse> done);
  void DeleteByMergeKey(const v1::DeleteByMergeKeyRequest& req, Reply<v1::Task> done);
  // Queue controls and bulk changes (queues.cc).
  void PauseQueue(const std::string& queue, bool paused, Reply<v1::QueueStats> done);
  void SetQueueLimits(const v1::SetQueueLimitsRequest& req, Reply<v1::QueueStats> done);
  void SetQueueWeight(const v1::SetQueueWeightRequest& req, Reply<v1::QueueStats> done);
  void CancelTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done);
  void RetryTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done);
  // Retention (cold.cc): deleting finished tasks and jobs, and how long a
  // queue keeps them.
  void DeleteTask(const std::string& id, Reply<v1::DeleteTaskResponse> done);
  void DeleteTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done);
  void SetQueueRetention(const v1::SetQueueRetentionRequest& req, Reply<v1::QueueStats> done);
  // Replies when the task is terminal, or with done=false after `max_wait`.
  // Returns the waiter's id, for CancelWait; 0 when it was answered at
  // once (done, an error, or no wait asked for).
  uint64_t WaitTask(const std::string& id, absl::Duration max_wait,
                    Reply<v1::WaitTaskResponse> done);
  // The caller went away: the waiter is dropped, and answered CANCELLED
  // unless a commit or its deadline answered it first.
  void CancelWait(uint64_t waiter);
  // WaitTask calls in progress.
  size_t waiting();
  // A WatchTasks subscription; `wake` as in Watch, but always called on
  // the Engine's wake thread (never on the thread that answers commits,
  // so a wake may read the store). StopWatch when the stream ends.
  absl::StatusOr<std::shared_ptr<Watch>> StartWatch(const v1::WatchTasksRequest& req,
                                                    std::function<void()> wake);
  void StopWatch(const std::shared_ptr<Watch>& watch);

  // --- StreamTaskOutput (follow.cc). ---
  // A follower of a task's output. `wake` is called (without the Engine's
  // locks, on a commit or agent stream thread; it must not block) when it
  // has something to send after NextOutput said nothing. Its first
  // messages come once the commits queued before it landed, so it never
  // shows a state that could vanish. StopOutput when the stream ends.
  absl::StatusOr<std::shared_ptr<OutputFollower>> StartOutput(
      const v1::StreamTaskOutputRequest& req, std::function<void()> wake);
  absl::StatusOr<OutputRelay::Batch> NextOutput(const std::shared_ptr<OutputFollower>& f,
                                                size_t max_bytes);
  void StopOutput(const std::shared_ptr<OutputFollower>& f);

  // --- BoardService (board.cc). Each reply runs once, after the change is
  // durable. ---
  void Claim(const v1::ClaimRequest& req, Reply<v1::ClaimResponse> done);
  void ExtendClaim(const v1::ExtendClaimRequest& req, Reply<v1::ExtendClaimResponse> done);
  void CompleteClaim(v1::CompleteClaimRequest req, Reply<v1::CompleteClaimResponse> done);
  void AbandonClaim(const v1::AbandonClaimRequest& req, Reply<v1::AbandonClaimResponse> done);
  void TrashClaim(const v1::TrashClaimRequest& req, Reply<v1::TrashClaimResponse> done);
  void RestoreTask(const std::string& id, Reply<v1::Task> done);
  // Replies when the queue has tasks these labels may claim (at once when
  // it has), or with ready=0 after `max_wait`. Returns the waiter's id for
  // CancelWorkWait, 0 when answered at once.
  uint64_t WaitForWork(const v1::WaitForWorkRequest& req, absl::Duration max_wait,
                       Reply<v1::WaitForWorkResponse> done);
  void CancelWorkWait(uint64_t waiter);
  // WaitForWork calls in progress.
  size_t waiting_for_work();

  // --- JobService. ---
  void SubmitJob(v1::SubmitJobRequest req, Reply<v1::Job> done);
  void GetJob(const std::string& id, Reply<v1::Job> done);
  void ListJobs(const v1::ListJobsRequest& req, Reply<v1::ListJobsResponse> done);
  void CancelJob(const std::string& id, Reply<v1::Job> done);
  void RetryJob(const std::string& id, Reply<v1::Job> done);
  void DeleteJob(const std::string& id, Reply<v1::DeleteJobResponse> done);

  // --- ScheduleService (schedules.cc). Each reply runs once, after the
  // change is durable; the fires commit with the ticker's Tick. ---
  void CreateSchedule(v1::CreateScheduleRequest req, Reply<v1::Schedule> done);
  void GetSchedule(const std::string& id, Reply<v1::Schedule> done);
  // In id order; the page token is the last id of the page before.
  void ListSchedules(const v1::ListSchedulesRequest& req, Reply<v1::ListSchedulesResponse> done);
  void PauseSchedule(const std::string& id, Reply<v1::Schedule> done);
  void ResumeSchedule(const std::string& id, Reply<v1::Schedule> done);
  void DeleteSchedule(const std::string& id, Reply<v1::Schedule> done);

  // --- ClusterService. ---
  void ListAgents(Reply<v1::ListAgentsResponse> done);
  void DrainAgent(const std::string& id, Reply<v1::Agent> done);
  void UndrainAgent(const std::string& id, Reply<v1::Agent> done);
  void GetClusterStats(Reply<v1::ClusterStats> done);

  // --- Metrics. ---
  // A snapshot of the Scheduler's counts and counters, the writer's stats
  // and the open watches and waits. Holds the mutex for O(queues +
  // agents), never O(tasks); answered at once, without waiting for a
  // commit (counters need not be durable).
  EngineMetrics Metrics();

  // --- Agent streams. ---
  // A new stream; returns its connection id.
  uint64_t AttachAgent(std::shared_ptr<AgentChannel> channel);
  // The first message. An error means the stream must end with it.
  absl::Status AgentHello(uint64_t conn, const v1::Hello& hello);
  void AgentMessage(uint64_t conn, const v1::AgentMessage& msg);
  // The stream ended.
  void DetachAgent(uint64_t conn);
  // The heartbeat interval adaptive agents are told now (it grows with the
  // fleet).
  absl::Duration heartbeat_interval();
  // The server is stopping: ends every agent stream with `why` (agents
  // reconnect to the next scheduler and keep their tasks within the grace)
  // and answers every WaitTask and WaitForWork in progress with it, so no
  // RPC is left open.
  void EndCalls(const absl::Status& why);

  // --- For tests and tools. ---
  // Blocks until everything queued so far is committed and delivered.
  void Sync();
  // Runs `f` on the Scheduler under the Engine's mutex (read-only use).
  void Inspect(const std::function<void(const core::Scheduler&)>& f);
  // Runs the Scheduler's time-based work now, as the ticker would.
  void TickNow();

 private:
  // Describes `records` into `out`, in order, until the next one would take
  // the page past opts_.max_page_bytes (the first always goes); when it
  // stops early, *next_after_seq becomes the seq of the last one taken.
  template <typename Record, typename Proto, typename DescribeFn>
  void TakeWithinBytes(const std::vector<const Record*>& records,
                       google::protobuf::RepeatedPtrField<Proto>* out, int64_t* next_after_seq,
                       const DescribeFn& describe) const;
  // Takes the Scheduler's effects (with mu_ held) and queues them; `after`
  // runs once they are committed and delivered.
  void CommitLocked(std::function<void(const absl::Status&)> after);
  // Aborts on a broken invariant when opts_.check_invariants; mu_ held.
  void CheckInvariantsLocked() const;
  // Answers `done` with `result` once everything queued so far (this
  // operation's rows) is committed; with the commit's error if it fails.
  template <typename T>
  void Answer(absl::StatusOr<T> result, Reply<T> done) {
    CommitLocked(
        [result = std::move(result), done = std::move(done)](const absl::Status& s) mutable {
          if (!s.ok()) {
            done(s);
          } else {
            done(std::move(result));
          }
        });
  }
  static absl::Status Stopped();
  void Deliver(std::vector<core::Outgoing>& messages, const std::vector<uint64_t>& closes);
  // Start's recovery, with mu_ held: reads the store back into sched_, a
  // chunk of rows at a time, on this thread and a reader thread (joined
  // before it returns).
  absl::Status Restore();
  void TickerLoop();
  // Offers committed events (through revision `last`) to every watch
  // (writer thread, commit order).
  void Publish(const std::vector<core::EventRow>& events, int64_t last);
  void TaskOp(absl::StatusOr<const core::TaskRecord*> (core::Scheduler::*op)(const std::string&),
              const std::string& id, Reply<v1::Task> done);

  // --- Finished tasks on disk (cold.cc). ---
  // Runs `op` with mu_ held once the tasks on disk that `needs` (called
  // with mu_ held) names are back in memory, with what they need
  // (Scheduler::ColdNeeds, Warm). The store is read without mu_; a few
  // rounds at most (each task read back may need more), then `op` runs
  // anyway and meets what is still on disk as UNAVAILABLE.
  void WithWarm(const std::function<std::vector<int64_t>()>& needs,
                const std::function<void()>& op);
  // WithWarm for an operation on one task.
  void WithTask(const std::string& task_id, const std::function<void()>& op) {
    WithWarm([&] { return sched_.ColdSeqsOfIds({task_id}); }, op);
  }
  // The API view of tasks on disk, read back from the store (and their
  // replicas with them), one per seq asked, empty for one deleted
  // meanwhile. Without mu_ held (it is taken to describe them).
  absl::StatusOr<std::vector<std::optional<v1::Task>>> DescribeStored(
      const std::vector<int64_t>& seqs);
  static absl::Status NotFound(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  }
  // The ticker's share: finished tasks whose last change is committed go
  // to disk, and what a schedule's fire waits for comes back (mu_ held;
  // returns what to read back, for WithWarm once mu_ is let go).
  std::vector<int64_t> ColdWorkLocked();
  // After kTrimAfterEvictions records went to disk, the ticker hands the
  // memory they held back to the system (malloc_trim, outside mu_): the
  // allocator would otherwise keep a burst's peak for good.
  static constexpr size_t kTrimAfterEvictions = 50'000;
  bool TrimDueLocked();
  static void TrimMemory();
  size_t evicted_since_trim_ = 0;  // guarded by mu_
  // Answers `done` with the task an operation returned (or its error), once
  // what the operation changed is committed. Holds mu_.
  void AnswerTask(absl::StatusOr<const core::TaskRecord*> t, Reply<v1::Task> done);
  // As AnswerTask, for a schedule.
  void AnswerSchedule(absl::StatusOr<const core::ScheduleRecord*> s, Reply<v1::Schedule> done);
  void JobOp(absl::StatusOr<const core::JobRecord*> (core::Scheduler::*op)(const std::string&),
             const std::string& id, Reply<v1::Job> done);
  void AgentOp(absl::StatusOr<const core::AgentRecord*> (core::Scheduler::*op)(const std::string&),
               const std::string& id, Reply<v1::Agent> done);
  void BulkOp(absl::StatusOr<core::BulkResult> (core::Scheduler::*op)(core::ListFilter),
              const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done);
  // Answers the pull workers waiting on a controlled queue that may claim
  // something now (mu_ held; every tick), and those of one queue.
  void WakeControlledLocked();
  void WakeQueueLocked(const std::string& queue);

  const Clock* const clock_;
  const EngineOptions opts_;
  store::Store* const store_;
  std::function<void(const absl::Status&)> on_fatal_;

  std::mutex mu_;
  core::Scheduler sched_;  // guarded by mu_
  store::GroupCommitWriter writer_;
  bool started_ = false;    // guarded by mu_
  bool stopped_ = false;    // guarded by mu_
  uint64_t next_conn_ = 1;  // guarded by mu_
  std::once_flag fatal_once_;

  std::mutex channels_mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<AgentChannel>>
      channels_;  // guarded by channels_mu_

  TaskWaiters waiters_;  // guarded by mu_
  // WaitForWork calls, by queue, with the worker's labels.
  using WorkWaiters =
      Waiters<v1::WaitForWorkResponse, google::protobuf::Map<std::string, std::string>>;
  WorkWaiters work_waiters_;  // guarded by mu_
  // The work waiters that a commit's events let claim something now,
  // answered with how much (mu_ held).
  std::vector<std::pair<Reply<v1::WaitForWorkResponse>, v1::WaitForWorkResponse>> WorkArrivedLocked(
      const std::vector<core::EventRow>& events);

  // Live output (follow.cc). followed_ counts the followers of each task
  // from StartOutput to StopOutput, so every commit that changes a
  // followed task (CommitLocked), and a reconnect or disconnect of its
  // agent, queues the task's state in output_updates_; the commit's
  // callback hands them to the relay in commit order, before its agent
  // messages go out.
  OutputRelay output_;
  absl::flat_hash_map<std::string, int> followed_;  // guarded by mu_
  std::vector<OutputTaskState> output_updates_;     // guarded by mu_
  // The task as a follower sees it (mu_ held); `last`: with the last
  // result, as a finished task's attach needs.
  OutputTaskState OutputStateLocked(const core::TaskRecord& t, bool last) const;
  // Queues the states of the followed tasks among `events`, with the
  // attempts the events ended (mu_ held).
  void OutputEventsLocked(const std::vector<core::EventRow>& events);
  // The followed tasks whose live attempt the agent on `conn` holds, and
  // queueing their states (the agent's stream came or went; mu_ held).
  std::vector<std::string> FollowedOnConnLocked(uint64_t conn) const;
  void QueueOutputStatesLocked(const std::vector<std::string>& ids);
  // Applies `updates` to the relay and sends what it asks of agents.
  void UpdateOutput(std::vector<OutputTaskState>& updates);
  void SendOutputControl(std::vector<core::Outgoing> msgs);

  std::mutex watches_mu_;
  std::set<std::shared_ptr<Watch>> watches_;  // guarded by watches_mu_
  std::atomic<int> watch_count_{0};
  std::atomic<int64_t> published_revision_{0};

  // Watch wakes run here, one at a time, off the commit thread and off
  // watches_mu_. At most one wake per watch is queued (a Watch wakes only
  // once it went idle), so the queue is bounded by max_watches.
  void PostWake(std::function<void()> wake);
  void WakeLoop();
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  std::deque<std::function<void()>> wakes_;  // guarded by wake_mu_
  bool wake_stop_ = false;                   // guarded by wake_mu_
  std::thread waker_;

  std::mutex ticker_mu_;
  std::condition_variable ticker_cv_;
  bool ticker_stop_ = false;  // guarded by ticker_mu_
  std::thread ticker_;
};

}  // namespace taskgrid::engine
