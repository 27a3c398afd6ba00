// The invariants of the task table, its indexes and the agents, checked
// after every operation in tests (and with --check_invariants).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/core/replica_rules.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

absl::Status Scheduler::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  absl::flat_hash_map<std::string, std::array<int64_t, kNumStates>> counts;
  size_t pending = 0, scheduled = 0, claimable = 0, joinable = 0;
  absl::flat_hash_map<std::string, int64_t> claimed;
  // Submit order: the first PENDING task seen of a queue is its oldest.
  absl::flat_hash_map<std::string, const TaskRecord*> oldest_pending;
  if (table_.by_seq().size() != table_.size()) {
    return fail("the table holds ", table_.size(), " tasks but ", table_.by_seq().size(), " seqs");
  }
  for (const auto& [seq, tp] : table_.by_seq()) {
    const TaskRecord& t = *tp;
    const std::string& id = t.id();
    if (t.seq != seq) return fail("task ", id, " is listed under seq ", seq);
    if (table_.Find(id) != &t) return fail("task ", id, " is not found by its own id");
    ++counts[t.queue()][t.state];
    if (t.state == v1::TASK_STATE_PENDING) {
      ++pending;
      oldest_pending.try_emplace(t.queue(), &t);
      if (!ready_.Holds(t)) return fail("PENDING task ", id, " is not in its ready queue");
    }
    if (t.state == v1::TASK_STATE_SCHEDULED) {
      ++scheduled;
      if (table_.scheduled().count({t.next_run_time, t.seq, const_cast<TaskRecord*>(&t)}) == 0) {
        return fail("SCHEDULED task ", id, " is not in the timer");
      }
    }
    if (const int32_t n = ReplicaCount(t.spec); n > 0) {
      if (static_cast<int32_t>(t.replicas.size()) != n) {
        return fail("task ", id, " asks for ", n, " replicas but has ", t.replicas.size());
      }
      if (!IsTerminal(t.state) && t.state != v1::TASK_STATE_BLOCKED) {
        return fail("task ", id, " with replicas is ", StateName(t.state));
      }
      absl::flat_hash_set<std::string> holders;
      for (const TaskRecord* r : t.replicas) {
        if (r->replica_of != &t || r->spec.replica_of() != id) {
          return fail("replica ", r->id(), " does not name its task ", id);
        }
        if (IsInFlight(r->state) && !holders.insert(r->agent_id).second) {
          return fail("two replicas of ", id, " are in flight on agent ", r->agent_id);
        }
      }
    } else if (!t.replicas.empty()) {
      return fail("task ", id, " has replicas it did not ask for");
    }
    if (!t.spec.replica_of().empty() && t.replica_of == nullptr) {
      return fail("replica ", id, " is not linked to its task");
    }
    if (t.state == v1::TASK_STATE_PENDING && ClaimBoard::OnBoard(t)) {
      ++claimable;
      if (!board_.Indexed(t)) {
        return fail("PENDING task ", id, " is not in its queue's ready index");
      }
    }
    if (IsInFlight(t.state) && t.claimed()) {
      if (t.attempt < 1) return fail("claimed task ", id, " has attempt ", t.attempt);
      if (t.state != v1::TASK_STATE_RUNNING) return fail("claimed task ", id, " is not RUNNING");
      if (t.agent_id.empty()) return fail("claimed task ", id, " names no owner");
      if (!board_.HasEnd(id)) return fail("claimed task ", id, " has no claim end");
      if (task_deadlines_.Contains(id)) return fail("claimed task ", id, " has an agent deadline");
      ++claimed[t.queue()];
    } else if (IsInFlight(t.state)) {
      if (t.attempt < 1) return fail("in-flight task ", id, " has attempt ", t.attempt);
      const AgentRecord* a = FindAgent(t.agent_id);
      if (a == nullptr) return fail("task ", id, " is held by unknown agent ", t.agent_id);
      if (!a->tasks.contains(id)) return fail("agent ", a->id, " does not list task ", id);
    } else if (!t.agent_id.empty()) {
      return fail("task ", id, " is ", StateName(t.state), " but names agent ", t.agent_id);
    } else if (t.claimed()) {
      return fail("task ", id, " is ", StateName(t.state), " but claimed");
    }
    if (t.state == v1::TASK_STATE_PENDING &&
        (t.ready_time == absl::InfinitePast() || t.ready_time > Now())) {
      return fail("PENDING task ", id, " has no ready time (or one ahead of now)");
    }
    if (t.state == v1::TASK_STATE_DISPATCHED && t.chained_after == nullptr &&
        t.stop_request == StopRequest::kNone && !task_deadlines_.Contains(t.id())) {
      return fail("DISPATCHED task ", id, " has no ack deadline");
    }
    if (t.stop_request != StopRequest::kNone && (!IsInFlight(t.state) || t.claimed())) {
      return fail("task ", id, " is ", StateName(t.state),
                  " with a stop asked of an agent that holds nothing of it");
    }
    // Dependencies.
    int32_t unsucceeded = 0, unfinished = 0;
    for (const TaskRecord* d : t.deps) {
      unsucceeded += d->state != v1::TASK_STATE_SUCCEEDED;
      unfinished += !IsTerminal(d->state);
      if (std::find(d->dependents.begin(), d->dependents.end(), &t) == d->dependents.end()) {
        return fail("task ", d->id(), " does not list its dependent ", id);
      }
    }
    if (unsucceeded != t.deps_unsucceeded || unfinished != t.deps_unfinished) {
      return fail("task ", id, " counts ", t.deps_unsucceeded, "/", t.deps_unfinished,
                  " open dependencies, not ", unsucceeded, "/", unfinished);
    }
    for (const TaskRecord* d : t.deps) {
      if (table_.Find(d->id()) != d) return fail("task ", id, " depends on ", d->id(), " on disk");
    }
    if (t.deps_deleted
            ? !IsTerminal(t.state) || t.deps.size() >= static_cast<size_t>(t.spec.depends_on_size())
            : t.deps.size() != static_cast<size_t>(t.spec.depends_on_size())) {
      return fail("task ", id, " is ", StateName(t.state), " with ", t.deps.size(),
                  " linked dependencies of ", t.spec.depends_on_size(),
                  t.deps_deleted ? " (some deleted)" : "");
    }
    if (t.job != nullptr && !t.job->cold.empty()) {
      return fail("task ", id, " is in memory, but some of its job's tasks are on disk");
    }
    if (t.state == v1::TASK_STATE_BLOCKED && t.replicas.empty() &&
        (DepsMet(t) && !(DepFailed(t) && CancelsOnUpstreamFailure(t)))) {
      return fail("BLOCKED task ", id, " could run");
    }
    if (t.state == v1::TASK_STATE_BLOCKED && DepFailed(t) && CancelsOnUpstreamFailure(t)) {
      return fail("BLOCKED task ", id, " has a failed dependency and was not cancelled");
    }
    if ((t.state == v1::TASK_STATE_PENDING || t.state == v1::TASK_STATE_SCHEDULED) && !DepsMet(t)) {
      return fail(StateName(t.state), " task ", id, " has dependencies still open");
    }
    if (t.chained_after != nullptr) {
      const TaskRecord& p = *t.chained_after;
      if (t.state != v1::TASK_STATE_DISPATCHED && t.state != v1::TASK_STATE_CANCELLING) {
        return fail("chain link ", id, " is ", StateName(t.state));
      }
      if (p.chain_next != &t || !IsInFlight(p.state) || p.agent_id != t.agent_id) {
        return fail("chain link ", id, " and its predecessor ", p.id(), " disagree");
      }
    }
    if (t.chain_next != nullptr && t.chain_next->chained_after != &t) {
      return fail("task ", id, " and the chain link after it disagree");
    }
    if (t.job != nullptr && t.job->id != t.job_id()) return fail("task ", id, " is in another job");
    if (static_cast<bool>(t.merge) != !t.spec.merge_key().empty()) {
      return fail("task ", id, " has merge state ", t.merge ? "without" : "missing for",
                  " a merge key");
    }
    if (TaskKeys::Joinable(t)) {
      ++joinable;
      if (keys_.JoinableTask(TaskKeys::MergeKeyOf(t)) != &t) {
        return fail("task ", id, " of merge key ", t.spec.merge_key(), " is not the one joined");
      }
    }
    if (static_cast<int32_t>(t.attempts.size()) + t.attempts_dropped > t.attempt) {
      return fail("task ", id, " has more finished attempts than its counter");
    }
    if (static_cast<int64_t>(t.attempts.size()) > std::max(opts_.max_attempt_history, 1)) {
      return fail("task ", id, " keeps ", t.attempts.size(), " attempts, past the bound");
    }
    if (t.interrupted_dropped > t.attempts_dropped || t.attempts_dropped < 0) {
      return fail("task ", id, " counts more interrupted dropped attempts than dropped ones");
    }
  }
  if (std::string broken = board_.CheckInvariants(claimable, claimed); !broken.empty()) {
    return fail(broken);
  }
  if (keys_.joinable_count() != joinable) {
    return fail("the merge index holds ", keys_.joinable_count(), " keys, not ", joinable);
  }
  if (table_.scheduled().size() != scheduled) {
    return fail("timer holds ", table_.scheduled().size(), " tasks");
  }
  // Finished tasks on disk: found both ways, counted, in no index of
  // tasks in memory; each waits for its retention once (as itself, with
  // its job, or with its task for a replica).
  const size_t expiring = cold_.expiring();
  size_t should_expire = 0;
  int64_t last_seq = 0;
  for (TaskTable::ColdRef r : table_.cold_by_seq()) {
    const ColdTask* c = &table_.cold(r);
    if (c->seq <= last_seq || table_.FindColdBySeq(c->seq) != c || table_.FindCold(c->id()) != c) {
      return fail("task ", c->id(), " on disk is indexed wrongly");
    }
    last_seq = c->seq;
    if (table_.Find(c->id()) != nullptr) return fail("task ", c->id(), " is on disk and in memory");
    if (!IsTerminal(c->state())) {
      return fail("task ", c->id(), " on disk is ", StateName(c->state()));
    }
    ++counts[*c->queue][c->state()];
    if (c->job == nullptr && !c->replica) ++should_expire;
  }
  if (const std::string bad = table_.CheckLabelSets(); !bad.empty()) return fail(bad);
  for (const auto& [id, j] : table_.jobs()) {
    if (j->tasks.empty() && !j->cold.empty()) ++should_expire;
  }
  if (expiring != should_expire) {
    return fail("retention waits for ", expiring, " tasks and jobs on disk, not ", should_expire);
  }
  for (const auto& [queue, arr] : table_.counts()) {
    auto it = counts.find(queue);
    for (int s = 0; s < kNumStates; ++s) {
      const int64_t want = it == counts.end() ? 0 : it->second[s];
      if (arr[s] != want) return fail("count of ", queue, "/", s, " is ", arr[s], " not ", want);
    }
    auto oldest = oldest_pending.find(queue);
    if (table_.OldestPending(queue) !=
        (oldest == oldest_pending.end() ? nullptr : oldest->second)) {
      return fail("the oldest PENDING task of queue ", queue, " is indexed wrongly");
    }
  }
  for (const auto& [id, j] : table_.jobs()) {
    std::array<int64_t, kNumStates> jc{};
    for (const TaskRecord* t : j->tasks) ++jc[t->state];
    for (int64_t seq : j->cold) {
      const ColdTask* c = table_.FindColdBySeq(seq);
      if (c == nullptr || c->job != j.get()) return fail("job ", id, " lost task seq ", seq);
      ++jc[c->state()];
    }
    if (jc != j->counts) return fail("job ", id, " counts its tasks wrongly");
    if (j->size() == 0) return fail("job ", id, " has no task");
  }
  absl::flat_hash_map<std::string, Resources> held_by_queue;
  absl::flat_hash_map<std::string, int64_t> slots_by_queue;
  for (const auto& [id, a] : agents_.all()) {
    int32_t used = 0;
    Resources held;
    for (const std::string& tid : a->tasks) {
      const TaskRecord* t = Find(tid);
      if (t == nullptr || !IsInFlight(t->state) || t->agent_id != id) {
        return fail("agent ", id, " lists task ", tid, " it does not hold");
      }
      if (t->chained_after == nullptr) {
        used += SlotsOf(t->spec.placement());
        slots_by_queue[t->queue()] += SlotsOf(t->spec.placement());
        const Resources need = NeedOf(t->spec.placement());
        AddResources(need, &held);
        if (!need.empty()) AddResources(need, &held_by_queue[t->queue()]);
      }
    }
    if (used != a->used) return fail("agent ", id, " uses ", a->used, " slots, not ", used);
    // Free is exactly offered minus held: held is the sum of what its
    // slot-holding attempts asked for, nothing more or less.
    if (held != a->held) {
      return fail("agent ", id, " holds ", FormatResources(a->held), ", not ",
                  FormatResources(held));
    }
    if (!agents_.ConnIndexAgrees(*a)) return fail("agent ", id, " conn mismatch");
  }
  // A gang member in flight while a sibling waits to run is stopping.
  for (const auto& [id, t] : table_.by_seq()) {
    if (t->requeue_requested && (!IsGangMember(*t) || (t->state != v1::TASK_STATE_DISPATCHED &&
                                                       t->state != v1::TASK_STATE_RUNNING))) {
      return fail("task ", t->id(), " is to stop for its gang but is ", StateName(t->state),
                  IsGangMember(*t) ? "" : " and in no gang");
    }
    if (t->replicas.empty() || !t->spec.replicas().gang()) continue;
    bool waits = false;
    for (const TaskRecord* r : t->replicas) {
      waits |= r->state == v1::TASK_STATE_PENDING || r->state == v1::TASK_STATE_SCHEDULED;
    }
    if (!waits) continue;
    for (const TaskRecord* r : t->replicas) {
      if ((r->state == v1::TASK_STATE_DISPATCHED || r->state == v1::TASK_STATE_RUNNING) &&
          !r->requeue_requested && !r->pause_requested) {
        return fail("gang ", t->id(), " has replica ", r->id(), " ", StateName(r->state),
                    " while a sibling waits to run, and it is not stopping");
      }
    }
  }
  if (std::string broken =
          gangs_.CheckInvariants([this](const std::string& id) { return table_.Find(id); });
      !broken.empty()) {
    return fail(broken);
  }
  // A class waits parked only while nothing could place it, and over its
  // queue's quota only while it (a gang's class: the whole gang) does not
  // fit it.
  auto waits_rightly = [&](const ReadyClass& c) -> std::string {
    const TaskRecord* group = c.replica_of.empty() ? nullptr : table_.Find(c.replica_of);
    const bool gang = group != nullptr && group->spec.replicas().gang();
    if (c.where == ReadyClass::Where::kOverQuota) {
      Resources need = c.need;
      if (gang) {
        need.clear();
        for (const TaskRecord* r : GangMembers(*group)) {
          AddResources(NeedOf(r->spec.placement()), &need);
        }
      }
      if (ready_.WithinQuota(c.queue, need)) {
        return absl::StrCat("class ", c.key, " waits over the quota of ", c.queue, " but fits it");
      }
      return "";
    }
    if (gang) {
      // A gang's class waits parked while a member is not ready, or while
      // too few agents could run one each.
      const std::vector<TaskRecord*> members = GangMembers(*group);
      const bool all_ready = std::all_of(members.begin(), members.end(), [](const TaskRecord* r) {
        return r->state == v1::TASK_STATE_PENDING;
      });
      if (all_ready &&
          gangs_.AgentsCould(*group, members) >= static_cast<int32_t>(members.size())) {
        return absl::StrCat("gang class ", c.key, " is parked, but its gang could be placed");
      }
      return "";
    }
    absl::flat_hash_set<std::string> taken;
    if (group != nullptr) taken = ReplicaAgents(*group);
    if (ready_.AnyAgentCouldTake(c.placement, c.replica_of.empty() ? nullptr : &taken)) {
      return absl::StrCat("parked class ", c.key, " could be taken by a connected agent");
    }
    return "";
  };
  if (std::string broken =
          ready_.CheckInvariants(pending, held_by_queue, slots_by_queue, waits_rightly);
      !broken.empty()) {
    return fail(broken);
  }
  if (std::string broken = schedules_.CheckInvariants(); !broken.empty()) return fail(broken);
  return absl::OkStatus();
}

}  // namespace taskgrid::core
