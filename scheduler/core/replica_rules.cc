#include "scheduler/core/replica_rules.h"

#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

std::vector<TaskRecord*> GangMembers(const TaskRecord& group) {
  std::vector<TaskRecord*> out;
  for (TaskRecord* r : group.replicas) {
    if (!IsTerminal(r->state)) out.push_back(r);
  }
  return out;
}

absl::flat_hash_set<std::string> ReplicaAgents(const TaskRecord& group) {
  absl::flat_hash_set<std::string> out;
  for (const TaskRecord* r : group.replicas) {
    if (IsInFlight(r->state)) {
      out.insert(r->agent_id);
    } else if (r->state == v1::TASK_STATE_SUCCEEDED && !r->attempts.empty()) {
      out.insert(r->attempts.back().agent_id());
    }
  }
  return out;
}

}  // namespace taskgrid::core
