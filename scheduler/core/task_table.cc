#include "scheduler/core/task_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

TaskRecord* TaskTable::Find(absl::string_view id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

TaskRecord& TaskTable::Insert(std::unique_ptr<TaskRecord> owned) {
  TaskRecord& t = *owned;
  t.seq = next_seq_++;
  const bool inserted = tasks_.try_emplace(t.id(), std::move(owned)).second;
  TASKGRID_CHECK(inserted, absl::StrCat("task ", t.id(), " was created twice"));
  by_seq_[t.seq] = &t;
  return t;
}

absl::StatusOr<TaskRecord*> TaskTable::Adopt(std::unique_ptr<TaskRecord> owned) {
  TaskRecord* t = owned.get();
  // try_emplace leaves `owned` alone when the id is taken.
  if (!tasks_.try_emplace(t->id(), std::move(owned)).second) {
    return absl::DataLossError(absl::StrCat("task ", t->id(), " is stored twice"));
  }
  by_seq_.emplace_hint(by_seq_.end(), t->seq, t);
  next_seq_ = std::max(next_seq_, t->seq + 1);
  return t;
}

std::string TaskTable::NewTaskId(absl::Time now) {
  for (;;) {
    std::string id =
        absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(now), ++id_counter_ % 1'000'000);
    if (!tasks_.contains(id)) return id;
  }
}

JobRecord* TaskTable::FindJob(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

JobRecord& TaskTable::FindOrAddJob(const std::string& id, int64_t seq, absl::Time create_time) {
  std::unique_ptr<JobRecord>& j = jobs_[id];
  if (j == nullptr) {
    j = std::make_unique<JobRecord>();
    j->id = id;
    j->seq = seq;
    j->create_time = create_time;
    j->update_time = create_time;
    jobs_by_seq_[seq] = j.get();
  }
  return *j;
}

std::string TaskTable::NewJobId(absl::Time now) {
  for (;;) {
    std::string id =
        absl::StrFormat("j%014d-%06d", absl::ToUnixMillis(now), ++id_counter_ % 1'000'000);
    if (!jobs_.contains(id)) return id;
  }
}

v1::TaskState TaskTable::Apply(TaskRecord& t, v1::TaskState to, std::string reason, absl::Time now,
                               const std::string* event_agent, WriteBatch* batch) {
  const v1::TaskState from = t.state;
  TASKGRID_CHECK(IsAllowedTransition(from, to),
                 absl::StrCat("task ", t.id(), ": ", StateName(from), " -> ", StateName(to)));
  if (from != v1::TASK_STATE_UNSPECIFIED) Leave(t);
  t.state = to;
  Enter(t);
  Record(t, from, std::move(reason), now, event_agent, batch);
  return from;
}

void TaskTable::Amend(TaskRecord& t, const std::function<void(TaskRecord&)>& change,
                      std::string reason, absl::Time now, WriteBatch* batch) {
  Leave(t);
  change(t);
  Enter(t);
  Record(t, t.state, std::move(reason), now, nullptr, batch);
}

void TaskTable::Record(TaskRecord& t, v1::TaskState from, std::string reason, absl::Time now,
                       const std::string* event_agent, WriteBatch* batch) {
  t.reason = std::move(reason);
  t.update_time = now;
  if (t.job != nullptr) t.job->update_time = now;
  batch->tasks.push_back(ToRow(t, from == v1::TASK_STATE_UNSPECIFIED));
  EventRow e;
  e.revision = ++last_revision_;
  e.task_id = t.id();
  e.queue = t.queue();
  e.from_state = from;
  e.to_state = t.state;
  e.attempt = t.attempt;
  e.agent_id = event_agent != nullptr ? *event_agent : t.agent_id;
  e.time_us = ToUnixMicrosOrZero(now);
  e.reason = t.reason;
  e.job_id = t.job_id();
  if (revision_marks_.empty() ||
      e.time_us / 1'000'000 != ToUnixMicrosOrZero(revision_marks_.back().second) / 1'000'000) {
    revision_marks_.push_back({e.revision, now});
  } else {
    revision_marks_.back().first = e.revision;
  }
  batch->events.push_back(std::move(e));
}

void TaskTable::Enter(TaskRecord& t) {
  ++counts_[t.queue()][t.state];
  if (t.job != nullptr) ++t.job->counts[t.state];
  if (t.state == v1::TASK_STATE_SCHEDULED) scheduled_.insert({t.next_run_time, t.seq, &t});
  if (t.state == v1::TASK_STATE_PENDING) pending_[t.queue()].insert({t.seq, &t});
}

void TaskTable::Leave(TaskRecord& t) {
  if (t.state == v1::TASK_STATE_SCHEDULED) scheduled_.erase({t.next_run_time, t.seq, &t});
  if (t.state == v1::TASK_STATE_PENDING) {
    auto it = pending_.find(t.queue());
    it->second.erase({t.seq, &t});
    if (it->second.empty()) pending_.erase(it);
  }
  --counts_[t.queue()][t.state];
  if (t.job != nullptr) --t.job->counts[t.state];
}

TaskRecord* TaskTable::NextDue(absl::Time now) const {
  if (scheduled_.empty() || std::get<0>(*scheduled_.begin()) > now) return nullptr;
  return std::get<2>(*scheduled_.begin());
}

const TaskRecord* TaskTable::OldestPending(const std::string& queue) const {
  auto it = pending_.find(queue);
  return it == pending_.end() ? nullptr : it->second.begin()->second;
}

const TaskTable::Counts& TaskTable::CountsOf(const std::string& queue) const {
  static const Counts kNone{};
  auto it = counts_.find(queue);
  return it == counts_.end() ? kNone : it->second;
}

void TaskTable::SetRevisions(int64_t last, int64_t oldest, absl::Time now) {
  last_revision_ = last;
  oldest_revision_ = std::max<int64_t>(oldest, 1);
  if (last > 0) revision_marks_.push_back({last, now});
}

int64_t TaskTable::PruneBefore(absl::Time cutoff) {
  int64_t prune = 0;
  while (!revision_marks_.empty() && revision_marks_.front().second < cutoff) {
    prune = revision_marks_.front().first;
    revision_marks_.pop_front();
  }
  if (prune > 0) oldest_revision_ = prune + 1;
  return prune;
}

}  // namespace taskgrid::core
