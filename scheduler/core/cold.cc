// Finished tasks on disk, the Scheduler's side (the state is ColdStore's):
// what an operation needs read back (ColdSeqsOf*), the delete operations
// as clients ask for them (checked here, done by ColdStore), a queue's
// retention settings, and the start-up half (RestoreCold, RestoreNeeds).

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

size_t Scheduler::Evict(int64_t committed) { return cold_.Evict(committed, Now()); }

absl::Duration Scheduler::RetentionOf(const std::string& queue, bool failed) const {
  return cold_.RetentionOf(queue, failed);
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
  return cold_.Needs(records);
}

std::vector<int64_t> Scheduler::Warm(std::vector<std::unique_ptr<TaskRecord>>* records) {
  return cold_.Warm(records, [this](TaskRecord& t) { ready_.SetClass(t); });
}

// ---------------------------------------------------------------------------
// Deleting.

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
  if (TaskRecord* t = Mutable(id)) RETURN_IF_ERROR(cold_.ToDiskForDelete(*t));
  std::vector<std::string> ids;
  cold_.DeleteTask(*table_.FindCold(id), &ids, &effects_.batch);
  return ids;
}

absl::StatusOr<int64_t> Scheduler::DeleteJob(const std::string& id) {
  ASSIGN_OR_RETURN(JobRecord * j, LookupJob(id));
  if (JobStateOf(*j) == v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", id, "\" has tasks that have not finished: cancel it first (CancelJob)"));
  }
  if (!j->tasks.empty()) RETURN_IF_ERROR(cold_.ToDiskForDelete(*j->tasks.front()));
  return cold_.DeleteJob(*j, &effects_.batch);
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
    RETURN_IF_ERROR(cold_.Adopt(row));
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
