// Delivery by merge key: submits with the same (queue, merge key) gather
// into one task until it is dispatched. The first submit makes the task
// and its MergeState (its payload, its fire time); each later one appends
// its payload and, with MERGE_UPDATE_ALWAYS, moves the fire time of a task
// still SCHEDULED to its own not_before. A merge keeps the task's state,
// so it goes through TaskTable::Amend: a row and an event like any change.
// merge_index_ finds the task a submit joins; it holds exactly the
// Joinable() tasks, kept by IndexMerge after every change of one.

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

bool Scheduler::SameSteps(const v1::TaskSpec& a, const v1::TaskSpec& b) {
  if (a.steps_size() != b.steps_size()) return false;
  for (int i = 0; i < a.steps_size(); ++i) {
    if (!google::protobuf::util::MessageDifferencer::Equals(a.steps(i), b.steps(i))) return false;
  }
  return true;
}

bool Scheduler::Joinable(const TaskRecord& t) {
  return t.merge && t.attempt == 0 &&
         (t.state == v1::TASK_STATE_SCHEDULED || t.state == v1::TASK_STATE_PENDING ||
          t.state == v1::TASK_STATE_PAUSED);
}

void Scheduler::IndexMerge(TaskRecord& t) {
  if (!t.merge) return;
  const MergeKey key = MergeKeyOf(t);
  auto it = merge_index_.find(key);
  if (Joinable(t)) {
    TASKGRID_CHECK(it == merge_index_.end() || it->second == &t,
                   absl::StrCat("two tasks of merge key ", key.second, ": ", t.id(), " and ",
                                it == merge_index_.end() ? "" : it->second->id()));
    merge_index_[key] = &t;
  } else if (it != merge_index_.end() && it->second == &t) {
    merge_index_.erase(it);
  }
}

TaskRecord* Scheduler::JoinableTask(const MergeKey& key) const {
  auto it = merge_index_.find(key);
  return it == merge_index_.end() ? nullptr : it->second;
}

void Scheduler::StartMerge(TaskRecord& t, absl::Time now) {
  MergeState& m = t.merge.emplace();
  m.merged.add_payloads(t.spec.payload());
  m.bytes = static_cast<int64_t>(t.spec.payload().size());
  effects_.batch.merged.push_back({t.id(), 0, t.spec.payload()});
  SetTimestamp(t.spec.has_not_before() ? FromProto(t.spec.not_before()) : now,
               m.merged.mutable_fire_time());
}

absl::Status Scheduler::CheckMergeRoom(const MergeKey& key, int64_t count, int64_t bytes,
                                       const v1::TaskSpec& spec, const FieldPath& field) const {
  const int64_t payload = static_cast<int64_t>(spec.payload().size());
  if (count + 1 > opts_.max_merged_payloads) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field.str(), ": merge key \"", key.second, "\" of queue ", key.first, " holds ", count,
        " payloads; the limit is ", opts_.max_merged_payloads, " (--max_merged_payloads)"));
  }
  if (bytes + payload > opts_.max_merged_payload_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field.str(), ": merge key \"", key.second, "\" of queue ", key.first, " holds ", bytes,
        " bytes of payloads and this one is ", payload, "; the limit is ",
        opts_.max_merged_payload_bytes, " (--max_merged_payload_bytes)"));
  }
  return absl::OkStatus();
}

void Scheduler::Merge(TaskRecord& t, const v1::TaskSpec& spec, absl::Time now) {
  const bool move =
      spec.merge_update() != v1::MERGE_UPDATE_ONCE && t.state == v1::TASK_STATE_SCHEDULED;
  const absl::Time fire = spec.has_not_before() ? FromProto(spec.not_before()) : now;
  const int n = t.merge->merged.payloads_size() + 1;
  std::string reason = absl::StrCat("merge key ", spec.merge_key(), ": ", n, " payloads");
  if (move) {
    absl::StrAppend(&reason, "; fires at ",
                    absl::FormatTime(absl::RFC3339_sec, fire, absl::UTCTimeZone()));
  }
  table_.Amend(
      t,
      [&](TaskRecord& r) {
        MergeState& m = *r.merge;
        effects_.batch.merged.push_back({r.id(), m.merged.payloads_size(), spec.payload()});
        m.merged.add_payloads(spec.payload());
        m.bytes += static_cast<int64_t>(spec.payload().size());
        if (move) {
          SetTimestamp(fire, m.merged.mutable_fire_time());
          r.next_run_time = fire;
        }
      },
      std::move(reason), Now(), &effects_.batch);
  if (move && fire <= now) {
    Transition(t, v1::TASK_STATE_PENDING,
               absl::StrCat("merge key ", spec.merge_key(), ": fire time reached"));
  }
}

absl::StatusOr<const TaskRecord*> Scheduler::DeleteByMergeKey(const std::string& queue,
                                                              const std::string& merge_key) {
  const std::string q = queue.empty() ? std::string(kDefaultQueue) : queue;
  RETURN_IF_ERROR(CheckName("queue", q, kMaxQueueNameLength));
  RETURN_IF_ERROR(CheckName("merge_key", merge_key, kMaxIdLength));
  TaskRecord* t = JoinableTask({q, merge_key});
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("no task of merge key \"", merge_key, "\" in queue ", q,
                                            " waits to be delivered"));
  }
  CancelOne(*t, absl::StrCat("deleted by merge key ", merge_key));
  return t;
}

}  // namespace taskgrid::core
