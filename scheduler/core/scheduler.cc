#include "scheduler/core/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

namespace {

// A broken internal invariant is a bug: fail loudly, never limp on.
#define TASKGRID_CHECK(cond, msg)                                                 \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "CHECK failed: %s: %s\n", #cond, std::string(msg).c_str()); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

v1::TaskResult LostResult(std::string error) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_LOST);
  r.set_exit_code(-1);
  r.set_error(std::move(error));
  return r;
}

const char* OutcomeWord(v1::Outcome o) {
  switch (o) {
    case v1::OUTCOME_SUCCEEDED:
      return "succeeded";
    case v1::OUTCOME_TIMED_OUT:
      return "timed out";
    case v1::OUTCOME_CANCELLED:
      return "was cancelled";
    case v1::OUTCOME_LOST:
      return "was lost";
    default:
      return "failed";
  }
}

bool IsRetryableFailure(const TaskRecord& t, const v1::TaskResult& r) {
  if (r.outcome() == v1::OUTCOME_FAILED) {
    for (int32_t code : t.spec.retry().non_retryable_exit_codes()) {
      if (code == r.exit_code()) return false;
    }
  }
  return true;
}

}  // namespace

Scheduler::Scheduler(const Clock* clock, SchedulerOptions opts)
    : clock_(clock), opts_(std::move(opts)) {}

absl::Time Scheduler::Now() const {
  // Stored times have microsecond precision; keep memory identical to disk.
  return absl::FromUnixMicros(absl::ToUnixMicros(clock_->Now()));
}

// ---------------------------------------------------------------------------
// The one door.

void Scheduler::Transition(TaskRecord& t, v1::TaskState to, std::string reason,
                           const std::string* event_agent) {
  const v1::TaskState from = t.state;
  TASKGRID_CHECK(IsAllowedTransition(from, to),
                 absl::StrCat("task ", t.id(), ": ", StateName(from), " -> ", StateName(to)));
  auto& counts = counts_[t.queue()];
  if (from == v1::TASK_STATE_PENDING) {
    ready_[t.placement_class].erase({-int64_t{t.spec.priority()}, t.seq, &t});
  } else if (from == v1::TASK_STATE_SCHEDULED) {
    scheduled_.erase({t.next_run_time, t.seq, &t});
  }
  if (from != v1::TASK_STATE_UNSPECIFIED) --counts[from];
  t.state = to;
  t.reason = std::move(reason);
  t.update_time = Now();
  ++counts[to];
  if (to == v1::TASK_STATE_PENDING) {
    ready_[t.placement_class].insert({-int64_t{t.spec.priority()}, t.seq, &t});
  } else if (to == v1::TASK_STATE_SCHEDULED) {
    scheduled_.insert({t.next_run_time, t.seq, &t});
  }
  effects_.batch.tasks.push_back(ToRow(t, from == v1::TASK_STATE_UNSPECIFIED));
  EventRow e;
  e.revision = ++last_revision_;
  e.task_id = t.id();
  e.queue = t.queue();
  e.from_state = from;
  e.to_state = to;
  e.attempt = t.attempt;
  e.agent_id = event_agent != nullptr ? *event_agent : t.agent_id;
  e.time_us = ToUnixMicrosOrZero(t.update_time);
  e.reason = t.reason;
  if (revision_marks_.empty() ||
      e.time_us / 1'000'000 != ToUnixMicrosOrZero(revision_marks_.back().second) / 1'000'000) {
    revision_marks_.push_back({e.revision, t.update_time});
  } else {
    revision_marks_.back().first = e.revision;
  }
  effects_.batch.events.push_back(std::move(e));
}

v1::TaskState Scheduler::ReadyOrScheduled(TaskRecord& t) {
  const absl::Time not_before = FromProto(t.spec.not_before());
  if (not_before > Now() && not_before > t.next_run_time) t.next_run_time = not_before;
  return t.next_run_time > Now() ? v1::TASK_STATE_SCHEDULED : v1::TASK_STATE_PENDING;
}

// ---------------------------------------------------------------------------
// Recovery.

absl::Status Scheduler::Restore(std::vector<TaskRecord> tasks, int64_t last_revision,
                                int64_t oldest_revision) {
  if (!tasks_.empty()) return absl::FailedPreconditionError("Restore needs an empty scheduler");
  last_revision_ = last_revision;
  oldest_revision_ = std::max<int64_t>(oldest_revision, 1);
  // History from before the restart counts as of now for retention.
  if (last_revision > 0) revision_marks_.push_back({last_revision, Now()});
  const absl::Duration grace_end = Mono() + opts_.reconnect_grace;
  for (TaskRecord& rec : tasks) {
    auto owned = std::make_unique<TaskRecord>(std::move(rec));
    TaskRecord& t = *owned;
    t.placement_class = PlacementClass(t.spec.placement());
    if (!tasks_.emplace(t.id(), std::move(owned)).second) {
      return absl::DataLossError(absl::StrCat("task ", t.id(), " is stored twice"));
    }
    by_seq_[t.seq] = &t;
    next_seq_ = std::max(next_seq_, t.seq + 1);
    ++counts_[t.queue()][t.state];
    if (!IsTerminal(t.state) && !IsInFlight(t.state)) ArmStartDeadline(t, t.create_time);
    if (t.state == v1::TASK_STATE_PENDING) {
      ready_[t.placement_class].insert({-int64_t{t.spec.priority()}, t.seq, &t});
    } else if (t.state == v1::TASK_STATE_SCHEDULED) {
      scheduled_.insert({t.next_run_time, t.seq, &t});
    } else if (IsInFlight(t.state)) {
      if (t.agent_id.empty()) {
        return absl::DataLossError(absl::StrCat("task ", t.id(), " is in flight with no agent"));
      }
      // The agent is not connected yet: it gets the grace window to come
      // back and claim its attempts; after it they are re-queued.
      auto& a = agents_[t.agent_id];
      if (!a) {
        a = std::make_unique<AgentRecord>();
        a->id = t.agent_id;
        a->last_seen = Mono();
        agent_deadlines_.Set(a->id, grace_end);
      }
      a->tasks.insert(t.id());
      a->used += SlotsOf(t.spec.placement());
      a->slots = std::max(a->slots, a->used);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Client operations.

absl::StatusOr<std::vector<const TaskRecord*>> Scheduler::Submit(std::vector<v1::TaskSpec> specs) {
  if (specs.empty()) return absl::InvalidArgumentError("tasks is empty: submit at least one task");
  if (static_cast<int>(specs.size()) > opts_.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tasks has ", specs.size(), " entries; the limit per call is ", opts_.max_batch_size));
  }
  absl::flat_hash_map<std::string, size_t> seen;
  std::vector<const TaskRecord*> existing(specs.size(), nullptr);
  absl::flat_hash_map<std::string, int64_t> adds;  // queue -> new tasks
  for (size_t i = 0; i < specs.size(); ++i) {
    v1::TaskSpec& spec = specs[i];
    const std::string field = absl::StrCat("tasks[", i, "]");
    if (absl::Status s = ValidateSpec(spec, opts_, field); !s.ok()) return s;
    if (spec.queue().empty()) spec.set_queue(kDefaultQueue);
    if (spec.id().empty()) {
      ++adds[spec.queue()];
      continue;
    }
    auto [it, inserted] = seen.emplace(spec.id(), i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".id \"", spec.id(), "\" repeats tasks[", it->second, "].id"));
    }
    if (const TaskRecord* t = Find(spec.id())) {
      if (!google::protobuf::util::MessageDifferencer::Equals(t->spec, spec)) {
        return absl::AlreadyExistsError(absl::StrCat("task \"", spec.id(), "\" (", field,
                                                     ") already exists with a different spec"));
      }
      existing[i] = t;
      continue;
    }
    ++adds[spec.queue()];
  }
  for (const auto& [queue, n] : adds) {
    const int64_t max = opts_.QueueMaxLength(queue);
    const int64_t len = QueueLength(queue);
    if (max > 0 && len + n > max) {
      return absl::ResourceExhaustedError(absl::StrCat("queue \"", queue, "\" is full: it holds ",
                                                       len, " of at most ", max,
                                                       " tasks and this batch adds ", n));
    }
  }

  const absl::Time now = Now();
  std::vector<const TaskRecord*> out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (existing[i] != nullptr) {
      out.push_back(existing[i]);
      continue;
    }
    auto owned = std::make_unique<TaskRecord>();
    TaskRecord& t = *owned;
    t.spec = std::move(specs[i]);
    if (t.spec.id().empty()) t.spec.set_id(NewTaskId());
    t.seq = next_seq_++;
    t.create_time = now;
    t.placement_class = PlacementClass(t.spec.placement());
    tasks_.emplace(t.id(), std::move(owned));
    by_seq_[t.seq] = &t;
    const v1::TaskState to = ReadyOrScheduled(t);
    Transition(t, to, to == v1::TASK_STATE_SCHEDULED ? "waiting for not_before" : "submitted");
    ArmStartDeadline(t, now);
    out.push_back(&t);
  }
  Dispatch();
  return out;
}

absl::StatusOr<const TaskRecord*> Scheduler::Cancel(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  switch (t->state) {
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
    case v1::TASK_STATE_BLOCKED:
    case v1::TASK_STATE_PAUSED:
      Transition(*t, v1::TASK_STATE_CANCELLED, "cancelled by request");
      start_deadlines_.Remove(t->id());
      return t;
    case v1::TASK_STATE_DISPATCHED:
    case v1::TASK_STATE_RUNNING:
      t->pause_requested = false;  // cancel wins over a pause under way
      Transition(*t, v1::TASK_STATE_CANCELLING,
                 absl::StrCat("cancel requested; waiting for agent ", t->agent_id));
      SendCancel(*t);
      return t;
    case v1::TASK_STATE_CANCELLING:
    case v1::TASK_STATE_CANCELLED:
      return t;  // already done or under way: cancelling is idempotent
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "task \"", id, "\" is ", StateName(t->state), " and can no longer be cancelled"));
  }
}

absl::StatusOr<const TaskRecord*> Scheduler::Retry(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state != v1::TASK_STATE_FAILED && t->state != v1::TASK_STATE_CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                     "; only FAILED or CANCELLED tasks can be retried"));
  }
  if (AttemptsUsed(*t) >= MaxAttempts(*t)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" has used all ", MaxAttempts(*t),
                     " of its attempts; reset it to run it again from attempt 0"));
  }
  t->next_run_time = absl::InfinitePast();
  Transition(*t, ReadyOrScheduled(*t), "retried by request");
  ArmStartDeadline(*t, Now());
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::Reset(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (!IsTerminal(t->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state),
                     "; only SUCCEEDED, FAILED or CANCELLED tasks can be reset"));
  }
  t->attempt = 0;
  t->attempts.clear();
  t->result.Clear();
  t->next_run_time = absl::InfinitePast();
  effects_.batch.clear_attempts.push_back(t->id());
  Transition(*t, ReadyOrScheduled(*t), "reset by request");
  ArmStartDeadline(*t, Now());
  Dispatch();
  return t;
}

absl::StatusOr<const TaskRecord*> Scheduler::Pause(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  switch (t->state) {
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
    case v1::TASK_STATE_BLOCKED:
      Transition(*t, v1::TASK_STATE_PAUSED, "paused by request");
      return t;
    case v1::TASK_STATE_PAUSED:
      return t;
    case v1::TASK_STATE_DISPATCHED:
    case v1::TASK_STATE_RUNNING:
      if (t->pause_requested) return t;
      // The agent stops the attempt; its result then ends the task PAUSED.
      t->pause_requested = true;
      t->reason = absl::StrCat("pause requested; waiting for agent ", t->agent_id);
      PersistRow(*t);
      SendCancel(*t);
      return t;
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("task \"", id, "\" is ", StateName(t->state), " and cannot be paused"));
  }
}

absl::StatusOr<const TaskRecord*> Scheduler::Resume(const std::string& id) {
  ASSIGN_OR_RETURN(TaskRecord * t, Lookup(id));
  if (t->state != v1::TASK_STATE_PAUSED) {
    return absl::FailedPreconditionError(
        absl::StrCat("task \"", id, "\" is ", StateName(t->state), ", not PAUSED"));
  }
  Transition(*t, ReadyOrScheduled(*t), "resumed by request");
  Dispatch();
  return t;
}

const TaskRecord* Scheduler::Find(const std::string& id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

void Scheduler::Describe(const TaskRecord& t, v1::Task* out,
                         const std::vector<const AgentRecord*>* agents) const {
  ToTaskProto(t, out);
  out->set_max_attempts(MaxAttempts(t));
  if (t.state == v1::TASK_STATE_PENDING) {
    // Placeable tasks keep their stored reason (e.g. why the last attempt
    // failed); the others say what no agent offers.
    const std::string why =
        WhyUnplaceable(t.spec.placement(), agents != nullptr ? *agents : Agents());
    if (!why.empty()) out->set_reason("waiting: " + why);
  }
}

std::vector<const AgentRecord*> Scheduler::Agents() const {
  std::vector<const AgentRecord*> out;
  out.reserve(agents_.size());
  for (const auto& [id, a] : agents_) out.push_back(a.get());
  std::sort(out.begin(), out.end(),
            [](const AgentRecord* x, const AgentRecord* y) { return x->id < y->id; });
  return out;
}

void Scheduler::DescribeAgent(const AgentRecord& a, v1::Agent* out) const {
  out->set_id(a.id);
  for (const auto& [k, v] : a.labels) (*out->mutable_labels())[k] = v;
  out->set_slots(a.slots);
  out->set_slots_used(a.used);
  std::vector<std::string> running(a.tasks.begin(), a.tasks.end());
  std::sort(running.begin(), running.end());
  for (std::string& id : running) out->add_running(std::move(id));
  out->set_state(!a.connected() ? v1::AGENT_STATE_LOST
                 : a.draining   ? v1::AGENT_STATE_DRAINING
                                : v1::AGENT_STATE_ACTIVE);
  SetTimestamp(a.last_seen_time, out->mutable_last_heartbeat_time());
  SetTimestamp(a.connect_time, out->mutable_connect_time());
  out->set_version(a.version);
}

v1::ClusterStats Scheduler::ClusterStats() const {
  v1::ClusterStats st;
  for (const auto& [id, a] : agents_) {
    if (!a->connected()) {
      st.set_agents_lost(st.agents_lost() + 1);
      continue;
    }
    if (a->draining) {
      st.set_agents_draining(st.agents_draining() + 1);
    } else {
      st.set_agents_active(st.agents_active() + 1);
    }
    st.set_slots_total(st.slots_total() + a->slots);
    st.set_slots_used(st.slots_used() + a->used);
  }
  st.set_stale_messages(stale_messages_);
  for (const auto& [queue, counts] : counts_) {
    for (int s = 1; s < kNumStates; ++s) {
      if (counts[s] != 0) {
        (*st.mutable_tasks())[StateName(static_cast<v1::TaskState>(s))] += counts[s];
      }
    }
  }
  return st;
}

absl::StatusOr<const AgentRecord*> Scheduler::Drain(const std::string& agent_id) {
  if (agent_id.empty()) return absl::InvalidArgumentError("id is empty");
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) {
    return absl::NotFoundError(absl::StrCat("agent \"", agent_id, "\" is not known"));
  }
  AgentRecord& a = *it->second;
  if (!a.draining) {
    a.draining = true;
    SendDrain(a);
  }
  return &a;
}

void Scheduler::SendDrain(const AgentRecord& a) {
  v1::SchedulerMessage msg;
  msg.mutable_drain();
  Send(a.conn, std::move(msg));
}

void Scheduler::PersistRow(const TaskRecord& t) {
  effects_.batch.tasks.push_back(ToRow(t, /*insert=*/false));
}

void Scheduler::ArmStartDeadline(const TaskRecord& t, absl::Time from) {
  const absl::Duration timeout = FromProto(t.spec.schedule_timeout());
  if (timeout <= absl::ZeroDuration()) return;
  for (const v1::Attempt& a : t.attempts) {
    if (FromProto(a.start_time()) != absl::InfinitePast()) return;  // it has started before
  }
  start_deadlines_.Set(t.id(), (from + timeout) - absl::UnixEpoch());
}

int32_t Scheduler::AttemptsUsed(const TaskRecord& t) const {
  int32_t interrupted = 0;
  for (const v1::Attempt& a : t.attempts) interrupted += a.interrupted() ? 1 : 0;
  return t.attempt - interrupted;
}

TaskRecord* Scheduler::Mutable(const std::string& id) {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->second.get();
}

absl::StatusOr<TaskRecord*> Scheduler::Lookup(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  TaskRecord* t = Mutable(id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("task \"", id, "\" does not exist"));
  return t;
}

ListPage Scheduler::List(const ListFilter& filter) const {
  ListPage page;
  const absl::flat_hash_set<int> states(filter.states.begin(), filter.states.end());
  for (auto it = by_seq_.upper_bound(filter.after_seq); it != by_seq_.end(); ++it) {
    const TaskRecord* t = it->second;
    if (!filter.queue.empty() && t->queue() != filter.queue) continue;
    if (!states.empty() && !states.contains(t->state)) continue;
    if (static_cast<int>(page.tasks.size()) == filter.page_size) {
      page.next_after_seq = page.tasks.back()->seq;
      break;
    }
    page.tasks.push_back(t);
  }
  return page;
}

std::vector<v1::QueueStats> Scheduler::Stats(const std::string& queue) const {
  std::map<std::string, v1::QueueStats> by_name;
  auto add = [&](const std::string& name) {
    v1::QueueStats& qs = by_name[name];
    qs.set_queue(name);
    qs.set_max_length(opts_.QueueMaxLength(name));
    qs.set_length(QueueLength(name));
    auto it = counts_.find(name);
    if (it == counts_.end()) return;
    for (int s = 1; s < kNumStates; ++s) {
      if (it->second[s] != 0) {
        (*qs.mutable_counts())[StateName(static_cast<v1::TaskState>(s))] = it->second[s];
      }
    }
  };
  if (!queue.empty()) {
    add(queue);
  } else {
    for (const auto& [name, unused] : counts_) add(name);
    for (const auto& [name, unused] : opts_.queue_max_length) add(name);
  }
  std::vector<v1::QueueStats> out;
  for (auto& [name, qs] : by_name) out.push_back(std::move(qs));
  return out;
}

int64_t Scheduler::QueueLength(const std::string& queue) const {
  auto it = counts_.find(queue);
  if (it == counts_.end()) return 0;
  int64_t n = 0;
  for (int s = 1; s < kNumStates; ++s) {
    if (!IsTerminal(static_cast<v1::TaskState>(s))) n += it->second[s];
  }
  return n;
}

int32_t Scheduler::MaxAttempts(const TaskRecord& t) const {
  return t.spec.max_attempts() > 0 ? t.spec.max_attempts() : opts_.default_max_attempts;
}

absl::Duration Scheduler::AckTimeout(const TaskRecord& t) const {
  const absl::Duration d = FromProto(t.spec.ack_timeout());
  return d > absl::ZeroDuration() ? d : opts_.default_ack_timeout;
}

absl::Duration Scheduler::Backoff(const TaskRecord& t) {
  const v1::RetryPolicy& r = t.spec.retry();
  absl::Duration initial = FromProto(r.initial_backoff());
  if (!r.has_initial_backoff()) initial = opts_.default_initial_backoff;
  absl::Duration max = FromProto(r.max_backoff());
  if (!r.has_max_backoff()) max = opts_.default_max_backoff;
  const double mult = r.multiplier() > 0 ? r.multiplier() : opts_.default_backoff_multiplier;
  // attempt 1 failed -> initial; attempt 2 failed -> initial * mult; ...
  const double factor = std::pow(mult, std::max(0, t.attempt - 1));
  absl::Duration d = std::min(std::isfinite(factor) ? initial * factor : max, max);
  const double u =
      opts_.random ? opts_.random() : std::uniform_real_distribution<double>(0, 1)(rng_);
  d *= 1.0 - opts_.backoff_jitter * std::clamp(u, 0.0, 1.0);
  return d;
}

std::string Scheduler::NewTaskId() {
  // Time-ordered: sorts by creation time as text.
  for (;;) {
    std::string id = absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(clock_->Now()),
                                     ++id_counter_ % 1'000'000);
    if (!tasks_.contains(id)) return id;
  }
}

// ---------------------------------------------------------------------------
// Dispatch.

void Scheduler::Dispatch() {
  std::vector<AgentRecord*> agents;
  for (auto& [id, a] : agents_) {
    if (a->takes_work() && a->free_slots() > 0) agents.push_back(a.get());
  }
  if (agents.empty()) return;
  absl::flat_hash_map<AgentRecord*, v1::Assign> assigns;
  absl::flat_hash_set<std::string> unplaceable;  // classes no agent has room for now
  const absl::Duration mono = Mono();
  const absl::Time now = Now();
  for (;;) {
    ReadySet* best = nullptr;
    const std::string* best_class = nullptr;
    for (auto& [cls, set] : ready_) {
      if (set.empty() || unplaceable.contains(cls)) continue;
      if (best == nullptr || *set.begin() < *best->begin()) {
        best = &set;
        best_class = &cls;
      }
    }
    if (best == nullptr) break;
    TaskRecord& t = *std::get<2>(*best->begin());
    AgentRecord* a = Pick(t.spec.placement(), agents);
    if (a == nullptr) {
      unplaceable.insert(*best_class);
      continue;
    }
    ++t.attempt;
    t.agent_id = a->id;
    t.dispatch_time = now;
    t.start_time = absl::InfinitePast();
    a->used += SlotsOf(t.spec.placement());
    a->tasks.insert(t.id());
    a->last_assigned = ++assign_counter_;
    task_deadlines_.Set(t.id(), mono + AckTimeout(t));
    Transition(t, v1::TASK_STATE_DISPATCHED,
               absl::StrCat("attempt ", t.attempt, " dispatched to agent ", a->id));
    v1::Assignment* as = assigns[a].add_tasks();
    as->set_task_id(t.id());
    as->set_attempt(t.attempt);
    as->set_queue(t.queue());
    *as->mutable_steps() = t.spec.steps();
    as->set_payload(t.spec.payload());
    *as->mutable_attempt_timeout() = t.spec.attempt_timeout();
    as->set_slots(SlotsOf(t.spec.placement()));
  }
  for (auto& [a, assign] : assigns) {
    v1::SchedulerMessage msg;
    *msg.mutable_assign() = std::move(assign);
    Send(a->conn, std::move(msg));
  }
}

void Scheduler::FinishAttempt(TaskRecord& t, v1::TaskResult result, bool interrupted) {
  TASKGRID_CHECK(IsInFlight(t.state), absl::StrCat("task ", t.id(), " is not in flight"));
  auto it = agents_.find(t.agent_id);
  TASKGRID_CHECK(it != agents_.end(), absl::StrCat("task ", t.id(), ": unknown agent"));
  AgentRecord& a = *it->second;
  a.used -= SlotsOf(t.spec.placement());
  a.tasks.erase(t.id());
  task_deadlines_.Remove(t.id());

  const bool pausing = t.pause_requested;
  t.pause_requested = false;
  // A pause that stopped the attempt interrupts it, like a drain's release.
  interrupted |= pausing && result.outcome() == v1::OUTCOME_CANCELLED;
  v1::Attempt done;
  done.set_attempt(t.attempt);
  done.set_agent_id(t.agent_id);
  SetTimestamp(t.dispatch_time, done.mutable_dispatch_time());
  SetTimestamp(t.start_time, done.mutable_start_time());
  SetTimestamp(Now(), done.mutable_finish_time());
  *done.mutable_result() = result;
  done.set_interrupted(interrupted);
  effects_.batch.attempts.push_back(ToAttemptRow(t.id(), done));
  t.attempts.push_back(std::move(done));
  t.result = std::move(result);
  const std::string agent = std::move(t.agent_id);
  t.agent_id.clear();
  t.dispatch_time = absl::InfinitePast();
  t.start_time = absl::InfinitePast();

  const v1::TaskResult& r = t.result;
  const std::string what = absl::StrCat("attempt ", t.attempt, " on agent ", agent);
  if (t.state == v1::TASK_STATE_CANCELLING) {
    if (r.outcome() == v1::OUTCOME_SUCCEEDED) {
      Transition(t, v1::TASK_STATE_SUCCEEDED, what + " succeeded before the cancel reached it",
                 &agent);
    } else {
      Transition(t, v1::TASK_STATE_CANCELLED, "cancelled by request", &agent);
    }
    return;
  }
  if (r.outcome() == v1::OUTCOME_SUCCEEDED) {
    Transition(t, v1::TASK_STATE_SUCCEEDED, what + " succeeded", &agent);
    return;
  }
  std::string why = absl::StrCat(what, " ", OutcomeWord(r.outcome()));
  if (!r.error().empty()) absl::StrAppend(&why, ": ", r.error());
  if (pausing) {
    Transition(t, v1::TASK_STATE_PAUSED, absl::StrCat("paused by request (", why, ")"), &agent);
    return;
  }
  if (interrupted) {
    t.next_run_time = absl::InfinitePast();
    Transition(t, ReadyOrScheduled(t), absl::StrCat(why, "; re-queued, not counted"), &agent);
    return;
  }
  if (!IsRetryableFailure(t, r)) {
    Transition(t, v1::TASK_STATE_FAILED,
               absl::StrCat(why, " (exit code ", r.exit_code(), " is not retryable)"), &agent);
    return;
  }
  if (AttemptsUsed(t) >= MaxAttempts(t)) {
    Transition(t, v1::TASK_STATE_FAILED,
               absl::StrCat(why, "; all ", MaxAttempts(t), " attempts used"), &agent);
    return;
  }
  // A lost attempt (agent gone, hand-over not confirmed) says nothing about
  // the task: it counts, but is re-queued at once rather than backed off.
  t.next_run_time = r.outcome() == v1::OUTCOME_LOST ? absl::InfinitePast() : Now() + Backoff(t);
  Transition(t, ReadyOrScheduled(t), absl::StrCat(why, "; will retry"), &agent);
}

// ---------------------------------------------------------------------------
// Agents.

void Scheduler::Send(uint64_t conn, v1::SchedulerMessage msg) {
  if (conn == 0) return;
  effects_.messages.push_back({conn, std::move(msg)});
}

void Scheduler::SendCancel(const TaskRecord& t) {
  auto it = agents_.find(t.agent_id);
  if (it == agents_.end()) return;
  v1::SchedulerMessage msg;
  msg.mutable_cancel()->set_task_id(t.id());
  msg.mutable_cancel()->set_attempt(t.attempt);
  Send(it->second->conn, std::move(msg));
}

absl::Status Scheduler::Connect(uint64_t conn, const v1::Hello& hello) {
  if (absl::Status s = CheckName("hello.agent_id", hello.agent_id(), kMaxIdLength); !s.ok()) {
    return s;
  }
  if (hello.slots() < 1 || hello.slots() > 100'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.slots is ", hello.slots(), "; it must be in [1, 100000]"));
  }
  for (const auto& [k, v] : hello.labels()) {
    if (absl::Status s = CheckName("hello.labels key", k, kMaxIdLength); !s.ok()) return s;
  }
  if (by_conn_.contains(conn)) {
    return absl::FailedPreconditionError("hello was already sent on this stream");
  }
  auto& slot = agents_[hello.agent_id()];
  if (!slot) {
    slot = std::make_unique<AgentRecord>();
    slot->id = hello.agent_id();
  }
  AgentRecord& a = *slot;
  if (a.connected() && Mono() - a.last_seen < 2 * opts_.heartbeat_interval) {
    // The old stream is alive: a second agent with the same id, not a
    // reconnect. Taking over would make the two evict each other forever.
    return absl::AlreadyExistsError(
        absl::StrCat("agent \"", a.id, "\" is connected on another stream (heard from ",
                     absl::FormatDuration(absl::Trunc(Mono() - a.last_seen, absl::Milliseconds(1))),
                     " ago); give each agent its own --id"));
  }
  if (a.connected()) {
    // A reconnect that beat the old (silent) stream's end: the new one wins.
    by_conn_.erase(a.conn);
    effects_.close_conns.push_back(a.conn);
  }
  a.conn = conn;
  by_conn_[conn] = &a;
  a.lost = false;
  a.draining = hello.draining();
  a.version = hello.version();
  a.labels = {hello.labels().begin(), hello.labels().end()};
  a.slots = hello.slots();
  a.last_seen = Mono();
  a.connect_time = Now();
  a.last_seen_time = a.connect_time;
  agent_deadlines_.Set(a.id, a.last_seen + opts_.heartbeat_timeout);

  v1::SchedulerMessage welcome;
  welcome.mutable_welcome()->set_session_id(absl::StrCat(a.id, "/", conn));
  *welcome.mutable_welcome()->mutable_heartbeat_interval() = ToProto(opts_.heartbeat_interval);
  welcome.mutable_welcome()->set_max_output_bytes(opts_.max_output_bytes);
  // The agent stops its tasks itself before the grace ends and they move.
  *welcome.mutable_welcome()->mutable_stop_on_lost_after() = ToProto(opts_.StopOnLostAfter());
  Send(conn, std::move(welcome));

  // Reconcile what the agent still runs with what it holds here.
  absl::flat_hash_map<std::string, int32_t> running;
  for (const v1::AttemptRef& r : hello.running()) running[r.task_id()] = r.attempt();
  const std::vector<std::string> held(a.tasks.begin(), a.tasks.end());
  for (const std::string& id : held) {
    TaskRecord& t = *Mutable(id);
    auto it = running.find(id);
    if (it != running.end() && it->second == t.attempt) {
      running.erase(it);
      // Cancels and pauses are durable: said again until the agent confirms.
      if (t.state == v1::TASK_STATE_CANCELLING || t.pause_requested) SendCancel(t);
      continue;
    }
    FinishAttempt(t, LostResult(absl::StrCat("agent ", a.id, " came back without it")));
  }
  for (const auto& [id, attempt] : running) {
    // Not the live attempt here: the agent must stop it.
    v1::SchedulerMessage msg;
    msg.mutable_cancel()->set_task_id(id);
    msg.mutable_cancel()->set_attempt(attempt);
    Send(conn, std::move(msg));
  }
  Dispatch();
  return absl::OkStatus();
}

void Scheduler::Disconnect(uint64_t conn) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  AgentRecord& a = *it->second;
  by_conn_.erase(it);
  a.conn = 0;
  agent_deadlines_.Set(a.id, Mono() + opts_.reconnect_grace);
}

void Scheduler::LoseAgent(AgentRecord& a, const std::string& why) {
  const std::vector<std::string> held(a.tasks.begin(), a.tasks.end());
  for (const std::string& id : held) FinishAttempt(*Mutable(id), LostResult(why));
  // Listed as LOST for a while, then forgotten.
  a.lost = true;
  agent_deadlines_.Set(a.id, Mono() + opts_.lost_agent_retention);
}

TaskRecord* Scheduler::LiveAttempt(const AgentRecord& a, const std::string& task_id,
                                   int32_t attempt) {
  TaskRecord* t = Mutable(task_id);
  if (t == nullptr || !IsInFlight(t->state) || t->attempt != attempt || t->agent_id != a.id) {
    return nullptr;
  }
  return t;
}

void Scheduler::OnAgentMessage(uint64_t conn, const v1::AgentMessage& msg) {
  auto it = by_conn_.find(conn);
  if (it == by_conn_.end()) return;
  AgentRecord& a = *it->second;
  a.last_seen = Mono();
  a.last_seen_time = Now();
  agent_deadlines_.Set(a.id, a.last_seen + opts_.heartbeat_timeout);
  switch (msg.msg_case()) {
    case v1::AgentMessage::kHeartbeat: {
      v1::SchedulerMessage ack;
      ack.mutable_heartbeat_ack();
      Send(a.conn, std::move(ack));
      break;
    }
    case v1::AgentMessage::kDraining:
      a.draining = true;
      break;
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
    default:
      break;
  }
  Dispatch();
}

void Scheduler::OnAccept(AgentRecord& a, const v1::Accept& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
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
  if (t->pause_requested) SendCancel(*t);
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
    r.set_error(absl::StrCat("released by the agent: ", m.reason()));
    FinishAttempt(*t, std::move(r), /*interrupted=*/true);
    ack.mutable_result_ack()->set_accepted(true);
  }
  Send(a.conn, std::move(ack));
}

void Scheduler::OnReject(AgentRecord& a, const v1::Reject& m) {
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t == nullptr) {
    ++stale_messages_;
    return;
  }
  FinishAttempt(*t, LostResult(absl::StrCat("rejected by the agent: ", m.reason())));
}

void Scheduler::OnResult(AgentRecord& a, const v1::Result& m) {
  v1::SchedulerMessage ack;
  ack.mutable_result_ack()->set_task_id(m.task_id());
  ack.mutable_result_ack()->set_attempt(m.attempt());
  TaskRecord* t = LiveAttempt(a, m.task_id(), m.attempt());
  if (t != nullptr) {
    if (t->state == v1::TASK_STATE_DISPATCHED) {
      // A result implies the agent accepted: keep DISPATCHED -> RUNNING.
      v1::Accept implied;
      implied.set_task_id(m.task_id());
      implied.set_attempt(m.attempt());
      OnAccept(a, implied);
    }
    v1::TaskResult r = m.result();
    if (r.outcome() == v1::OUTCOME_UNSPECIFIED || r.outcome() == v1::OUTCOME_LOST) {
      r.set_outcome(v1::OUTCOME_FAILED);
    }
    FinishAttempt(*t, std::move(r));
    ack.mutable_result_ack()->set_accepted(true);
  } else {
    // A result resent after its ack was lost is already committed: say so.
    const TaskRecord* known = Find(m.task_id());
    bool committed = false;
    if (known != nullptr) {
      for (const v1::Attempt& done : known->attempts) {
        if (done.attempt() == m.attempt() && done.agent_id() == a.id &&
            done.result().outcome() != v1::OUTCOME_LOST) {
          committed = true;
        }
      }
    }
    if (!committed) ++stale_messages_;
    ack.mutable_result_ack()->set_accepted(committed);
  }
  Send(a.conn, std::move(ack));
}

// ---------------------------------------------------------------------------
// Time.

void Scheduler::Tick() {
  const absl::Time now = Now();
  // Event retention: prune through the newest mark older than the window.
  int64_t prune = 0;
  while (!revision_marks_.empty() && revision_marks_.front().second < now - opts_.event_retention) {
    prune = revision_marks_.front().first;
    revision_marks_.pop_front();
  }
  if (prune > 0) {
    effects_.batch.prune_events_through = prune;
    oldest_revision_ = prune + 1;
  }
  while (!scheduled_.empty() && std::get<0>(*scheduled_.begin()) <= now) {
    TaskRecord& t = *std::get<2>(*scheduled_.begin());
    Transition(t, v1::TASK_STATE_PENDING,
               t.attempt > 0 ? "retry backoff over" : "not_before reached");
  }
  for (const std::string& id : start_deadlines_.PopExpired(now - absl::UnixEpoch())) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || IsTerminal(t->state) || IsInFlight(t->state)) continue;
    Transition(*t, v1::TASK_STATE_FAILED,
               absl::StrCat("expired before start: not started within schedule_timeout ",
                            absl::FormatDuration(FromProto(t->spec.schedule_timeout()))));
  }
  const absl::Duration mono = Mono();
  for (const std::string& id : task_deadlines_.PopExpired(mono)) {
    TaskRecord* t = Mutable(id);
    if (t == nullptr || !IsInFlight(t->state)) continue;
    SendCancel(*t);  // in case the agent does hold it
    if (t->state == v1::TASK_STATE_DISPATCHED) {
      FinishAttempt(*t, LostResult(absl::StrCat("agent ", t->agent_id, " did not accept it within ",
                                                absl::FormatDuration(AckTimeout(*t)))));
    } else {
      v1::TaskResult r;
      r.set_outcome(v1::OUTCOME_TIMED_OUT);
      r.set_exit_code(-1);
      r.set_error(absl::StrCat("no result from agent ", t->agent_id, " within attempt_timeout ",
                               absl::FormatDuration(FromProto(t->spec.attempt_timeout()))));
      FinishAttempt(*t, std::move(r));
    }
  }
  for (const std::string& id : agent_deadlines_.PopExpired(mono)) {
    auto it = agents_.find(id);
    if (it == agents_.end()) continue;
    AgentRecord& a = *it->second;
    if (a.connected()) {
      // Silent past heartbeat_timeout: lost; end its stream, start the grace.
      effects_.close_conns.push_back(a.conn);
      by_conn_.erase(a.conn);
      a.conn = 0;
      agent_deadlines_.Set(a.id, mono + opts_.reconnect_grace);
    } else if (!a.lost) {
      LoseAgent(a, absl::StrCat("agent ", id, " was lost and did not come back within ",
                                absl::FormatDuration(opts_.reconnect_grace)));
    } else {
      agents_.erase(it);  // lost long enough: forgotten
    }
  }
  Dispatch();
}

Effects Scheduler::TakeEffects() { return std::exchange(effects_, Effects{}); }

const AgentRecord* Scheduler::FindAgent(const std::string& id) const {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.get();
}

absl::Status Scheduler::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  absl::flat_hash_map<std::string, std::array<int64_t, kNumStates>> counts;
  size_t pending = 0, scheduled = 0;
  for (const auto& [id, tp] : tasks_) {
    const TaskRecord& t = *tp;
    ++counts[t.queue()][t.state];
    if (t.state == v1::TASK_STATE_PENDING) {
      ++pending;
      auto it = ready_.find(t.placement_class);
      if (it == ready_.end() || it->second.count({-int64_t{t.spec.priority()}, t.seq,
                                                  const_cast<TaskRecord*>(&t)}) == 0) {
        return fail("PENDING task ", id, " is not in its ready queue");
      }
    }
    if (t.state == v1::TASK_STATE_SCHEDULED) {
      ++scheduled;
      if (scheduled_.count({t.next_run_time, t.seq, const_cast<TaskRecord*>(&t)}) == 0) {
        return fail("SCHEDULED task ", id, " is not in the timer");
      }
    }
    if (IsInFlight(t.state)) {
      if (t.attempt < 1) return fail("in-flight task ", id, " has attempt ", t.attempt);
      const AgentRecord* a = FindAgent(t.agent_id);
      if (a == nullptr) return fail("task ", id, " is held by unknown agent ", t.agent_id);
      if (!a->tasks.contains(id)) return fail("agent ", a->id, " does not list task ", id);
    } else if (!t.agent_id.empty()) {
      return fail("task ", id, " is ", StateName(t.state), " but names agent ", t.agent_id);
    }
    if (t.state == v1::TASK_STATE_DISPATCHED && !task_deadlines_.Contains(id)) {
      return fail("DISPATCHED task ", id, " has no ack deadline");
    }
    if (static_cast<int32_t>(t.attempts.size()) > t.attempt) {
      return fail("task ", id, " has more finished attempts than its counter");
    }
  }
  size_t in_ready = 0;
  for (const auto& [cls, set] : ready_) in_ready += set.size();
  if (in_ready != pending) return fail("ready queues hold ", in_ready, " tasks, not ", pending);
  if (scheduled_.size() != scheduled) return fail("timer holds ", scheduled_.size(), " tasks");
  for (const auto& [queue, arr] : counts_) {
    auto it = counts.find(queue);
    for (int s = 0; s < kNumStates; ++s) {
      const int64_t want = it == counts.end() ? 0 : it->second[s];
      if (arr[s] != want) return fail("count of ", queue, "/", s, " is ", arr[s], " not ", want);
    }
  }
  for (const auto& [id, a] : agents_) {
    int32_t used = 0;
    for (const std::string& tid : a->tasks) {
      const TaskRecord* t = Find(tid);
      if (t == nullptr || !IsInFlight(t->state) || t->agent_id != id) {
        return fail("agent ", id, " lists task ", tid, " it does not hold");
      }
      used += SlotsOf(t->spec.placement());
    }
    if (used != a->used) return fail("agent ", id, " uses ", a->used, " slots, not ", used);
    if (a->connected() != by_conn_.contains(a->conn)) return fail("agent ", id, " conn mismatch");
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::core
