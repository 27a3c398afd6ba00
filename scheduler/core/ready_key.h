// The order ready tasks are taken in, shared by the ready classes of
// Dispatch and the claim board's index by queue: priority first (higher
// first), then submit order.
#pragma once

#include <cstdint>
#include <tuple>

#include "absl/container/btree_set.h"
#include "scheduler/core/model.h"

namespace taskgrid::core {

using ReadyKey = std::tuple<int64_t, int64_t, TaskRecord*>;  // -priority, seq
// B-trees: a million pending tasks take a third of the memory of
// std::set nodes, and submit-order inserts are cheap.
using ReadySet = absl::btree_set<ReadyKey>;

inline ReadyKey ReadyKeyOf(const TaskRecord& t) {
  return {-int64_t{t.spec.priority()}, t.seq, const_cast<TaskRecord*>(&t)};
}

}  // namespace taskgrid::core
