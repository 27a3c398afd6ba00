// Pull mode: the job board. A pull worker claims ready tasks of a queue
// instead of having them pushed to it over an agent stream. A claim is the
// task's live attempt, RUNNING from the moment it is taken, held by the
// claim's owner (in agent_id) until claim_until; its attempt number fences
// every later call, as (task, attempt) fences an agent's messages. Claims
// and agents take from the same ready tasks through the same door
// (Transition), so no task goes to both.

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

absl::StatusOr<absl::Duration> Scheduler::LeaseOf(const google::protobuf::Duration& lease,
                                                  absl::string_view field) const {
  const absl::Duration d = FromProto(lease);
  if (d < absl::ZeroDuration())
    return absl::InvalidArgumentError(absl::StrCat(field, " is negative"));
  if (d > opts_.max_claim_lease) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", absl::FormatDuration(d), "; the limit is ",
                     absl::FormatDuration(opts_.max_claim_lease), " (--max_claim_lease)"));
  }
  return d == absl::ZeroDuration() ? opts_.default_claim_lease : d;
}

std::string Scheduler::NowIs(const TaskRecord& t) {
  if (t.claimed()) return absl::StrCat("attempt ", t.attempt, " claimed by ", t.agent_id);
  if (IsInFlight(t.state)) return absl::StrCat("attempt ", t.attempt, " on agent ", t.agent_id);
  return absl::StrCat(StateName(t.state), " (", t.reason, ")");
}

absl::StatusOr<TaskRecord*> Scheduler::ClaimableById(const v1::ClaimRequest& req) {
  const std::string& id = req.task_id();
  const auto refuse = [&](auto&&... why) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" cannot be claimed: ", why...));
  };
  TaskRecord* t = Mutable(id);
  if (t == nullptr) {
    if (table_.FindCold(id) != nullptr) return refuse("it has finished");
    return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  }
  if (!req.queue().empty() && req.queue() != t->queue()) {
    return refuse("it is in queue \"", t->queue(), "\", not \"", req.queue(), "\"");
  }
  if (t->state != v1::TASK_STATE_PENDING) return refuse("it is ", NowIs(*t));
  if (!t->spec.replica_of().empty()) return refuse("it is a replica, run by agents only");
  const v1::Placement& p = t->spec.placement();
  if (!p.agent_ids().empty()) {
    return refuse("it is pinned to agents ", absl::StrJoin(p.agent_ids(), ", "));
  }
  if (const auto* missing = ClaimBoard::MissingLabel(p, req.labels())) {
    return refuse("it requires the label ", missing->first, "=", missing->second,
                  ", which the worker's labels lack");
  }
  switch (queue_controls_.empty() ? QueueControls::Gate::kOpen : GateOf(t->queue())) {
    case QueueControls::Gate::kOpen:
      return t;
    case QueueControls::Gate::kPaused:
      return refuse("its queue \"", t->queue(), "\" is paused");
    case QueueControls::Gate::kConcurrency:
      return refuse("its queue \"", t->queue(), "\" is at its concurrency limit");
    case QueueControls::Gate::kRate:
      return refuse("its queue \"", t->queue(), "\" is at its rate limit");
  }
  return t;
}

absl::StatusOr<std::vector<v1::ClaimedTask>> Scheduler::Claim(const v1::ClaimRequest& req) {
  RETURN_IF_ERROR(ValidateClaim(req, opts_));
  ASSIGN_OR_RETURN(const absl::Duration lease, LeaseOf(req.lease(), "lease"));
  std::string queue = req.queue().empty() ? std::string(kDefaultQueue) : req.queue();
  const int max = req.max() > 0 ? req.max() : 1;
  std::vector<v1::ClaimedTask> out;
  // Picked first, changed after: each Transition edits the set walked here.
  std::vector<TaskRecord*> picked;
  if (!req.task_id().empty()) {
    ASSIGN_OR_RETURN(TaskRecord * t, ClaimableById(req));
    queue = t->queue();
    picked.push_back(t);
  } else {
    picked = board_.Pick(queue, max, req.labels());
  }
  const absl::Time now = Now();
  const absl::Time until = now + lease;
  const absl::Duration mono = Mono();
  for (TaskRecord* tp : picked) {
    TaskRecord& t = *tp;
    // Paused, or at its concurrency or rate limit: no more now.
    if (!queue_controls_.empty() && GateOf(queue) != QueueControls::Gate::kOpen) break;
    v1::ClaimedTask& c = out.emplace_back();
    int64_t input_bytes = 0;
    if (!FillAssignment(t, nullptr, c.mutable_assignment(), &input_bytes)) {
      Transition(t, v1::TASK_STATE_FAILED,
                 absl::StrCat("the outputs of its dependencies total ", input_bytes,
                              " bytes; the limit is ", opts_.max_input_bytes));
      start_deadlines_.Remove(t.id());
      out.pop_back();
      continue;
    }
    queue_controls_.Take(queue, mono);
    c.mutable_assignment()->set_attempt(++t.attempt);
    t.agent_id = req.owner();
    t.dispatch_time = now;
    t.start_time = now;
    t.claim_until = until;
    board_.Claimed(t, until);
    start_deadlines_.Remove(t.id());  // it has started
    Transition(t, v1::TASK_STATE_RUNNING,
               absl::StrCat("attempt ", t.attempt, " claimed by ", req.owner()));
    SetTimestamp(until, c.mutable_expire_time());
  }
  return out;
}

absl::StatusOr<TaskRecord*> Scheduler::LiveClaim(const v1::ClaimRef& ref) {
  RETURN_IF_ERROR(ValidateClaimRef(ref));
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(ref.task_id()));
  if (t->claimed() && t->attempt == ref.attempt() && t->agent_id == ref.owner()) return t;
  return absl::AbortedError(absl::StrCat("claim of task \"", ref.task_id(), "\" attempt ",
                                         ref.attempt(), " by ", ref.owner(),
                                         " is not live: the task is now ", NowIs(*t)));
}

absl::StatusOr<absl::Time> Scheduler::ExtendClaim(const v1::ClaimRef& ref,
                                                  const google::protobuf::Duration& lease) {
  ASSIGN_OR_RETURN(const absl::Duration d, LeaseOf(lease, "lease"));
  ASSIGN_OR_RETURN(TaskRecord * t, LiveClaim(ref));
  t->claim_until = Now() + d;
  board_.Extended(*t, t->claim_until);
  PersistRow(*t);
  return t->claim_until;
}

absl::StatusOr<const TaskRecord*> Scheduler::CompleteClaim(const v1::ClaimRef& ref,
                                                           v1::TaskResult result) {
  absl::StatusOr<TaskRecord*> live = LiveClaim(ref);
  BoundResult(&result);
  if (!live.ok()) {
    if (live.status().code() == absl::StatusCode::kAborted && Completed(ref, result)) {
      return Find(ref.task_id());  // the same completion again, its answer lost
    }
    return live.status();
  }
  TaskRecord& t = **live;
  FinishAttempt(t, std::move(result));
  Dispatch();  // a dependent may be ready now
  return &t;
}

bool Scheduler::Completed(const v1::ClaimRef& ref, const v1::TaskResult& result) const {
  const TaskRecord* t = Find(ref.task_id());
  if (t == nullptr) return false;
  v1::TaskResult kept = result;
  kept.clear_output();  // as the history keeps it
  for (const v1::Attempt& done : t->attempts) {
    if (done.attempt() == ref.attempt() && done.agent_id() == ref.owner()) {
      return google::protobuf::util::MessageDifferencer::Equals(done.result(), kept);
    }
  }
  return false;
}

absl::StatusOr<const TaskRecord*> Scheduler::AbandonClaim(const v1::ClaimRef& ref,
                                                          const std::string& reason) {
  ASSIGN_OR_RETURN(TaskRecord * t, LiveClaim(ref));
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_CANCELLED);
  r.set_exit_code(-1);
  r.set_error(absl::StrCat("abandoned by ", ref.owner(),
                           reason.empty() ? "" : ": " + Bounded(reason, kMaxReasonBytes)));
  FinishAttempt(*t, std::move(r), /*interrupted=*/true);
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::TrashClaim(const v1::ClaimRef& ref,
                                                        const std::string& reason) {
  ASSIGN_OR_RETURN(TaskRecord * t, LiveClaim(ref));
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_FAILED);
  r.set_exit_code(-1);
  const std::string why = absl::StrCat(
      "trashed by ", ref.owner(), reason.empty() ? "" : ": " + Bounded(reason, kMaxReasonBytes));
  r.set_error(why);
  const Closed c = CloseAttempt(*t, std::move(r), /*interrupted=*/false, /*holds_slot=*/true);
  Transition(*t, v1::TASK_STATE_TRASHED, why, &c.holder);
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::RestoreTask(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state != v1::TASK_STATE_TRASHED) {
    return absl::FailedPreconditionError(absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                                                      "; only TRASHED tasks can be restored"));
  }
  RETURN_IF_ERROR(CheckDepsKept(*t, "restored"));
  RETURN_IF_ERROR(CheckRoom(t->queue(), 1, absl::StrCat("restoring \"", id, "\"")));
  t->next_run_time = absl::InfinitePast();
  const v1::TaskState to = NextWaitingState(*t);
  Transition(*t, to,
             to == v1::TASK_STATE_BLOCKED ? "restored by request; " + BlockedReason(*t)
                                          : "restored by request");
  ArmStartDeadline(*t, Now());
  Dispatch();
  return t;
}

int64_t Scheduler::ClaimableCount(
    const std::string& queue, const google::protobuf::Map<std::string, std::string>& labels) const {
  const std::string name = queue.empty() ? std::string(kDefaultQueue) : queue;
  // A queue that may not start a task now has nothing to claim.
  if (!queue_controls_.empty() && GateOf(name) != QueueControls::Gate::kOpen) return 0;
  return board_.Count(name, labels);
}

}  // namespace taskgrid::core
