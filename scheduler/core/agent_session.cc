// The agent session protocol: Hello, the messages of a stream, fencing by
// (task, attempt), losing and forgetting agents, drain.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/message_limits.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "scheduler/core/retry_policy.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

absl::StatusOr<const AgentRecord*> Scheduler::Drain(const std::string& agent_id) {
  if (agent_id.empty()) return absl::InvalidArgumentError("id is empty");
  AgentRecord* found = agents_.Find(agent_id);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("agent \"", agent_id, "\" is not known"));
  }
  AgentRecord& a = *found;
  if (!a.draining) {
    a.draining = true;
    agents_.Changed();
    SendDrain(a);
  }
  return &a;
}

absl::StatusOr<const AgentRecord*> Scheduler::Undrain(const std::string& agent_id) {
  if (agent_id.empty()) return absl::InvalidArgumentError("id is empty");
  AgentRecord* found = agents_.Find(agent_id);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("agent \"", agent_id, "\" is not known"));
  }
  AgentRecord& a = *found;
  if (!a.draining) return &a;
  if (!a.connected()) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent \"", agent_id, "\" is not connected; undrain it once it is back"));
  }
  if (a.exiting || a.leaving) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent \"", agent_id,
                     "\" is draining to stop (it was told to exit) and cannot be undrained"));
  }
  if (!a.undrains) {
    return absl::FailedPreconditionError(absl::StrCat(
        "agent \"", agent_id, "\" (version ", a.version.empty() ? "unknown" : a.version,
        ") cannot take an undrain; restart it to give it work again"));
  }
  a.draining = false;
  agents_.Changed();
  ready_.Grew(a);
  v1::SchedulerMessage msg;
  msg.mutable_undrain();
  Send(a.conn, std::move(msg));
  // Classes no agent could take until now: this one may.
  ready_.UnparkFor(a);
  Dispatch();
  return &a;
}

void Scheduler::SendDrain(const AgentRecord& a) {
  v1::SchedulerMessage msg;
  msg.mutable_drain();
  Send(a.conn, std::move(msg));
}

void Scheduler::Send(uint64_t conn, v1::SchedulerMessage msg) {
  if (conn == 0) return;
  effects_.messages.push_back({conn, std::move(msg)});
}

void Scheduler::SendCancel(const TaskRecord& t) {
  if (t.claimed()) return;  // a pull worker learns it on its next call
  const AgentRecord* a = agents_.Find(t.agent_id);
  if (a == nullptr) return;
  v1::SchedulerMessage msg;
  msg.mutable_cancel()->set_task_id(t.id());
  msg.mutable_cancel()->set_attempt(t.attempt);
  Send(a->conn, std::move(msg));
}

bool Scheduler::ReportsStops(const std::string& agent_id) const {
  const AgentRecord* a = agents_.Find(agent_id);
  return a != nullptr && a->reports_stops;
}

void Scheduler::RequestStop(TaskRecord& t, StopRequest why) {
  if (why <= t.stop_request) return;
  t.stop_request = why;
  // A cancel under way keeps saying so: it decides how the task ends.
  if (t.state == v1::TASK_STATE_CANCELLING) why = StopRequest::kNone;
  switch (why) {
    case StopRequest::kNone:
      break;
    case StopRequest::kTimedOut:
      t.reason = absl::StrCat("attempt ", t.attempt, " timed out (attempt_timeout ",
                              absl::FormatDuration(FromProto(t.spec.attempt_timeout())),
                              "); waiting for agent ", t.agent_id, " to stop it");
      break;
    case StopRequest::kNotAccepted:
      t.reason = absl::StrCat("attempt ", t.attempt, " not accepted within ",
                              absl::FormatDuration(AckTimeout(t)), "; waiting for agent ",
                              t.agent_id, " to say it holds nothing of it");
      break;
    default:
      t.reason = absl::StrCat("expired before start (schedule_timeout ",
                              absl::FormatDuration(FromProto(t.spec.schedule_timeout())),
                              "); waiting for agent ", t.agent_id, " to drop attempt ", t.attempt);
      break;
  }
  if (why != StopRequest::kNone) PersistRow(t);
  SendCancel(t);  // and again on every reconnect, until the agent says
}

absl::Status Scheduler::Connect(uint64_t conn, const v1::Hello& hello) {
  RETURN_IF_ERROR(ValidateHello(hello, opts_));
  if (agents_.HasConn(conn)) {
    return absl::FailedPreconditionError("hello was already sent on this stream");
  }
  AgentRecord& a = agents_.FindOrAdd(hello.agent_id());
  if (a.connected() && Mono() - a.last_seen < 2 * a.judged_interval()) {
    // The old stream is alive: a second agent with the same id, not a
    // reconnect. Taking over would make the two evict each other forever.
    return absl::AlreadyExistsError(
        absl::StrCat("agent \"", a.id, "\" is connected on another stream (heard from ",
                     absl::FormatDuration(absl::Trunc(Mono() - a.last_seen, absl::Milliseconds(1))),
                     " ago); give each agent its own --id"));
  }
  // Back after a restart of ours, or of its own keeping its steps: what it
  // comes back without was ended by a restart, not by the task.
  const bool across_restart = a.restored || a.restarting || a.restart_hold > absl::ZeroDuration();
  // A reconnect that beat the old (silent) stream's end: the new one wins.
  if (const uint64_t old = agents_.Bind(a, conn); old != 0) effects_.close_conns.push_back(old);
  a.lost = false;
  a.leaving = false;
  a.draining = hello.draining();
  a.exiting = hello.exiting();
  a.undrains = hello.undrain();
  a.live_output = hello.live_output();
  a.reports_stops = hello.reports_stops();
  a.unlisted.clear();
  a.version = hello.version();
  a.chains = hello.chains();
  a.labels = {hello.labels().begin(), hello.labels().end()};
  a.slots = hello.slots();
  a.resources = ParseResourceMap(hello.resources()).value_or(Resources{});  // validated
  agents_.Changed();
  ready_.Grew(a);
  a.last_seen = Mono();
  a.connect_time = Now();
  a.last_seen_time = a.connect_time;
  // Agents that cannot adapt keep the base interval, as before.
  a.adaptive_heartbeat = hello.adaptive_heartbeat();
  a.told_interval = a.adaptive_heartbeat ? heartbeat_interval() : opts_.heartbeat_interval;
  a.agent_interval = a.told_interval;              // it takes Welcome's at once
  a.silence_deadline = -absl::InfiniteDuration();  // a new stream
  agents_.Heard(a);

  v1::SchedulerMessage welcome;
  v1::Welcome* w = welcome.mutable_welcome();
  w->set_session_id(absl::StrCat(a.id, "/", conn));
  *w->mutable_heartbeat_interval() = ToProto(a.told_interval);
  w->set_max_output_bytes(opts_.max_output_bytes);
  w->set_batches(true);
  // The agent stops its tasks itself before the grace ends and they move.
  *w->mutable_stop_on_lost_after() = ToProto(opts_.StopOnLostAfter());
  *w->mutable_heartbeat_lease() = ToProto(opts_.HeartbeatLeaseFor(a.told_interval));
  // And keeps them while a restarting scheduler refuses it, for as long as
  // the restarted one will wait for it.
  *w->mutable_restart_grace() = ToProto(opts_.RestartGrace());
  Send(conn, std::move(welcome));

  // Reconcile what the agent still runs with what it holds here.
  absl::flat_hash_map<std::string, const v1::AttemptRef*> running;
  for (const v1::AttemptRef& r : hello.running()) running[r.task_id()] = &r;
  const std::vector<std::string> held(a.tasks.begin(), a.tasks.end());
  std::vector<std::string> gone;
  for (const std::string& id : held) {
    TaskRecord& t = *Mutable(id);
    auto it = running.find(id);
    if (it != running.end() && it->second->attempt() == t.attempt) {
      const bool started = !it->second->waiting();
      running.erase(it);
      // Cancels and pauses are durable: said again until the agent confirms.
      if (t.state == v1::TASK_STATE_CANCELLING || t.pause_requested || t.requeue_requested ||
          t.stop_request != StopRequest::kNone) {
        SendCancel(t);
      }
      // Timed out while it was away: an agent that does not report its
      // stops is freed on the timer again, now that it is back.
      if (t.stop_request != StopRequest::kNone && !a.reports_stops &&
          t.stop_request != StopRequest::kExpired) {
        task_deadlines_.Set(t.id(), Mono() + opts_.attempt_timeout_slack);
      }
      // Listed as started: its Accept may have been lost with the old stream.
      if (started && t.state == v1::TASK_STATE_DISPATCHED) {
        if (t.chained_after == nullptr) {
          ImpliedAccept(a, t);
        } else {
          // A link cannot start before its predecessor succeeded: that
          // Result is on its way (resent), and the link runs already.
          t.link_started = true;
        }
      }
      continue;
    }
    gone.push_back(id);
  }
  EndHeld(a, gone,
          LostResult(absl::StrCat("agent ", a.id, " came back without it",
                                  across_restart ? " after a restart; not counted" : "")),
          /*interrupted=*/across_restart);
  for (const auto& [id, ref] : running) {
    if (ref->finished()) continue;  // its message comes after Welcome: stale then
    const int32_t attempt = ref->attempt();
    // Not the live attempt here: the agent must stop it.
    v1::SchedulerMessage msg;
    msg.mutable_cancel()->set_task_id(id);
    msg.mutable_cancel()->set_attempt(attempt);
    Send(conn, std::move(msg));
  }
  // Classes no agent could take until now: this one may.
  ready_.UnparkFor(a);
  Dispatch();
  return absl::OkStatus();
}

void Scheduler::Disconnect(uint64_t conn) {
  AgentRecord* a = agents_.ByConn(conn);
  if (a == nullptr) return;
  if (a->restart_hold > absl::ZeroDuration()) {
    // It restarts keeping its steps: they run on until the hold it was
    // granted ends (it counts from before this), and the agent that comes
    // back takes them; the reconnect grace on top covers the way back.
    agents_.Unbind(*a, Mono() + a->restart_hold + opts_.reconnect_grace);
    a->restarting = true;
    return;
  }
  agents_.Unbind(*a, Mono() + opts_.reconnect_grace);
}

void Scheduler::LoseAgent(AgentRecord& a, const std::string& why, bool interrupted) {
  // Chain heads first would end their links anyway; EndHeld skips those.
  EndHeld(a, std::vector<std::string>(a.tasks.begin(), a.tasks.end()), LostResult(why),
          interrupted);
  // Listed as LOST for a while, then forgotten.
  agents_.MarkLost(a, Mono() + opts_.lost_agent_retention);
}

TaskRecord* Scheduler::LiveAttempt(const AgentRecord& a, const std::string& task_id,
                                   int32_t attempt) {
  TaskRecord* t = Mutable(task_id);
  // A pull worker's claim is never an agent's, whatever the names.
  if (t == nullptr || !IsInFlight(t->state) || t->attempt != attempt || t->agent_id != a.id ||
      t->claimed()) {
    return nullptr;
  }
  return t;
}

void Scheduler::OnAgentMessage(uint64_t conn, const v1::AgentMessage& msg,
                               std::vector<v1::TaskOutput>* output) {
  AgentRecord* found = agents_.ByConn(conn);
  if (found == nullptr) return;
  AgentRecord& a = *found;
  a.last_seen = Mono();
  a.last_seen_time = Now();
  bool frees = false;
  if (msg.has_batch()) {
    // One Dispatch for the whole batch: the slots its results free are
    // filled together, in one Assign.
    for (const v1::AgentMessage& m : msg.batch().msgs()) {
      frees |= OnOneAgentMessage(a, m, output);
    }
  } else {
    frees = OnOneAgentMessage(a, msg, output);
  }
  agents_.Heard(a);
  if (a.leaving && a.tasks.empty()) ForgetAgent(a);  // `a` is gone
  // Only an ended attempt frees room (here or, re-queued, elsewhere).
  // Dispatching on every heartbeat made heartbeats cost O(agents) each,
  // O(agents^2) in all (taskgrid-bench W6).
  if (frees) Dispatch();
}

bool Scheduler::OnOneAgentMessage(AgentRecord& a, const v1::AgentMessage& msg,
                                  std::vector<v1::TaskOutput>* output) {
  switch (msg.msg_case()) {
    case v1::AgentMessage::kHeartbeat: {
      v1::SchedulerMessage ack;
      v1::HeartbeatAck* h = ack.mutable_heartbeat_ack();
      if (a.adaptive_heartbeat) {
        // The interval it says it uses, never longer than any it was told
        // (an agent cannot stretch its own timeout).
        const absl::Duration used = FromProto(msg.heartbeat().heartbeat_interval());
        if (used > absl::ZeroDuration()) {
          a.agent_interval = std::clamp(used, opts_.heartbeat_interval, a.judged_interval());
        }
        a.told_interval = heartbeat_interval();
        *h->mutable_heartbeat_interval() = ToProto(a.told_interval);
        *h->mutable_heartbeat_lease() = ToProto(opts_.HeartbeatLeaseFor(a.told_interval));
      }
      Send(a.conn, std::move(ack));
      if (a.reports_stops && a.restart_hold == absl::ZeroDuration()) {
        ReconcileHeld(a, msg.heartbeat().running());
        return true;  // an attempt it ended frees room
      }
      break;
    }
    case v1::AgentMessage::kDraining:
      a.draining = true;
      agents_.Changed();
      a.exiting = a.exiting || msg.draining().exiting();
      break;
    case v1::AgentMessage::kGoodbye:
      // It stops for good; forgotten once it holds nothing (see
      // OnAgentMessage). Until then it is draining.
      a.draining = true;
      a.leaving = true;
      agents_.Changed();
      break;
    case v1::AgentMessage::kRestarting: {
      // It takes no more work, and asks to keep what it holds through its
      // restart: granted up to the restart grace.
      a.draining = true;
      agents_.Changed();
      a.restart_hold = std::clamp(FromProto(msg.restarting().hold()), absl::ZeroDuration(),
                                  opts_.RestartGrace());
      v1::SchedulerMessage grant;
      *grant.mutable_restart_hold()->mutable_hold() = ToProto(a.restart_hold);
      Send(a.conn, std::move(grant));
      break;
    }
    case v1::AgentMessage::kRelease:
      OnRelease(a, msg.release());
      break;
    case v1::AgentMessage::kAccept:
      OnAccept(a, msg.accept());
      break;
    case v1::AgentMessage::kReject:
      OnReject(a, msg.reject());
      break;
    case v1::AgentMessage::kResult:
      OnResult(a, msg.result());
      break;
    case v1::AgentMessage::kOutput:
      OnOutput(a, msg.output(), output);
      break;
    default:  // a Hello or a batch inside a batch: refused by the service
      break;
  }
  return msg.has_result() || msg.has_release() || msg.has_reject();
}

void Scheduler::OnAccept(AgentRecord& a, const v1::Accept& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  // A chain link cannot start before its predecessor's result arrived.
  if (t != nullptr && t->chained_after != nullptr) t = nullptr;
  if (t == nullptr) {
    ++stale_messages_;
    v1::SchedulerMessage cancel;
    cancel.mutable_cancel()->set_task_id(m.task_id());
    cancel.mutable_cancel()->set_attempt(m.attempt());
    Send(a.conn, std::move(cancel));
    return;
  }
  if (t->state != v1::TASK_STATE_DISPATCHED) return;  // a repeated Accept
  t->start_time = Now();
  const absl::Duration timeout = FromProto(t->spec.attempt_timeout());
  if (timeout > absl::ZeroDuration()) {
    task_deadlines_.Set(t->id(), Mono() + timeout + opts_.attempt_timeout_slack);
  } else {
    task_deadlines_.Remove(t->id());
  }
  start_deadlines_.Remove(t->id());
  Transition(*t, v1::TASK_STATE_RUNNING,
             absl::StrCat("attempt ", t->attempt, " running on agent ", a.id));
  if (t->pause_requested || t->requeue_requested) SendCancel(*t);
}

void Scheduler::ImpliedAccept(AgentRecord& a, const TaskRecord& t) {
  v1::Accept implied;
  implied.set_task_id(t.id());
  implied.set_attempt(t.attempt);
  OnAccept(a, implied);
}

void Scheduler::OnRelease(AgentRecord& a, const v1::Release& m) {
  v1::SchedulerMessage ack;
  ack.mutable_result_ack()->set_task_id(m.task_id());
  ack.mutable_result_ack()->set_attempt(m.attempt());
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t == nullptr) {
    ++stale_messages_;
  } else {
    v1::TaskResult r;
    r.set_outcome(v1::OUTCOME_CANCELLED);
    r.set_exit_code(-1);
    r.set_error(absl::StrCat(m.not_held() ? "not held by the agent: " : "released by the agent: ",
                             Bounded(m.reason(), kMaxReasonBytes)));
    // Nothing of it runs there: whatever timeout we asked it to stop for,
    // the attempt is not the task's to pay for (an expired start still
    // fails the task).
    if (m.not_held() && t->stop_request != StopRequest::kExpired) {
      t->stop_request = StopRequest::kNone;
    }
    FinishAttempt(*t, std::move(r), /*interrupted=*/true);
    ack.mutable_result_ack()->set_accepted(true);
  }
  Send(a.conn, std::move(ack));
}

void Scheduler::OnOutput(AgentRecord& a, const v1::TaskOutput& m,
                         std::vector<v1::TaskOutput>* output) {
  // Only the holder of the live attempt speaks for its output, as for its
  // result; a claim's owner is never an agent.
  if (!a.live_output || LiveAttempt(a, m.task_id(), m.attempt()) == nullptr) {
    ++stale_messages_;
    return;
  }
  if (output == nullptr) return;
  v1::TaskOutput& kept = output->emplace_back();
  kept.set_task_id(m.task_id());
  kept.set_attempt(m.attempt());
  kept.set_stream(m.stream());
  kept.set_offset(m.offset());
  kept.set_caught_up(m.caught_up());
  // A bound whatever the agent was told: the copy never holds more.
  kept.set_data(m.data().substr(0, std::min<size_t>(m.data().size(), kMaxOutputChunkBytes)));
}

void Scheduler::OnReject(AgentRecord& a, const v1::Reject& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t == nullptr) {
    ++stale_messages_;
    return;
  }
  v1::TaskResult r =
      LostResult(absl::StrCat("rejected by the agent: ", Bounded(m.reason(), kMaxReasonBytes)));
  switch (m.code()) {
    case v1::REJECT_CODE_DRAINING:
    case v1::REJECT_CODE_BUSY:
    case v1::REJECT_CODE_NO_SLOTS:
      // The agent's state, not the task's: not counted, and back after the
      // initial backoff (at once, it could meet the same state again).
      FinishAttempt(*t, std::move(r), /*interrupted=*/true, InitialBackoffOf(*t, opts_));
      return;
    default:
      FinishAttempt(*t, std::move(r));
  }
}

void Scheduler::BoundResult(v1::TaskResult* r) const {
  // Whatever the agent or worker was told, what is stored stays readable.
  const int64_t max = opts_.max_output_bytes;
  r->set_stdout_cut_bytes(r->stdout_cut_bytes() + CutTail(r->mutable_stdout_tail(), max));
  r->set_stderr_cut_bytes(r->stderr_cut_bytes() + CutTail(r->mutable_stderr_tail(), max));
  if (static_cast<int64_t>(r->error().size()) > max) r->set_error(Bounded(r->error(), max));
  if (r->outcome() == v1::OUTCOME_UNSPECIFIED || r->outcome() == v1::OUTCOME_LOST) {
    r->set_outcome(v1::OUTCOME_FAILED);
  }
  if (r->has_output() && static_cast<int64_t>(r->output().size()) > opts_.max_task_output_bytes) {
    r->set_error(absl::StrCat("its output is ", r->output().size(), " bytes; the limit is ",
                              opts_.max_task_output_bytes));
    r->clear_output();
    r->set_outcome(v1::OUTCOME_FAILED);
  }
}

void Scheduler::ReconcileHeld(AgentRecord& a,
                              const google::protobuf::RepeatedPtrField<v1::AttemptRef>& listed) {
  if (a.tasks.empty() && a.unlisted.empty() && listed.empty()) return;
  absl::flat_hash_map<absl::string_view, int32_t> has;
  for (const v1::AttemptRef& r : listed) has[r.task_id()] = r.attempt();
  // Only accepted attempts: the agent held each of them before it sent
  // the Accept, which came before the previous heartbeat, so every
  // heartbeat built after that one lists it (running, or finished with its
  // message unacknowledged) until we acknowledged it. Two in a row that
  // leave it out mean it is not there (one could have been built before
  // the Accept was written). A dispatched one is the ack timeout's.
  absl::flat_hash_set<std::pair<std::string, int32_t>> unlisted;
  std::vector<std::string> gone;
  for (const std::string& id : a.tasks) {
    const TaskRecord* t = Find(id);
    if (t == nullptr || t->state != v1::TASK_STATE_RUNNING || t->chained_after != nullptr) {
      continue;
    }
    auto it = has.find(id);
    if (it != has.end() && it->second == t->attempt) continue;
    std::pair<std::string, int32_t> key(id, t->attempt);
    if (a.unlisted.contains(key)) {
      gone.push_back(id);
    } else {
      unlisted.insert(std::move(key));
    }
  }
  a.unlisted = std::move(unlisted);
  EndHeld(a, gone,
          LostResult(absl::StrCat("agent ", a.id,
                                  " no longer holds it: two heartbeats in a row left it out")));
  // Running there but not live here: the agent must stop it.
  for (const v1::AttemptRef& r : listed) {
    if (r.finished() || r.waiting()) continue;
    if (LiveAttempt(a, r.task_id(), r.attempt()) != nullptr) continue;
    v1::SchedulerMessage msg;
    msg.mutable_cancel()->set_task_id(r.task_id());
    msg.mutable_cancel()->set_attempt(r.attempt());
    Send(a.conn, std::move(msg));
  }
}

bool Scheduler::Committed(const std::string& task_id, int32_t attempt, const std::string& holder,
                          const v1::TaskResult& sent) const {
  const TaskRecord* known = Find(task_id);
  if (known == nullptr) {
    // Finished and on disk: its history is not read back for this. An
    // attempt it made was taken; which holder sent it is not checked
    // (either answer makes the agent drop it; only its log line differs).
    const ColdTask* c = table_.FindCold(task_id);
    return c != nullptr && attempt >= 1 && attempt <= c->attempt;
  }
  v1::TaskResult bounded = sent;
  BoundResult(&bounded);
  for (const v1::Attempt& done : known->attempts) {
    if (done.attempt() != attempt || done.agent_id() != holder) continue;
    const v1::TaskResult& kept = done.result();
    // The stored end is this result when its content is (a stop we asked
    // for may have renamed a cancel a timeout): not one the scheduler made
    // itself when it ended the attempt without it.
    // A lost attempt's end is never an agent's result.
    if (kept.outcome() == v1::OUTCOME_LOST) return false;
    const bool renamed =
        bounded.outcome() == v1::OUTCOME_CANCELLED && kept.outcome() == v1::OUTCOME_TIMED_OUT;
    return (kept.outcome() == bounded.outcome() || renamed) && kept.step() == bounded.step() &&
           kept.stdout_tail() == bounded.stdout_tail() &&
           kept.stderr_tail() == bounded.stderr_tail() &&
           kept.stdout_cut_bytes() == bounded.stdout_cut_bytes() &&
           kept.stderr_cut_bytes() == bounded.stderr_cut_bytes() &&
           (renamed || kept.exit_code() == bounded.exit_code());
  }
  return false;
}

void Scheduler::OnResult(AgentRecord& a, const v1::Result& m) {
  v1::SchedulerMessage ack;
  ack.mutable_result_ack()->set_task_id(m.task_id());
  ack.mutable_result_ack()->set_attempt(m.attempt());
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t != nullptr && t->chained_after != nullptr) t = nullptr;  // out of order: not started here
  if (t != nullptr) {
    // A result implies the agent accepted: keep DISPATCHED -> RUNNING.
    if (t->state == v1::TASK_STATE_DISPATCHED) ImpliedAccept(a, *t);
    v1::TaskResult r = m.result();
    BoundResult(&r);
    FinishAttempt(*t, std::move(r));
    ack.mutable_result_ack()->set_accepted(true);
  } else {
    // A result resent after its ack was lost is already committed: say so.
    const bool committed = Committed(m.task_id(), m.attempt(), a.id, m.result());
    if (!committed) ++stale_messages_;
    ack.mutable_result_ack()->set_accepted(committed);
  }
  Send(a.conn, std::move(ack));
}

void Scheduler::ForgetAgent(AgentRecord& a) {
  TASKGRID_CHECK(a.tasks.empty(), absl::StrCat("agent ", a.id, " is forgotten holding tasks"));
  const std::string id = a.id;
  if (const uint64_t conn = agents_.Forget(id); conn != 0) effects_.close_conns.push_back(conn);
}

}  // namespace taskgrid::core
