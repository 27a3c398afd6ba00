// The replicas of a task as functions of its records: which of them make
// its gang, and which agents a replica keeps off. Shared by the
// Scheduler, ReadyQueues' host and Gangs; no state.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "scheduler/core/model.h"

namespace taskgrid::core {

// A replica of a task whose replicas start as a gang.
inline bool IsGangMember(const TaskRecord& t) {
  return t.replica_of != nullptr && t.replica_of->spec.replicas().gang();
}

// The replicas of `group` that have not ended (the gang to start).
std::vector<TaskRecord*> GangMembers(const TaskRecord& group);

// Agents a replica of `group` may not take: those holding another of its
// replicas, and those one succeeded on.
absl::flat_hash_set<std::string> ReplicaAgents(const TaskRecord& group);

}  // namespace taskgrid::core
