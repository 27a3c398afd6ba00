#include "scheduler/core/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/retry_policy.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

Scheduler::Scheduler(const Clock* clock, SchedulerOptions opts)
    : clock_(clock), opts_(std::move(opts)) {}

absl::Time Scheduler::Now() const {
  // Stored times have microsecond precision; keep memory identical to disk.
  return absl::FromUnixMicros(absl::ToUnixMicros(clock_->Now()));
}

void Scheduler::Transition(TaskRecord& t, v1::TaskState to, std::string reason,
                           const std::string* event_agent) {
  // The ready queues are Dispatch's index; the table keeps the others.
  if (t.state == v1::TASK_STATE_PENDING) RemoveReady(t);
  // Before the row is written: it stores that the key was let go of.
  if (to == v1::TASK_STATE_SUCCEEDED || to == v1::TASK_STATE_CANCELLED) keys_.Release(t);
  const absl::Time now = Now();
  const v1::TaskState from =
      table_.Apply(t, to, std::move(reason), now, event_agent, &effects_.batch);
  if (to == v1::TASK_STATE_PENDING && from != v1::TASK_STATE_PENDING) t.ready_time = now;
  counters_.CountTransition(t, from, to, now);
  if (to == v1::TASK_STATE_RUNNING) t.ready_time = absl::InfinitePast();
  // Finished: to disk once the change is committed and old enough (Evict).
  if (IsTerminal(to)) cold_.Finished(t);
  if (to == v1::TASK_STATE_PENDING) AddReady(t);
  keys_.Index(t);
  // Room under its queue's concurrency limit.
  if (ready_.any_held() && IsInFlight(from) && !IsInFlight(to)) ready_.ReleaseHeld(t.queue());
  if (t.replica_of != nullptr) {
    // Its task counts the replicas that ended; an agent it let go of may
    // take a sibling now.
    if (IsTerminal(from) != IsTerminal(to)) {
      t.replica_of->replica_ended = &t;
      settle_queue_.push_back(t.replica_of);
    }
    if ((IsInFlight(from) && !IsInFlight(to)) || from == v1::TASK_STATE_SUCCEEDED) {
      ready_.UnparkClassesOf(*t.replica_of);
    } else if (IsGangMember(t)) {
      // A gang waits for all its members: any change may complete it.
      ready_.UnparkClassesOf(*t.replica_of);
    }
    // A member stops waiting other than by the gang's start: the gang no
    // longer waits as a whole, and reserves nothing.
    if (from == v1::TASK_STATE_PENDING && to != v1::TASK_STATE_DISPATCHED && IsGangMember(t)) {
      gangs_.Release(t.replica_of->id());
    }
    // A member is to run again: the rest of its gang stops, so that all of
    // it starts again together.
    if (IsInFlight(from) && (to == v1::TASK_STATE_PENDING || to == v1::TASK_STATE_SCHEDULED) &&
        IsGangMember(t)) {
      StopGang(*t.replica_of, t);
    }
  }
  if (IsTerminal(to) && !t.replicas.empty()) gangs_.Release(t.id());

  // Dependents see the change; a task that starts waiting is looked at too.
  NoteStateChange(t, from, to, &settle_queue_);
  if (to == v1::TASK_STATE_BLOCKED) settle_queue_.push_back(&t);
  if (defer_settling_ == 0) SettleDependents();
}

v1::TaskState Scheduler::ReadyOrScheduled(TaskRecord& t) {
  // A task delivered by merge key fires when its merges say.
  const absl::Time not_before =
      t.merge ? FromProto(t.merge->merged.fire_time()) : FromProto(t.spec.not_before());
  if (not_before > Now() && not_before > t.next_run_time) t.next_run_time = not_before;
  return t.next_run_time > Now() ? v1::TASK_STATE_SCHEDULED : v1::TASK_STATE_PENDING;
}

v1::TaskState Scheduler::NextWaitingState(TaskRecord& t) {
  if (!t.replicas.empty()) return v1::TASK_STATE_BLOCKED;  // its replicas run, not it
  if (!DepsMet(t) || (DepFailed(t) && CancelsOnUpstreamFailure(t))) return v1::TASK_STATE_BLOCKED;
  return ReadyOrScheduled(t);
}

absl::StatusOr<std::vector<const TaskRecord*>> Scheduler::Submit(std::vector<v1::TaskSpec> specs) {
  if (specs.empty()) return absl::InvalidArgumentError("tasks is empty: submit at least one task");
  if (static_cast<int>(specs.size()) > opts_.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tasks has ", specs.size(), " entries; the limit per call is ", opts_.max_batch_size));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].job_id().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tasks[", i, "].job_id is set: submit the tasks of a job with SubmitJob"));
    }
  }
  return AddTasks(std::move(specs), nullptr);
}

absl::StatusOr<const JobRecord*> Scheduler::SubmitJob(std::string job_id,
                                                      std::vector<v1::TaskSpec> specs) {
  if (!job_id.empty()) {
    if (absl::Status s = CheckName("job_id", job_id, kMaxIdLength); !s.ok()) return s;
  }
  if (specs.empty()) {
    return absl::InvalidArgumentError("tasks is empty: a job needs at least one task");
  }
  if (static_cast<int>(specs.size()) > opts_.max_job_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("tasks has ", specs.size(),
                                                   " entries; the limit per job is ",
                                                   opts_.max_job_tasks, " (--max_job_tasks)"));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].job_id().empty() && specs[i].job_id() != job_id) {
      return absl::InvalidArgumentError(absl::StrCat("tasks[", i, "].job_id is \"",
                                                     specs[i].job_id(), "\", not the job's id \"",
                                                     job_id, "\" (leave it empty)"));
    }
  }
  if (job_id.empty()) job_id = table_.NewJobId(clock_->Now());
  for (v1::TaskSpec& spec : specs) spec.set_job_id(job_id);
  if (const JobRecord* j = FindJob(job_id)) {
    // The same job again (a retried call): the same tasks in the same order.
    bool same = j->tasks.size() == specs.size();
    for (size_t i = 0; same && i < specs.size(); ++i) {
      v1::TaskSpec& spec = specs[i];
      if (spec.queue().empty()) spec.set_queue(kDefaultQueue);
      if (spec.id().empty()) spec.set_id(j->tasks[i]->id());
      same = google::protobuf::util::MessageDifferencer::Equals(spec, j->tasks[i]->spec);
    }
    if (!same) {
      return absl::AlreadyExistsError(
          absl::StrCat("job \"", job_id, "\" already exists with other tasks"));
    }
    return j;
  }
  ASSIGN_OR_RETURN(std::vector<const TaskRecord*> tasks, AddTasks(std::move(specs), &job_id));
  return tasks.front()->job;
}

absl::StatusOr<std::vector<const TaskRecord*>> Scheduler::AddTasks(std::vector<v1::TaskSpec> specs,
                                                                   const std::string* job_id) {
  absl::flat_hash_map<std::string, size_t> seen;
  std::vector<const TaskRecord*> existing(specs.size(), nullptr);
  std::vector<size_t> fresh;                       // indexes of the tasks to create
  absl::flat_hash_map<std::string, int64_t> adds;  // queue -> new tasks
  // Merge keys: the specs that join a task, and what each key's task holds
  // once this batch is in (checked against the limits before any change).
  struct Gathered {
    TaskRecord* task = nullptr;  // an existing task; nullptr: made by this batch
    size_t first = 0;            // else the spec that makes it
    int64_t count = 0, bytes = 0;
  };
  absl::flat_hash_map<TaskKeys::Key, Gathered> gathered;
  std::vector<std::pair<size_t, TaskKeys::Key>> joins;     // (spec, key), in request order
  absl::flat_hash_map<TaskKeys::Key, size_t> unique_seen;  // (queue, unique key) -> spec
  const absl::Time submit_time = Now();
  for (size_t i = 0; i < specs.size(); ++i) {
    v1::TaskSpec& spec = specs[i];
    const FieldPath field("tasks", static_cast<int>(i));
    if (absl::Status s = ValidateSpec(spec, opts_, field); !s.ok()) return s;
    if (spec.queue().empty()) spec.set_queue(kDefaultQueue);
    if (!spec.id().empty()) {
      auto [it, inserted] = seen.emplace(spec.id(), i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(field.str(), ".id \"", spec.id(),
                                                       "\" repeats tasks[", it->second, "].id"));
      }
      if (const TaskRecord* t = Find(spec.id())) {
        if (job_id != nullptr) {
          return absl::AlreadyExistsError(
              absl::StrCat("task \"", spec.id(), "\" (", field.str(), ") already exists",
                           t->job_id().empty() ? "" : absl::StrCat(" in job \"", t->job_id(), "\""),
                           "; task ids are global: give the job's tasks their own ids"));
        }
        if (!google::protobuf::util::MessageDifferencer::Equals(t->spec, spec)) {
          return absl::AlreadyExistsError(absl::StrCat("task \"", spec.id(), "\" (", field.str(),
                                                       ") already exists with a different spec"));
        }
        existing[i] = t;
        continue;
      }
      if (table_.FindCold(spec.id()) != nullptr) return OnDisk(spec.id());
    }
    if (!spec.unique_key().empty()) {
      if (job_id != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            field.str(), ".unique_key is set: a job is unique by its id, not its tasks by key"));
      }
      const TaskKeys::Key key{spec.queue(), spec.unique_key()};
      if (const int64_t held = keys_.UniqueHolder(key, submit_time); held != 0) {
        if (auto it = table_.by_seq().find(held); it != table_.by_seq().end()) {
          if (spec.unique_refuse()) {
            const TaskRecord& h = *it->second;
            return absl::AlreadyExistsError(absl::StrCat(
                field.str(), ".unique_key \"", spec.unique_key(), "\" is held in queue ",
                spec.queue(), " by task \"", h.id(), "\" (", StateName(h.state), ") until ",
                absl::FormatTime(absl::RFC3339_sec, UniqueUntil(h), absl::UTCTimeZone())));
          }
          existing[i] = it->second;
          continue;
        }
        if (const ColdTask* c = table_.FindColdBySeq(held)) return OnDisk(c->id());
        // Its holder was deleted: the key is free.
      }
      auto [it, inserted] = unique_seen.emplace(key, i);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(field.str(), ".unique_key \"", spec.unique_key(), "\" repeats tasks[",
                         it->second, "].unique_key in queue ", spec.queue()));
      }
    }
    if (!spec.merge_key().empty()) {
      if (job_id != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            field.str(), ".merge_key is set: the tasks of a job are not delivered by merge key"));
      }
      const TaskKeys::Key key{spec.queue(), spec.merge_key()};
      auto [g, is_new] = gathered.try_emplace(key);
      if (is_new) {
        g->second.task = keys_.JoinableTask(key);
        if (g->second.task != nullptr) {
          g->second.count = g->second.task->merge->merged.payloads_size();
          g->second.bytes = g->second.task->merge->bytes;
        }
      }
      if (!is_new || g->second.task != nullptr) {  // joins a task
        // The key gathers payloads for one destination: the steps that
        // deliver them are part of its identity.
        const v1::TaskSpec& into =
            g->second.task != nullptr ? g->second.task->spec : specs[g->second.first];
        if (!TaskKeys::SameSteps(into, spec)) {
          return absl::FailedPreconditionError(absl::StrCat(
              field.str(), ".steps differ from those of ",
              g->second.task != nullptr ? absl::StrCat("task \"", into.id(), "\"")
                                        : absl::StrCat("tasks[", g->second.first, "]"),
              ", which gathers merge key \"", spec.merge_key(), "\" in queue ", spec.queue(),
              ": a merge key delivers to one place; use another key for other steps"));
        }
        RETURN_IF_ERROR(keys_.CheckRoom(key, g->second.count, g->second.bytes, spec, field));
        ++g->second.count;
        g->second.bytes += static_cast<int64_t>(spec.payload().size());
        joins.emplace_back(i, key);
        continue;
      }
      g->second.first = i;  // makes the key's task
      g->second.count = 1;
      g->second.bytes = static_cast<int64_t>(spec.payload().size());
    }
    fresh.push_back(i);
    adds[spec.queue()] += 1 + ReplicaCount(spec);
  }
  for (size_t i : fresh) {
    for (const std::string& dep : specs[i].depends_on()) {
      if (Find(dep) == nullptr && table_.FindCold(dep) != nullptr) return OnDisk(dep);
    }
  }
  if (absl::Status s =
          CheckDependencies(specs, fresh, seen, [this](const std::string& id) { return Find(id); });
      !s.ok()) {
    return s;
  }
  for (const auto& [queue, n] : adds) {
    RETURN_IF_ERROR(CheckRoom(queue, n, "this batch"));
  }

  // Ids for the tasks that gave none: never one an existing task or another
  // task of this request holds (a client may give an id of the generated
  // form; two records under one key would leave the indexes pointing at a
  // freed one).
  for (size_t i : fresh) {
    if (!specs[i].id().empty()) continue;
    std::string id = table_.NewTaskId(clock_->Now());
    while (seen.contains(id)) id = table_.NewTaskId(clock_->Now());
    specs[i].set_id(std::move(id));
  }
  // The ids the replicas will take: free, like every id.
  for (size_t i : fresh) {
    for (int32_t n = 1; n <= ReplicaCount(specs[i]); ++n) {
      const std::string id = ReplicaId(specs[i].id(), n);
      if (table_.Taken(id) || seen.contains(id)) {
        return absl::AlreadyExistsError(absl::StrCat("task \"", id, "\" already exists; tasks[", i,
                                                     "] needs that id for its replica ", n));
      }
    }
  }

  const absl::Time now = Now();
  JobRecord* job = nullptr;
  if (job_id != nullptr) {
    job = &table_.FindOrAddJob(*job_id, table_.next_seq(), now);
    job->tasks.reserve(fresh.size());
  }
  std::vector<const TaskRecord*> out(specs.size(), nullptr);
  std::vector<TaskRecord*> created;
  created.reserve(fresh.size());
  for (size_t i : fresh) {
    auto owned = std::make_unique<TaskRecord>();
    owned->spec = std::move(specs[i]);
    TaskRecord& t = table_.Insert(std::move(owned));
    t.create_time = now;
    ready_.SetClass(t);
    if (!t.spec.merge_key().empty()) TaskKeys::StartMerge(t, now, &effects_.batch);
    if (!t.spec.unique_key().empty()) keys_.Hold(t);
    t.job = job;
    if (job != nullptr) job->tasks.push_back(&t);
    created.push_back(&t);
    out[i] = &t;
    if (ReplicaCount(t.spec) > 0) MakeReplicas(t, now, &created);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (existing[i] != nullptr) out[i] = existing[i];
  }
  {
    // Every new task exists before any of them moves on.
    DeferSettling defer(this);
    for (TaskRecord* t : created) LinkDependencies(*t);
    for (TaskRecord* t : created) {
      const v1::TaskState to = NextWaitingState(*t);
      Transition(*t, to,
                 !t->replicas.empty()             ? ReplicasReason(*t)
                 : to == v1::TASK_STATE_BLOCKED   ? BlockedReason(*t)
                 : to == v1::TASK_STATE_SCHEDULED ? "waiting for not_before"
                                                  : "submitted");
      ArmStartDeadline(*t, now);
    }
    // Then the submits that join a task, in request order.
    for (const auto& [i, key] : joins) {
      const Gathered& g = gathered.at(key);
      TaskRecord* t = g.task != nullptr ? g.task : const_cast<TaskRecord*>(out[g.first]);
      if (TaskKeys::Merge(table_, *t, specs[i], now, &effects_.batch)) {
        Transition(*t, v1::TASK_STATE_PENDING,
                   absl::StrCat("merge key ", specs[i].merge_key(), ": fire time reached"));
      }
      out[i] = t;
    }
  }
  Dispatch();
  return out;
}

absl::StatusOr<const TaskRecord*> Scheduler::Cancel(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state == v1::TASK_STATE_SUCCEEDED || t->state == v1::TASK_STATE_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                                                      " and can no longer be cancelled"));
  }
  CancelOne(*t, "cancelled by request");
  return t;
}

void Scheduler::CancelOne(TaskRecord& t, const std::string& reason) {
  switch (t.state) {
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
    case v1::TASK_STATE_BLOCKED:
    case v1::TASK_STATE_PAUSED:
      Transition(t, v1::TASK_STATE_CANCELLED, reason);
      start_deadlines_.Remove(t.id());
      // Its replicas after it: ended first, they would fail it.
      for (TaskRecord* r : t.replicas) {
        CancelOne(*r, absl::StrCat("task ", t.id(), " was cancelled"));
      }
      return;
    case v1::TASK_STATE_DISPATCHED:
    case v1::TASK_STATE_RUNNING: {
      t.pause_requested = false;  // cancel wins over a pause under way
      t.requeue_requested = false;
      // A chain link its agent may have started already (its predecessor's
      // success on the way): an agent that reports its stops says which.
      const bool waiting = t.chained_after != nullptr && !ReportsStops(t.agent_id);
      Transition(t, v1::TASK_STATE_CANCELLING, CancellingReason(reason, t.agent_id));
      SendCancel(t);
      if (waiting || t.claimed()) {
        // A chain link that has not started, on an older agent: it drops
        // it on the Cancel without a word, so it ends here and now. A pull
        // worker's claim ends now too: its next call finds it gone.
        v1::TaskResult r;
        r.set_outcome(v1::OUTCOME_CANCELLED);
        r.set_exit_code(-1);
        r.set_error(waiting ? "cancelled before it started" : "cancelled while claimed");
        FinishAttempt(t, std::move(r));
      }
      return;
    }
    default:
      return;  // CANCELLING, or terminal: nothing to do
  }
}

absl::StatusOr<const TaskRecord*> Scheduler::Retry(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state != v1::TASK_STATE_FAILED && t->state != v1::TASK_STATE_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                     "; only FAILED or CANCELLED tasks can be retried"));
  }
  if (AttemptsUsed(*t) >= MaxAttempts(*t)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" has used all ", MaxAttempts(*t),
                     " of its attempts; reset it for a fresh budget"));
  }
  RETURN_IF_ERROR(CheckDepsKept(*t, "retried"));
  if (!t->replicas.empty()) {
    RETURN_IF_ERROR(CheckRestartReplicas(*t, /*all=*/false, absl::StrCat("retrying \"", id, "\"")));
  } else {
    RETURN_IF_ERROR(CheckRoom(t->queue(), 1, absl::StrCat("retrying \"", id, "\"")));
  }
  {
    // Its replicas run again as it waits for them.
    DeferSettling defer(this);
    t->next_run_time = absl::InfinitePast();
    const v1::TaskState to = NextWaitingState(*t);
    Transition(*t, to,
               !t->replicas.empty()           ? "retried by request; " + ReplicasReason(*t)
               : to == v1::TASK_STATE_BLOCKED ? "retried by request; " + BlockedReason(*t)
                                              : "retried by request");
    RestartReplicas(*t, /*all=*/false, absl::StrCat("retried with its task ", id));
    ArmStartDeadline(*t, Now());
  }
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::Reset(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (!IsTerminal(t->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                     "; only SUCCEEDED, FAILED or CANCELLED tasks can be reset"));
  }
  RETURN_IF_ERROR(CheckDepsKept(*t, "reset"));
  if (!t->replicas.empty()) {
    RETURN_IF_ERROR(CheckRestartReplicas(*t, /*all=*/true, absl::StrCat("resetting \"", id, "\"")));
  } else {
    RETURN_IF_ERROR(CheckRoom(t->queue(), 1, absl::StrCat("resetting \"", id, "\"")));
  }
  {
    // Its replicas run again as it waits for them.
    DeferSettling defer(this);
    ClearForRerun(*t);
    const v1::TaskState to = NextWaitingState(*t);
    Transition(*t, to,
               !t->replicas.empty()           ? "reset by request; " + ReplicasReason(*t)
               : to == v1::TASK_STATE_BLOCKED ? "reset by request; " + BlockedReason(*t)
                                              : "reset by request");
    RestartReplicas(*t, /*all=*/true, absl::StrCat("reset with its task ", id));
    ArmStartDeadline(*t, Now());
  }
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::Pause(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (!t->replicas.empty() && !IsTerminal(t->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" runs as ", t->replicas.size(),
                     " replicas and is not paused itself: pause its replicas (\"",
                     t->replicas.front()->id(), "\", ...) one by one"));
  }
  switch (t->state) {
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
    case v1::TASK_STATE_BLOCKED:
      Transition(*t, v1::TASK_STATE_PAUSED, "paused by request");
      return t;
    case v1::TASK_STATE_PAUSED:
      return t;
    case v1::TASK_STATE_DISPATCHED:
    case v1::TASK_STATE_RUNNING:
      if (t->pause_requested) return t;
      // The agent stops the attempt; its result then ends the task PAUSED.
      t->pause_requested = true;
      t->reason = absl::StrCat("pause requested; waiting for agent ", t->agent_id);
      PersistRow(*t);
      SendCancel(*t);
      if (t->claimed() || (t->chained_after != nullptr && !ReportsStops(t->agent_id))) {
        // A chain link that has not started, on an older agent: it drops
        // it silently (one that reports its stops says whether it had
        // started). A claim ends now: its worker's next call finds it gone.
        v1::TaskResult r;
        r.set_outcome(v1::OUTCOME_CANCELLED);
        r.set_exit_code(-1);
        r.set_error(t->claimed() ? "paused while claimed" : "paused before it started");
        FinishAttempt(*t, std::move(r));
      }
      return t;
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("task \"", id, "\" is ", StateName(t->state), " and cannot be paused"));
  }
}

absl::StatusOr<const TaskRecord*> Scheduler::Resume(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state != v1::TASK_STATE_PAUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state), ", not PAUSED"));
  }
  const v1::TaskState to = NextWaitingState(*t);
  Transition(*t, to,
             to == v1::TASK_STATE_BLOCKED ? "resumed by request; " + BlockedReason(*t)
                                          : "resumed by request");
  Dispatch();
  return t;
}

absl::StatusOr<JobRecord*> Scheduler::LookupJob(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  JobRecord* j = table_.FindJob(id);
  if (j == nullptr) return absl::NotFoundError(absl::StrCat("job \"", id, "\" does not exist"));
  return j;
}

absl::StatusOr<const JobRecord*> Scheduler::CancelJob(const std::string& id) {
  ASSIGN_OR_RETURN(JobRecord * j, LookupJob(id));
  {
    // Cancelled by the request, not as someone's downstream.
    DeferSettling defer(this);
    for (TaskRecord* t : j->tasks) CancelOne(*t, "job cancelled by request");
  }
  Dispatch();  // slots of cancelled chain links may be free
  return j;
}

absl::StatusOr<const JobRecord*> Scheduler::RetryJob(const std::string& id) {
  ASSIGN_OR_RETURN(JobRecord * j, LookupJob(id));
  // The FAILED tasks, and (breadth first, never recursive) every CANCELLED
  // task of the job downstream of them that cancels on upstream failure.
  std::vector<TaskRecord*> retry;
  absl::flat_hash_set<TaskRecord*> picked;
  for (TaskRecord* t : j->tasks) {
    if (t->state == v1::TASK_STATE_FAILED && picked.insert(t).second) retry.push_back(t);
  }
  for (size_t k = 0; k < retry.size(); ++k) {
    for (TaskRecord* d : retry[k]->dependents) {
      if (d->job == j && d->state == v1::TASK_STATE_CANCELLED && CancelsOnUpstreamFailure(*d) &&
          picked.insert(d).second) {
        retry.push_back(d);
      }
    }
  }
  if (retry.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", id, "\" has no FAILED task (and so none cancelled because of one) ", "to retry"));
  }
  for (const TaskRecord* t : retry) RETURN_IF_ERROR(CheckDepsKept(*t, "retried"));
  absl::btree_map<std::string, int64_t> adds;  // in name order: the same error each time
  for (const TaskRecord* t : retry) {
    ++adds[t->queue()];
    if (t->replicas.empty()) continue;
    // Its replicas that did not succeed run again: they must have stopped.
    RETURN_IF_ERROR(
        CheckRestartReplicas(*t, /*all=*/false, absl::StrCat("retrying job \"", id, "\"")));
  }
  for (const auto& [queue, n] : adds) {
    RETURN_IF_ERROR(CheckRoom(queue, n, absl::StrCat("retrying job \"", id, "\"")));
  }
  std::sort(retry.begin(), retry.end(),
            [](const TaskRecord* a, const TaskRecord* b) { return a->seq < b->seq; });
  {
    // Downstream tasks must not be cancelled again by an upstream one that
    // is about to be re-queued too.
    DeferSettling defer(this);
    for (TaskRecord* t : retry) {
      t->attempt_base = t->attempt;  // a fresh budget of attempts
      t->interrupted_dropped = 0;    // every dropped attempt is below the base now
      t->next_run_time = absl::InfinitePast();
      const v1::TaskState to = NextWaitingState(*t);
      Transition(*t, to, "retried with its job");
      ArmStartDeadline(*t, Now());
      RestartReplicas(*t, /*all=*/false, absl::StrCat("retried with its task ", t->id()));
    }
  }
  Dispatch();
  return j;
}

void Scheduler::PersistRow(const TaskRecord& t) {
  effects_.batch.tasks.push_back(ToRow(t, /*insert=*/false));
}

void Scheduler::ArmStartDeadline(const TaskRecord& t, absl::Time from) {
  if (!t.spec.has_schedule_timeout()) return;  // most tasks: restore asks for each
  if (ReplicaCount(t.spec) > 0) return;        // never starts: its replicas do
  const absl::Duration timeout = FromProto(t.spec.schedule_timeout());
  if (timeout <= absl::ZeroDuration()) return;
  // Once history was dropped, whether it ever started is not known: it has
  // had its chances.
  if (t.attempts_dropped > 0) return;
  for (const v1::Attempt& a : t.attempts) {
    if (FromProto(a.start_time()) != absl::InfinitePast()) return;  // it has started before
  }
  start_deadlines_.Set(t.id(), (from + timeout) - absl::UnixEpoch());
}

TaskRecord* Scheduler::Mutable(const std::string& id) { return table_.Find(id); }

absl::StatusOr<TaskRecord*> Scheduler::Lookup(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  TaskRecord* t = Mutable(id);
  if (t == nullptr && table_.FindCold(id) != nullptr) return OnDisk(id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  return t;
}

absl::Status Scheduler::CheckDepsKept(const TaskRecord& t, absl::string_view what) {
  if (!t.deps_deleted) return absl::OkStatus();
  std::string gone;
  for (const std::string& id : t.spec.depends_on()) {
    if (std::none_of(t.deps.begin(), t.deps.end(),
                     [&](const TaskRecord* d) { return d->id() == id; })) {
      gone = id;
      break;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("task \"", t.id(), "\" cannot be ", what,
                                                    ": its dependency \"", gone, "\" was deleted"));
}

absl::Status Scheduler::OnDisk(absl::string_view id) {
  // The Engine reads a task back before any operation that needs it
  // (ColdSeqs*, Warm); meeting one here means it went back to disk in
  // between, which a retry of the call gets past.
  return absl::UnavailableError(
      absl::StrCat("task \"", id, "\" is finished and was not read back from disk; try again"));
}

absl::Status Scheduler::CheckRoom(const std::string& queue, int64_t n,
                                  absl::string_view what) const {
  const int64_t max = opts_.QueueMaxLength(queue);
  const int64_t len = QueueLength(queue);
  if (max <= 0 || len + n <= max) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("queue \"", queue, "\" is full: it holds ", len,
                                                   " of at most ", max, " tasks and ", what,
                                                   " adds ", n));
}

int64_t Scheduler::QueueLength(const std::string& queue) const {
  const TaskTable::Counts& counts = table_.CountsOf(queue);
  int64_t n = 0;
  for (int s = 1; s < kNumStates; ++s) {
    if (!IsTerminal(static_cast<v1::TaskState>(s))) n += counts[s];
  }
  return n;
}

int32_t Scheduler::MaxAttempts(const TaskRecord& t) const { return MaxAttemptsOf(t, opts_); }

absl::Duration Scheduler::AckTimeout(const TaskRecord& t) const {
  const absl::Duration d = FromProto(t.spec.ack_timeout());
  return d > absl::ZeroDuration() ? d : opts_.default_ack_timeout;
}

void Scheduler::Tick() {
  const absl::Time now = Now();
  history_.Sample(counters_, now);
  // Event retention: prune through the newest mark older than the window.
  if (const int64_t prune = table_.PruneBefore(now - opts_.event_retention); prune > 0) {
    effects_.batch.prune_events_through = prune;
  }
  while (TaskRecord* due = table_.NextDue(now)) {
    TaskRecord& t = *due;
    Transition(t, v1::TASK_STATE_PENDING,
               t.attempt > t.attempt_base ? "retry backoff over" : "not_before reached");
  }
  for (const std::string& id : start_deadlines_.PopExpired(now - absl::UnixEpoch())) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || IsTerminal(t->state)) continue;
    if (IsInFlight(t->state)) {
      // Dispatched, not started: its agent is told to stop it, and short
      // of a success it fails once the agent says so (or is lost). One
      // that started is not concerned (its Accept removed the deadline).
      if (t->start_time == absl::InfinitePast() && !t->claimed()) {
        RequestStop(*t, StopRequest::kExpired);
      }
      continue;
    }
    Transition(*t, v1::TASK_STATE_FAILED,
               absl::StrCat("expired before start: not started within schedule_timeout ",
                            absl::FormatDuration(FromProto(t->spec.schedule_timeout()))));
  }
  for (const std::string& id : board_.Expired(now)) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || !t->claimed()) continue;
    FinishAttempt(*t, LostResult(absl::StrCat("the claim by ", t->agent_id,
                                              " ran out: neither completed nor extended")));
  }
  const absl::Duration mono = Mono();
  for (const std::string& id : task_deadlines_.PopExpired(mono)) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || !IsInFlight(t->state)) continue;
    const AgentRecord* holder = agents_.Find(t->agent_id);
    if (holder != nullptr && (holder->reports_stops || !holder->connected())) {
      // Freed on the agent's word only (or once the agent is lost): its
      // step may be cleaning up for its kill grace, or run on under a
      // restart hold or through an outage of ours while the agent is
      // away, and must not overlap the next attempt.
      RequestStop(*t, t->start_time == absl::InfinitePast() ? StopRequest::kNotAccepted
                                                            : StopRequest::kTimedOut);
      continue;
    }
    SendCancel(*t);                               // in case the agent does hold it
    if (t->start_time == absl::InfinitePast()) {  // never accepted
      FinishAttempt(*t, LostResult(absl::StrCat("agent ", t->agent_id, " did not accept it within ",
                                                absl::FormatDuration(AckTimeout(*t)))));
    } else {
      v1::TaskResult r;
      r.set_outcome(v1::OUTCOME_TIMED_OUT);
      r.set_exit_code(-1);
      r.set_error(absl::StrCat("no result from agent ", t->agent_id, " within attempt_timeout ",
                               absl::FormatDuration(FromProto(t->spec.attempt_timeout()))));
      FinishAttempt(*t, std::move(r));
    }
  }
  AgentRegistry::Expired expired = agents_.Expire(mono);
  // Silent past heartbeat_timeout: their streams end, and the grace starts.
  for (uint64_t conn : expired.silent_conns) effects_.close_conns.push_back(conn);
  for (const std::string& id : expired.grace_over) {
    AgentRecord* a = agents_.Find(id);
    if (a == nullptr) continue;
    if (a->restarting) {
      LoseAgent(
          *a,
          absl::StrCat("agent ", id, " restarted keeping its steps and did not come back within ",
                       absl::FormatDuration(a->restart_hold),
                       " (and the reconnect grace); not counted as an attempt"),
          /*interrupted=*/true);
    } else if (a->restored) {
      LoseAgent(
          *a,
          absl::StrCat("the scheduler restarted and agent ", id,
                       " did not come back within the restart grace (",
                       absl::FormatDuration(opts_.RestartGrace()), "); not counted as an attempt"),
          /*interrupted=*/true);
    } else {
      LoseAgent(*a, absl::StrCat("agent ", id, " was lost and did not come back within ",
                                 absl::FormatDuration(opts_.reconnect_grace)));
    }
  }
  FireSchedules(now);
  if (ready_.any_held()) {
    ready_.ReleaseOpened([this](const std::string& q) { return GateOf(q); });
  }
  keys_.Expire(now);
  cold_.DeleteExpired(now, &effects_.batch);
  Dispatch();
}

absl::StatusOr<const ScheduleRecord*> Scheduler::CreateSchedule(v1::Schedule def) {
  return schedules_.Create(std::move(def), Now(), &effects_);
}

absl::StatusOr<const ScheduleRecord*> Scheduler::PauseSchedule(const std::string& id) {
  return schedules_.Pause(id, Now(), &effects_);
}

absl::StatusOr<const ScheduleRecord*> Scheduler::ResumeSchedule(const std::string& id) {
  return schedules_.Resume(id, Now(), &effects_);
}

absl::StatusOr<ScheduleRecord> Scheduler::DeleteSchedule(const std::string& id) {
  return schedules_.Delete(id, &effects_);
}

absl::Status Scheduler::RestoreSchedules(std::vector<ScheduleRow> rows) {
  return schedules_.Restore(std::move(rows), Now());
}

void Scheduler::FireSchedules(absl::Time now) {
  using Fired = ScheduleBook::Fired;
  schedules_.FireDue(
      now,
      [&](v1::TaskSpec spec) -> Fired {
        // This fire's task exists and finished (a fire repeated after a
        // clock went back).
        if (const ColdTask* c = table_.FindCold(spec.id())) {
          return {Fired::Kind::kExisted, std::string(c->id()), {}};
        }
        google::protobuf::RepeatedPtrField<v1::TaskSpec> one;
        *one.Add() = spec;
        if (std::vector<int64_t> cold = ColdSeqsOfSpecs(one); !cold.empty()) {
          // Its dependencies, or its unique key's holder, are on disk: the
          // Engine reads them back and the fire comes on a later tick.
          cold_.Want(cold);
          return {Fired::Kind::kWait, "", {}};
        }
        std::vector<v1::TaskSpec> specs;
        specs.push_back(std::move(spec));
        absl::StatusOr<std::vector<const TaskRecord*>> made = Submit(std::move(specs));
        if (!made.ok()) return {Fired::Kind::kRefused, "", made.status()};
        return {Fired::Kind::kMade, made->front()->id(), {}};
      },
      &effects_);
}

absl::StatusOr<const TaskRecord*> Scheduler::DeleteByMergeKey(const std::string& queue,
                                                              const std::string& merge_key) {
  const std::string q = queue.empty() ? std::string(kDefaultQueue) : queue;
  RETURN_IF_ERROR(CheckName("queue", q, kMaxQueueNameLength));
  RETURN_IF_ERROR(CheckName("merge_key", merge_key, kMaxIdLength));
  TaskRecord* t = keys_.JoinableTask({q, merge_key});
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("no task of merge key \"", merge_key, "\" in queue ", q,
                                            " waits to be delivered"));
  }
  CancelOne(*t, absl::StrCat("deleted by merge key ", merge_key));
  return t;
}

Effects Scheduler::TakeEffects() { return std::exchange(effects_, Effects{}); }

}  // namespace taskgrid::core
