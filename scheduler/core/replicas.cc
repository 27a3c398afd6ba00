// One task on N workers: a task with `replicas` runs nothing itself. Its
// replicas, "<id>:r1" ... "<id>:rN", are tasks of their own (dispatched,
// fenced, retried and moved off lost agents like any other), each kept off
// the agents its siblings hold or succeeded on; the task waits BLOCKED and
// ends by its success policy.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

namespace {

// How many replicas must succeed.
int32_t Needed(const TaskRecord& t) {
  const v1::Replicas& r = t.spec.replicas();
  switch (r.success()) {
    case v1::SUCCESS_POLICY_ANY:
      return 1;
    case v1::SUCCESS_POLICY_QUORUM:
      return r.quorum();
    default:
      return static_cast<int32_t>(t.replicas.size());
  }
}

std::string PolicyName(const TaskRecord& t) {
  const v1::Replicas& r = t.spec.replicas();
  switch (r.success()) {
    case v1::SUCCESS_POLICY_ANY:
      return "any";
    case v1::SUCCESS_POLICY_QUORUM:
      return absl::StrCat("quorum ", r.quorum());
    default:
      return "all";
  }
}

}  // namespace

void Scheduler::MakeReplicas(TaskRecord& t, absl::Time now, std::vector<TaskRecord*>* created) {
  const v1::Replicas& want = t.spec.replicas();
  const int32_t count = ReplicaCount(t.spec);
  t.replicas.reserve(count);
  for (int32_t n = 1; n <= count; ++n) {
    auto owned = std::make_unique<TaskRecord>();
    v1::TaskSpec& spec = owned->spec;
    spec = t.spec;
    spec.clear_replicas();
    spec.clear_job_id();  // the task is the job's; its replicas are its own
    spec.set_id(ReplicaId(t.id(), n));
    spec.set_replica_of(t.id());
    if (want.agent_ids_size() > 0) {
      spec.mutable_placement()->clear_agent_ids();
      spec.mutable_placement()->add_agent_ids(want.agent_ids(n - 1));
    }
    TaskRecord& r = table_.Insert(std::move(owned));
    r.create_time = now;
    ready_.SetClass(r);
    r.replica_of = &t;
    t.replicas.push_back(&r);
    created->push_back(&r);
  }
}

std::string Scheduler::ReplicasReason(const TaskRecord& t) const {
  return absl::StrCat("waiting for its ", t.replicas.size(), " replicas (success: ", PolicyName(t),
                      ")");
}

void Scheduler::SettleReplicas(TaskRecord& t) {
  const int32_t total = static_cast<int32_t>(t.replicas.size());
  const int32_t need = Needed(t);
  int32_t succeeded = 0, failed = 0;
  // The result of the task: the replica that decided it (the one that
  // ended last), else any that ended so.
  const TaskRecord* last_ok = nullptr;
  const TaskRecord* last_bad = nullptr;
  for (const TaskRecord* r : t.replicas) {
    if (r->state == v1::TASK_STATE_SUCCEEDED) {
      ++succeeded;
      if (last_ok == nullptr || r == t.replica_ended) last_ok = r;
    } else if (IsTerminal(r->state)) {
      ++failed;
      if (last_bad == nullptr || r == t.replica_ended) last_bad = r;
    }
  }
  std::string why;
  if (succeeded >= need) {
    t.set_result(last_ok->result());
    Transition(t, v1::TASK_STATE_SUCCEEDED,
               absl::StrCat(succeeded, " of ", total,
                            " replicas succeeded (success: ", PolicyName(t), ")"));
    why = absl::StrCat("not needed: task ", t.id(), " succeeded");
  } else if (failed > total - need) {
    t.set_result(last_bad->result());
    Transition(t, v1::TASK_STATE_FAILED,
               absl::StrCat("replica ", last_bad->id(), " ended ", StateName(last_bad->state), ": ",
                            succeeded, " of ", total, " succeeded and ", failed, " did not, so ",
                            need, " can no longer succeed (success: ", PolicyName(t), ")"));
    why = absl::StrCat("task ", t.id(), " failed");
  } else {
    return;
  }
  for (TaskRecord* r : t.replicas) {
    if (!IsTerminal(r->state)) CancelOne(*r, why);
  }
}

absl::Status Scheduler::CheckRestartReplicas(const TaskRecord& t, bool all,
                                             absl::string_view what) const {
  int64_t n = 1;  // the task itself waits again
  for (const TaskRecord* r : t.replicas) {
    if (!all && r->state == v1::TASK_STATE_SUCCEEDED) continue;
    if (!IsTerminal(r->state)) {
      return absl::FailedPreconditionError(absl::StrCat("replica \"", r->id(), "\" of task \"",
                                                        t.id(), "\" is ", StateName(r->state),
                                                        "; try again once it has stopped"));
    }
    ++n;
  }
  return CheckRoom(t.queue(), n, what);
}

void Scheduler::RestartReplicas(TaskRecord& t, bool all, const std::string& why) {
  for (TaskRecord* r : t.replicas) {
    if (!all && r->state == v1::TASK_STATE_SUCCEEDED) continue;
    ClearForRerun(*r);
    const v1::TaskState to = NextWaitingState(*r);
    Transition(*r, to, to == v1::TASK_STATE_BLOCKED ? why + "; " + BlockedReason(*r) : why);
    ArmStartDeadline(*r, Now());
  }
}

void Scheduler::StopGang(TaskRecord& group, const TaskRecord& member) {
  for (TaskRecord* r : group.replicas) {
    if (r == &member || r->requeue_requested || r->pause_requested) continue;
    if (r->state != v1::TASK_STATE_DISPATCHED && r->state != v1::TASK_STATE_RUNNING) continue;
    r->requeue_requested = true;
    r->reason = absl::StrCat("stopping: replica ", member.id(),
                             " is to run again, so its gang starts again together; waiting for "
                             "agent ",
                             r->agent_id);
    PersistRow(*r);
    SendCancel(*r);
  }
}

void Scheduler::ClearForRerun(TaskRecord& t) {
  // The attempt counter keeps rising, though: (task, attempt) fences agent
  // messages, and an attempt from before the reset may still be out there
  // (an agent frozen past its lease) with a result that must not end the
  // new run.
  t.attempt_base = t.attempt;
  t.attempts.clear();
  t.attempts_dropped = 0;
  t.interrupted_dropped = 0;
  t.clear_result();
  t.next_run_time = absl::InfinitePast();
  effects_.batch.clear_attempts.push_back(t.id());
}

}  // namespace taskgrid::core
