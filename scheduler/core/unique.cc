// Unique by key: a task with spec.unique_key holds (queue, key) for
// spec.unique_ttl from its submit; a submit with the key meanwhile gets that
// task back (AddTasks). Derived from the task rows: a restart rebuilds it.

#include "common/proto_time.h"
#include "scheduler/core/scheduler.h"

namespace taskgrid::core {

const TaskRecord* Scheduler::UniqueHolder(const MergeKey& key, absl::Time now) const {
  auto it = unique_index_.find(key);
  if (it == unique_index_.end() || it->second.until <= now) return nullptr;
  return it->second.task;
}

void Scheduler::HoldUniqueKey(TaskRecord& t) {
  const absl::Time until = t.create_time + FromProto(t.spec.unique_ttl());
  const MergeKey key{t.queue(), t.spec.unique_key()};
  UniqueHold& hold = unique_index_[key];
  if (hold.task != nullptr) {
    // A restore goes in submit order: a later task took the key after the
    // earlier one's time was up.
    unique_expiry_.erase({hold.until, key});
  }
  hold = {&t, until};
  unique_expiry_.insert({until, key});
}

void Scheduler::ExpireUniqueKeys(absl::Time now) {
  while (!unique_expiry_.empty() && unique_expiry_.begin()->first <= now) {
    unique_index_.erase(unique_expiry_.begin()->second);
    unique_expiry_.erase(unique_expiry_.begin());
  }
}

}  // namespace taskgrid::core
