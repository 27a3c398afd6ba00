// Gangs: gang placement's state. The replicas of a task with
// `replicas.gang` start in one Dispatch, each on an agent of its own, or
// none does. While they do not all fit, the gang reserves room on the
// agents it would use (other work leaves that room alone) for
// `gang_wait`, then lets it go for as long before it reserves again: no
// gang holds capacity it cannot use forever, and none starves behind a
// stream of smaller tasks.
//
// Owns: the waiting gangs (by their task's id): their turn of reserving
// or not, what they reserved, what their last look found; and the
// reservation fields of the agents (AgentRecord::reserved_for,
// reserved_slots, reserved), which nothing else writes.
// Invariants (CheckInvariants):
//   - a gang keeps state only while every member waits PENDING;
//   - an agent's reservation belongs to a gang in its reserving turn that
//     lists the agent, and an agent reserved for no gang has no room
//     reserved.
//
// It starts no task itself: a gang that fits is started through the
// ReadyQueues host, a gang that waits moves its classes there.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "scheduler/core/agent_registry.h"
#include "scheduler/core/model.h"
#include "scheduler/core/queue_controls.h"
#include "scheduler/core/ready_queues.h"

namespace taskgrid::core {

class Gangs {
 public:
  Gangs(const QueueControls* controls, AgentRegistry* agents, ReadyQueues* ready)
      : controls_(controls), agents_(agents), ready_(ready) {}
  Gangs(const Gangs&) = delete;
  Gangs& operator=(const Gangs&) = delete;

  // Dispatch came to a class of the gang of `group`: all of its members
  // start on agents of their own among `agents` (through `host`), or none
  // does and its classes leave the heads (aside, parked, held or over
  // quota), reserving room while it waits. `in_flight`: the tasks of its
  // queue DISPATCHED or RUNNING (its queue must have room for all).
  void Dispatch(TaskRecord& group, const std::vector<AgentRecord*>& agents, int64_t in_flight,
                absl::Duration mono, ReadyQueues::Host& host, std::vector<std::string>* aside);
  // The gang lets go of its reservation and its state (it started, or
  // stopped waiting as a whole).
  void Release(const std::string& group_id);
  // Why a PENDING member of `group` has not started; empty when nothing
  // about the gang holds it.
  std::string Reason(const TaskRecord& group, absl::Duration mono) const;
  // How many of `members` distinct connected agents could run, one each
  // (free room aside; not where a sibling succeeded).
  int32_t AgentsCould(const TaskRecord& group, const std::vector<TaskRecord*>& members) const;

  // "" or what is broken. `find`: the task in memory by id, or nullptr.
  std::string CheckInvariants(absl::FunctionRef<const TaskRecord*(const std::string&)> find) const;

 private:
  // What a waiting gang reserved, and whether it is in a turn of
  // reserving or of leaving the room to others.
  struct GangState {
    std::string group;
    bool started = false;  // its first turn began (phase_end is set)
    bool reserving = true;
    absl::Duration phase_end;           // monotonic: the turn ends
    std::vector<std::string> reserved;  // agents holding its reservation
    int32_t size = 0;                   // its members at its last look
    int32_t fit_now = 0;                // of them, how many had room
    int32_t agents_could = 0;           // distinct agents that could run one
  };

  // Reserves an agent for each member, or none when not every one has an
  // agent no other gang reserved.
  void Reserve(const TaskRecord& group, const std::vector<TaskRecord*>& members, GangState* g);
  void Unreserve(GangState& g);

  const QueueControls* const controls_;
  AgentRegistry* const agents_;
  ReadyQueues* const ready_;
  absl::flat_hash_map<std::string, GangState> gangs_;
};

}  // namespace taskgrid::core
