#include "agent/slots.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace taskgrid::agent {

namespace {
int32_t SlotsOf(const v1::Assignment& a) { return a.slots() > 0 ? a.slots() : 1; }
}  // namespace

v1::AgentMessage AcceptMsg(const v1::Assignment& a) {
  v1::AgentMessage m;
  m.mutable_accept()->set_task_id(a.task_id());
  m.mutable_accept()->set_attempt(a.attempt());
  return m;
}

v1::AgentMessage RejectMsg(const v1::Assignment& a, v1::RejectCode code, std::string reason) {
  v1::AgentMessage m;
  m.mutable_reject()->set_task_id(a.task_id());
  m.mutable_reject()->set_attempt(a.attempt());
  m.mutable_reject()->set_reason(std::move(reason));
  m.mutable_reject()->set_code(code);
  return m;
}

v1::AgentMessage ReleaseMsg(const std::string& task_id, int32_t attempt, std::string reason) {
  v1::AgentMessage m;
  m.mutable_release()->set_task_id(task_id);
  m.mutable_release()->set_attempt(attempt);
  m.mutable_release()->set_reason(std::move(reason));
  return m;
}

void Slots::Admit(const v1::Assign& assign, bool draining, std::vector<v1::AgentMessage>* replies,
                  std::vector<std::shared_ptr<TaskRun>>* starts) {
  std::map<std::string, bool> earlier;
  for (const v1::Assignment& a : assign.tasks()) AdmitOne(a, draining, &earlier, replies, starts);
}

void Slots::AdmitOne(const v1::Assignment& a, bool draining, std::map<std::string, bool>* earlier,
                     std::vector<v1::AgentMessage>* replies,
                     std::vector<std::shared_ptr<TaskRun>>* starts) {
  const int32_t slots = SlotsOf(a);
  auto running = running_.find(a.task_id());
  auto waiting = FindWaiting(a.task_id());
  bool& held = (*earlier)[a.task_id()];
  held = false;
  // A repeat of an attempt held here: accepted again if it runs, still
  // silent while it waits.
  if (running != running_.end() && running->second.run->assignment().attempt() == a.attempt()) {
    replies->push_back(AcceptMsg(a));
    held = true;
    return;
  }
  if (waiting != waiting_.end() && waiting->second.attempt() == a.attempt()) {
    held = true;
    return;
  }
  const bool busy = running != running_.end() || waiting != waiting_.end();
  if (a.run_after().empty()) {
    if (draining) {
      replies->push_back(RejectMsg(a, v1::REJECT_CODE_DRAINING, "agent is draining"));
    } else if (busy) {
      replies->push_back(
          RejectMsg(a, v1::REJECT_CODE_BUSY, "another attempt of this task is running here"));
    } else if (used_ + slots > capacity_) {
      replies->push_back(RejectMsg(a, v1::REJECT_CODE_NO_SLOTS, "no free slots"));
    } else {
      replies->push_back(AcceptMsg(a));
      starts->push_back(Start(a));
      held = true;
    }
    return;
  }

  // A chain link.
  const std::string& pred = a.run_after();
  auto before = earlier->find(pred);
  if (before == earlier->end() || pred == a.task_id()) {
    replies->push_back(
        RejectMsg(a, v1::REJECT_CODE_INVALID,
                  "run_after \"" + pred + "\" is not an earlier entry of this Assign"));
    return;
  }
  if (!before->second) {  // rejected or dropped: the scheduler ends this one too
    spdlog::info("dropped chain link {} attempt {}: {} is not held here", a.task_id(), a.attempt(),
                 pred);
    return;
  }
  v1::RejectCode code = v1::REJECT_CODE_INVALID;
  std::string reason = LinkRefusal(a, draining, busy, &code);
  if (!reason.empty()) {
    replies->push_back(RejectMsg(a, code, std::move(reason)));
    return;
  }
  waiting_[pred] = a;
  held = true;
  spdlog::info("{} attempt {} waits for {}", a.task_id(), a.attempt(), pred);
}

std::string Slots::LinkRefusal(const v1::Assignment& a, bool draining, bool busy,
                               v1::RejectCode* code) const {
  const std::string& pred = a.run_after();
  if (draining) {
    *code = v1::REJECT_CODE_DRAINING;
    return "agent is draining";
  }
  if (busy) {
    *code = v1::REJECT_CODE_BUSY;
    return "another attempt of this task is running here";
  }
  if (waiting_.count(pred) > 0) return "another chain link already runs after " + pred;
  int32_t pred_slots = 0;
  if (auto r = running_.find(pred); r != running_.end()) {
    pred_slots = r->second.slots;
  } else if (auto w = FindWaiting(pred); w != waiting_.end()) {
    pred_slots = SlotsOf(w->second);
  }
  if (SlotsOf(a) > pred_slots) {
    // It takes the slots its predecessor frees, and nothing else.
    return absl::StrCat("a chain link needs ", SlotsOf(a), " slot(s), more than the ", pred_slots,
                        " of ", pred, " that it runs after");
  }
  return "";
}

std::shared_ptr<TaskRun> Slots::Start(v1::Assignment a) {
  const std::string id = a.task_id();
  const int32_t slots = SlotsOf(a);
  std::shared_ptr<TaskRun> run = make_run_(std::move(a));
  Running& r = running_[id];
  r.run = run;
  r.slots = slots;
  used_ += slots;
  return run;
}

Slots::Ended Slots::Finish(const std::shared_ptr<TaskRun>& run, v1::TaskResult result,
                           bool draining) {
  const v1::Assignment& a = run->assignment();
  Ended out;
  StopCause cause = StopCause::kNone;
  std::string note;
  auto it = running_.find(a.task_id());
  if (it != running_.end() && it->second.run == run) {
    cause = it->second.cause;
    note = std::move(it->second.note);
    used_ -= it->second.slots;
    running_.erase(it);
    // Its supervisor stopped it at the agent's lease, which the agent let
    // pass without running: as if the agent had fenced itself in time.
    if (cause == StopCause::kNone && run->fenced()) {
      cause = StopCause::kFenced;
      note = "stopped by its step supervisor: the agent did not run past its lease (frozen?)";
    }
  }
  // A task that ended on its own just before the agent stopped it keeps its
  // real result.
  const bool stopped_by_us = result.outcome() == v1::OUTCOME_CANCELLED;
  const bool succeeded = result.outcome() == v1::OUTCOME_SUCCEEDED;
  // Stopped by the agent, not by what the task did: the scheduler takes a
  // Release back without counting it as an attempt.
  if ((cause == StopCause::kReleased || cause == StopCause::kFenced) && stopped_by_us) {
    out.report = ReleaseMsg(a.task_id(), a.attempt(), note);
  } else {
    v1::Result* r = out.report.mutable_result();
    r->set_task_id(a.task_id());
    r->set_attempt(a.attempt());
    *r->mutable_result() = std::move(result);
  }

  // When the agent fences itself or its drain runs out it drops every
  // waiting link at once (StopAll): a task that still ends SUCCEEDED after
  // that finds no link here.
  auto link = waiting_.find(a.task_id());
  if (link == waiting_.end()) return out;
  if (!succeeded) {
    out.dropped = DropChain(a.task_id());
  } else if (draining) {
    const std::string link_id = link->second.task_id();
    out.link = ReleaseMsg(link_id, link->second.attempt(), "agent is draining");
    waiting_.erase(link);
    out.dropped = DropChain(link_id);
  } else {
    v1::Assignment l = std::move(link->second);
    waiting_.erase(link);
    // What a task hands on: its output file, else its stdout.
    const v1::TaskResult& done = out.report.result().result();
    (*l.mutable_inputs())[a.task_id()] = done.has_output() ? done.output() : done.stdout_tail();
    out.link = AcceptMsg(l);
    out.next = Start(std::move(l));  // in the slot(s) just freed
  }
  return out;
}

std::vector<std::string> Slots::Kept(const std::shared_ptr<TaskRun>& run) {
  const std::string& id = run->assignment().task_id();
  auto it = running_.find(id);
  if (it != running_.end() && it->second.run == run) {
    used_ -= it->second.slots;
    running_.erase(it);
  }
  return DropChain(id);
}

void Slots::Adopt(std::shared_ptr<TaskRun> run) {
  const std::string id = run->assignment().task_id();
  Running& r = running_[id];
  r.slots = SlotsOf(run->assignment());
  r.run = std::move(run);
  used_ += r.slots;
}

std::vector<std::shared_ptr<TaskRun>> Slots::Runs() const {
  std::vector<std::shared_ptr<TaskRun>> runs;
  for (const auto& [id, r] : running_) runs.push_back(r.run);
  return runs;
}

std::vector<std::string> Slots::Cancel(const std::string& task_id, int32_t attempt) {
  auto it = running_.find(task_id);
  if (it != running_.end() && it->second.run->assignment().attempt() == attempt) {
    it->second.run->Cancel();  // its waiting links are dropped when it ends cancelled
    return {};
  }
  auto w = FindWaiting(task_id);
  if (w != waiting_.end() && w->second.attempt() == attempt) return DropChain(w->first);
  return {};
}

int Slots::StopAll(StopCause cause, const std::string& note, std::vector<std::string>* dropped) {
  int n = 0;
  for (auto& [id, r] : running_) {
    if (r.cause != StopCause::kNone) continue;
    r.cause = cause;
    r.note = note;
    r.run->Cancel();
    ++n;
  }
  for (const auto& [pred, a] : waiting_) dropped->push_back(a.task_id());
  waiting_.clear();
  return n;
}

void Slots::ListHeld(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const {
  for (const auto& [id, r] : running_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(id);
    ref->set_attempt(r.run->assignment().attempt());
  }
  // Not started yet, but the scheduler counts them as ours (DISPATCHED):
  // unlisted, they would be failed as lost.
  for (const auto& [pred, a] : waiting_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(a.task_id());
    ref->set_attempt(a.attempt());
    ref->set_waiting(true);
  }
}

bool Slots::AnyUnstopped() const {
  return std::any_of(running_.begin(), running_.end(),
                     [](const auto& e) { return e.second.cause == StopCause::kNone; });
}

std::vector<std::string> Slots::DropChain(std::string pred) {
  std::vector<std::string> dropped;
  for (auto it = waiting_.find(pred); it != waiting_.end(); it = waiting_.find(pred)) {
    pred = it->second.task_id();
    dropped.push_back(pred);
    waiting_.erase(it);
  }
  return dropped;
}

std::map<std::string, v1::Assignment>::const_iterator Slots::FindWaiting(
    const std::string& task_id) const {
  return std::find_if(waiting_.begin(), waiting_.end(),
                      [&](const auto& e) { return e.second.task_id() == task_id; });
}

std::shared_ptr<TaskRun> Slots::RunOf(const std::string& task_id, int32_t attempt) const {
  auto it = running_.find(task_id);
  if (it == running_.end() || it->second.run->assignment().attempt() != attempt) return nullptr;
  return it->second.run;
}

}  // namespace taskgrid::agent
