#include "scheduler/core/task_keys.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

bool TaskKeys::SameSteps(const v1::TaskSpec& a, const v1::TaskSpec& b) {
  if (a.steps_size() != b.steps_size()) return false;
  for (int i = 0; i < a.steps_size(); ++i) {
    if (!google::protobuf::util::MessageDifferencer::Equals(a.steps(i), b.steps(i))) return false;
  }
  return true;
}

bool TaskKeys::Joinable(const TaskRecord& t) {
  return t.merge && t.attempt == 0 &&
         (t.state == v1::TASK_STATE_SCHEDULED || t.state == v1::TASK_STATE_PENDING ||
          t.state == v1::TASK_STATE_PAUSED);
}

void TaskKeys::Index(TaskRecord& t) {
  if (!t.merge) return;
  const Key key = MergeKeyOf(t);
  auto it = merge_.find(key);
  if (Joinable(t)) {
    TASKGRID_CHECK(it == merge_.end() || it->second == &t,
                   absl::StrCat("two tasks of merge key ", key.second, ": ", t.id(), " and ",
                                it == merge_.end() ? "" : it->second->id()));
    merge_[key] = &t;
  } else if (it != merge_.end() && it->second == &t) {
    merge_.erase(it);
  }
}

TaskRecord* TaskKeys::JoinableTask(const Key& key) const {
  auto it = merge_.find(key);
  return it == merge_.end() ? nullptr : it->second;
}

void TaskKeys::StartMerge(TaskRecord& t, absl::Time now, WriteBatch* batch) {
  MergeState& m = t.merge.emplace();
  m.merged.add_payloads(t.spec.payload());
  m.bytes = static_cast<int64_t>(t.spec.payload().size());
  batch->merged.push_back({t.id(), 0, t.spec.payload()});
  SetTimestamp(t.spec.has_not_before() ? FromProto(t.spec.not_before()) : now,
               m.merged.mutable_fire_time());
}

absl::Status TaskKeys::CheckRoom(const Key& key, int64_t count, int64_t bytes,
                                 const v1::TaskSpec& spec, const FieldPath& field) const {
  const int64_t payload = static_cast<int64_t>(spec.payload().size());
  if (count + 1 > max_payloads_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field.str(), ": merge key \"", key.second, "\" of queue ", key.first, " holds ", count,
        " payloads; the limit is ", max_payloads_, " (--max_merged_payloads)"));
  }
  if (bytes + payload > max_payload_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field.str(), ": merge key \"", key.second, "\" of queue ", key.first,
                     " holds ", bytes, " bytes of payloads and this one is ", payload,
                     "; the limit is ", max_payload_bytes_, " (--max_merged_payload_bytes)"));
  }
  return absl::OkStatus();
}

bool TaskKeys::Merge(TaskTable& table, TaskRecord& t, const v1::TaskSpec& spec, absl::Time now,
                     WriteBatch* batch) {
  const bool move =
      spec.merge_update() != v1::MERGE_UPDATE_ONCE && t.state == v1::TASK_STATE_SCHEDULED;
  const absl::Time fire = spec.has_not_before() ? FromProto(spec.not_before()) : now;
  const int n = t.merge->merged.payloads_size() + 1;
  std::string reason = absl::StrCat("merge key ", spec.merge_key(), ": ", n, " payloads");
  if (move) {
    absl::StrAppend(&reason, "; fires at ",
                    absl::FormatTime(absl::RFC3339_sec, fire, absl::UTCTimeZone()));
  }
  table.Amend(
      t,
      [&](TaskRecord& r) {
        MergeState& m = *r.merge;
        batch->merged.push_back({r.id(), m.merged.payloads_size(), spec.payload()});
        m.merged.add_payloads(spec.payload());
        m.bytes += static_cast<int64_t>(spec.payload().size());
        if (move) {
          SetTimestamp(fire, m.merged.mutable_fire_time());
          r.next_run_time = fire;
        }
      },
      std::move(reason), now, batch);
  return move && fire <= now;
}

int64_t TaskKeys::UniqueHolder(const Key& key, absl::Time now) const {
  auto it = unique_.find(key);
  if (it == unique_.end() || it->second.until <= now) return 0;
  return it->second.seq;
}

void TaskKeys::Hold(const TaskRecord& t) {
  Hold({t.queue(), t.spec.unique_key()}, t.seq, UniqueUntil(t));
}

void TaskKeys::Release(TaskRecord& t) {
  if (t.spec.unique_key().empty() || t.unique_released ||
      t.spec.unique_release() == v1::UNIQUE_RELEASE_AT_TTL) {
    return;
  }
  Drop({t.queue(), t.spec.unique_key()}, t.seq);
  t.unique_released = true;  // stored with the transition's row
}

void TaskKeys::Hold(const Key& key, int64_t seq, absl::Time until) {
  UniqueHold& hold = unique_[key];
  if (hold.seq != 0) {
    // A restore may meet the holders in any order: a later task took the
    // key after the earlier one's time was up.
    if (hold.seq > seq) return;
    unique_expiry_.erase({hold.until, key});
  }
  hold = {seq, until};
  unique_expiry_.insert({until, key});
}

void TaskKeys::Drop(const Key& key, int64_t seq) {
  auto it = unique_.find(key);
  if (it == unique_.end() || it->second.seq != seq) return;
  unique_expiry_.erase({it->second.until, key});
  unique_.erase(it);
}

void TaskKeys::Expire(absl::Time now) {
  while (!unique_expiry_.empty() && unique_expiry_.begin()->first <= now) {
    unique_.erase(unique_expiry_.begin()->second);
    unique_expiry_.erase(unique_expiry_.begin());
  }
}

}  // namespace taskgrid::core
