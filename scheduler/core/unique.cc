// Unique by key: a task with spec.unique_key holds (queue, key) for
// spec.unique_ttl from its not_before (UniqueUntil); a submit with the key
// meanwhile gets that task back, or ALREADY_EXISTS with unique_refuse
// (AddTasks). Unless spec.unique_release is AT_TTL, the task lets go of the
// key when it succeeds or is cancelled (ReleaseUniqueKey). Derived from the
// task rows (the unique_key and unique_until_us columns, the latter 0 once
// let go of, so a task on disk holds its key too): a restart rebuilds it.

#include "common/proto_time.h"
#include "scheduler/core/scheduler.h"

namespace taskgrid::core {

int64_t Scheduler::UniqueHolder(const MergeKey& key, absl::Time now) const {
  auto it = unique_index_.find(key);
  if (it == unique_index_.end() || it->second.until <= now) return 0;
  return it->second.seq;
}

void Scheduler::HoldUniqueKey(const TaskRecord& t) {
  HoldUniqueKey({t.queue(), t.spec.unique_key()}, t.seq, UniqueUntil(t));
}

void Scheduler::ReleaseUniqueKey(TaskRecord& t) {
  if (t.spec.unique_key().empty() || t.unique_released ||
      t.spec.unique_release() == v1::UNIQUE_RELEASE_AT_TTL) {
    return;
  }
  DropUniqueKey({t.queue(), t.spec.unique_key()}, t.seq);
  t.unique_released = true;  // stored with the transition's row
}

void Scheduler::HoldUniqueKey(const MergeKey& key, int64_t seq, absl::Time until) {
  UniqueHold& hold = unique_index_[key];
  if (hold.seq != 0) {
    // A restore may meet the holders in any order: a later task took the
    // key after the earlier one's time was up.
    if (hold.seq > seq) return;
    unique_expiry_.erase({hold.until, key});
  }
  hold = {seq, until};
  unique_expiry_.insert({until, key});
}

void Scheduler::DropUniqueKey(const MergeKey& key, int64_t seq) {
  auto it = unique_index_.find(key);
  if (it == unique_index_.end() || it->second.seq != seq) return;
  unique_expiry_.erase({it->second.until, key});
  unique_index_.erase(it);
}

void Scheduler::ExpireUniqueKeys(absl::Time now) {
  while (!unique_expiry_.empty() && unique_expiry_.begin()->first <= now) {
    unique_index_.erase(unique_expiry_.begin()->second);
    unique_expiry_.erase(unique_expiry_.begin());
  }
}

}  // namespace taskgrid::core
