// Queue controls: pausing a queue, its concurrency and rate limits (the
// classes of a queue that may not start a task wait held in ReadyQueues),
// and bulk cancel and retry by filter.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/status_macros.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

absl::Status CheckQueue(const std::string& queue) {
  if (queue.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("queue is empty: name the queue (\"",
                                                   kDefaultQueue,
                                                   "\" for tasks submitted without one)"));
  }
  return CheckName("queue", queue, kMaxQueueNameLength);
}

int64_t Scheduler::InFlight(const std::string& queue) const {
  const TaskTable::Counts& c = table_.CountsOf(queue);
  return c[v1::TASK_STATE_DISPATCHED] + c[v1::TASK_STATE_RUNNING] + c[v1::TASK_STATE_CANCELLING];
}

std::vector<std::string> Scheduler::ControlledQueues() const {
  std::vector<std::string> out;
  queue_controls_.ForEach(
      [&](const std::string& name, const v1::QueueSettings&) { out.push_back(name); });
  std::sort(out.begin(), out.end());
  return out;
}

QueueControls::Gate Scheduler::GateOf(const std::string& queue) const {
  return queue_controls_.Check(queue, InFlight(queue), Mono());
}

v1::QueueStats Scheduler::ApplyQueueSettings(const std::string& queue, const v1::QueueSettings& s) {
  queue_controls_.Set(queue, s, Mono());
  ready_.IndexHeadsByQueue();
  QueueRow row;
  row.queue = queue;
  if (!IsDefault(s)) row.settings = s.SerializeAsString();
  effects_.batch.queues.push_back(std::move(row));
  // Looser or tighter, Dispatch judges the held classes again.
  ready_.ReleaseHeld(queue);
  ready_.ReleaseOverQuota(queue);
  ready_.LookAgain();  // a class in the heads may be closed now
  Dispatch();
  return Stats(queue).front();
}

absl::StatusOr<v1::QueueStats> Scheduler::PauseQueue(const std::string& queue, bool paused) {
  RETURN_IF_ERROR(CheckQueue(queue));
  const v1::QueueSettings* now = queue_controls_.Find(queue);
  v1::QueueSettings s = now != nullptr ? *now : v1::QueueSettings();
  if (s.paused() == paused) return Stats(queue).front();  // nothing to store
  s.set_paused(paused);
  return ApplyQueueSettings(queue, s);
}

absl::StatusOr<v1::QueueStats> Scheduler::SetQueueLimits(const v1::SetQueueLimitsRequest& req) {
  RETURN_IF_ERROR(CheckQueue(req.queue()));
  RETURN_IF_ERROR(ValidateQueueLimits(req));
  const v1::QueueSettings* now = queue_controls_.Find(req.queue());
  v1::QueueSettings s = now != nullptr ? *now : v1::QueueSettings();
  s.set_max_concurrency(req.max_concurrency());
  s.set_rate_per_second(req.rate_per_second());
  s.set_burst(req.burst());
  // One spelling: "64" and "64000m" store the same.
  s.clear_quota();
  ToResourceMap(ParseResourceMap(req.quota()).value_or(Resources{}), s.mutable_quota());
  if (now != nullptr ? now->SerializeAsString() == s.SerializeAsString() : IsDefault(s)) {
    return Stats(req.queue()).front();  // nothing to store
  }
  return ApplyQueueSettings(req.queue(), s);
}

absl::StatusOr<v1::QueueStats> Scheduler::SetQueueWeight(const v1::SetQueueWeightRequest& req) {
  RETURN_IF_ERROR(CheckQueue(req.queue()));
  if (req.has_weight() && (req.weight() < 0 || req.weight() > kMaxQueueWeight)) {
    return absl::InvalidArgumentError(absl::StrCat("weight: ", req.weight(), " is out of range 0-",
                                                   kMaxQueueWeight,
                                                   " (0: only when no other queue waits)"));
  }
  const v1::QueueSettings* now = queue_controls_.Find(req.queue());
  v1::QueueSettings s = now != nullptr ? *now : v1::QueueSettings();
  if (req.has_weight()) {
    s.set_weight(req.weight());
  } else {
    s.clear_weight();
  }
  if (now != nullptr ? now->SerializeAsString() == s.SerializeAsString() : IsDefault(s)) {
    return Stats(req.queue()).front();  // nothing to store
  }
  return ApplyQueueSettings(req.queue(), s);
}

absl::Status Scheduler::RestoreQueues(const std::vector<QueueRow>& rows) {
  for (const QueueRow& row : rows) {
    v1::QueueSettings s;
    if (!s.ParseFromString(row.settings)) {
      return absl::DataLossError(absl::StrCat("queue ", row.queue, ": its settings do not parse"));
    }
    queue_controls_.Set(row.queue, s, Mono());
  }
  ready_.IndexHeadsByQueue();
  return absl::OkStatus();
}

absl::Status BulkStates(ListFilter* filter, std::initializer_list<v1::TaskState> allowed,
                        absl::string_view change) {
  if (filter->queue.empty() && filter->job_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("name a queue or a job_id: a bulk ", change, " never spans every queue"));
  }
  if (!filter->queue.empty())
    RETURN_IF_ERROR(CheckName("queue", filter->queue, kMaxQueueNameLength));
  if (!filter->job_id.empty()) RETURN_IF_ERROR(CheckName("job_id", filter->job_id, kMaxIdLength));
  if (filter->states.empty()) {
    filter->states.assign(allowed.begin(), allowed.end());
    return absl::OkStatus();
  }
  for (size_t i = 0; i < filter->states.size(); ++i) {
    if (std::find(allowed.begin(), allowed.end(), filter->states[i]) == allowed.end()) {
      std::vector<std::string> names;
      for (v1::TaskState s : allowed) names.push_back(StateName(s));
      return absl::InvalidArgumentError(absl::StrCat(
          "states[", i, "]: a ", change, " does not apply to ", StateName(filter->states[i]),
          " tasks (only ", absl::StrJoin(names, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BulkResult> Scheduler::CancelTasks(ListFilter filter) {
  RETURN_IF_ERROR(
      BulkStates(&filter,
                 {v1::TASK_STATE_SCHEDULED, v1::TASK_STATE_BLOCKED, v1::TASK_STATE_PENDING,
                  v1::TASK_STATE_DISPATCHED, v1::TASK_STATE_RUNNING, v1::TASK_STATE_PAUSED},
                 "cancel"));
  const ListPage page = List(filter);
  BulkResult out;
  out.next_after_seq = page.next_after_seq;
  {
    DeferSettling defer(this);
    for (const TaskRecord* found : page.tasks) {
      if (found == nullptr) continue;  // on disk: finished
      TaskRecord& t = *Mutable(found->id());
      // A replica goes with its task (which may be on this page too).
      if (t.replica_of != nullptr || IsTerminal(t.state) || t.state == v1::TASK_STATE_CANCELLING) {
        continue;
      }
      CancelOne(t, "cancelled by a bulk request");
      out.ids.push_back(t.id());
    }
  }
  Dispatch();
  return out;
}

absl::StatusOr<BulkResult> Scheduler::RetryTasks(ListFilter filter) {
  RETURN_IF_ERROR(BulkStates(&filter, {v1::TASK_STATE_FAILED, v1::TASK_STATE_CANCELLED}, "retry"));
  const ListPage page = List(filter);
  BulkResult out;
  out.next_after_seq = page.next_after_seq;
  for (size_t i = 0; i < page.tasks.size(); ++i) {
    const TaskRecord* t = page.tasks[i];
    if (t == nullptr) {
      // On disk: the Engine reads back what a retry selects first, so this
      // one went back to disk in between.
      if (out.skipped++ == 0) {
        const ColdTask* c = table_.FindColdBySeq(page.seqs[i]);
        out.skipped_reason = std::string(
            (c != nullptr ? OnDisk(c->id()) : OnDisk(absl::StrCat(page.seqs[i]))).message());
      }
      continue;
    }
    if (t->replica_of != nullptr) continue;  // retried with its task
    absl::StatusOr<const TaskRecord*> r = Retry(t->id());
    if (r.ok()) {
      out.ids.push_back(t->id());
    } else if (out.skipped++ == 0) {
      out.skipped_reason = std::string(r.status().message());
    }
  }
  return out;
}

}  // namespace taskgrid::core
