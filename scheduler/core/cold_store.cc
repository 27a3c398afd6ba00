// ColdStore: evicting finished tasks, reading them back, deleting them,
// and retention.

#include "scheduler/core/cold_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "scheduler/core/dependency_graph.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

int ColdStore::RetentionKind(v1::TaskState s) {
  return s == v1::TASK_STATE_FAILED || s == v1::TASK_STATE_TRASHED ? 1 : 0;
}

absl::Duration ColdStore::RetentionOf(const std::string& queue, bool failed) const {
  if (const v1::QueueSettings* s = controls_->Find(queue)) {
    if (!failed && s->has_retention()) return FromProto(s->retention());
    if (failed && s->has_failed_retention()) return FromProto(s->failed_retention());
  }
  return failed ? opts_->failed_retention : opts_->retention;
}

namespace {

// An expiring entry's key: seq * 2, + 1 for a job (ColdStore::ExpiringSet).
int64_t ExpiringKey(int64_t seq, bool job) { return seq * 2 + (job ? 1 : 0); }

}  // namespace

void ColdStore::AddExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq,
                            bool job) {
  expiring_[queue][kind].insert({finish, ExpiringKey(seq, job)});
}

void ColdStore::RemoveExpiring(const std::string& queue, int kind, absl::Time finish, int64_t seq,
                               bool job) {
  // Never erases the queue's entry: DeleteExpired walks the map.
  auto it = expiring_.find(queue);
  if (it != expiring_.end()) it->second[kind].erase({finish, ExpiringKey(seq, job)});
}

void ColdStore::JobExpiring(const JobRecord& j, bool add) {
  if (j.cold.empty()) return;
  const ColdTask* first = table_->FindColdBySeq(j.cold.front());
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

std::vector<TaskRecord*> ColdStore::UnitOf(TaskRecord& t) {
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

std::string ColdStore::Unevictable(const std::vector<TaskRecord*>& unit, int64_t committed,
                                   bool force, absl::Time now) const {
  const absl::flat_hash_set<const TaskRecord*> in(unit.begin(), unit.end());
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
    if (now - x->update_time < opts_->finished_in_memory) return "it finished moments ago";
  }
  return "";
}

void ColdStore::EvictUnit(const std::vector<TaskRecord*>& unit) {
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
  for (TaskRecord* x : alone) table_->Evict(*x);
  if (job != nullptr) {
    table_->EvictJob(*job);
    JobExpiring(*job, /*add=*/true);
  }
  for (int64_t seq : look_again) evict_queue_.push_back({0, seq});
}

size_t ColdStore::Evict(int64_t committed, absl::Time now) {
  size_t evicted = 0;
  while (!evict_queue_.empty() && evicted < static_cast<size_t>(opts_->max_evictions_per_call)) {
    const auto [revision, seq] = evict_queue_.front();
    if (revision > committed) break;  // the change that finished it is not durable yet
    auto it = table_->by_seq().find(seq);
    if (it == table_->by_seq().end()) {  // gone already (with its unit)
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
    if (now - t.update_time < opts_->finished_in_memory) break;
    evict_queue_.pop_front();
    const std::vector<TaskRecord*> unit = UnitOf(t);
    // A unit kept for now comes back here when what keeps it lets go: its
    // last task finishing, a dependent leaving memory.
    if (!Unevictable(unit, committed, /*force=*/false, now).empty()) continue;
    evicted += unit.size();
    EvictUnit(unit);
  }
  return evicted;
}

// ---------------------------------------------------------------------------
// Back into memory.

std::vector<int64_t> ColdStore::Needs(
    const std::vector<std::unique_ptr<TaskRecord>>& records) const {
  absl::flat_hash_set<int64_t> have;
  for (const auto& r : records) have.insert(r->seq);
  std::vector<int64_t> out;
  auto need = [&](const ColdTask* c) {
    if (c != nullptr && have.insert(c->seq).second) out.push_back(c->seq);
  };
  for (const auto& r : records) {
    for (const std::string& dep : r->spec.depends_on()) need(table_->FindCold(dep));
    if (!r->spec.job_id().empty()) {
      if (const JobRecord* j = table_->FindJob(r->spec.job_id())) {
        for (int64_t seq : j->cold) need(table_->FindColdBySeq(seq));
      }
    }
    if (!r->spec.replica_of().empty()) need(table_->FindCold(r->spec.replica_of()));
    for (int32_t n = 1; n <= ReplicaCount(r->spec); ++n) {
      need(table_->FindCold(ReplicaId(r->id(), n)));
    }
  }
  return out;
}

std::vector<int64_t> ColdStore::Warm(std::vector<std::unique_ptr<TaskRecord>>* taken,
                                     absl::FunctionRef<void(TaskRecord&)> adopt) {
  // Read as the task is on disk now? (It may have come back, changed and
  // gone again since it was read: then it must be read again.)
  std::vector<int64_t> again;
  for (const auto& r : *taken) {
    const ColdTask* c = table_->FindColdBySeq(r->seq);
    if (c != nullptr &&
        (c->id() != r->id() || c->finish != r->update_time || c->state() != r->state)) {
      again.push_back(r->seq);
    }
  }
  if (!again.empty()) return again;
  if (std::vector<int64_t> missing = Needs(*taken); !missing.empty()) return missing;
  std::vector<std::unique_ptr<TaskRecord>> records = std::move(*taken);
  taken->clear();

  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a->seq < b->seq; });
  // Jobs leave the retention index before their tasks come back (the
  // entry names the first task's queue).
  absl::flat_hash_set<JobRecord*> jobs;
  for (const auto& r : records) {
    const ColdTask* c = table_->FindColdBySeq(r->seq);
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
    TaskRecord* t = table_->Warm(std::move(r));
    if (t == nullptr) continue;  // deleted, or in memory already
    adopt(*t);
    warmed.push_back(t);
  }
  for (JobRecord* j : jobs) {
    TASKGRID_CHECK(table_->WarmJob(*j), absl::StrCat("job ", j->id, " came back in part"));
  }
  for (TaskRecord* t : warmed) {
    for (const std::string& id : t->spec.depends_on()) {
      if (TaskRecord* d = table_->Find(id)) {
        LinkDependency(*t, *d);
      } else {
        t->deps_deleted = true;  // deleted while both were finished
      }
    }
  }
  for (TaskRecord* t : warmed) {
    if (t->spec.replica_of().empty()) continue;
    TaskRecord* group = table_->Find(t->spec.replica_of());
    TASKGRID_CHECK(group != nullptr,
                   absl::StrCat("replica ", t->id(), " came back without ", t->spec.replica_of()));
    t->replica_of = group;
    group->replicas.push_back(t);  // in submit order: `warmed` is
  }
  // Back to disk in time, unless the operation that needed it keeps it.
  for (TaskRecord* t : warmed) LookAgain(t->seq);
  return {};
}

// ---------------------------------------------------------------------------
// Deleting.

void ColdStore::DeleteTask(const ColdTask& c, std::vector<std::string>* ids, WriteBatch* batch) {
  const std::string id(c.id());
  const bool has_replicas = c.has_replicas;
  if (!c.replica) RemoveExpiring(*c.queue, RetentionKind(c.state()), c.finish, c.seq, false);
  // A unique key it held is let go of lazily: a holder that no longer
  // exists holds nothing (AddTasks).
  table_->DeleteCold(c, batch);
  ids->push_back(id);
  ++tasks_deleted_;
  if (!has_replicas) return;
  for (int32_t n = 1;; ++n) {
    const ColdTask* r = table_->FindCold(ReplicaId(id, n));
    if (r == nullptr || !r->replica) break;
    ids->emplace_back(r->id());
    table_->DeleteCold(*r, batch);
    ++tasks_deleted_;
  }
}

int64_t ColdStore::DeleteJob(JobRecord& j, WriteBatch* batch) {
  JobExpiring(j, /*add=*/false);
  std::vector<std::string> replicas_of;
  for (int64_t seq : j.cold) {
    const ColdTask* c = table_->FindColdBySeq(seq);
    if (c != nullptr && c->has_replicas) replicas_of.emplace_back(c->id());
  }
  int64_t n = static_cast<int64_t>(j.cold.size());
  table_->DeleteColdJob(j, batch);  // frees `j`
  for (const std::string& id : replicas_of) {
    for (int32_t k = 1;; ++k) {
      const ColdTask* r = table_->FindCold(ReplicaId(id, k));
      if (r == nullptr || !r->replica) break;
      table_->DeleteCold(*r, batch);
      ++n;
    }
  }
  tasks_deleted_ += n;
  return n;
}

absl::Status ColdStore::ToDiskForDelete(TaskRecord& t) {
  const std::vector<TaskRecord*> unit = UnitOf(t);
  const std::string why = Unevictable(unit, 0, /*force=*/true, absl::InfinitePast());
  if (!why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(t.job != nullptr
                                                          ? absl::StrCat("job \"", t.job_id(), "\"")
                                                          : absl::StrCat("task \"", t.id(), "\""),
                                                      " cannot be deleted: ", why));
  }
  EvictUnit(unit);
  return absl::OkStatus();
}

void ColdStore::DeleteExpired(absl::Time now, WriteBatch* batch) {
  int64_t budget = opts_->max_deletes_per_tick;
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
          auto it = table_->jobs_by_seq().find(seq);
          if (it != table_->jobs_by_seq().end() && it->second->tasks.empty()) {
            budget -= DeleteJob(*it->second, batch);
          }
        } else if (const ColdTask* c = table_->FindColdBySeq(seq)) {
          std::vector<std::string> ids;
          DeleteTask(*c, &ids, batch);
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

// ---------------------------------------------------------------------------
// Start-up.

absl::Status ColdStore::Adopt(const TaskRow& row) {
  if (absl::Status s = table_->AdoptCold(row); !s.ok()) return s;
  if (row.job_id.empty() && !row.replica) {
    AddExpiring(row.queue, RetentionKind(static_cast<v1::TaskState>(row.state)),
                FromUnixMicrosOrZero(row.update_us), row.seq, false);
  }
  return absl::OkStatus();
}

void ColdStore::Unadopt(const ColdTask& c) {
  if (c.job == nullptr && !c.replica) {
    RemoveExpiring(*c.queue, RetentionKind(c.state()), c.finish, c.seq, false);
  }
  table_->UnadoptCold(c.seq);
}

size_t ColdStore::expiring() const {
  size_t n = 0;
  for (const auto& [queue, kinds] : expiring_) n += kinds[0].size() + kinds[1].size();
  return n;
}

}  // namespace taskgrid::core
