// Scheduler: the state of every task and agent, and every decision about
// them. Pure logic: no gRPC, no SQLite, no threads; time from a Clock.
//
// The orchestrator of the core's components (the map is at the top of
// docs/architecture.md): TaskTable (records and the one door), AgentRegistry,
// QueueControls, ReadyQueues (placement: the ready classes, where each
// waits, what each queue holds, Dispatch's loop), Gangs (gang placement
// and its reservations), ColdStore (finished tasks on disk, retention),
// TaskKeys (merge and
// unique keys), ScheduleBook (periodic tasks), ClaimBoard (pull mode's
// index and claims) and DeadlineTables, each owning its state; it routes
// every operation to them and runs the invariant checker over all of them.
//
// Every operation mutates memory at once and records what must follow in
// Effects: the rows to commit (one transaction) and the messages to send to
// agents. The caller (service/Engine) commits the rows and only then sends
// the messages and answers its client, so nothing leaves the process before
// it is durable (invariant 1 in docs/architecture.md). Should a commit fail, memory is
// ahead of disk and the process must stop; restart recovers from disk.
//
// Every state change goes through Transition(), which checks the table of
// state_machine.h and writes the task row and an event row (invariant 2).
// Agent messages about a task are acted on only when (task_id, attempt,
// agent) is the live attempt (invariant 3).
//
// Not thread-safe: one owner (the Engine, under its mutex). The Clock is
// borrowed and must outlive the Scheduler.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "scheduler/core/agent_registry.h"
#include "scheduler/core/claim_board.h"
#include "scheduler/core/cold_store.h"
#include "scheduler/core/deadline_table.h"
#include "scheduler/core/dependency_graph.h"
#include "scheduler/core/effects.h"
#include "scheduler/core/gangs.h"
#include "scheduler/core/metrics.h"
#include "scheduler/core/model.h"
#include "scheduler/core/options.h"
#include "scheduler/core/placement.h"
#include "scheduler/core/queue_controls.h"
#include "scheduler/core/ready_queues.h"
#include "scheduler/core/replica_rules.h"
#include "scheduler/core/schedule_book.h"
#include "scheduler/core/task_keys.h"
#include "scheduler/core/task_table.h"
#include "scheduler/core/validate.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/cluster_service.pb.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/schedule_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::core {

struct ListFilter {
  std::string queue;                  // empty: all
  std::string job_id;                 // empty: all
  std::vector<v1::TaskState> states;  // empty: all
  std::string id_prefix;              // empty: all
  // Only tasks carrying every one of these (TaskSpec.labels); empty: all.
  std::vector<std::pair<std::string, std::string>> labels;
  int page_size = 100;
  // From the page token: the seq of the previous page's last task (0: the
  // first page). The page starts after it, or before it newest first.
  int64_t after_seq = 0;
  bool newest_first = false;
};

struct ListPage {
  // In submit order (or its reverse). A task kept on disk only is a nullptr in `tasks`: the
  // caller reads it back by its seq (seqs[i] is the seq of entry i).
  std::vector<const TaskRecord*> tasks;
  std::vector<int64_t> seqs;
  int64_t next_after_seq = 0;  // 0: no more
  int64_t total = 0;           // matches on every page together
};

// What a bulk change (CancelTasks, RetryTasks) did.
struct BulkResult {
  std::vector<std::string> ids;  // changed, in submit order
  int64_t next_after_seq = 0;    // 0: every match was looked at
  int64_t skipped = 0;
  std::string skipped_reason;  // the first one's
};

struct JobListFilter {
  std::vector<v1::JobState> states;  // empty: all
  int page_size = 100;
  int64_t after_seq = 0;  // from the page token
};

struct JobListPage {
  std::vector<const JobRecord*> jobs;
  int64_t next_after_seq = 0;  // 0: no more
};

class Scheduler {
 public:
  Scheduler(const Clock* clock, SchedulerOptions opts);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return opts_; }

  // Start-up: takes the tasks read back from the store. Ready tasks go to
  // the ready queues, scheduled ones to the timer; in-flight ones stay with
  // their agents, each agent getting a fresh reconnect grace window.
  // `oldest_revision`, `last_revision`: the event history the store keeps.
  //
  // In three calls, so a large table goes in chunk by chunk as it is read:
  // BeginRestore (`expected_tasks` sizes the indexes), RestoreTasks for
  // each chunk (records in submit order, with their finished attempts;
  // derived fields are rebuilt), then FinishRestore, which links
  // dependencies and chains and hands in-flight tasks to their agents.
  // After an error the scheduler must be thrown away.
  absl::Status BeginRestore(size_t expected_tasks, int64_t last_revision = 0,
                            int64_t oldest_revision = 1);
  absl::Status RestoreTasks(std::vector<std::unique_ptr<TaskRecord>>* tasks);
  absl::Status FinishRestore();
  // All three at once.
  absl::Status Restore(std::vector<TaskRecord> tasks, int64_t last_revision = 0,
                       int64_t oldest_revision = 1);

  // --- Client operations. On error nothing changed. ---

  // All or nothing; returns the tasks in request order (existing ones for an
  // identical resubmit). The specs may not name a job (SubmitJob does).
  absl::StatusOr<std::vector<const TaskRecord*>> Submit(std::vector<v1::TaskSpec> specs);
  // A job: all its tasks or nothing; the existing job for an identical
  // resubmit. An empty `job_id` is generated.
  absl::StatusOr<const JobRecord*> SubmitJob(std::string job_id, std::vector<v1::TaskSpec> specs);
  // Cancels every non-terminal task of the job.
  absl::StatusOr<const JobRecord*> CancelJob(const std::string& id);
  // Re-queues the FAILED tasks and the ones CANCELLED because of them.
  absl::StatusOr<const JobRecord*> RetryJob(const std::string& id);
  absl::StatusOr<const TaskRecord*> Cancel(const std::string& id);
  absl::StatusOr<const TaskRecord*> Retry(const std::string& id);
  absl::StatusOr<const TaskRecord*> Reset(const std::string& id);
  // A task an agent holds is interrupted (the agent kills it) and ends
  // PAUSED; the interrupted attempt does not count against max_attempts.
  absl::StatusOr<const TaskRecord*> Pause(const std::string& id);
  absl::StatusOr<const TaskRecord*> Resume(const std::string& id);

  // --- Pull mode: a job board (board.cc). Requests are checked here too;
  // on error nothing changed. A claim is the task's live attempt, held by
  // `owner` instead of an agent; its attempt number fences every later
  // call (ABORTED when it is no longer the live attempt). ---

  // Takes up to req.max() ready tasks of the queue that `req.labels()`
  // allow (never tasks pinned to agent ids), best first; each becomes
  // RUNNING. Returns what each holder needs to run them.
  absl::StatusOr<std::vector<v1::ClaimedTask>> Claim(const v1::ClaimRequest& req);
  // The claim's new end (now + lease; zero lease: the default).
  absl::StatusOr<absl::Time> ExtendClaim(const v1::ClaimRef& ref,
                                         const google::protobuf::Duration& lease);
  // Ends the claim with the worker's result, as an agent's Result does.
  absl::StatusOr<const TaskRecord*> CompleteClaim(const v1::ClaimRef& ref, v1::TaskResult result);
  // Back to the board at once, not counted.
  absl::StatusOr<const TaskRecord*> AbandonClaim(const v1::ClaimRef& ref,
                                                 const std::string& reason);
  // Ends the attempt and puts the task aside: TRASHED.
  absl::StatusOr<const TaskRecord*> TrashClaim(const v1::ClaimRef& ref, const std::string& reason);
  // A TRASHED task back on the board.
  absl::StatusOr<const TaskRecord*> RestoreTask(const std::string& id);
  // Ready tasks of `queue` a Claim with these labels would take now.
  int64_t ClaimableCount(const std::string& queue,
                         const google::protobuf::Map<std::string, std::string>& labels) const;

  // --- Delivery by merge key (TaskKeys). Submit joins a task of the same
  // queue and merge key that was never dispatched; this cancels that task
  // (NOT_FOUND when there is none). ---
  absl::StatusOr<const TaskRecord*> DeleteByMergeKey(const std::string& queue,
                                                     const std::string& merge_key);

  // --- Queue controls (queues.cc). Each change is in the rows it commits.
  // A queue needs no tasks to be told something. ---

  // Stops (or lets again) the queue's tasks being handed to agents and
  // pull workers; submits still go in, what runs goes on.
  absl::StatusOr<v1::QueueStats> PauseQueue(const std::string& queue, bool paused);
  // The queue's concurrency and rate limits, as the request gives them.
  absl::StatusOr<v1::QueueStats> SetQueueLimits(const v1::SetQueueLimitsRequest& req);
  absl::StatusOr<v1::QueueStats> SetQueueWeight(const v1::SetQueueWeightRequest& req);
  // Cancels or retries the tasks `filter` selects (filter.states empty:
  // every state the change applies to), at most filter.page_size of them.
  absl::StatusOr<BulkResult> CancelTasks(ListFilter filter);
  absl::StatusOr<BulkResult> RetryTasks(ListFilter filter);
  // Start-up, after BeginRestore: the settings the store keeps.
  absl::Status RestoreQueues(const std::vector<QueueRow>& rows);
  // What the queue is told; nullptr for the defaults.
  const v1::QueueSettings* QueueSettingsOf(const std::string& queue) const {
    return queue_controls_.Find(queue);
  }
  // The queues told something other than the defaults, by name.
  std::vector<std::string> ControlledQueues() const;

  // --- Periodic tasks (ScheduleBook). Tick fires the schedules that are
  // due, each fire through Submit with an id derived from the schedule and
  // the fire time (FireTaskId), the task and the schedule's row in one
  // batch. On error nothing changed. ---

  // INVALID_ARGUMENT naming the field; the existing schedule for the same
  // definition again; ALREADY_EXISTS for another one under its id.
  absl::StatusOr<const ScheduleRecord*> CreateSchedule(v1::Schedule def);
  // nullptr when unknown.
  const ScheduleRecord* FindSchedule(const std::string& id) const { return schedules_.Find(id); }
  absl::StatusOr<const ScheduleRecord*> PauseSchedule(const std::string& id);
  // Fires again from the next fire time after now.
  absl::StatusOr<const ScheduleRecord*> ResumeSchedule(const std::string& id);
  // Returns the schedule as it was.
  absl::StatusOr<ScheduleRecord> DeleteSchedule(const std::string& id);
  // Up to `limit` schedules with ids after `after_id`, in id order.
  std::vector<const ScheduleRecord*> ListSchedules(const std::string& after_id, int limit) const {
    return schedules_.List(after_id, limit);
  }
  void DescribeSchedule(const ScheduleRecord& s, v1::Schedule* out) const {
    ScheduleBook::Describe(s, out);
  }
  // Start-up, after FinishRestore: the stored schedules. One whose fire
  // time passed while the scheduler was down is left to its misfire
  // policy at the next Tick.
  absl::Status RestoreSchedules(std::vector<ScheduleRow> rows);
  size_t schedule_count() const { return schedules_.size(); }

  // --- Finished tasks on disk (cold.cc). A finished task leaves memory
  // (Evict) and lives on in the store; what the indexes need of it stays
  // (TaskTable's ColdTask). Reads describe its stored row; an operation
  // that may change it has it read back first (Warm): the Engine asks
  // ColdSeqs* what an operation needs, reads those rows, and Warms them,
  // so the operations below never meet a task on disk. ---

  // Moves out of memory the finished tasks whose last change is committed
  // (revision <= `committed`), that finished at least finished_in_memory
  // ago, and that nothing in memory needs (no dependent in memory; a job,
  // and a task with its replicas, go as a whole once all of it finished).
  // At most max_evictions_per_call; returns how many went.
  size_t Evict(int64_t committed);
  // Tasks on disk that time-driven work (a schedule's fire) waits for:
  // the Engine reads them back and Warms them.
  std::vector<int64_t> TakeWarmWanted() { return cold_.TakeWanted(); }
  // The task on disk under `id`, or nullptr.
  const ColdTask* FindCold(const std::string& id) const { return table_.FindCold(id); }
  size_t cold_task_count() const { return table_.cold_size(); }
  // Seqs of the tasks on disk an operation naming these needs in memory:
  // the tasks themselves; for specs, also their dependencies, their ids
  // and their unique keys' holders; for a job, its tasks.
  std::vector<int64_t> ColdSeqsOfIds(const std::vector<std::string>& ids) const;
  std::vector<int64_t> ColdSeqsOfSpecs(
      const google::protobuf::RepeatedPtrField<v1::TaskSpec>& specs) const;
  std::vector<int64_t> ColdSeqsOfJob(const std::string& job_id) const;
  // The tasks on disk a RetryTasks with `filter` would change.
  std::vector<int64_t> ColdSeqsOfBulkRetry(ListFilter filter) const;
  // What tasks read back from the store need in memory with them (so that
  // a task in memory always has its dependencies, its job and its replicas
  // in memory): the seqs on disk not among `records`.
  std::vector<int64_t> ColdNeeds(const std::vector<std::unique_ptr<TaskRecord>>& records) const;
  // Takes back into memory tasks read back from the store (and empties
  // `records`). All or nothing: when a record is not its task as it is on
  // disk now, or ColdNeeds(*records) is not empty, nothing changes and
  // those seqs are returned (to read, again or too). A record whose task
  // is no longer on disk (deleted, or back in memory) is dropped.
  std::vector<int64_t> Warm(std::vector<std::unique_ptr<TaskRecord>>* records);
  // Deletes a finished task for good, with its replicas; returns their ids.
  absl::StatusOr<std::vector<std::string>> DeleteTask(const std::string& id);
  // Deletes a finished job with its tasks; returns how many tasks went.
  absl::StatusOr<int64_t> DeleteJob(const std::string& id);
  // Deletes (as DeleteTask, or DeleteJob with filter.job_id) what `filter`
  // selects (filter.states empty: every finished state).
  absl::StatusOr<BulkResult> DeleteTasks(ListFilter filter);
  // How long the queue's finished tasks are kept: SUCCEEDED and CANCELLED
  // ones, and (failed) FAILED and TRASHED ones. Zero: kept.
  absl::Duration RetentionOf(const std::string& queue, bool failed) const;
  absl::StatusOr<v1::QueueStats> SetQueueRetention(const v1::SetQueueRetentionRequest& req);
  // Start-up, between BeginRestore and FinishRestore: finished tasks read
  // back light (TaskRow::light), kept on disk only.
  absl::Status RestoreCold(absl::Span<const TaskRow> rows);
  // Start-up, after RestoreTasks: the seqs of tasks on disk that the tasks
  // restored since the last call need in memory (read them back and hand
  // them to RestoreTasks too, until this is empty).
  std::vector<int64_t> RestoreNeeds();

  // nullptr when unknown (or on disk only).
  const TaskRecord* Find(const std::string& id) const;
  // The API view of a task, with effective values filled in. `agents`:
  // Agents(), when the caller describes many tasks at once.
  void Describe(const TaskRecord& t, v1::Task* out,
                const std::vector<const AgentRecord*>* agents = nullptr) const;
  ListPage List(const ListFilter& filter) const;
  const JobRecord* FindJob(const std::string& id) const;
  void DescribeJob(const JobRecord& j, v1::Job* out) const;
  static v1::JobState JobStateOf(const JobRecord& j) { return core::JobStateOf(j); }
  JobListPage ListJobs(const JobListFilter& filter) const;
  // Every queue that holds tasks, has a configured limit or is told
  // something (PauseQueue, SetQueueLimits); one when named.
  std::vector<v1::QueueStats> Stats(const std::string& queue) const;

  // --- Agents. `conn` identifies one stream; never reused. ---

  // Hello on a new stream. Error: the hello is invalid (nothing changed).
  absl::Status Connect(uint64_t conn, const v1::Hello& hello);
  // The stream ended. The agent keeps its tasks for the reconnect grace.
  void Disconnect(uint64_t conn);
  // Heartbeat, Accept, Reject, Result, Draining, Release or TaskOutput on
  // a stream that said Hello, or a batch of them (handled in order, then
  // one Dispatch). Live output changes no task: the TaskOutputs from the
  // agent holding their live attempt (that said Hello.live_output) are
  // appended to `output` when given, their data cut to
  // kMaxOutputChunkBytes; any other is dropped and counted as stale.
  void OnAgentMessage(uint64_t conn, const v1::AgentMessage& msg,
                      std::vector<v1::TaskOutput>* output = nullptr);
  // Gives the agent no more work and tells it so.
  absl::StatusOr<const AgentRecord*> Drain(const std::string& agent_id);
  // Gives a draining agent work again and tells it so. FAILED_PRECONDITION
  // for an agent that drains to stop, or that cannot be told.
  absl::StatusOr<const AgentRecord*> Undrain(const std::string& agent_id);
  std::vector<const AgentRecord*> Agents() const;
  // The interval adaptive agents are told now: heartbeat_interval times
  // the factor that keeps the connected agents within
  // max_heartbeats_per_second.
  absl::Duration heartbeat_interval() const {
    return opts_.heartbeat_interval * agents_.heartbeat_factor();
  }
  void DescribeAgent(const AgentRecord& a, v1::Agent* out) const;
  v1::ClusterStats ClusterStats() const;
  // What /metrics shows: Stats(""), ClusterStats(), the age of each
  // queue's oldest PENDING task and the counters since start-up.
  // O(queues + agents).
  SchedulerMetrics Metrics() const;
  // Fills qs->history: what qs->queue() did minute by minute over the last
  // hour (QueueHistory, sampled by Tick).
  void AddHistory(v1::QueueStats* qs) const;

  // Time-driven work: scheduled tasks whose time came, expired deadlines,
  // agents silent or lost past their grace, schedules due to fire. Call it often (the Engine does
  // every few milliseconds; tests after FakeClock::Advance).
  void Tick();

  // What the operations since the last call require.
  Effects TakeEffects();
  // What TakeEffects would return now.
  const Effects& pending_effects() const { return effects_; }

  // --- Introspection. ---
  const AgentRecord* FindAgent(const std::string& id) const;
  int64_t stale_messages() const { return stale_messages_; }
  // Finished tasks deleted for good since start-up (retention and deletes).
  int64_t tasks_deleted() const { return cold_.tasks_deleted(); }
  int64_t last_revision() const { return table_.last_revision(); }
  // The oldest event revision still kept (history before it was pruned).
  int64_t oldest_revision() const { return table_.oldest_revision(); }
  size_t task_count() const { return table_.size(); }
  // Placement classes holding PENDING tasks.
  size_t ready_classes() const { return ready_.classes(); }
  // Placement class names the records share (SetClass), swept ones aside.
  size_t class_names() const { return ready_.class_names(); }
  // Of those, the ones set aside because no connected agent could ever
  // take them (an agent that can connects, and they are looked at again).
  size_t parked_classes() const { return ready_.parked(); }
  // Times Dispatch has looked for an agent for the head of a class: what
  // dispatching costs, whatever the clock says.
  int64_t placement_attempts() const { return ready_.placement_attempts(); }
  // Agents looked at by those attempts (the candidates each was given).
  int64_t agents_examined() const { return ready_.agents_examined(); }
  // Checks the cross-structure invariants (each in-flight task held by a
  // known agent, queues hold exactly their states, slot and state counts).
  absl::Status CheckInvariants() const;

 private:
  static constexpr int kNumStates = kNumTaskStates;

  // While alive, dependents are not settled as tasks change (a batch of
  // changes is made first); the last one to end settles them.
  class DeferSettling {
   public:
    explicit DeferSettling(Scheduler* s) : s_(s) { ++s_->defer_settling_; }
    ~DeferSettling() {
      if (--s_->defer_settling_ == 0) s_->SettleDependents();
    }

   private:
    Scheduler* s_;
  };

  absl::Time Now() const;
  absl::Duration Mono() const { return clock_->Monotonic(); }

  // The one door for state changes.
  // `event_agent`: the agent the event names when the task no longer has
  // one (the attempt that just ended).
  void Transition(TaskRecord& t, v1::TaskState to, std::string reason,
                  const std::string* event_agent = nullptr);
  // PENDING or SCHEDULED, depending on next_run_time.
  v1::TaskState ReadyOrScheduled(TaskRecord& t);
  // Where a task waits when it is not in flight: BLOCKED until its
  // dependencies allow it to run, then as ReadyOrScheduled.
  v1::TaskState NextWaitingState(TaskRecord& t);

  // --- Dependencies. ---
  // Runs the queue of tasks whose dependencies changed: BLOCKED ones are
  // released or cancelled, ready ones whose dependency was reset are
  // blocked again. Iterative (a 100,000-task chain cancels in one loop).
  void SettleDependents();
  void Settle(TaskRecord& t);
  // Shared by Submit and SubmitJob.
  absl::StatusOr<std::vector<const TaskRecord*>> AddTasks(std::vector<v1::TaskSpec> specs,
                                                          const std::string* job_id);
  // Links a new task to its dependencies (which exist by now).
  void LinkDependencies(TaskRecord& t);
  // Cancels one task (CancelTask, CancelJob). Needs it non-terminal.
  void CancelOne(TaskRecord& t, const std::string& reason);
  // Fills `as` for dispatching `t`, all but the attempt (inputs from its
  // dependencies, except a run_after predecessor). False when the inputs are
  // over the limit.
  bool FillAssignment(const TaskRecord& t, const TaskRecord* run_after, v1::Assignment* as,
                      int64_t* input_bytes) const;

  // Hands ready tasks to agents (ReadyQueues::Dispatch, with a DispatchRun
  // as its host) and sends the Assigns.
  void Dispatch();
  // One Dispatch's side of the ready queues' loop: starts tasks into the
  // run's Assigns (dispatch.cc).
  class DispatchRun;
  // Per agent, the Assign messages one Dispatch sends (with their sizes).
  using Assigns = absl::flat_hash_map<AgentRecord*, std::vector<std::pair<v1::Assign, size_t>>>;
  // Dispatches PENDING `t` (and the chain below it) to `a`, into `assigns`.
  void StartOn(TaskRecord& t, const Resources& need, AgentRecord& a, absl::Duration mono,
               absl::Time now, Assigns* assigns);
  // Drops an agent that holds nothing (after its Goodbye): it ends its
  // stream and leaves the agent list at once.
  void ForgetAgent(AgentRecord& a);

  // --- Queue controls (queues.cc). ---
  // Whether a task of `queue` may start now.
  QueueControls::Gate GateOf(const std::string& queue) const;
  // Tasks of the queue DISPATCHED or RUNNING.
  int64_t InFlight(const std::string& queue) const;
  // Stores the queue's settings and applies them.
  v1::QueueStats ApplyQueueSettings(const std::string& queue, const v1::QueueSettings& s);
  // The ready-queue doors, shared by Transition and restore: the ready
  // queues and the claim board.
  void AddReady(TaskRecord& t);
  void RemoveReady(const TaskRecord& t);
  // Ends the live attempt with `result` and moves the task on (retry, done,
  // paused, re-queued). `interrupted`: ended by a pause or a drain, so it
  // does not count against max_attempts.
  // A chain link that never started is always interrupted; when `t` ends
  // without success, the links waiting behind it end too (interrupted), and
  // when it succeeds, the next link takes its slot.
  // An interrupted task comes back after `requeue_after` (at once if zero).
  // A live attempt's stop_request decides how it ends unless it succeeded.
  void FinishAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted = false,
                     absl::Duration requeue_after = absl::ZeroDuration());
  // FinishAttempt's first step: what `t.stop_request` makes of the end the
  // agent (or the loss of the agent) gave.
  void ApplyStopRequest(const TaskRecord& t, v1::TaskResult* result, bool* interrupted) const;
  // Asks the agent holding `t` to stop its live attempt for `why`, which
  // then stays held until the agent says its steps are gone (a stronger
  // request replaces a weaker one).
  void RequestStop(TaskRecord& t, StopRequest why);
  // The agent `agent_id` is known and reports its stops (Hello.reports_stops).
  bool ReportsStops(const std::string& agent_id) const;
  // Heartbeat.running of an agent that reports its stops: an accepted
  // attempt two heartbeats in a row leave out is ended; a running one
  // listed that is not live here is cancelled.
  void ReconcileHeld(AgentRecord& a,
                     const google::protobuf::RepeatedPtrField<v1::AttemptRef>& listed);
  // FinishAttempt's bookkeeping for one task. `holds_slot`: false for a
  // chain link that never started.
  void EndAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted, bool holds_slot,
                  absl::Duration requeue_after = absl::ZeroDuration());
  // EndAttempt's first half: the holder (agent or claim) lets go, and the
  // attempt goes into the history. What comes next is the caller's.
  struct Closed {
    std::string holder;  // the agent, or the claim's owner
    bool claimed = false;
    bool pausing = false;
    bool interrupted = false;
  };
  Closed CloseAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted, bool holds_slot);

  // --- One task on N workers (replicas.cc). ---
  // Makes the replicas of `t` (new, with replicas in its spec), appending
  // them to `created`.
  void MakeReplicas(TaskRecord& t, absl::Time now, std::vector<TaskRecord*>* created);
  // A BLOCKED task with replicas: SUCCEEDED once its policy is met, FAILED
  // once it cannot be; the replicas still running are then cancelled.
  void SettleReplicas(TaskRecord& t);
  // Why a task with replicas is BLOCKED.
  std::string ReplicasReason(const TaskRecord& t) const;
  // FAILED_PRECONDITION unless every replica `RestartReplicas` would run
  // again has stopped; RESOURCE_EXHAUSTED when the queue has no room.
  absl::Status CheckRestartReplicas(const TaskRecord& t, bool all, absl::string_view what) const;
  // Runs again, each with a fresh budget, the replicas of `t` that did not
  // succeed (all of them when `all`).
  void RestartReplicas(TaskRecord& t, bool all, const std::string& why);
  // A finished task is made like new for a reset: a fresh budget of
  // attempts, no history, no result (the attempt counter keeps rising).
  void ClearForRerun(TaskRecord& t);

  // `member` is to run again: every sibling in flight stops (its agent
  // kills it), to wait again uncounted, so the gang starts again whole.
  void StopGang(TaskRecord& group, const TaskRecord& member);

  // --- Periodic tasks. ---
  // Fires the due schedules (ScheduleBook::FireDue), each through Submit.
  void FireSchedules(absl::Time now);

  // --- Pull mode (board.cc). ---
  // A result as it may be stored: tails and error cut to max_output_bytes
  // (counting what went), an output past max_task_output_bytes fails the
  // attempt, and an outcome the holder may not give is FAILED.
  void BoundResult(v1::TaskResult* r) const;
  // The attempt ended with `sent`, a result from `holder`, taken (a resent
  // result whose answer was lost is then no error), rather than ended
  // another way (the scheduler's own timeout, a lost agent) before it came.
  bool Committed(const std::string& task_id, int32_t attempt, const std::string& holder,
                 const v1::TaskResult& sent) const;
  // The live claim `ref` names: NOT_FOUND for an unknown task, ABORTED
  // when it is not (or no longer) that claim.
  absl::StatusOr<TaskRecord*> LiveClaim(const v1::ClaimRef& ref);
  // The task a Claim names by task_id, if this worker may claim it now;
  // else NOT_FOUND or FAILED_PRECONDITION saying why not.
  absl::StatusOr<TaskRecord*> ClaimableById(const v1::ClaimRequest& req);
  // Where the task stands, for an error: "attempt 2 claimed by w1",
  // "attempt 1 on agent a1", "SUCCEEDED (exit 0)".
  static std::string NowIs(const TaskRecord& t);
  // `ref` was completed with `result` already (a CompleteClaim repeated
  // after its answer was lost), as opposed to ended some other way.
  bool Completed(const v1::ClaimRef& ref, const v1::TaskResult& result) const;
  // The lease asked for, or the default; INVALID_ARGUMENT past the bounds.
  absl::StatusOr<absl::Duration> LeaseOf(const google::protobuf::Duration& lease,
                                         absl::string_view field) const;
  // The tasks `a` holds, each ended with `result` unless it has moved on
  // meanwhile (a chain link ended with its predecessor).
  // `interrupted`: not counted against max_attempts.
  void EndHeld(AgentRecord& a, const std::vector<std::string>& ids, const v1::TaskResult& result,
               bool interrupted = false);
  // Writes a row change that is not a state change (pause_requested).
  void PersistRow(const TaskRecord& t);
  // schedule_timeout: fail the task if it has not started by `from` + timeout.
  void ArmStartDeadline(const TaskRecord& t, absl::Time from);
  // Its tasks move (LOST); counted against max_attempts unless
  // `interrupted` (the agent held them through a restart of the scheduler
  // and did not come back: the scheduler's outage, not the task, ended them).
  void LoseAgent(AgentRecord& a, const std::string& why, bool interrupted = false);
  void Send(uint64_t conn, v1::SchedulerMessage msg);
  void SendCancel(const TaskRecord& t);
  // The live attempt held by the agent on `conn`, or nullptr.
  TaskRecord* LiveAttempt(const AgentRecord& a, const std::string& task_id, int32_t attempt);

  // One message of OnAgentMessage; true when it may have freed room.
  bool OnOneAgentMessage(AgentRecord& a, const v1::AgentMessage& msg,
                         std::vector<v1::TaskOutput>* output);
  void OnOutput(AgentRecord& a, const v1::TaskOutput& m, std::vector<v1::TaskOutput>* output);
  void OnAccept(AgentRecord& a, const v1::Accept& m);
  void OnReject(AgentRecord& a, const v1::Reject& m);
  void OnResult(AgentRecord& a, const v1::Result& m);
  void OnRelease(AgentRecord& a, const v1::Release& m);
  // An Accept the agent's other messages imply (a Result, or a Hello
  // listing the attempt as started).
  void ImpliedAccept(AgentRecord& a, const TaskRecord& t);
  void SendDrain(const AgentRecord& a);

  // Drops the oldest finished attempts past opts_.max_attempt_history,
  // counting them, and has the store drop them too.
  void TrimHistory(TaskRecord& t);
  // Attempts that count against max_attempts (interrupted ones do not).
  int32_t AttemptsUsed(const TaskRecord& t) const;
  // RESOURCE_EXHAUSTED when `what` would put `n` more unfinished tasks in
  // a queue that has no room for them.
  absl::Status CheckRoom(const std::string& queue, int64_t n, absl::string_view what) const;
  int32_t MaxAttempts(const TaskRecord& t) const;
  absl::Duration AckTimeout(const TaskRecord& t) const;
  int64_t QueueLength(const std::string& queue) const;
  TaskRecord* Mutable(const std::string& id);
  absl::StatusOr<TaskRecord*> Lookup(const std::string& id);
  // UNAVAILABLE for an operation that met task `id` on disk only.
  static absl::Status OnDisk(absl::string_view id);
  // FAILED_PRECONDITION when a dependency of `t` was deleted (it cannot
  // run again); `what` says what was asked ("retried").
  static absl::Status CheckDepsKept(const TaskRecord& t, absl::string_view what);
  absl::StatusOr<JobRecord*> LookupJob(const std::string& id);

  const Clock* clock_;
  SchedulerOptions opts_;
  Effects effects_;

  TaskTable table_;
  // Tasks whose dependencies changed, for SettleDependents.
  std::deque<TaskRecord*> settle_queue_;
  int defer_settling_ = 0;
  bool settling_ = false;

  QueueControls queue_controls_;
  // Finished tasks on disk: eviction, reading back, deletes, retention.
  ColdStore cold_{&table_, &opts_, &queue_controls_};

  AgentRegistry agents_{&opts_};
  // The ready classes, where each waits, what each queue holds.
  ReadyQueues ready_{&queue_controls_, &agents_};
  // Gangs waiting to start that Dispatch has looked at, and their
  // reservations.
  Gangs gangs_{&queue_controls_, &agents_, &ready_};
  uint64_t assign_counter_ = 0;

  // Pull mode: the claimable tasks by queue and the live claims.
  ClaimBoard board_;
  // Merge and unique keys.
  TaskKeys keys_{opts_.max_merged_payloads, opts_.max_merged_payload_bytes};
  DeadlineTable task_deadlines_;   // DISPATCHED: ack; RUNNING: attempt timeout
  DeadlineTable start_deadlines_;  // schedule_timeout, wall time since the Unix epoch
  std::mt19937_64 rng_{std::random_device{}()};
  int64_t stale_messages_ = 0;
  TaskCounters counters_;
  QueueHistory history_;  // of counters_, sampled by Tick

  ScheduleBook schedules_{&opts_, &counters_};

  // Between BeginRestore and FinishRestore: the few tasks FinishRestore
  // needs, so a large table is walked once.
  struct Restoring {
    std::vector<TaskRecord*> with_deps;
    std::vector<TaskRecord*> in_flight;
    std::vector<TaskRecord*> replicas;
  };
  std::unique_ptr<Restoring> restoring_;
  // Tasks restored since the last RestoreNeeds (start-up only).
  std::vector<TaskRecord*> restored_unexamined_;
};

}  // namespace taskgrid::core
