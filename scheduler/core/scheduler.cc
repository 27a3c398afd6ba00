#include "scheduler/core/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/retry_policy.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

namespace {

// A broken internal invariant is a bug: fail loudly, never limp on.
#define TASKGRID_CHECK(cond, msg)                                                 \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "CHECK failed: %s: %s\n", #cond, std::string(msg).c_str()); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

// The most of an agent's free-text reason (reject, release) kept.
constexpr int64_t kMaxReasonBytes = 1024;

// Text an agent sent, at most `max` bytes: a longer one keeps its start
// and says how much went.
std::string Bounded(absl::string_view text, int64_t max) {
  if (static_cast<int64_t>(text.size()) <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "... (", text.size() - max, " bytes cut)");
}

// The tail of an output stream, at most `max` bytes; returns how many went.
int64_t CutTail(std::string* tail, int64_t max) {
  if (static_cast<int64_t>(tail->size()) <= max) return 0;
  const int64_t cut = static_cast<int64_t>(tail->size()) - max;
  tail->erase(0, cut);
  return cut;
}

v1::TaskResult LostResult(std::string error) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_LOST);
  r.set_exit_code(-1);
  r.set_error(std::move(error));
  return r;
}

// How a dependency's state counts for its dependents.
enum class DepClass { kOpen, kSucceeded, kFailed };

DepClass ClassOf(v1::TaskState s) {
  if (s == v1::TASK_STATE_SUCCEEDED) return DepClass::kSucceeded;
  if (s == v1::TASK_STATE_FAILED || s == v1::TASK_STATE_CANCELLED) return DepClass::kFailed;
  return DepClass::kOpen;
}

// What a dependent receives from a finished dependency.
const std::string& OutputOf(const TaskRecord& t) {
  return t.result.has_output() ? t.result.output() : t.result.stdout_tail();
}

}  // namespace

Scheduler::Scheduler(const Clock* clock, SchedulerOptions opts)
    : clock_(clock), opts_(std::move(opts)) {}

absl::Time Scheduler::Now() const {
  // Stored times have microsecond precision; keep memory identical to disk.
  return absl::FromUnixMicros(absl::ToUnixMicros(clock_->Now()));
}

// ---------------------------------------------------------------------------
// The one door.

void Scheduler::Transition(TaskRecord& t, v1::TaskState to, std::string reason,
                           const std::string* event_agent) {
  const v1::TaskState from = t.state;
  TASKGRID_CHECK(IsAllowedTransition(from, to),
                 absl::StrCat("task ", t.id(), ": ", StateName(from), " -> ", StateName(to)));
  auto& counts = counts_[t.queue()];
  if (from == v1::TASK_STATE_PENDING) {
    RemoveReady(t);
  } else if (from == v1::TASK_STATE_SCHEDULED) {
    scheduled_.erase({t.next_run_time, t.seq, &t});
  }
  if (from != v1::TASK_STATE_UNSPECIFIED) --counts[from];
  t.state = to;
  t.reason = std::move(reason);
  t.update_time = Now();
  ++counts[to];
  if (t.job != nullptr) {
    if (from != v1::TASK_STATE_UNSPECIFIED) --t.job->counts[from];
    ++t.job->counts[to];
    t.job->update_time = t.update_time;
  }
  if (to == v1::TASK_STATE_PENDING) {
    AddReady(t);
  } else if (to == v1::TASK_STATE_SCHEDULED) {
    scheduled_.insert({t.next_run_time, t.seq, &t});
  }
  effects_.batch.tasks.push_back(ToRow(t, from == v1::TASK_STATE_UNSPECIFIED));
  EventRow e;
  e.revision = ++last_revision_;
  e.task_id = t.id();
  e.queue = t.queue();
  e.from_state = from;
  e.to_state = to;
  e.attempt = t.attempt;
  e.agent_id = event_agent != nullptr ? *event_agent : t.agent_id;
  e.time_us = ToUnixMicrosOrZero(t.update_time);
  e.reason = t.reason;
  e.job_id = t.job_id();
  if (revision_marks_.empty() ||
      e.time_us / 1'000'000 != ToUnixMicrosOrZero(revision_marks_.back().second) / 1'000'000) {
    revision_marks_.push_back({e.revision, t.update_time});
  } else {
    revision_marks_.back().first = e.revision;
  }
  effects_.batch.events.push_back(std::move(e));

  // Dependents see the change; a task that starts waiting is looked at too.
  const DepClass was = ClassOf(from), is = ClassOf(to);
  if (was != is) {
    for (TaskRecord* d : t.dependents) {
      d->deps_unsucceeded += (was == DepClass::kSucceeded) - (is == DepClass::kSucceeded);
      d->deps_unfinished += (is == DepClass::kOpen) - (was == DepClass::kOpen);
      settle_queue_.push_back(d);
    }
  }
  if (to == v1::TASK_STATE_BLOCKED) settle_queue_.push_back(&t);
  if (defer_settling_ == 0) SettleDependents();
}

v1::TaskState Scheduler::ReadyOrScheduled(TaskRecord& t) {
  const absl::Time not_before = FromProto(t.spec.not_before());
  if (not_before > Now() && not_before > t.next_run_time) t.next_run_time = not_before;
  return t.next_run_time > Now() ? v1::TASK_STATE_SCHEDULED : v1::TASK_STATE_PENDING;
}

v1::TaskState Scheduler::NextWaitingState(TaskRecord& t) {
  if (!DepsMet(t) || (DepFailed(t) && CancelsOnUpstreamFailure(t))) return v1::TASK_STATE_BLOCKED;
  return ReadyOrScheduled(t);
}

// ---------------------------------------------------------------------------
// Dependencies.

bool Scheduler::CancelsOnUpstreamFailure(const TaskRecord& t) {
  return t.spec.on_upstream_failure() != v1::UPSTREAM_FAILURE_RUN;
}

bool Scheduler::DepsMet(const TaskRecord& t) {
  return CancelsOnUpstreamFailure(t) ? t.deps_unsucceeded == 0 : t.deps_unfinished == 0;
}

void Scheduler::SettleDependents() {
  if (settling_) return;  // the loop below is running further up the stack
  settling_ = true;
  while (!settle_queue_.empty()) {
    TaskRecord* t = settle_queue_.front();
    settle_queue_.pop_front();
    Settle(*t);
  }
  settling_ = false;
}

void Scheduler::Settle(TaskRecord& t) {
  switch (t.state) {
    case v1::TASK_STATE_BLOCKED:
      if (DepFailed(t) && CancelsOnUpstreamFailure(t)) {
        const TaskRecord* failed = nullptr;
        for (const TaskRecord* d : t.deps) {
          if (ClassOf(d->state) == DepClass::kFailed) {
            failed = d;
            break;
          }
        }
        start_deadlines_.Remove(t.id());
        Transition(
            t, v1::TASK_STATE_CANCELLED,
            absl::StrCat("upstream task ", failed->id(),
                         failed->state == v1::TASK_STATE_FAILED ? " failed" : " was cancelled"));
      } else if (DepsMet(t)) {
        const v1::TaskState to = ReadyOrScheduled(t);
        Transition(t, to,
                   t.deps.size() == 1
                       ? absl::StrCat("dependency ", t.deps[0]->id(), " ",
                                      t.deps[0]->state == v1::TASK_STATE_SUCCEEDED ? "succeeded"
                                                                                   : "finished")
                       : absl::StrCat("all ", t.deps.size(), " dependencies ",
                                      DepFailed(t) ? "finished" : "succeeded"));
      }
      break;
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
      // Released earlier, but a dependency was reset or retried since.
      if (!DepsMet(t)) Transition(t, v1::TASK_STATE_BLOCKED, BlockedReason(t));
      break;
    default:
      break;  // in flight or done: a dependency changing later does not recall it
  }
}

std::string Scheduler::BlockedReason(const TaskRecord& t) const {
  std::vector<std::string> open;
  int n = 0;
  for (const TaskRecord* d : t.deps) {
    const bool waits = CancelsOnUpstreamFailure(t) ? d->state != v1::TASK_STATE_SUCCEEDED
                                                   : ClassOf(d->state) == DepClass::kOpen;
    if (!waits) continue;
    if (++n <= 3) open.push_back(d->id());
  }
  std::string why = absl::StrCat("waiting for ", absl::StrJoin(open, ", "));
  if (n > 3) absl::StrAppend(&why, " and ", n - 3, " more");
  return why;
}

void Scheduler::LinkDependencies(TaskRecord& t) {
  t.deps.reserve(t.spec.depends_on_size());
  for (const std::string& id : t.spec.depends_on()) {
    TaskRecord* d = Mutable(id);
    TASKGRID_CHECK(d != nullptr, absl::StrCat("task ", t.id(), ": unknown dependency ", id));
    t.deps.push_back(d);
    d->dependents.push_back(&t);
    if (ClassOf(d->state) != DepClass::kSucceeded) ++t.deps_unsucceeded;
    if (ClassOf(d->state) == DepClass::kOpen) ++t.deps_unfinished;
  }
}

absl::Status Scheduler::CheckDependencies(
    const std::vector<v1::TaskSpec>& specs, const std::vector<size_t>& fresh,
    const absl::flat_hash_map<std::string, size_t>& index) const {
  // Unknown names first.
  for (size_t i : fresh) {
    const v1::TaskSpec& spec = specs[i];
    for (int j = 0; j < spec.depends_on_size(); ++j) {
      const std::string& dep = spec.depends_on(j);
      if (!index.contains(dep) && Find(dep) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("tasks[", i, "].depends_on[", j, "] names task \"", dep,
                         "\", which is neither in this request nor an existing task"));
      }
    }
  }
  // Cycles can only run through new tasks (an existing task never depends
  // on a new one). Kahn's algorithm over the new tasks of the request.
  absl::flat_hash_map<size_t, int> indegree;  // request index -> new deps not yet done
  absl::flat_hash_map<size_t, std::vector<size_t>> dependents;
  const absl::flat_hash_set<size_t> is_fresh(fresh.begin(), fresh.end());
  for (size_t i : fresh) {
    int& n = indegree[i];
    for (const std::string& dep : specs[i].depends_on()) {
      auto it = index.find(dep);
      if (it == index.end() || !is_fresh.contains(it->second)) continue;
      ++n;
      dependents[it->second].push_back(i);
    }
  }
  std::vector<size_t> ready;
  for (const auto& [i, n] : indegree) {
    if (n == 0) ready.push_back(i);
  }
  size_t done = 0;
  while (!ready.empty()) {
    const size_t i = ready.back();
    ready.pop_back();
    ++done;
    auto it = dependents.find(i);
    if (it == dependents.end()) continue;
    for (size_t d : it->second) {
      if (--indegree[d] == 0) ready.push_back(d);
    }
  }
  if (done == fresh.size()) return absl::OkStatus();
  // Every task left waits on another one left: walk from one of them along
  // such dependencies until a task repeats; from there on it is a cycle.
  size_t start = 0;
  for (size_t i : fresh) {
    if (indegree[i] > 0) {
      start = i;
      break;
    }
  }
  std::vector<size_t> path;
  absl::flat_hash_map<size_t, size_t> pos;
  size_t cur = start;
  while (!pos.contains(cur)) {
    pos[cur] = path.size();
    path.push_back(cur);
    for (const std::string& dep : specs[cur].depends_on()) {
      auto it = index.find(dep);
      if (it != index.end() && is_fresh.contains(it->second) && indegree[it->second] > 0) {
        cur = it->second;
        break;
      }
    }
  }
  std::vector<std::string> names;
  const size_t first = pos[cur];
  const size_t len = path.size() - first;
  for (size_t k = first; k < path.size() && names.size() < 20; ++k) {
    names.push_back(specs[path[k]].id());
  }
  if (len > 20) names.push_back(absl::StrCat("... (", len - 20, " more)"));
  names.push_back(specs[cur].id());
  return absl::InvalidArgumentError(
      absl::StrCat("depends_on forms a cycle of ", len, " task", len == 1 ? "" : "s", ": ",
                   absl::StrJoin(names, " -> "), " (each depends on the next)"));
}

// ---------------------------------------------------------------------------
// Recovery.

absl::Status Scheduler::Restore(std::vector<TaskRecord> tasks, int64_t last_revision,
                                int64_t oldest_revision) {
  RETURN_IF_ERROR(BeginRestore(tasks.size(), last_revision, oldest_revision));
  std::vector<std::unique_ptr<TaskRecord>> owned;
  owned.reserve(tasks.size());
  for (TaskRecord& t : tasks) owned.push_back(std::make_unique<TaskRecord>(std::move(t)));
  RETURN_IF_ERROR(RestoreTasks(&owned));
  return FinishRestore();
}

absl::Status Scheduler::BeginRestore(size_t expected_tasks, int64_t last_revision,
                                     int64_t oldest_revision) {
  if (!tasks_.empty() || restoring_ != nullptr) {
    return absl::FailedPreconditionError("Restore needs an empty scheduler");
  }
  restoring_ = std::make_unique<Restoring>();
  tasks_.reserve(expected_tasks);
  last_revision_ = last_revision;
  oldest_revision_ = std::max<int64_t>(oldest_revision, 1);
  // History from before the restart counts as of now for retention.
  if (last_revision > 0) revision_marks_.push_back({last_revision, Now()});
  return absl::OkStatus();
}

absl::Status Scheduler::RestoreTasks(std::vector<std::unique_ptr<TaskRecord>>* tasks) {
  if (restoring_ == nullptr)
    return absl::FailedPreconditionError("RestoreTasks before BeginRestore");
  for (std::unique_ptr<TaskRecord>& owned : *tasks) {
    TaskRecord& t = *owned;
    t.placement_class = PlacementClass(t.spec.placement());
    if (!tasks_.emplace(t.id(), std::move(owned)).second) {
      return absl::DataLossError(absl::StrCat("task ", t.id(), " is stored twice"));
    }
    by_seq_.emplace_hint(by_seq_.end(), t.seq, &t);
    next_seq_ = std::max(next_seq_, t.seq + 1);
    ++counts_[t.queue()][t.state];
    if (!t.spec.depends_on().empty()) restoring_->with_deps.push_back(&t);
    if (IsInFlight(t.state)) restoring_->in_flight.push_back(&t);
    if (!IsTerminal(t.state) && !IsInFlight(t.state)) ArmStartDeadline(t, t.create_time);
    if (t.state == v1::TASK_STATE_PENDING) {
      AddReady(t);
    } else if (t.state == v1::TASK_STATE_SCHEDULED) {
      scheduled_.insert({t.next_run_time, t.seq, &t});
    }
    if (!t.job_id().empty()) {
      auto& j = jobs_[t.job_id()];
      if (!j) {
        j = std::make_unique<JobRecord>();
        j->id = t.job_id();
        j->seq = t.seq;
        j->create_time = t.create_time;
        jobs_by_seq_[j->seq] = j.get();
      }
      t.job = j.get();
      j->tasks.push_back(&t);
      ++j->counts[t.state];
      j->update_time = std::max(j->update_time, t.update_time);
    }
  }
  tasks->clear();
  return absl::OkStatus();
}

absl::Status Scheduler::FinishRestore() {
  if (restoring_ == nullptr)
    return absl::FailedPreconditionError("FinishRestore before BeginRestore");
  const std::unique_ptr<Restoring> r = std::move(restoring_);
  std::vector<TaskRecord*>& with_deps = r->with_deps;
  const absl::Duration grace_end = Mono() + opts_.reconnect_grace;
  // Dependencies may name tasks stored later (a request lists them in any
  // order): link once every task is back, in submit order.
  const auto by_seq = [](const TaskRecord* x, const TaskRecord* y) { return x->seq < y->seq; };
  std::sort(with_deps.begin(), with_deps.end(), by_seq);
  for (TaskRecord* t : with_deps) {
    for (const std::string& id : t->spec.depends_on()) {
      if (Find(id) == nullptr) {
        return absl::DataLossError(
            absl::StrCat("task ", t->id(), " depends on ", id, ", which is not stored"));
      }
    }
    LinkDependencies(*t);
  }
  for (TaskRecord* tp : r->in_flight) {
    TaskRecord& t = *tp;
    if (t.agent_id.empty()) {
      return absl::DataLossError(absl::StrCat("task ", t.id(), " is in flight with no agent"));
    }
    // A chain link still waiting on its agent for its predecessor (in
    // flight there too) holds no slot.
    if (t.deps.size() == 1 && IsInFlight(t.deps[0]->state) && t.deps[0]->agent_id == t.agent_id &&
        t.deps[0]->dependents.size() == 1 && t.state == v1::TASK_STATE_DISPATCHED) {
      t.chained_after = t.deps[0];
      t.deps[0]->chain_next = &t;
    }
    // The agent is not connected yet: it gets the grace window to come
    // back and claim its attempts; after it they are re-queued.
    auto& a = agents_[t.agent_id];
    if (!a) {
      a = std::make_unique<AgentRecord>();
      a->id = t.agent_id;
      a->last_seen = Mono();
      agent_deadlines_.Set(a->id, grace_end);
    }
    a->tasks.insert(t.id());
    if (t.chained_after == nullptr) a->used += SlotsOf(t.spec.placement());
    if (t.chained_after == nullptr) {
      if (t.start_time == absl::InfinitePast()) {
        // Not accepted yet (DISPATCHED, or cancelled before it was): its
        // agent's Hello settles it; should the agent come back without
        // ever accepting it, the ack timeout still applies.
        task_deadlines_.Set(t.id(), grace_end + AckTimeout(t));
      } else if (const absl::Duration timeout = FromProto(t.spec.attempt_timeout());
                 timeout > absl::ZeroDuration()) {
        // Started: what is left of its attempt timeout, counted from the
        // stored start time, but never ending before its agent had the
        // grace to come back with a result it may hold.
        const absl::Duration left = std::max(t.start_time + timeout - Now(), absl::ZeroDuration());
        task_deadlines_.Set(t.id(),
                            std::max(grace_end, Mono() + left) + opts_.attempt_timeout_slack);
      }
    }
    a->slots = std::max(a->slots, a->used);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Client operations.

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
  if (job_id.empty()) job_id = NewJobId();
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
    }
    fresh.push_back(i);
    ++adds[spec.queue()];
  }
  if (absl::Status s = CheckDependencies(specs, fresh, seen); !s.ok()) return s;
  for (const auto& [queue, n] : adds) {
    RETURN_IF_ERROR(CheckRoom(queue, n, "this batch"));
  }

  // Ids for the tasks that gave none: never one an existing task or another
  // task of this request holds (a client may give an id of the generated
  // form; two records under one key would leave the indexes pointing at a
  // freed one).
  for (size_t i : fresh) {
    if (!specs[i].id().empty()) continue;
    std::string id = NewTaskId();
    while (seen.contains(id)) id = NewTaskId();
    specs[i].set_id(std::move(id));
  }

  const absl::Time now = Now();
  JobRecord* job = nullptr;
  if (job_id != nullptr) {
    auto owned = std::make_unique<JobRecord>();
    job = owned.get();
    job->id = *job_id;
    job->seq = next_seq_;
    job->create_time = now;
    job->update_time = now;
    job->tasks.reserve(fresh.size());
    jobs_by_seq_[job->seq] = job;
    jobs_.emplace(job->id, std::move(owned));
  }
  std::vector<const TaskRecord*> out(specs.size(), nullptr);
  std::vector<TaskRecord*> created;
  created.reserve(fresh.size());
  for (size_t i : fresh) {
    auto owned = std::make_unique<TaskRecord>();
    TaskRecord& t = *owned;
    t.spec = std::move(specs[i]);
    t.seq = next_seq_++;
    t.create_time = now;
    t.placement_class = PlacementClass(t.spec.placement());
    t.job = job;
    if (job != nullptr) job->tasks.push_back(&t);
    const bool inserted = tasks_.try_emplace(t.id(), std::move(owned)).second;
    TASKGRID_CHECK(inserted, absl::StrCat("task ", t.id(), " was created twice"));
    by_seq_[t.seq] = &t;
    created.push_back(&t);
    out[i] = &t;
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
                 to == v1::TASK_STATE_BLOCKED     ? BlockedReason(*t)
                 : to == v1::TASK_STATE_SCHEDULED ? "waiting for not_before"
                                                  : "submitted");
      ArmStartDeadline(*t, now);
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
      return;
    case v1::TASK_STATE_DISPATCHED:
    case v1::TASK_STATE_RUNNING: {
      t.pause_requested = false;  // cancel wins over a pause under way
      const bool waiting = t.chained_after != nullptr;
      Transition(t, v1::TASK_STATE_CANCELLING,
                 absl::StrCat("cancel requested; waiting for agent ", t.agent_id));
      SendCancel(t);
      if (waiting) {
        // A chain link that has not started: the agent drops it on the
        // Cancel without a word, so it ends here and now.
        v1::TaskResult r;
        r.set_outcome(v1::OUTCOME_CANCELLED);
        r.set_exit_code(-1);
        r.set_error("cancelled before it started");
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
  RETURN_IF_ERROR(CheckRoom(t->queue(), 1, absl::StrCat("retrying \"", id, "\"")));
  t->next_run_time = absl::InfinitePast();
  const v1::TaskState to = NextWaitingState(*t);
  Transition(*t, to,
             to == v1::TASK_STATE_BLOCKED ? "retried by request; " + BlockedReason(*t)
                                          : "retried by request");
  ArmStartDeadline(*t, Now());
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
  RETURN_IF_ERROR(CheckRoom(t->queue(), 1, absl::StrCat("resetting \"", id, "\"")));
  // Like new: a fresh budget of attempts and no history. The attempt
  // counter keeps rising, though: (task, attempt) fences agent messages,
  // and an attempt from before the reset may still be out there (an agent
  // frozen past its lease) with a result that must not end the new run.
  t->attempt_base = t->attempt;
  t->attempts.clear();
  t->attempts_dropped = 0;
  t->interrupted_dropped = 0;
  t->result.Clear();
  t->next_run_time = absl::InfinitePast();
  effects_.batch.clear_attempts.push_back(t->id());
  const v1::TaskState to = NextWaitingState(*t);
  Transition(
      *t, to,
      to == v1::TASK_STATE_BLOCKED ? "reset by request; " + BlockedReason(*t) : "reset by request");
  ArmStartDeadline(*t, Now());
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::Pause(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
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
      if (t->chained_after != nullptr) {
        // A chain link that has not started: the agent drops it silently.
        v1::TaskResult r;
        r.set_outcome(v1::OUTCOME_CANCELLED);
        r.set_exit_code(-1);
        r.set_error("paused before it started");
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
  auto it = jobs_.find(id);
  if (it == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job \"", id, "\" does not exist"));
  return it->second.get();
}

const JobRecord* Scheduler::FindJob(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
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
  absl::btree_map<std::string, int64_t> adds;  // in name order: the same error each time
  for (const TaskRecord* t : retry) ++adds[t->queue()];
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
    }
  }
  Dispatch();
  return j;
}

v1::JobState Scheduler::JobStateOf(const JobRecord& j) {
  for (int s = 1; s < kNumStates; ++s) {
    if (j.counts[s] > 0 && !IsTerminal(static_cast<v1::TaskState>(s))) {
      return v1::JOB_STATE_RUNNING;
    }
  }
  if (j.counts[v1::TASK_STATE_FAILED] > 0) return v1::JOB_STATE_FAILED;
  if (j.counts[v1::TASK_STATE_CANCELLED] > 0) return v1::JOB_STATE_CANCELLED;
  return v1::JOB_STATE_SUCCEEDED;
}

void Scheduler::DescribeJob(const JobRecord& j, v1::Job* out) const {
  out->set_id(j.id);
  out->set_state(JobStateOf(j));
  out->set_task_count(static_cast<int32_t>(j.tasks.size()));
  for (int s = 1; s < kNumStates; ++s) {
    if (j.counts[s] != 0) {
      (*out->mutable_counts())[StateName(static_cast<v1::TaskState>(s))] = j.counts[s];
    }
  }
  SetTimestamp(j.create_time, out->mutable_create_time());
  SetTimestamp(j.update_time, out->mutable_update_time());
}

JobListPage Scheduler::ListJobs(const JobListFilter& filter) const {
  JobListPage page;
  const absl::flat_hash_set<int> states(filter.states.begin(), filter.states.end());
  for (auto it = jobs_by_seq_.upper_bound(filter.after_seq); it != jobs_by_seq_.end(); ++it) {
    const JobRecord* j = it->second;
    if (!states.empty() && !states.contains(JobStateOf(*j))) continue;
    if (static_cast<int>(page.jobs.size()) == filter.page_size) {
      page.next_after_seq = page.jobs.back()->seq;
      break;
    }
    page.jobs.push_back(j);
  }
  return page;
}

const TaskRecord* Scheduler::Find(const std::string& id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

void Scheduler::Describe(const TaskRecord& t, v1::Task* out,
                         const std::vector<const AgentRecord*>* agents) const {
  ToTaskProto(t, out);
  out->set_max_attempts(MaxAttempts(t));
  out->set_attempts_used(AttemptsUsed(t));
  out->set_pause_requested(t.pause_requested);
  if (t.state == v1::TASK_STATE_PENDING) {
    // Placeable tasks keep their stored reason (e.g. why the last attempt
    // failed); the others say what no agent offers.
    const std::string why =
        WhyUnplaceable(t.spec.placement(), agents != nullptr ? *agents : Agents());
    if (!why.empty()) out->set_reason("waiting: " + why);
  } else if (t.state == v1::TASK_STATE_BLOCKED) {
    out->set_reason(BlockedReason(t));
  }
}

std::vector<const AgentRecord*> Scheduler::Agents() const {
  std::vector<const AgentRecord*> out;
  out.reserve(agents_.size());
  for (const auto& [id, a] : agents_) out.push_back(a.get());
  std::sort(out.begin(), out.end(),
            [](const AgentRecord* x, const AgentRecord* y) { return x->id < y->id; });
  return out;
}

void Scheduler::DescribeAgent(const AgentRecord& a, v1::Agent* out) const {
  out->set_id(a.id);
  for (const auto& [k, v] : a.labels) (*out->mutable_labels())[k] = v;
  out->set_slots(a.slots);
  out->set_slots_used(a.used);
  std::vector<std::string> running(a.tasks.begin(), a.tasks.end());
  std::sort(running.begin(), running.end());
  for (std::string& id : running) out->add_running(std::move(id));
  out->set_state(!a.connected() ? v1::AGENT_STATE_LOST
                 : a.draining   ? v1::AGENT_STATE_DRAINING
                                : v1::AGENT_STATE_ACTIVE);
  SetTimestamp(a.last_seen_time, out->mutable_last_heartbeat_time());
  SetTimestamp(a.connect_time, out->mutable_connect_time());
  out->set_version(a.version);
}

v1::ClusterStats Scheduler::ClusterStats() const {
  v1::ClusterStats st;
  for (const auto& [id, a] : agents_) {
    if (!a->connected()) {
      st.set_agents_lost(st.agents_lost() + 1);
      continue;
    }
    if (a->draining) {
      st.set_agents_draining(st.agents_draining() + 1);
    } else {
      st.set_agents_active(st.agents_active() + 1);
    }
    st.set_slots_total(st.slots_total() + a->slots);
    st.set_slots_used(st.slots_used() + a->used);
  }
  st.set_stale_messages(stale_messages_);
  *st.mutable_heartbeat_interval() = ToProto(heartbeat_interval());
  for (const auto& [queue, counts] : counts_) {
    for (int s = 1; s < kNumStates; ++s) {
      if (counts[s] != 0) {
        (*st.mutable_tasks())[StateName(static_cast<v1::TaskState>(s))] += counts[s];
      }
    }
  }
  return st;
}

absl::StatusOr<const AgentRecord*> Scheduler::Drain(const std::string& agent_id) {
  if (agent_id.empty()) return absl::InvalidArgumentError("id is empty");
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) {
    return absl::NotFoundError(absl::StrCat("agent \"", agent_id, "\" is not known"));
  }
  AgentRecord& a = *it->second;
  if (!a.draining) {
    a.draining = true;
    SendDrain(a);
  }
  return &a;
}

void Scheduler::SendDrain(const AgentRecord& a) {
  v1::SchedulerMessage msg;
  msg.mutable_drain();
  Send(a.conn, std::move(msg));
}

void Scheduler::PersistRow(const TaskRecord& t) {
  effects_.batch.tasks.push_back(ToRow(t, /*insert=*/false));
}

void Scheduler::ArmStartDeadline(const TaskRecord& t, absl::Time from) {
  if (!t.spec.has_schedule_timeout()) return;  // most tasks: restore asks for each
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

void Scheduler::TrimHistory(TaskRecord& t) {
  const size_t keep = static_cast<size_t>(std::max(opts_.max_attempt_history, 1));
  if (t.attempts.size() <= keep) return;
  const size_t drop = t.attempts.size() - keep;
  for (size_t i = 0; i < drop; ++i) {
    const v1::Attempt& a = t.attempts[i];
    ++t.attempts_dropped;
    if (a.interrupted() && a.attempt() > t.attempt_base) ++t.interrupted_dropped;
  }
  t.attempts.erase(t.attempts.begin(), t.attempts.begin() + static_cast<ptrdiff_t>(drop));
  effects_.batch.trim_attempts.emplace_back(t.id(), t.attempts.front().attempt());
}

int32_t Scheduler::AttemptsUsed(const TaskRecord& t) const {
  int32_t interrupted = 0;
  for (const v1::Attempt& a : t.attempts) {
    interrupted += a.attempt() > t.attempt_base && a.interrupted() ? 1 : 0;
  }
  return t.attempt - t.attempt_base - interrupted - t.interrupted_dropped;
}

TaskRecord* Scheduler::Mutable(const std::string& id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

absl::StatusOr<TaskRecord*> Scheduler::Lookup(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  TaskRecord* t = Mutable(id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  return t;
}

ListPage Scheduler::List(const ListFilter& filter) const {
  ListPage page;
  const absl::flat_hash_set<int> states(filter.states.begin(), filter.states.end());
  // Returns false when the page is full.
  auto take = [&](const TaskRecord* t) {
    if (!filter.queue.empty() && t->queue() != filter.queue) return true;
    if (!states.empty() && !states.contains(t->state)) return true;
    if (static_cast<int>(page.tasks.size()) == filter.page_size) {
      page.next_after_seq = page.tasks.back()->seq;
      return false;
    }
    page.tasks.push_back(t);
    return true;
  };
  if (!filter.job_id.empty()) {
    const JobRecord* j = FindJob(filter.job_id);
    if (j == nullptr) return page;
    auto it = std::upper_bound(j->tasks.begin(), j->tasks.end(), filter.after_seq,
                               [](int64_t seq, const TaskRecord* t) { return seq < t->seq; });
    for (; it != j->tasks.end(); ++it) {
      if (!take(*it)) break;
    }
    return page;
  }
  for (auto it = by_seq_.upper_bound(filter.after_seq); it != by_seq_.end(); ++it) {
    if (!take(it->second)) break;
  }
  return page;
}

std::vector<v1::QueueStats> Scheduler::Stats(const std::string& queue) const {
  std::map<std::string, v1::QueueStats> by_name;
  auto add = [&](const std::string& name) {
    v1::QueueStats& qs = by_name[name];
    qs.set_queue(name);
    qs.set_max_length(opts_.QueueMaxLength(name));
    qs.set_length(QueueLength(name));
    auto it = counts_.find(name);
    if (it == counts_.end()) return;
    for (int s = 1; s < kNumStates; ++s) {
      if (it->second[s] != 0) {
        (*qs.mutable_counts())[StateName(static_cast<v1::TaskState>(s))] = it->second[s];
      }
    }
  };
  if (!queue.empty()) {
    add(queue);
  } else {
    for (const auto& [name, unused] : counts_) add(name);
    for (const auto& [name, unused] : opts_.queue_max_length) add(name);
  }
  std::vector<v1::QueueStats> out;
  for (auto& [name, qs] : by_name) out.push_back(std::move(qs));
  return out;
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
  auto it = counts_.find(queue);
  if (it == counts_.end()) return 0;
  int64_t n = 0;
  for (int s = 1; s < kNumStates; ++s) {
    if (!IsTerminal(static_cast<v1::TaskState>(s))) n += it->second[s];
  }
  return n;
}

int32_t Scheduler::MaxAttempts(const TaskRecord& t) const { return MaxAttemptsOf(t, opts_); }

absl::Duration Scheduler::AckTimeout(const TaskRecord& t) const {
  const absl::Duration d = FromProto(t.spec.ack_timeout());
  return d > absl::ZeroDuration() ? d : opts_.default_ack_timeout;
}

std::string Scheduler::NewJobId() {
  for (;;) {
    std::string id = absl::StrFormat("j%014d-%06d", absl::ToUnixMillis(clock_->Now()),
                                     ++id_counter_ % 1'000'000);
    if (!jobs_.contains(id)) return id;
  }
}

std::string Scheduler::NewTaskId() {
  // Time-ordered: sorts by creation time as text.
  for (;;) {
    std::string id = absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(clock_->Now()),
                                     ++id_counter_ % 1'000'000);
    if (!tasks_.contains(id)) return id;
  }
}

// ---------------------------------------------------------------------------
// Dispatch.

TaskRecord* Scheduler::ChainSuccessor(const TaskRecord& cur) const {
  if (cur.dependents.size() != 1) return nullptr;
  TaskRecord* d = cur.dependents[0];
  if (d->state != v1::TASK_STATE_BLOCKED || d->deps.size() != 1 || !CancelsOnUpstreamFailure(*d) ||
      d->placement_class != cur.placement_class || d->pause_requested) {
    return nullptr;
  }
  const absl::Time now = Now();
  if (FromProto(d->spec.not_before()) > now || d->next_run_time > now) return nullptr;
  return d;
}

bool Scheduler::FillAssignment(const TaskRecord& t, const TaskRecord* run_after, v1::Assignment* as,
                               int64_t* input_bytes) const {
  *input_bytes = 0;
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result.outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    *input_bytes += static_cast<int64_t>(OutputOf(*d).size());
  }
  if (*input_bytes > opts_.max_input_bytes) return false;
  as->set_task_id(t.id());
  as->set_queue(t.queue());
  *as->mutable_steps() = t.spec.steps();
  as->set_payload(t.spec.payload());
  *as->mutable_attempt_timeout() = t.spec.attempt_timeout();
  as->set_slots(SlotsOf(t.spec.placement()));
  if (run_after != nullptr) as->set_run_after(run_after->id());
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result.outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    (*as->mutable_inputs())[d->id()] = OutputOf(*d);
  }
  return true;
}

void Scheduler::AddReady(TaskRecord& t) {
  std::unique_ptr<ReadyClass>& slot = ready_[t.placement_class];
  if (slot == nullptr) {
    slot = std::make_unique<ReadyClass>();
    slot->key = t.placement_class;
    slot->placement = t.spec.placement();
  }
  ReadyClass& c = *slot;
  const ReadyKey key = ReadyKeyOf(t);
  const bool new_head = c.tasks.empty() || key < *c.tasks.begin();
  if (new_head && c.where == ReadyClass::Where::kHeads) {
    if (!c.tasks.empty()) heads_.erase({*c.tasks.begin(), &c});
    heads_.insert({key, &c});
  }
  c.tasks.insert(key);
}

void Scheduler::RemoveReady(const TaskRecord& t) {
  auto it = ready_.find(t.placement_class);
  TASKGRID_CHECK(it != ready_.end(), absl::StrCat("PENDING task ", t.id(), " has no ready class"));
  ReadyClass& c = *it->second;
  const ReadyKey key = ReadyKeyOf(t);
  const bool was_head = *c.tasks.begin() == key;
  if (was_head && c.where == ReadyClass::Where::kHeads) heads_.erase({key, &c});
  c.tasks.erase(key);
  if (c.tasks.empty()) {
    parked_.erase(&c);
    ready_.erase(it);
    return;
  }
  if (was_head && c.where == ReadyClass::Where::kHeads) heads_.insert({*c.tasks.begin(), &c});
}

void Scheduler::BackToHeads(ReadyClass& c) {
  c.where = ReadyClass::Where::kHeads;
  heads_.insert({*c.tasks.begin(), &c});
}

bool Scheduler::AnyAgentCouldTake(const v1::Placement& p) const {
  auto could = [&](const AgentRecord& a) { return a.takes_work() && Matches(p, a); };
  if (!p.agent_ids().empty()) {
    // Pinned: only the named agents need looking at.
    return std::any_of(p.agent_ids().begin(), p.agent_ids().end(), [&](const std::string& id) {
      auto it = agents_.find(id);
      return it != agents_.end() && could(*it->second);
    });
  }
  return std::any_of(agents_.begin(), agents_.end(),
                     [&](const auto& e) { return could(*e.second); });
}

void Scheduler::Dispatch() {
  // Called on every tick: nothing ready (or only classes no agent could
  // take) must cost nothing, however many agents there are.
  if (heads_.empty()) return;
  std::vector<AgentRecord*> agents;
  for (auto& [id, a] : agents_) {
    if (a->takes_work() && a->free_slots() > 0) agents.push_back(a.get());
  }
  if (agents.empty()) return;
  // Per agent, Assign messages of about kAssignBytes each (a chain is never
  // split between two).
  constexpr size_t kAssignBytes = 4 << 20;
  constexpr size_t kMaxAssignBytes = 32 << 20;
  absl::flat_hash_map<AgentRecord*, std::vector<std::pair<v1::Assign, size_t>>> assigns;
  std::vector<std::string> aside;  // classes no agent has room for now
  const absl::Duration mono = Mono();
  const absl::Time now = Now();
  while (!heads_.empty()) {
    auto [key, cls] = *heads_.begin();
    TaskRecord& t = *std::get<2>(key);
    ++placement_attempts_;
    AgentRecord* a = Pick(cls->placement, agents);
    if (a == nullptr) {
      heads_.erase(heads_.begin());
      if (AnyAgentCouldTake(cls->placement)) {
        cls->where = ReadyClass::Where::kAside;
        aside.push_back(cls->key);
      } else {
        cls->where = ReadyClass::Where::kParked;
        parked_.insert(cls);
      }
      continue;
    }
    v1::Assignment head;
    int64_t input_bytes = 0;
    if (!FillAssignment(t, nullptr, &head, &input_bytes)) {
      Transition(t, v1::TASK_STATE_FAILED,
                 absl::StrCat("the outputs of its dependencies total ", input_bytes,
                              " bytes; the limit is ", opts_.max_input_bytes));
      start_deadlines_.Remove(t.id());
      continue;
    }
    head.set_attempt(++t.attempt);
    t.agent_id = a->id;
    t.dispatch_time = now;
    t.start_time = absl::InfinitePast();
    a->used += SlotsOf(t.spec.placement());
    a->tasks.insert(t.id());
    a->last_assigned = ++assign_counter_;
    task_deadlines_.Set(t.id(), mono + AckTimeout(t));
    Transition(t, v1::TASK_STATE_DISPATCHED,
               absl::StrCat("attempt ", t.attempt, " dispatched to agent ", a->id));
    auto& msgs = assigns[a];
    if (msgs.empty() || msgs.back().second >= kAssignBytes) msgs.emplace_back();
    msgs.back().second += head.ByteSizeLong();
    *msgs.back().first.add_tasks() = std::move(head);
    if (!a->chains) continue;
    // The chain below t goes along, each link to start when the one
    // before it succeeded there.
    TaskRecord* cur = &t;
    for (int len = 1; len < opts_.max_chain_length; ++len) {
      TaskRecord* d = ChainSuccessor(*cur);
      if (d == nullptr) break;
      v1::Assignment link;
      FillAssignment(*d, cur, &link, &input_bytes);  // no inputs but cur's
      // The rest of the chain goes in a later Assign, once cur succeeded:
      // one message stays well under what an agent accepts (64 MiB).
      if (msgs.back().second + link.ByteSizeLong() > kMaxAssignBytes) break;
      link.set_attempt(++d->attempt);
      d->agent_id = a->id;
      d->dispatch_time = now;
      d->start_time = absl::InfinitePast();
      a->tasks.insert(d->id());
      cur->chain_next = d;
      d->chained_after = cur;
      Transition(*d, v1::TASK_STATE_DISPATCHED,
                 absl::StrCat("attempt ", d->attempt, " dispatched to agent ", a->id,
                              ", to run after ", cur->id()));
      msgs.back().second += link.ByteSizeLong();
      *msgs.back().first.add_tasks() = std::move(link);
      cur = d;
    }
  }
  for (const std::string& k : aside) {
    auto it = ready_.find(k);  // emptied meanwhile: gone
    if (it == ready_.end() || it->second->where != ReadyClass::Where::kAside) continue;
    BackToHeads(*it->second);
  }
  for (auto& [a, msgs] : assigns) {
    for (auto& [assign, bytes] : msgs) {
      v1::SchedulerMessage msg;
      *msg.mutable_assign() = std::move(assign);
      Send(a->conn, std::move(msg));
    }
  }
}

void Scheduler::FinishAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted,
                              absl::Duration requeue_after) {
  const bool waiting = t.chained_after != nullptr;
  if (waiting) {
    // Never started: it says nothing about the task.
    t.chained_after->chain_next = nullptr;
    t.chained_after = nullptr;
    interrupted = true;
  }
  TaskRecord* next = std::exchange(t.chain_next, nullptr);
  const std::string agent = t.agent_id;
  EndAttempt(t, std::move(result), interrupted, /*holds_slot=*/!waiting, requeue_after);
  if (next == nullptr) return;
  next->chained_after = nullptr;
  auto ait = agents_.find(agent);
  if (!waiting && t.state == v1::TASK_STATE_SUCCEEDED && IsInFlight(next->state) &&
      next->agent_id == agent && ait != agents_.end()) {
    // The next link starts on the agent now, in the slot t freed: from here
    // on it is an ordinary dispatched attempt.
    ait->second->used += SlotsOf(next->spec.placement());
    task_deadlines_.Set(next->id(), Mono() + AckTimeout(*next));
    if (next->link_started) ImpliedAccept(*ait->second, *next);
    return;
  }
  // t did not succeed: the links after it will not start (the agent drops
  // them without a word). End them here, first unlinking them all.
  std::vector<TaskRecord*> rest;
  for (TaskRecord* p = next; p != nullptr;) {
    rest.push_back(p);
    TaskRecord* n = std::exchange(p->chain_next, nullptr);
    if (n != nullptr) n->chained_after = nullptr;
    p = n;
  }
  for (TaskRecord* p : rest) {
    if (!IsInFlight(p->state) || p->agent_id != agent) continue;
    SendCancel(*p);
    v1::TaskResult r;
    r.set_outcome(v1::OUTCOME_CANCELLED);
    r.set_exit_code(-1);
    r.set_error(absl::StrCat("not started: ", t.id(), " before it in the chain did not succeed"));
    EndAttempt(*p, std::move(r), /*interrupted=*/true, /*holds_slot=*/false);
  }
}

void Scheduler::EndHeld(AgentRecord& a, const std::vector<std::string>& ids,
                        const v1::TaskResult& result) {
  for (const std::string& id : ids) {
    TaskRecord* t = Mutable(id);
    // Ending one task may already have ended the chain links behind it.
    if (t == nullptr || !IsInFlight(t->state) || t->agent_id != a.id) continue;
    FinishAttempt(*t, result);
  }
}

void Scheduler::EndAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted, bool holds_slot,
                           absl::Duration requeue_after) {
  TASKGRID_CHECK(IsInFlight(t.state), absl::StrCat("task ", t.id(), " is not in flight"));
  auto it = agents_.find(t.agent_id);
  TASKGRID_CHECK(it != agents_.end(), absl::StrCat("task ", t.id(), ": unknown agent"));
  AgentRecord& a = *it->second;
  if (holds_slot) a.used -= SlotsOf(t.spec.placement());
  a.tasks.erase(t.id());
  task_deadlines_.Remove(t.id());

  t.link_started = false;
  const bool pausing = t.pause_requested;
  t.pause_requested = false;
  // A pause that stopped the attempt interrupts it, like a drain's release.
  interrupted |= pausing && result.outcome() == v1::OUTCOME_CANCELLED;
  v1::Attempt done;
  done.set_attempt(t.attempt);
  done.set_agent_id(t.agent_id);
  SetTimestamp(t.dispatch_time, done.mutable_dispatch_time());
  // Unset when it never started (e.g. a chain link whose predecessor failed).
  if (t.start_time != absl::InfinitePast()) SetTimestamp(t.start_time, done.mutable_start_time());
  SetTimestamp(Now(), done.mutable_finish_time());
  *done.mutable_result() = result;
  done.mutable_result()->clear_output();  // t.result keeps it; history need not
  done.set_interrupted(interrupted);
  effects_.batch.attempts.push_back(ToAttemptRow(t.id(), done));
  t.attempts.push_back(std::move(done));
  TrimHistory(t);
  t.result = std::move(result);
  const std::string agent = std::move(t.agent_id);
  t.agent_id.clear();
  t.dispatch_time = absl::InfinitePast();
  t.start_time = absl::InfinitePast();

  const AfterAttempt after = DecideAfterAttempt(
      t, absl::StrCat("attempt ", t.attempt, " on agent ", agent),
      {interrupted, pausing, requeue_after}, AttemptsUsed(t), opts_, Now(), [this] {
        return opts_.random ? opts_.random() : std::uniform_real_distribution<double>(0, 1)(rng_);
      });
  switch (after.next) {
    case AfterAttempt::Next::kSucceeded:
      Transition(t, v1::TASK_STATE_SUCCEEDED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kCancelled:
      Transition(t, v1::TASK_STATE_CANCELLED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kPaused:
      Transition(t, v1::TASK_STATE_PAUSED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kFailed:
      Transition(t, v1::TASK_STATE_FAILED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kRequeue: {
      t.next_run_time = after.next_run_time;
      const v1::TaskState to = NextWaitingState(t);
      Transition(t, to,
                 absl::StrCat(after.reason, to == v1::TASK_STATE_BLOCKED
                                                ? "; not counted, " + BlockedReason(t)
                                                : "; re-queued, not counted"),
                 &agent);
      return;
    }
    case AfterAttempt::Next::kRetry:
      t.next_run_time = after.next_run_time;
      Transition(t, NextWaitingState(t), after.reason, &agent);
      return;
  }
}

// ---------------------------------------------------------------------------
// Agents.

void Scheduler::Send(uint64_t conn, v1::SchedulerMessage msg) {
  if (conn == 0) return;
  effects_.messages.push_back({conn, std::move(msg)});
}

void Scheduler::SendCancel(const TaskRecord& t) {
  auto it = agents_.find(t.agent_id);
  if (it == agents_.end()) return;
  v1::SchedulerMessage msg;
  msg.mutable_cancel()->set_task_id(t.id());
  msg.mutable_cancel()->set_attempt(t.attempt);
  Send(it->second->conn, std::move(msg));
}

absl::Status Scheduler::Connect(uint64_t conn, const v1::Hello& hello) {
  RETURN_IF_ERROR(ValidateHello(hello, opts_));
  if (by_conn_.contains(conn)) {
    return absl::FailedPreconditionError("hello was already sent on this stream");
  }
  auto& slot = agents_[hello.agent_id()];
  if (!slot) {
    slot = std::make_unique<AgentRecord>();
    slot->id = hello.agent_id();
  }
  AgentRecord& a = *slot;
  if (a.connected() && Mono() - a.last_seen < 2 * a.judged_interval()) {
    // The old stream is alive: a second agent with the same id, not a
    // reconnect. Taking over would make the two evict each other forever.
    return absl::AlreadyExistsError(
        absl::StrCat("agent \"", a.id, "\" is connected on another stream (heard from ",
                     absl::FormatDuration(absl::Trunc(Mono() - a.last_seen, absl::Milliseconds(1))),
                     " ago); give each agent its own --id"));
  }
  if (a.connected()) {
    // A reconnect that beat the old (silent) stream's end: the new one wins.
    by_conn_.erase(a.conn);
    effects_.close_conns.push_back(a.conn);
  }
  a.conn = conn;
  by_conn_[conn] = &a;
  a.lost = false;
  a.leaving = false;
  a.draining = hello.draining();
  a.version = hello.version();
  a.chains = hello.chains();
  a.labels = {hello.labels().begin(), hello.labels().end()};
  a.slots = hello.slots();
  a.last_seen = Mono();
  a.connect_time = Now();
  a.last_seen_time = a.connect_time;
  UpdateHeartbeatFactor();
  // Agents that cannot adapt keep the base interval, as before.
  a.adaptive_heartbeat = hello.adaptive_heartbeat();
  a.told_interval = a.adaptive_heartbeat ? heartbeat_interval() : opts_.heartbeat_interval;
  a.agent_interval = a.told_interval;              // it takes Welcome's at once
  a.silence_deadline = -absl::InfiniteDuration();  // a new stream
  ExtendSilenceDeadline(a);

  v1::SchedulerMessage welcome;
  v1::Welcome* w = welcome.mutable_welcome();
  w->set_session_id(absl::StrCat(a.id, "/", conn));
  *w->mutable_heartbeat_interval() = ToProto(a.told_interval);
  w->set_max_output_bytes(opts_.max_output_bytes);
  w->set_batches(true);
  // The agent stops its tasks itself before the grace ends and they move.
  *w->mutable_stop_on_lost_after() = ToProto(opts_.StopOnLostAfter());
  *w->mutable_heartbeat_lease() = ToProto(opts_.HeartbeatLeaseFor(a.told_interval));
  Send(conn, std::move(welcome));

  // Reconcile what the agent still runs with what it holds here.
  absl::flat_hash_map<std::string, const v1::AttemptRef*> running;
  for (const v1::AttemptRef& r : hello.running()) running[r.task_id()] = &r;
  const std::vector<std::string> held(a.tasks.begin(), a.tasks.end());
  std::vector<std::string> gone;
  for (const std::string& id : held) {
    TaskRecord& t = *Mutable(id);
    auto it = running.find(id);
    if (it != running.end() && it->second->attempt() == t.attempt) {
      const bool started = !it->second->waiting();
      running.erase(it);
      // Cancels and pauses are durable: said again until the agent confirms.
      if (t.state == v1::TASK_STATE_CANCELLING || t.pause_requested) SendCancel(t);
      // Listed as started: its Accept may have been lost with the old stream.
      if (started && t.state == v1::TASK_STATE_DISPATCHED) {
        if (t.chained_after == nullptr) {
          ImpliedAccept(a, t);
        } else {
          // A link cannot start before its predecessor succeeded: that
          // Result is on its way (resent), and the link runs already.
          t.link_started = true;
        }
      }
      continue;
    }
    gone.push_back(id);
  }
  EndHeld(a, gone, LostResult(absl::StrCat("agent ", a.id, " came back without it")));
  for (const auto& [id, ref] : running) {
    const int32_t attempt = ref->attempt();
    // Not the live attempt here: the agent must stop it.
    v1::SchedulerMessage msg;
    msg.mutable_cancel()->set_task_id(id);
    msg.mutable_cancel()->set_attempt(attempt);
    Send(conn, std::move(msg));
  }
  // Classes no agent could take until now: this one may.
  if (a.takes_work()) {
    for (auto it = parked_.begin(); it != parked_.end();) {
      ReadyClass& c = **it;
      if (!Matches(c.placement, a)) {
        ++it;
        continue;
      }
      parked_.erase(it++);
      BackToHeads(c);
    }
  }
  Dispatch();
  return absl::OkStatus();
}

void Scheduler::Disconnect(uint64_t conn) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  AgentRecord& a = *it->second;
  by_conn_.erase(it);
  a.conn = 0;
  agent_deadlines_.Set(a.id, Mono() + opts_.reconnect_grace);
  UpdateHeartbeatFactor();
}

void Scheduler::UpdateHeartbeatFactor() {
  const int64_t agents = static_cast<int64_t>(by_conn_.size());
  heartbeat_factor_ = opts_.HeartbeatFactor(agents, heartbeat_factor_);
}

void Scheduler::LoseAgent(AgentRecord& a, const std::string& why) {
  // Chain heads first would end their links anyway; EndHeld skips those.
  EndHeld(a, std::vector<std::string>(a.tasks.begin(), a.tasks.end()), LostResult(why));
  // Listed as LOST for a while, then forgotten.
  a.lost = true;
  agent_deadlines_.Set(a.id, Mono() + opts_.lost_agent_retention);
}

TaskRecord* Scheduler::LiveAttempt(const AgentRecord& a, const std::string& task_id,
                                   int32_t attempt) {
  TaskRecord* t = Mutable(task_id);
  if (t == nullptr || !IsInFlight(t->state) || t->attempt != attempt || t->agent_id != a.id) {
    return nullptr;
  }
  return t;
}

void Scheduler::OnAgentMessage(uint64_t conn, const v1::AgentMessage& msg) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  AgentRecord& a = *it->second;
  a.last_seen = Mono();
  a.last_seen_time = Now();
  bool frees = false;
  if (msg.has_batch()) {
    // One Dispatch for the whole batch: the slots its results free are
    // filled together, in one Assign.
    for (const v1::AgentMessage& m : msg.batch().msgs()) frees |= OnOneAgentMessage(a, m);
  } else {
    frees = OnOneAgentMessage(a, msg);
  }
  ExtendSilenceDeadline(a);
  if (a.leaving && a.tasks.empty()) ForgetAgent(a);  // `a` is gone
  // Only an ended attempt frees room (here or, re-queued, elsewhere).
  // Dispatching on every heartbeat made heartbeats cost O(agents) each,
  // O(agents^2) in all (taskgrid-bench W6).
  if (frees) Dispatch();
}

bool Scheduler::OnOneAgentMessage(AgentRecord& a, const v1::AgentMessage& msg) {
  switch (msg.msg_case()) {
    case v1::AgentMessage::kHeartbeat: {
      v1::SchedulerMessage ack;
      v1::HeartbeatAck* h = ack.mutable_heartbeat_ack();
      if (a.adaptive_heartbeat) {
        // The interval it says it uses, never longer than any it was told
        // (an agent cannot stretch its own timeout).
        const absl::Duration used = FromProto(msg.heartbeat().heartbeat_interval());
        if (used > absl::ZeroDuration()) {
          a.agent_interval = std::clamp(used, opts_.heartbeat_interval, a.judged_interval());
        }
        a.told_interval = heartbeat_interval();
        *h->mutable_heartbeat_interval() = ToProto(a.told_interval);
        *h->mutable_heartbeat_lease() = ToProto(opts_.HeartbeatLeaseFor(a.told_interval));
      }
      Send(a.conn, std::move(ack));
      break;
    }
    case v1::AgentMessage::kDraining:
      a.draining = true;
      break;
    case v1::AgentMessage::kGoodbye:
      // It stops for good; forgotten once it holds nothing (see
      // OnAgentMessage). Until then it is draining.
      a.draining = true;
      a.leaving = true;
      break;
    case v1::AgentMessage::kRelease:
      OnRelease(a, msg.release());
      break;
    case v1::AgentMessage::kAccept:
      OnAccept(a, msg.accept());
      break;
    case v1::AgentMessage::kReject:
      OnReject(a, msg.reject());
      break;
    case v1::AgentMessage::kResult:
      OnResult(a, msg.result());
      break;
    default:  // a Hello or a batch inside a batch: refused by the service
      break;
  }
  return msg.has_result() || msg.has_release() || msg.has_reject();
}

void Scheduler::OnAccept(AgentRecord& a, const v1::Accept& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  // A chain link cannot start before its predecessor's result arrived.
  if (t != nullptr && t->chained_after != nullptr) t = nullptr;
  if (t == nullptr) {
    ++stale_messages_;
    v1::SchedulerMessage cancel;
    cancel.mutable_cancel()->set_task_id(m.task_id());
    cancel.mutable_cancel()->set_attempt(m.attempt());
    Send(a.conn, std::move(cancel));
    return;
  }
  if (t->state != v1::TASK_STATE_DISPATCHED) return;  // a repeated Accept
  t->start_time = Now();
  const absl::Duration timeout = FromProto(t->spec.attempt_timeout());
  if (timeout > absl::ZeroDuration()) {
    task_deadlines_.Set(t->id(), Mono() + timeout + opts_.attempt_timeout_slack);
  } else {
    task_deadlines_.Remove(t->id());
  }
  start_deadlines_.Remove(t->id());
  Transition(*t, v1::TASK_STATE_RUNNING,
             absl::StrCat("attempt ", t->attempt, " running on agent ", a.id));
  if (t->pause_requested) SendCancel(*t);
}

void Scheduler::ImpliedAccept(AgentRecord& a, const TaskRecord& t) {
  v1::Accept implied;
  implied.set_task_id(t.id());
  implied.set_attempt(t.attempt);
  OnAccept(a, implied);
}

void Scheduler::OnRelease(AgentRecord& a, const v1::Release& m) {
  v1::SchedulerMessage ack;
  ack.mutable_result_ack()->set_task_id(m.task_id());
  ack.mutable_result_ack()->set_attempt(m.attempt());
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t == nullptr) {
    ++stale_messages_;
  } else {
    v1::TaskResult r;
    r.set_outcome(v1::OUTCOME_CANCELLED);
    r.set_exit_code(-1);
    r.set_error(absl::StrCat("released by the agent: ", Bounded(m.reason(), kMaxReasonBytes)));
    FinishAttempt(*t, std::move(r), /*interrupted=*/true);
    ack.mutable_result_ack()->set_accepted(true);
  }
  Send(a.conn, std::move(ack));
}

void Scheduler::OnReject(AgentRecord& a, const v1::Reject& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t == nullptr) {
    ++stale_messages_;
    return;
  }
  v1::TaskResult r =
      LostResult(absl::StrCat("rejected by the agent: ", Bounded(m.reason(), kMaxReasonBytes)));
  switch (m.code()) {
    case v1::REJECT_CODE_DRAINING:
    case v1::REJECT_CODE_BUSY:
    case v1::REJECT_CODE_NO_SLOTS:
      // The agent's state, not the task's: not counted, and back after the
      // initial backoff (at once, it could meet the same state again).
      FinishAttempt(*t, std::move(r), /*interrupted=*/true, InitialBackoffOf(*t, opts_));
      return;
    default:
      FinishAttempt(*t, std::move(r));
  }
}

void Scheduler::OnResult(AgentRecord& a, const v1::Result& m) {
  v1::SchedulerMessage ack;
  ack.mutable_result_ack()->set_task_id(m.task_id());
  ack.mutable_result_ack()->set_attempt(m.attempt());
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t != nullptr && t->chained_after != nullptr) t = nullptr;  // out of order: not started here
  if (t != nullptr) {
    // A result implies the agent accepted: keep DISPATCHED -> RUNNING.
    if (t->state == v1::TASK_STATE_DISPATCHED) ImpliedAccept(a, *t);
    v1::TaskResult r = m.result();
    // Whatever the agent was told, what is stored stays readable.
    const int64_t max = opts_.max_output_bytes;
    r.set_stdout_cut_bytes(r.stdout_cut_bytes() + CutTail(r.mutable_stdout_tail(), max));
    r.set_stderr_cut_bytes(r.stderr_cut_bytes() + CutTail(r.mutable_stderr_tail(), max));
    if (static_cast<int64_t>(r.error().size()) > max) r.set_error(Bounded(r.error(), max));
    if (r.outcome() == v1::OUTCOME_UNSPECIFIED || r.outcome() == v1::OUTCOME_LOST) {
      r.set_outcome(v1::OUTCOME_FAILED);
    }
    if (r.has_output() && static_cast<int64_t>(r.output().size()) > opts_.max_task_output_bytes) {
      r.set_error(absl::StrCat("its output is ", r.output().size(), " bytes; the limit is ",
                               opts_.max_task_output_bytes));
      r.clear_output();
      r.set_outcome(v1::OUTCOME_FAILED);
    }
    FinishAttempt(*t, std::move(r));
    ack.mutable_result_ack()->set_accepted(true);
  } else {
    // A result resent after its ack was lost is already committed: say so.
    const TaskRecord* known = Find(m.task_id());
    bool committed = false;
    if (known != nullptr) {
      for (const v1::Attempt& done : known->attempts) {
        if (done.attempt() == m.attempt() && done.agent_id() == a.id &&
            done.result().outcome() != v1::OUTCOME_LOST) {
          committed = true;
        }
      }
    }
    if (!committed) ++stale_messages_;
    ack.mutable_result_ack()->set_accepted(committed);
  }
  Send(a.conn, std::move(ack));
}

// ---------------------------------------------------------------------------
// Time.

void Scheduler::Tick() {
  const absl::Time now = Now();
  // Event retention: prune through the newest mark older than the window.
  int64_t prune = 0;
  while (!revision_marks_.empty() && revision_marks_.front().second < now - opts_.event_retention) {
    prune = revision_marks_.front().first;
    revision_marks_.pop_front();
  }
  if (prune > 0) {
    effects_.batch.prune_events_through = prune;
    oldest_revision_ = prune + 1;
  }
  while (!scheduled_.empty() && std::get<0>(*scheduled_.begin()) <= now) {
    TaskRecord& t = *std::get<2>(*scheduled_.begin());
    Transition(t, v1::TASK_STATE_PENDING,
               t.attempt > t.attempt_base ? "retry backoff over" : "not_before reached");
  }
  for (const std::string& id : start_deadlines_.PopExpired(now - absl::UnixEpoch())) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || IsTerminal(t->state) || IsInFlight(t->state)) continue;
    Transition(*t, v1::TASK_STATE_FAILED,
               absl::StrCat("expired before start: not started within schedule_timeout ",
                            absl::FormatDuration(FromProto(t->spec.schedule_timeout()))));
  }
  const absl::Duration mono = Mono();
  for (const std::string& id : task_deadlines_.PopExpired(mono)) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || !IsInFlight(t->state)) continue;
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
  for (const std::string& id : agent_deadlines_.PopExpired(mono)) {
    auto it = agents_.find(id);
    if (it == agents_.end()) continue;
    AgentRecord& a = *it->second;
    if (a.connected()) {
      // Silent past heartbeat_timeout: lost; end its stream, start the grace.
      effects_.close_conns.push_back(a.conn);
      by_conn_.erase(a.conn);
      a.conn = 0;
      agent_deadlines_.Set(a.id, mono + opts_.reconnect_grace);
      UpdateHeartbeatFactor();
    } else if (!a.lost) {
      LoseAgent(a, absl::StrCat("agent ", id, " was lost and did not come back within ",
                                absl::FormatDuration(opts_.reconnect_grace)));
    } else {
      agents_.erase(it);  // lost long enough: forgotten
    }
  }
  Dispatch();
}

void Scheduler::ForgetAgent(AgentRecord& a) {
  TASKGRID_CHECK(a.tasks.empty(), absl::StrCat("agent ", a.id, " is forgotten holding tasks"));
  if (a.connected()) {
    by_conn_.erase(a.conn);
    effects_.close_conns.push_back(a.conn);
  }
  agent_deadlines_.Remove(a.id);
  const std::string id = a.id;
  agents_.erase(id);
  UpdateHeartbeatFactor();
}

Effects Scheduler::TakeEffects() { return std::exchange(effects_, Effects{}); }

const AgentRecord* Scheduler::FindAgent(const std::string& id) const {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.get();
}

absl::Status Scheduler::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  absl::flat_hash_map<std::string, std::array<int64_t, kNumStates>> counts;
  size_t pending = 0, scheduled = 0;
  for (const auto& [id, tp] : tasks_) {
    const TaskRecord& t = *tp;
    if (id.data() != t.id().data()) return fail("task ", id, " is not keyed by its own id");
    ++counts[t.queue()][t.state];
    if (t.state == v1::TASK_STATE_PENDING) {
      ++pending;
      auto it = ready_.find(t.placement_class);
      if (it == ready_.end() || !it->second->tasks.contains(ReadyKeyOf(t))) {
        return fail("PENDING task ", id, " is not in its ready queue");
      }
    }
    if (t.state == v1::TASK_STATE_SCHEDULED) {
      ++scheduled;
      if (scheduled_.count({t.next_run_time, t.seq, const_cast<TaskRecord*>(&t)}) == 0) {
        return fail("SCHEDULED task ", id, " is not in the timer");
      }
    }
    if (IsInFlight(t.state)) {
      if (t.attempt < 1) return fail("in-flight task ", id, " has attempt ", t.attempt);
      const AgentRecord* a = FindAgent(t.agent_id);
      if (a == nullptr) return fail("task ", id, " is held by unknown agent ", t.agent_id);
      if (!a->tasks.contains(id)) return fail("agent ", a->id, " does not list task ", id);
    } else if (!t.agent_id.empty()) {
      return fail("task ", id, " is ", StateName(t.state), " but names agent ", t.agent_id);
    }
    if (t.state == v1::TASK_STATE_DISPATCHED && t.chained_after == nullptr &&
        !task_deadlines_.Contains(t.id())) {
      return fail("DISPATCHED task ", id, " has no ack deadline");
    }
    // Dependencies.
    int32_t unsucceeded = 0, unfinished = 0;
    for (const TaskRecord* d : t.deps) {
      unsucceeded += d->state != v1::TASK_STATE_SUCCEEDED;
      unfinished += !IsTerminal(d->state);
      if (std::find(d->dependents.begin(), d->dependents.end(), &t) == d->dependents.end()) {
        return fail("task ", d->id(), " does not list its dependent ", id);
      }
    }
    if (unsucceeded != t.deps_unsucceeded || unfinished != t.deps_unfinished) {
      return fail("task ", id, " counts ", t.deps_unsucceeded, "/", t.deps_unfinished,
                  " open dependencies, not ", unsucceeded, "/", unfinished);
    }
    if (t.deps.size() != static_cast<size_t>(t.spec.depends_on_size())) {
      return fail("task ", id, " has ", t.deps.size(), " linked dependencies");
    }
    if (t.state == v1::TASK_STATE_BLOCKED &&
        (DepsMet(t) && !(DepFailed(t) && CancelsOnUpstreamFailure(t)))) {
      return fail("BLOCKED task ", id, " could run");
    }
    if (t.state == v1::TASK_STATE_BLOCKED && DepFailed(t) && CancelsOnUpstreamFailure(t)) {
      return fail("BLOCKED task ", id, " has a failed dependency and was not cancelled");
    }
    if ((t.state == v1::TASK_STATE_PENDING || t.state == v1::TASK_STATE_SCHEDULED) && !DepsMet(t)) {
      return fail(StateName(t.state), " task ", id, " has dependencies still open");
    }
    if (t.chained_after != nullptr) {
      const TaskRecord& p = *t.chained_after;
      if (t.state != v1::TASK_STATE_DISPATCHED && t.state != v1::TASK_STATE_CANCELLING) {
        return fail("chain link ", id, " is ", StateName(t.state));
      }
      if (p.chain_next != &t || !IsInFlight(p.state) || p.agent_id != t.agent_id) {
        return fail("chain link ", id, " and its predecessor ", p.id(), " disagree");
      }
    }
    if (t.chain_next != nullptr && t.chain_next->chained_after != &t) {
      return fail("task ", id, " and the chain link after it disagree");
    }
    if (t.job != nullptr && t.job->id != t.job_id()) return fail("task ", id, " is in another job");
    if (static_cast<int32_t>(t.attempts.size()) + t.attempts_dropped > t.attempt) {
      return fail("task ", id, " has more finished attempts than its counter");
    }
    if (static_cast<int64_t>(t.attempts.size()) > std::max(opts_.max_attempt_history, 1)) {
      return fail("task ", id, " keeps ", t.attempts.size(), " attempts, past the bound");
    }
    if (t.interrupted_dropped > t.attempts_dropped || t.attempts_dropped < 0) {
      return fail("task ", id, " counts more interrupted dropped attempts than dropped ones");
    }
  }
  size_t in_ready = 0;
  size_t in_heads = 0, parked = 0;
  for (const auto& [key, c] : ready_) {
    if (c->tasks.empty()) return fail("ready class ", key, " is empty but kept");
    if (c->key != key) return fail("ready class ", key, " is keyed as ", c->key);
    in_ready += c->tasks.size();
    switch (c->where) {
      case ReadyClass::Where::kHeads:
        ++in_heads;
        if (!heads_.contains({*c->tasks.begin(), c.get()})) {
          return fail("ready class ", key, " is not in the heads by its first task");
        }
        break;
      case ReadyClass::Where::kAside:
        return fail("ready class ", key, " was left aside after a dispatch");
      case ReadyClass::Where::kParked:
        ++parked;
        if (!parked_.contains(c.get())) return fail("parked class ", key, " is not listed");
        if (AnyAgentCouldTake(c->placement)) {
          return fail("parked class ", key, " could be taken by a connected agent");
        }
        break;
    }
  }
  if (heads_.size() != in_heads)
    return fail("heads hold ", heads_.size(), " classes, not ", in_heads);
  if (parked_.size() != parked) return fail(parked_.size(), " classes listed parked, not ", parked);
  if (in_ready != pending) return fail("ready queues hold ", in_ready, " tasks, not ", pending);
  if (scheduled_.size() != scheduled) return fail("timer holds ", scheduled_.size(), " tasks");
  for (const auto& [queue, arr] : counts_) {
    auto it = counts.find(queue);
    for (int s = 0; s < kNumStates; ++s) {
      const int64_t want = it == counts.end() ? 0 : it->second[s];
      if (arr[s] != want) return fail("count of ", queue, "/", s, " is ", arr[s], " not ", want);
    }
  }
  for (const auto& [id, j] : jobs_) {
    std::array<int64_t, kNumStates> jc{};
    for (const TaskRecord* t : j->tasks) ++jc[t->state];
    if (jc != j->counts) return fail("job ", id, " counts its tasks wrongly");
  }
  for (const auto& [id, a] : agents_) {
    int32_t used = 0;
    for (const std::string& tid : a->tasks) {
      const TaskRecord* t = Find(tid);
      if (t == nullptr || !IsInFlight(t->state) || t->agent_id != id) {
        return fail("agent ", id, " lists task ", tid, " it does not hold");
      }
      if (t->chained_after == nullptr) used += SlotsOf(t->spec.placement());
    }
    if (used != a->used) return fail("agent ", id, " uses ", a->used, " slots, not ", used);
    if (a->connected() != by_conn_.contains(a->conn)) return fail("agent ", id, " conn mismatch");
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::core
