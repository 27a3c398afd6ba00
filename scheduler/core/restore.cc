// Recovery: the table read back from the store at start-up.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

absl::Status Scheduler::Restore(std::vector<TaskRecord> tasks, int64_t last_revision,
                                int64_t oldest_revision) {
  RETURN_IF_ERROR(BeginRestore(tasks.size(), last_revision, oldest_revision));
  std::vector<std::unique_ptr<TaskRecord>> owned;
  owned.reserve(tasks.size());
  for (TaskRecord& t : tasks) owned.push_back(std::make_unique<TaskRecord>(std::move(t)));
  RETURN_IF_ERROR(RestoreTasks(&owned));
  return FinishRestore();
}

absl::Status Scheduler::BeginRestore(size_t expected_tasks, int64_t last_revision,
                                     int64_t oldest_revision) {
  if (table_.size() != 0 || restoring_ != nullptr) {
    return absl::FailedPreconditionError("Restore needs an empty scheduler");
  }
  restoring_ = std::make_unique<Restoring>();
  table_.Reserve(expected_tasks);
  // History from before the restart counts as of now for retention.
  table_.SetRevisions(last_revision, oldest_revision, Now());
  return absl::OkStatus();
}

absl::Status Scheduler::RestoreTasks(std::vector<std::unique_ptr<TaskRecord>>* tasks) {
  if (restoring_ == nullptr)
    return absl::FailedPreconditionError("RestoreTasks before BeginRestore");
  for (std::unique_ptr<TaskRecord>& owned : *tasks) {
    // A finished task read light, needed in memory after all (RestoreNeeds).
    if (const ColdTask* c = table_.FindCold(owned->id())) {
      if (c->seq != owned->seq) {
        return absl::DataLossError(absl::StrCat("task ", owned->id(), " is stored twice"));
      }
      cold_.Unadopt(*c);
    }
    ready_.SetClass(*owned);
    ASSIGN_OR_RETURN(TaskRecord * adopted, table_.Adopt(std::move(owned)));
    TaskRecord& t = *adopted;
    if (!t.spec.depends_on().empty()) restoring_->with_deps.push_back(&t);
    if (!t.spec.replica_of().empty()) restoring_->replicas.push_back(&t);
    if (UniqueUntil(t) > Now()) keys_.Hold(t);
    restored_unexamined_.push_back(&t);
    if (IsInFlight(t.state)) {
      restoring_->in_flight.push_back(&t);
    } else if (t.claimed()) {
      return absl::DataLossError(
          absl::StrCat("task ", t.id(), " is ", StateName(t.state), " but claimed"));
    }
    // A dispatched attempt not accepted yet has not started either: its
    // deadline holds through the restart (and, passed, asks its agent to
    // stop it once the agent is back).
    if (!IsTerminal(t.state) && (!IsInFlight(t.state) || (t.state == v1::TASK_STATE_DISPATCHED &&
                                                          t.start_time == absl::InfinitePast()))) {
      ArmStartDeadline(t, t.create_time);
    }
    if (!t.job_id().empty()) {
      JobRecord& j = table_.FindOrAddJob(t.job_id(), t.seq, t.create_time);
      t.job = &j;
      j.tasks.push_back(&t);
      j.update_time = std::max(j.update_time, t.update_time.get());
    }
    table_.Enter(t);  // as Transition does
    if (t.state == v1::TASK_STATE_PENDING) {
      t.ready_time = t.update_time;  // its last change made it PENDING, or came after
      AddReady(t);
    }
    keys_.Index(t);
  }
  tasks->clear();
  return absl::OkStatus();
}

absl::Status Scheduler::FinishRestore() {
  if (restoring_ == nullptr)
    return absl::FailedPreconditionError("FinishRestore before BeginRestore");
  const std::unique_ptr<Restoring> r = std::move(restoring_);
  std::vector<TaskRecord*>& with_deps = r->with_deps;
  // An agent gets as long as agents keep their tasks while the scheduler
  // refuses them (Welcome.restart_grace): it may be running them still.
  const absl::Duration agent_grace_end = Mono() + opts_.RestartGrace();
  // The deadlines of the attempts themselves (an accept that never comes,
  // an attempt timeout) count from the reconnect grace, as for a reconnect:
  // an agent that is alive comes back within a second of the restore, and
  // one that does not has its attempts' own limits run out as they would.
  const absl::Duration grace_end = Mono() + opts_.reconnect_grace;
  // Dependencies may name tasks stored later (a request lists them in any
  // order): link once every task is back, in submit order.
  const auto by_seq = [](const TaskRecord* x, const TaskRecord* y) { return x->seq < y->seq; };
  std::sort(with_deps.begin(), with_deps.end(), by_seq);
  for (TaskRecord* t : with_deps) {
    for (const std::string& id : t->spec.depends_on()) {
      if (TaskRecord* d = Mutable(id)) {
        LinkDependency(*t, *d);
      } else if (IsTerminal(t->state)) {
        t->deps_deleted = true;  // deleted while both were finished
      } else {
        return absl::DataLossError(
            absl::StrCat("task ", t->id(), " depends on ", id, ", which is not stored"));
      }
    }
  }
  // Jobs: tasks read back after the scan (RestoreNeeds) joined theirs out
  // of order; a job all on disk waits for its retention.
  for (const auto& [seq, j] : table_.jobs_by_seq()) {
    std::sort(j->tasks.begin(), j->tasks.end(), by_seq);
    if (!j->tasks.empty() && !j->cold.empty()) {
      return absl::DataLossError(absl::StrCat("job ", j->id, " came back in part"));
    }
    if (j->tasks.empty()) cold_.AdoptJob(*j);
  }
  // Finished tasks in memory (needed by unfinished ones, or in an
  // unfinished job) go to disk once nothing needs them.
  for (const auto& [seq, t] : table_.by_seq()) {
    if (IsTerminal(t->state)) cold_.LookAgain(seq);
  }
  restored_unexamined_.clear();
  // Replicas back to their task, in order (they were made in order).
  std::sort(r->replicas.begin(), r->replicas.end(), by_seq);
  for (TaskRecord* rep : r->replicas) {
    TaskRecord* group = Mutable(rep->spec.replica_of());
    if (group == nullptr || ReplicaCount(group->spec) == 0) {
      return absl::DataLossError(absl::StrCat("task ", rep->id(), " is a replica of ",
                                              rep->spec.replica_of(),
                                              ", which is not stored or has no replicas"));
    }
    rep->replica_of = group;
    group->replicas.push_back(rep);
  }
  // A gang member in flight while a sibling waits to run again was told
  // to stop before the restart (the request is not stored): it is again,
  // and its agent hears the stop when it reconnects.
  for (TaskRecord* rep : r->replicas) {
    if (!IsGangMember(*rep) || rep->replica_of->replicas.front() != rep) continue;
    const std::vector<TaskRecord*>& members = rep->replica_of->replicas;
    if (std::none_of(members.begin(), members.end(), [](const TaskRecord* m) {
          return m->state == v1::TASK_STATE_PENDING || m->state == v1::TASK_STATE_SCHEDULED;
        })) {
      continue;
    }
    for (TaskRecord* m : members) {
      if ((m->state == v1::TASK_STATE_DISPATCHED || m->state == v1::TASK_STATE_RUNNING) &&
          !m->pause_requested) {
        m->requeue_requested = true;
      }
    }
  }
  for (TaskRecord* tp : r->in_flight) {
    TaskRecord& t = *tp;
    if (t.agent_id.empty()) {
      return absl::DataLossError(absl::StrCat("task ", t.id(), " is in flight with no agent"));
    }
    if (t.claimed()) {
      // A pull worker's claim: it holds until its stored end (the worker
      // may extend or complete it once the scheduler is back), then the
      // first tick takes it back.
      if (t.state != v1::TASK_STATE_RUNNING) {
        return absl::DataLossError(
            absl::StrCat("task ", t.id(), " is claimed but ", StateName(t.state)));
      }
      board_.Claimed(t, t.claim_until);
      continue;
    }
    // A chain link still waiting on its agent for its predecessor (in
    // flight there too) holds no slot.
    if (t.deps.size() == 1 && IsInFlight(t.deps[0]->state) && t.deps[0]->agent_id == t.agent_id &&
        t.deps[0]->dependents.size() == 1 && t.state == v1::TASK_STATE_DISPATCHED) {
      t.chained_after = t.deps[0];
      t.deps[0]->chain_next = &t;
    }
    // The agent is not connected yet: it gets the grace window to come
    // back and claim its attempts; after it they are re-queued.
    AgentRecord* a = &agents_.Restored(t.agent_id, Mono(), agent_grace_end);
    a->tasks.insert(t.id());
    if (t.chained_after == nullptr) {
      ready_.TakeResources(*a, t.queue(), SlotsOf(t.spec.placement()), NeedOf(t.spec.placement()));
      if (t.start_time == absl::InfinitePast()) {
        // Not accepted yet (DISPATCHED, or cancelled before it was): its
        // agent's Hello settles it; should the agent come back without
        // ever accepting it, the ack timeout still applies.
        task_deadlines_.Set(t.id(), grace_end + AckTimeout(t));
      } else if (const absl::Duration timeout = FromProto(t.spec.attempt_timeout());
                 timeout > absl::ZeroDuration()) {
        // Started: what is left of its attempt timeout, counted from the
        // stored start time, but never ending before its agent had the
        // grace to come back with a result it may hold.
        const absl::Duration left = std::max(t.start_time + timeout - Now(), absl::ZeroDuration());
        task_deadlines_.Set(t.id(),
                            std::max(grace_end, Mono() + left) + opts_.attempt_timeout_slack);
      }
    }
    a->slots = std::max(a->slots, a->used);
    // Until its Hello says what it offers, it offers what it holds.
    for (const auto& [name, amount] : a->held) {
      int64_t& offer = a->resources[name];
      offer = std::max(offer, amount);
    }
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::core
