// The end of an attempt: its history (bounded), and what follows it
// (core/retry_policy decides; this applies it).

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "scheduler/core/retry_policy.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

void Scheduler::TrimHistory(TaskRecord& t) {
  const size_t keep = static_cast<size_t>(std::max(opts_.max_attempt_history, 1));
  if (t.attempts.size() <= keep) return;
  const size_t drop = t.attempts.size() - keep;
  for (size_t i = 0; i < drop; ++i) {
    const v1::Attempt& a = t.attempts[i];
    ++t.attempts_dropped;
    if (a.interrupted() && a.attempt() > t.attempt_base) ++t.interrupted_dropped;
  }
  t.attempts.erase(t.attempts.begin(), t.attempts.begin() + static_cast<ptrdiff_t>(drop));
  effects_.batch.trim_attempts.emplace_back(t.id(), t.attempts.front().attempt());
}

int32_t Scheduler::AttemptsUsed(const TaskRecord& t) const {
  int32_t interrupted = 0;
  for (const v1::Attempt& a : t.attempts) {
    interrupted += a.attempt() > t.attempt_base && a.interrupted() ? 1 : 0;
  }
  return t.attempt - t.attempt_base - interrupted - t.interrupted_dropped;
}

void Scheduler::ApplyStopRequest(const TaskRecord& t, v1::TaskResult* result,
                                 bool* interrupted) const {
  // What the agent said stands when it is a success, or a failure of the
  // step's own; what our request stopped (or what a lost agent took with
  // it) ends as the request says.
  const bool stopped =
      result->outcome() == v1::OUTCOME_CANCELLED || result->outcome() == v1::OUTCOME_LOST;
  switch (t.stop_request) {
    case StopRequest::kTimedOut:
      if (!stopped) return;
      result->set_outcome(v1::OUTCOME_TIMED_OUT);
      result->set_exit_code(-1);
      result->set_error(absl::StrCat(
          "attempt_timeout ", absl::FormatDuration(FromProto(t.spec.attempt_timeout())),
          " passed with no result (the scheduler's deadline, ",
          absl::FormatDuration(opts_.attempt_timeout_slack), " after it); agent ", t.agent_id,
          " stopped it (", result->error(), ")"));
      *interrupted = false;
      return;
    case StopRequest::kNotAccepted:
      if (!stopped || *interrupted) return;
      *result =
          LostResult(absl::StrCat("agent ", t.agent_id, " did not accept it within ",
                                  absl::FormatDuration(AckTimeout(t)), " (", result->error(), ")"));
      return;
    default:  // kExpired: the task fails short of a success (EndAttempt)
      return;
  }
}

void Scheduler::FinishAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted,
                              absl::Duration requeue_after) {
  ApplyStopRequest(t, &result, &interrupted);
  const bool waiting = t.chained_after != nullptr;
  if (waiting) {
    // Never started: it says nothing about the task.
    t.chained_after->chain_next = nullptr;
    t.chained_after = nullptr;
    interrupted = true;
  }
  TaskRecord* next = std::exchange(t.chain_next, nullptr);
  const std::string agent = t.agent_id;
  EndAttempt(t, std::move(result), interrupted, /*holds_slot=*/!waiting, requeue_after);
  if (next == nullptr) return;
  next->chained_after = nullptr;
  AgentRecord* holder = agents_.Find(agent);
  if (!waiting && t.state == v1::TASK_STATE_SUCCEEDED && IsInFlight(next->state) &&
      next->agent_id == agent && holder != nullptr) {
    // The next link starts on the agent now, in the slot t freed: from here
    // on it is an ordinary dispatched attempt.
    ready_.TakeResources(*holder, next->queue(), SlotsOf(next->spec.placement()),
                         NeedOf(next->spec.placement()));
    task_deadlines_.Set(next->id(), Mono() + AckTimeout(*next));
    next->ready_time = Now();
    if (next->link_started) ImpliedAccept(*holder, *next);
    return;
  }
  // t did not succeed: the links after it will not start (the agent drops
  // them without a word). End them here, first unlinking them all.
  std::vector<TaskRecord*> rest;
  for (TaskRecord* p = next; p != nullptr;) {
    rest.push_back(p);
    TaskRecord* n = std::exchange(p->chain_next, nullptr);
    if (n != nullptr) n->chained_after = nullptr;
    p = n;
  }
  for (TaskRecord* p : rest) {
    if (!IsInFlight(p->state) || p->agent_id != agent) continue;
    SendCancel(*p);
    v1::TaskResult r;
    r.set_outcome(v1::OUTCOME_CANCELLED);
    r.set_exit_code(-1);
    r.set_error(absl::StrCat("not started: ", t.id(), " before it in the chain did not succeed"));
    EndAttempt(*p, std::move(r), /*interrupted=*/true, /*holds_slot=*/false);
  }
}

void Scheduler::EndHeld(AgentRecord& a, const std::vector<std::string>& ids,
                        const v1::TaskResult& result, bool interrupted) {
  for (const std::string& id : ids) {
    TaskRecord* t = Mutable(id);
    // Ending one task may already have ended the chain links behind it.
    if (t == nullptr || !IsInFlight(t->state) || t->agent_id != a.id) continue;
    FinishAttempt(*t, result, interrupted);
  }
}

Scheduler::Closed Scheduler::CloseAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted,
                                          bool holds_slot) {
  TASKGRID_CHECK(IsInFlight(t.state), absl::StrCat("task ", t.id(), " is not in flight"));
  Closed c;
  c.claimed = t.claimed();
  if (c.claimed) {
    board_.Released(t);
    t.claim_until = absl::InfinitePast();
  } else {
    AgentRecord* holder = agents_.Find(t.agent_id);
    TASKGRID_CHECK(holder != nullptr, absl::StrCat("task ", t.id(), ": unknown agent"));
    AgentRecord& a = *holder;
    if (holds_slot) {
      ready_.GiveBackResources(a, t.queue(), SlotsOf(t.spec.placement()),
                               NeedOf(t.spec.placement()));
    }
    a.tasks.erase(t.id());
    task_deadlines_.Remove(t.id());
  }

  t.link_started = false;
  t.stop_request = StopRequest::kNone;
  c.pausing = t.pause_requested;
  t.pause_requested = false;
  // A pause that stopped the attempt interrupts it, like a drain's release;
  // so does a stop for its gang to start again.
  interrupted |= (c.pausing || t.requeue_requested) && result.outcome() == v1::OUTCOME_CANCELLED;
  t.requeue_requested = false;
  c.interrupted = interrupted;
  v1::Attempt done;
  done.set_attempt(t.attempt);
  done.set_agent_id(t.agent_id);
  SetTimestamp(t.dispatch_time, done.mutable_dispatch_time());
  // Unset when it never started (e.g. a chain link whose predecessor failed).
  if (t.start_time != absl::InfinitePast()) SetTimestamp(t.start_time, done.mutable_start_time());
  const absl::Time now = Now();
  SetTimestamp(now, done.mutable_finish_time());
  counters_.CountAttemptEnd(t, now);
  *done.mutable_result() = result;
  done.mutable_result()->clear_output();  // t.result() keeps it; history need not
  done.set_interrupted(interrupted);
  effects_.batch.attempts.push_back(ToAttemptRow(t.id(), done));
  t.attempts.push_back(std::move(done));
  TrimHistory(t);
  t.set_result(std::move(result));
  c.holder = std::move(t.agent_id);
  t.agent_id.clear();
  t.dispatch_time = absl::InfinitePast();
  t.start_time = absl::InfinitePast();
  return c;
}

void Scheduler::EndAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted, bool holds_slot,
                           absl::Duration requeue_after) {
  const bool expired = t.stop_request == StopRequest::kExpired;
  const Closed c = CloseAttempt(t, std::move(result), interrupted, holds_slot);
  const std::string& agent = c.holder;
  const AfterAttempt after = DecideAfterAttempt(
      t, absl::StrCat("attempt ", t.attempt, c.claimed ? " claimed by " : " on agent ", agent),
      {c.interrupted, c.pausing, requeue_after, expired, FromProto(t.spec.schedule_timeout())},
      AttemptsUsed(t), opts_, Now(), [this] {
        return opts_.random ? opts_.random() : std::uniform_real_distribution<double>(0, 1)(rng_);
      });
  switch (after.next) {
    case AfterAttempt::Next::kSucceeded:
      Transition(t, v1::TASK_STATE_SUCCEEDED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kCancelled:
      Transition(t, v1::TASK_STATE_CANCELLED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kPaused:
      Transition(t, v1::TASK_STATE_PAUSED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kFailed:
      Transition(t, v1::TASK_STATE_FAILED, after.reason, &agent);
      return;
    case AfterAttempt::Next::kRequeue: {
      t.next_run_time = after.next_run_time;
      const v1::TaskState to = NextWaitingState(t);
      Transition(t, to,
                 absl::StrCat(after.reason, to == v1::TASK_STATE_BLOCKED
                                                ? "; not counted, " + BlockedReason(t)
                                                : "; re-queued, not counted"),
                 &agent);
      return;
    }
    case AfterAttempt::Next::kRetry:
      t.next_run_time = after.next_run_time;
      Transition(t, NextWaitingState(t), after.reason, &agent);
      return;
  }
}

}  // namespace taskgrid::core
