// Dispatch: the Scheduler's side of ReadyQueues' loop. Starting a task
// (with the chain below it) on the agent the loop picked, and sending the
// Assigns.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

namespace {

// Per agent, Assign messages of about kAssignBytes each (a chain is never
// split between two), and never more than kMaxAssignBytes.
constexpr size_t kAssignBytes = 4 << 20;
constexpr size_t kMaxAssignBytes = 32 << 20;

}  // namespace

bool Scheduler::FillAssignment(const TaskRecord& t, const TaskRecord* run_after, v1::Assignment* as,
                               int64_t* input_bytes) const {
  *input_bytes = 0;
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result().outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    *input_bytes += static_cast<int64_t>(OutputOf(*d).size());
  }
  if (*input_bytes > opts_.max_input_bytes) return false;
  as->set_task_id(t.id());
  as->set_queue(t.queue());
  *as->mutable_steps() = t.spec.steps();
  as->set_payload(t.spec.payload());
  if (t.merge) *as->mutable_merged_payloads() = t.merge->merged.payloads();
  *as->mutable_attempt_timeout() = t.spec.attempt_timeout();
  as->set_slots(SlotsOf(t.spec.placement()));
  if (run_after != nullptr) as->set_run_after(run_after->id());
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result().outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    (*as->mutable_inputs())[d->id()] = OutputOf(*d);
  }
  return true;
}

void Scheduler::AddReady(TaskRecord& t) {
  ready_.Add(t);
  board_.AddReady(t);
}

void Scheduler::RemoveReady(const TaskRecord& t) {
  ready_.Remove(t);
  board_.RemoveReady(t);
}

class Scheduler::DispatchRun final : public ReadyQueues::Host {
 public:
  explicit DispatchRun(Scheduler* s) : s_(s), mono_(s->Mono()), now_(s->Now()) {}

  QueueControls::Gate GateOf(const std::string& queue) const override { return s_->GateOf(queue); }
  absl::flat_hash_set<std::string> ReplicaAgents(const TaskRecord& group) const override {
    return core::ReplicaAgents(group);
  }
  void DispatchGang(TaskRecord& group, const std::vector<AgentRecord*>& agents,
                    std::vector<std::string>* aside) override {
    s_->gangs_.Dispatch(group, agents, s_->InFlight(group.queue()), mono_, *this, aside);
  }
  void StartOn(TaskRecord& t, const Resources& need, AgentRecord& a) override {
    s_->StartOn(t, need, a, mono_, now_, &assigns_);
  }

  Assigns& assigns() { return assigns_; }

 private:
  Scheduler* const s_;
  const absl::Duration mono_;
  const absl::Time now_;
  Assigns assigns_;
};

void Scheduler::StartOn(TaskRecord& t, const Resources& need, AgentRecord& a, absl::Duration mono,
                        absl::Time now, Assigns* assigns) {
  v1::Assignment head;
  int64_t input_bytes = 0;
  if (!FillAssignment(t, nullptr, &head, &input_bytes)) {
    Transition(t, v1::TASK_STATE_FAILED,
               absl::StrCat("the outputs of its dependencies total ", input_bytes,
                            " bytes; the limit is ", opts_.max_input_bytes));
    start_deadlines_.Remove(t.id());
    return;
  }
  queue_controls_.Take(t.queue(), mono);
  head.set_attempt(++t.attempt);
  t.agent_id = a.id;
  t.dispatch_time = now;
  t.start_time = absl::InfinitePast();
  ready_.TakeResources(a, t.queue(), SlotsOf(t.spec.placement()), need);
  a.tasks.insert(t.id());
  a.last_assigned = ++assign_counter_;
  task_deadlines_.Set(t.id(), mono + AckTimeout(t));
  Transition(t, v1::TASK_STATE_DISPATCHED,
             absl::StrCat("attempt ", t.attempt, " dispatched to agent ", a.id));
  auto& msgs = (*assigns)[&a];
  if (msgs.empty() || msgs.back().second >= kAssignBytes) msgs.emplace_back();
  msgs.back().second += head.ByteSizeLong();
  *msgs.back().first.add_tasks() = std::move(head);
  if (!a.chains) return;
  // The chain below t goes along, each link to start when the one
  // before it succeeded there.
  TaskRecord* cur = &t;
  for (int len = 1; len < opts_.max_chain_length; ++len) {
    TaskRecord* d = ChainSuccessor(*cur, now);
    if (d == nullptr) break;
    // Each link starts a task of the queue (the same as cur's: they
    // share a class) and counts against its limits.
    if (!queue_controls_.empty() && GateOf(d->queue()) != QueueControls::Gate::kOpen) break;
    v1::Assignment link;
    FillAssignment(*d, cur, &link, &input_bytes);  // no inputs but cur's
    // The rest of the chain goes in a later Assign, once cur succeeded:
    // one message stays well under what an agent accepts (64 MiB).
    if (msgs.back().second + link.ByteSizeLong() > kMaxAssignBytes) break;
    queue_controls_.Take(d->queue(), mono);
    link.set_attempt(++d->attempt);
    d->agent_id = a.id;
    d->dispatch_time = now;
    d->start_time = absl::InfinitePast();
    a.tasks.insert(d->id());
    cur->chain_next = d;
    d->chained_after = cur;
    Transition(*d, v1::TASK_STATE_DISPATCHED,
               absl::StrCat("attempt ", d->attempt, " dispatched to agent ", a.id,
                            ", to run after ", cur->id()));
    msgs.back().second += link.ByteSizeLong();
    *msgs.back().first.add_tasks() = std::move(link);
    cur = d;
  }
}

void Scheduler::Dispatch() {
  // Called on every tick: nothing to look at must cost nothing.
  if (ready_.Idle()) return;
  DispatchRun run(this);
  ready_.Dispatch(run);
  for (auto& [a, msgs] : run.assigns()) {
    for (auto& [assign, bytes] : msgs) {
      v1::SchedulerMessage msg;
      *msg.mutable_assign() = std::move(assign);
      Send(a->conn, std::move(msg));
    }
  }
}

}  // namespace taskgrid::core
