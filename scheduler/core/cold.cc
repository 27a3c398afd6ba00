// Finished tasks on disk: moving them out of memory (Evict), reading them
// back in (Warm), deleting them for good (DeleteTask, DeleteJob,
// DeleteTasks, and retention from Tick), and the start-up half of it
// (RestoreCold, RestoreNeeds).
//
// The rule that keeps it simple: a task in memory has its dependencies,
// its job's other tasks, the task it is a replica of and its own replicas
// in memory too (a dependency deleted while everything was finished is
// the one exception, marked deps_deleted). So a task leaves memory with
// its unit (UnitOf) once no task in memory depends on it, and comes back
// with what it needs (ColdNeeds); nothing in memory ever points at a task
// on disk.

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "scheduler/core/dependency_graph.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

int Scheduler::RetentionKind(v1::TaskState s) {
  return s == v1::TASK_STATE_FAILED || s == v1::TASK_STATE_TRASHED ? 1 : 0;
}

absl::Duration Scheduler::RetentionOf(const std::string& queue, bool failed) const {
  if (const v1::QueueSettings* s = queue_controls_.Find(queue)) {
    if (!failed && s->has_retention()) return FromProto(s->retention());
    if (failed && s->has_failed_retention()) return FromProto(s->failed_retention());
  }
  return failed ? opts_.failed_retention : opts_.retention;
}

namespace {

// An expiring entry's key: seq * 2, + 1 for a job (Scheduler::ExpiringSet).
int64_t ExpiringKey(int64_t seq, bool job) { return seq * 2 + (job ? 1 : 0); }

}  // namespace

void Scheduler::AddExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq,
                            bool job) {
  expiring_[queue][kind].insert({finish, ExpiringKey(seq, job)});
}

void Scheduler::RemoveExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq,
                               bool job) {
  // Never erases the queue's entry: DeleteExpired walks the map.
  auto it = expiring_.find(queue);
  if (it != expiring_.end()) it->second[kind].erase({finish, ExpiringKey(seq, job)});
}

void Scheduler::JobExpiring(const JobRecord& j, bool add) {
  if (j.cold.empty()) return;
  const ColdTask* first = table_.FindColdBySeq(j.cold.front());
  TASKGRID_CHECK(first != nullptr, absl::StrCat("job ", j.id, " lost its first task"));
  const int kind = JobStateOf(j) == v1::JOB_STATE_FAILED ? 1 : 0;
  if (add) {
    AddExpiring(*first->queue, kind, j.update_time, j.seq, true);
  } else {
    RemoveExpiring(*first->queue, kind, j.update_time, j.seq, true);
  }
}

// ---------------------------------------------------------------------------
// Out of memory.

std::vector<TaskRecord*> Scheduler::UnitOf(TaskRecord& t) {
  std::vector<TaskRecord*> unit{&t};
  absl::flat_hash_set<TaskRecord*> in{&t};
  auto add = [&](TaskRecord* x) {
    if (x != nullptr && in.insert(x).second) unit.push_back(x);
  };
  for (size_t i = 0; i < unit.size(); ++i) {
    TaskRecord* x = unit[i];
    if (x->job != nullptr) {
      for (TaskRecord* m : x->job->tasks) add(m);
    }
    add(x->replica_of);
    for (TaskRecord* r : x->replicas) add(r);
  }
  return unit;
}

std::string Scheduler::Unevictable(const std::vector<TaskRecord*>& unit, int64_t committed,
                                   bool force) const {
  const absl::flat_hash_set<const TaskRecord*> in(unit.begin(), unit.end());
  const absl::Time now = Now();
  for (const TaskRecord* x : unit) {
    if (!IsTerminal(x->state)) {
      return absl::StrCat("task ", x->id(), " is ", StateName(x->state));
    }
    for (const TaskRecord* d : x->dependents) {
      if (in.contains(d)) continue;
      // A finished dependent may stay behind when the unit is deleted (it
      // is marked deps_deleted); it keeps the unit in memory otherwise.
      if (!force || !IsTerminal(d->state)) {
        return absl::StrCat("task ", d->id(), " depends on ", x->id(), " and is ",
                            StateName(d->state));
      }
    }
    if (force) continue;
    if (x->revision > committed) return "its last change is not committed yet";
    if (now - x->update_time < opts_.finished_in_memory) return "it finished moments ago";
  }
  return "";
}

void Scheduler::EvictUnit(const std::vector<TaskRecord*>& unit) {
  const absl::flat_hash_set<TaskRecord*> in(unit.begin(), unit.end());
  std::vector<int64_t> look_again;  // dependencies outside the unit
  JobRecord* job = nullptr;
  std::vector<TaskRecord*> alone;  // the tasks in no job
  for (TaskRecord* x : unit) {
    TASKGRID_CHECK(x->chained_after == nullptr && x->chain_next == nullptr,
                   absl::StrCat("task ", x->id(), " leaves memory in a chain"));
    for (TaskRecord* d : x->deps) {
      if (in.contains(d)) continue;
      d->dependents.erase(std::remove(d->dependents.begin(), d->dependents.end(), x),
                          d->dependents.end());
      look_again.push_back(d->seq);
    }
    for (TaskRecord* d : x->dependents) {
      if (in.contains(d)) continue;
      // A finished dependent left behind (a delete): it can no longer run.
      d->deps.erase(std::remove(d->deps.begin(), d->deps.end(), x), d->deps.end());
      d->deps_deleted = true;
      if (ClassOf(x->state) != DepClass::kSucceeded) --d->deps_unsucceeded;
    }
    if (x->job != nullptr) {
      job = x->job;
    } else {
      alone.push_back(x);
      if (x->replica_of == nullptr) {
        AddExpiring(x->queue(), RetentionKind(x->state), x->update_time, x->seq, false);
      }
    }
  }
  for (TaskRecord* x : alone) table_.Evict(*x);
  if (job != nullptr) {
    table_.EvictJob(*job);
    JobExpiring(*job, /*add=*/true);
  }
  for (int64_t seq : look_again) evict_queue_.push_back({0, seq});
}

size_t Scheduler::Evict(int64_t committed) {
  size_t evicted = 0;
  const absl::Time now = Now();
  while (!evict_queue_.empty() && evicted < static_cast<size_t>(opts_.max_evictions_per_call)) {
    const auto [revision, seq] = evict_queue_.front();
    if (revision > committed) break;  // the change that finished it is not durable yet
    auto it = table_.by_seq().find(seq);
    if (it == table_.by_seq().end()) {  // gone already (with its unit)
      evict_queue_.pop_front();
      continue;
    }
    TaskRecord& t = *it->second;
    if (!IsTerminal(t.state) || (revision != 0 && t.revision != revision)) {
      // It changed since; should it finish again, that change queues it.
      evict_queue_.pop_front();
      continue;
    }
    // The front finished first; the rest are younger.
    if (now - t.update_time < opts_.finished_in_memory) break;
    evict_queue_.pop_front();
    const std::vector<TaskRecord*> unit = UnitOf(t);
    // A unit kept for now comes back here when what keeps it lets go: its
    // last task finishing, a dependent leaving memory.
    if (!Unevictable(unit, committed, /*force=*/false).empty()) continue;
    evicted += unit.size();
    EvictUnit(unit);
  }
  return evicted;
}

// ---------------------------------------------------------------------------
// Back into memory.

std::vector<int64_t> Scheduler::ColdSeqsOfIds(const std::vector<std::string>& ids) const {
  std::vector<int64_t> out;
  for (const std::string& id : ids) {
    if (const ColdTask* c = table_.FindCold(id)) out.push_back(c->seq);
  }
  return out;
}

std::vector<int64_t> Scheduler::ColdSeqsOfSpecs(
    const google::protobuf::RepeatedPtrField<v1::TaskSpec>& specs) const {
  std::vector<int64_t> out;
  const absl::Time now = Now();
  for (const v1::TaskSpec& spec : specs) {
    if (const ColdTask* c = table_.FindCold(spec.id())) out.push_back(c->seq);
    for (const std::string& dep : spec.depends_on()) {
      if (const ColdTask* c = table_.FindCold(dep)) out.push_back(c->seq);
    }
    if (!spec.unique_key().empty()) {
      const std::string& queue = spec.queue().empty() ? kDefaultQueue : spec.queue();
      const int64_t held = keys_.UniqueHolder({queue, spec.unique_key()}, now);
      if (held != 0 && table_.FindColdBySeq(held) != nullptr) out.push_back(held);
    }
  }
  return out;
}

std::vector<int64_t> Scheduler::ColdSeqsOfJob(const std::string& job_id) const {
  const JobRecord* j = table_.FindJob(job_id);
  return j == nullptr ? std::vector<int64_t>() : j->cold;
}

std::vector<int64_t> Scheduler::ColdSeqsOfBulkRetry(ListFilter filter) const {
  std::vector<int64_t> out;
  if (!BulkStates(&filter, {v1::TASK_STATE_FAILED, v1::TASK_STATE_CANCELLED}, "retry").ok()) {
    return out;  // RetryTasks says why
  }
  const ListPage page = List(filter);
  for (size_t i = 0; i < page.tasks.size(); ++i) {
    if (page.tasks[i] == nullptr) out.push_back(page.seqs[i]);
  }
  return out;
}

std::vector<int64_t> Scheduler::ColdNeeds(
    const std::vector<std::unique_ptr<TaskRecord>>& records) const {
  absl::flat_hash_set<int64_t> have;
  for (const auto& r : records) have.insert(r->seq);
  std::vector<int64_t> out;
  auto need = [&](const ColdTask* c) {
    if (c != nullptr && have.insert(c->seq).second) out.push_back(c->seq);
  };
  for (const auto& r : records) {
    for (const std::string& dep : r->spec.depends_on()) need(table_.FindCold(dep));
    if (!r->spec.job_id().empty()) {
      if (const JobRecord* j = table_.FindJob(r->spec.job_id())) {
        for (int64_t seq : j->cold) need(table_.FindColdBySeq(seq));
      }
    }
    if (!r->spec.replica_of().empty()) need(table_.FindCold(r->spec.replica_of()));
    for (int32_t n = 1; n <= ReplicaCount(r->spec); ++n) {
      need(table_.FindCold(ReplicaId(r->id(), n)));
    }
  }
  return out;
}

std::vector<int64_t> Scheduler::Warm(std::vector<std::unique_ptr<TaskRecord>>* taken) {
  // Read as the task is on disk now? (It may have come back, changed and
  // gone again since it was read: then it must be read again.)
  std::vector<int64_t> again;
  for (const auto& r : *taken) {
    const ColdTask* c = table_.FindColdBySeq(r->seq);
    if (c != nullptr &&
        (c->id() != r->id() || c->finish != r->update_time || c->state() != r->state)) {
      again.push_back(r->seq);
    }
  }
  if (!again.empty()) return again;
  if (std::vector<int64_t> missing = ColdNeeds(*taken); !missing.empty()) return missing;
  std::vector<std::unique_ptr<TaskRecord>> records = std::move(*taken);
  taken->clear();

  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  // Jobs leave the retention index before their tasks come back (the
  // entry names the first task's queue).
  absl::flat_hash_set<JobRecord*> jobs;
  for (const auto& r : records) {
    const ColdTask* c = table_.FindColdBySeq(r->seq);
    if (c == nullptr) continue;
    if (c->job != nullptr) {
      if (jobs.insert(c->job).second) JobExpiring(*c->job, /*add=*/false);
    } else if (!c->replica) {
      RemoveExpiring(*c->queue, RetentionKind(c->state()), c->finish, c->seq, false);
    }
  }
  std::vector<TaskRecord*> warmed;
  warmed.reserve(records.size());
  for (auto& r : records) {
    TaskRecord* t = table_.Warm(std::move(r));
    if (t == nullptr) continue;  // deleted, or in memory already
    ready_.SetClass(*t);
    warmed.push_back(t);
  }
  for (JobRecord* j : jobs) {
    TASKGRID_CHECK(table_.WarmJob(*j), absl::StrCat("job ", j->id, " came back in part"));
  }
  for (TaskRecord* t : warmed) {
    for (const std::string& id : t->spec.depends_on()) {
      if (TaskRecord* d = Mutable(id)) {
        LinkDependency(*t, *d);
      } else {
        t->deps_deleted = true;  // deleted while both were finished
      }
    }
  }
  for (TaskRecord* t : warmed) {
    if (t->spec.replica_of().empty()) continue;
    TaskRecord* group = Mutable(t->spec.replica_of());
    TASKGRID_CHECK(group != nullptr,
                   absl::StrCat("replica ", t->id(), " came back without ", t->spec.replica_of()));
    t->replica_of = group;
    group->replicas.push_back(t);  // in submit order: `warmed` is
  }
  // Back to disk in time, unless the operation that needed it keeps it.
  for (TaskRecord* t : warmed) evict_queue_.push_back({0, t->seq});
  return {};
}

// ---------------------------------------------------------------------------
// Deleting.

void Scheduler::DeleteColdTask(const ColdTask& c, std::vector<std::string>* ids) {
  const std::string id(c.id());
  const bool has_replicas = c.has_replicas;
  if (!c.replica) RemoveExpiring(*c.queue, RetentionKind(c.state()), c.finish, c.seq, false);
  // A unique key it held is let go of lazily: a holder that no longer
  // exists holds nothing (AddTasks).
  table_.DeleteCold(c, &effects_.batch);
  ids->push_back(id);
  ++tasks_deleted_;
  if (!has_replicas) return;
  for (int32_t n = 1;; ++n) {
    const ColdTask* r = table_.FindCold(ReplicaId(id, n));
    if (r == nullptr || !r->replica) break;
    ids->emplace_back(r->id());
    table_.DeleteCold(*r, &effects_.batch);
    ++tasks_deleted_;
  }
}

int64_t Scheduler::DeleteColdJob(JobRecord& j) {
  JobExpiring(j, /*add=*/false);
  std::vector<std::string> replicas_of;
  for (int64_t seq : j.cold) {
    const ColdTask* c = table_.FindColdBySeq(seq);
    if (c != nullptr && c->has_replicas) replicas_of.emplace_back(c->id());
  }
  int64_t n = static_cast<int64_t>(j.cold.size());
  table_.DeleteColdJob(j, &effects_.batch);  // frees `j`
  for (const std::string& id : replicas_of) {
    for (int32_t k = 1;; ++k) {
      const ColdTask* r = table_.FindCold(ReplicaId(id, k));
      if (r == nullptr || !r->replica) break;
      table_.DeleteCold(*r, &effects_.batch);
      ++n;
    }
  }
  tasks_deleted_ += n;
  return n;
}

absl::Status Scheduler::ToDiskForDelete(TaskRecord& t) {
  const std::vector<TaskRecord*> unit = UnitOf(t);
  const std::string why = Unevictable(unit, 0, /*force=*/true);
  if (!why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(t.job != nullptr
                                                          ? absl::StrCat("job \"", t.job_id(), "\"")
                                                          : absl::StrCat("task \"", t.id(), "\""),
                                                      " cannot be deleted: ", why));
  }
  EvictUnit(unit);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Scheduler::DeleteTask(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  const std::string* job_id = nullptr;
  const std::string* replica_of = nullptr;
  std::string cold_replica_of;
  if (TaskRecord* t = Mutable(id)) {
    if (!IsTerminal(t->state)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "task \"", id, "\" is ", StateName(t->state),
          "; only finished tasks (SUCCEEDED, FAILED, CANCELLED, TRASHED) can be deleted: cancel "
          "it first"));
    }
    if (!t->job_id().empty()) job_id = &t->job_id();
    if (t->replica_of != nullptr) replica_of = &t->replica_of->id();
  } else if (const ColdTask* c = table_.FindCold(id)) {
    if (c->job != nullptr) job_id = &c->job->id;
    if (c->replica) {
      cold_replica_of = id.substr(0, id.rfind(":r"));
      replica_of = &cold_replica_of;
    }
  } else {
    return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  }
  if (job_id != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task \"", id, "\" belongs to job \"", *job_id, "\": a job is deleted whole (DeleteJob)"));
  }
  if (replica_of != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is a replica of \"", *replica_of, "\": delete that task"));
  }
  if (TaskRecord* t = Mutable(id)) RETURN_IF_ERROR(ToDiskForDelete(*t));
  std::vector<std::string> ids;
  DeleteColdTask(*table_.FindCold(id), &ids);
  return ids;
}

absl::StatusOr<int64_t> Scheduler::DeleteJob(const std::string& id) {
  ASSIGN_OR_RETURN(JobRecord * j, LookupJob(id));
  if (JobStateOf(*j) == v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", id, "\" has tasks that have not finished: cancel it first (CancelJob)"));
  }
  if (!j->tasks.empty()) RETURN_IF_ERROR(ToDiskForDelete(*j->tasks.front()));
  return DeleteColdJob(*j);
}

absl::StatusOr<BulkResult> Scheduler::DeleteTasks(ListFilter filter) {
  RETURN_IF_ERROR(BulkStates(&filter,
                             {v1::TASK_STATE_SUCCEEDED, v1::TASK_STATE_FAILED,
                              v1::TASK_STATE_CANCELLED, v1::TASK_STATE_TRASHED},
                             "delete"));
  BulkResult out;
  if (!filter.job_id.empty()) {
    // A job goes whole, or not at all.
    JobRecord* j = table_.FindJob(filter.job_id);
    if (j == nullptr) return out;
    std::vector<std::string> ids;
    for (const TaskRecord* t : j->tasks) ids.push_back(t->id());
    for (int64_t seq : j->cold) ids.emplace_back(table_.FindColdBySeq(seq)->id());
    absl::StatusOr<int64_t> deleted = DeleteJob(filter.job_id);
    if (deleted.ok()) {
      out.ids = std::move(ids);
    } else {
      out.skipped = static_cast<int64_t>(ids.size());
      out.skipped_reason = std::string(deleted.status().message());
    }
    return out;
  }
  const ListPage page = List(filter);
  out.next_after_seq = page.next_after_seq;
  auto skip = [&](const std::string& why) {
    if (out.skipped++ == 0) out.skipped_reason = why;
  };
  for (int64_t seq : page.seqs) {
    // Looked up again: deleting a task deletes its replicas, which may be
    // later on the page.
    std::string id;
    if (auto it = table_.by_seq().find(seq); it != table_.by_seq().end()) {
      if (it->second->replica_of != nullptr) continue;  // goes with its task
      id = it->second->id();
    } else if (const ColdTask* c = table_.FindColdBySeq(seq)) {
      if (c->replica) continue;
      id = std::string(c->id());
    } else {
      continue;
    }
    absl::StatusOr<std::vector<std::string>> ids = DeleteTask(id);
    if (ids.ok()) {
      out.ids.insert(out.ids.end(), ids->begin(), ids->end());
    } else {
      skip(std::string(ids.status().message()));
    }
  }
  return out;
}

void Scheduler::DeleteExpired(absl::Time now) {
  int64_t budget = opts_.max_deletes_per_tick;
  for (auto& [queue, kinds] : expiring_) {
    for (int kind = 0; kind < 2 && budget > 0; ++kind) {
      const absl::Duration keep = RetentionOf(queue, kind == 1);
      if (keep <= absl::ZeroDuration()) continue;
      ExpiringSet& set = kinds[kind];
      while (budget > 0 && !set.empty() && set.begin()->first + keep <= now) {
        const int64_t seq = set.begin()->second / 2;
        const bool is_job = set.begin()->second % 2 == 1;
        set.erase(set.begin());
        if (is_job) {
          auto it = table_.jobs_by_seq().find(seq);
          if (it != table_.jobs_by_seq().end() && it->second->tasks.empty()) {
            budget -= DeleteColdJob(*it->second);
          }
        } else if (const ColdTask* c = table_.FindColdBySeq(seq)) {
          std::vector<std::string> ids;
          DeleteColdTask(*c, &ids);
          budget -= static_cast<int64_t>(ids.size());
        }
      }
    }
    if (budget <= 0) break;
  }
  absl::erase_if(expiring_, [](const auto& entry) {
    return entry.second[0].empty() && entry.second[1].empty();
  });
}

absl::StatusOr<v1::QueueStats> Scheduler::SetQueueRetention(
    const v1::SetQueueRetentionRequest& req) {
  RETURN_IF_ERROR(CheckQueue(req.queue()));
  if (req.has_retention()) RETURN_IF_ERROR(CheckDuration(req.retention(), "retention"));
  if (req.has_failed_retention()) {
    RETURN_IF_ERROR(CheckDuration(req.failed_retention(), "failed_retention"));
  }
  const v1::QueueSettings* now = queue_controls_.Find(req.queue());
  v1::QueueSettings s = now != nullptr ? *now : v1::QueueSettings();
  if (req.has_retention()) {
    *s.mutable_retention() = req.retention();
  } else {
    s.clear_retention();
  }
  if (req.has_failed_retention()) {
    *s.mutable_failed_retention() = req.failed_retention();
  } else {
    s.clear_failed_retention();
  }
  if (now != nullptr ? now->SerializeAsString() == s.SerializeAsString() : IsDefault(s)) {
    return Stats(req.queue()).front();  // nothing to store
  }
  return ApplyQueueSettings(req.queue(), s);
}

// ---------------------------------------------------------------------------
// Start-up.

absl::Status Scheduler::RestoreCold(absl::Span<const TaskRow> rows) {
  if (restoring_ == nullptr) {
    return absl::FailedPreconditionError("RestoreCold before BeginRestore");
  }
  const absl::Time now = Now();
  for (const TaskRow& row : rows) {
    RETURN_IF_ERROR(table_.AdoptCold(row));
    const absl::Time finish = FromUnixMicrosOrZero(row.update_us);
    if (row.job_id.empty() && !row.replica) {
      AddExpiring(row.queue, RetentionKind(static_cast<v1::TaskState>(row.state)), finish, row.seq,
                  false);
    }
    const absl::Time until = FromUnixMicrosOrZero(row.unique_until_us);
    if (!row.unique_key.empty() && until > now) {
      keys_.Hold({row.queue, row.unique_key}, row.seq, until);
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Scheduler::RestoreNeeds() {
  absl::flat_hash_set<int64_t> seen;
  std::vector<int64_t> out;
  auto need = [&](const ColdTask* c) {
    if (c != nullptr && seen.insert(c->seq).second) out.push_back(c->seq);
  };
  for (const TaskRecord* t : restored_unexamined_) {
    for (const std::string& dep : t->spec.depends_on()) need(table_.FindCold(dep));
    if (t->job != nullptr) {
      for (int64_t seq : t->job->cold) need(table_.FindColdBySeq(seq));
    }
    if (!t->spec.replica_of().empty()) need(table_.FindCold(t->spec.replica_of()));
    for (int32_t n = 1; n <= ReplicaCount(t->spec); ++n) {
      need(table_.FindCold(ReplicaId(t->id(), n)));
    }
  }
  restored_unexamined_.clear();
  return out;
}

}  // namespace taskgrid::core
