// Gangs: starting a gang whole, or reserving room for it in turns.

#include "scheduler/core/gangs.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_time.h"
#include "scheduler/core/replica_rules.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

namespace {

absl::Duration GangWait(const TaskRecord& group) {
  const v1::Replicas& r = group.spec.replicas();
  const absl::Duration wait = FromProto(r.gang_wait());
  return wait > absl::ZeroDuration() ? wait : kDefaultGangWait;
}

std::string Seconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(std::max(d, absl::ZeroDuration()), absl::Seconds(1)));
}

}  // namespace

void Gangs::Release(const std::string& group_id) {
  auto it = gangs_.find(group_id);
  if (it == gangs_.end()) return;
  Unreserve(it->second);
  gangs_.erase(it);
}

void Gangs::Unreserve(GangState& g) {
  for (const std::string& id : g.reserved) {
    AgentRecord* a = agents_->Find(id);
    if (a == nullptr || a->reserved_for != g.group) continue;
    a->reserved_for.clear();
    a->reserved_slots = 0;
    a->reserved.clear();
    ready_->Grew(*a);
  }
  g.reserved.clear();
}

void Gangs::Dispatch(TaskRecord& group, const std::vector<AgentRecord*>& agents, int64_t in_flight,
                     absl::Duration mono, ReadyQueues::Host& host,
                     std::vector<std::string>* aside) {
  const std::vector<TaskRecord*> members = GangMembers(group);
  // A sibling still running or waiting: the gang starts again only as a
  // whole, once every one of them waits to. Its transitions unpark these.
  if (std::any_of(members.begin(), members.end(),
                  [](const TaskRecord* r) { return r->state != v1::TASK_STATE_PENDING; })) {
    Release(group.id());
    ready_->MoveClassesOf(group, ReadyClass::Where::kParked, aside);
    return;
  }
  const int64_t k = static_cast<int64_t>(members.size());
  // Its queue must have room for all of them at once.
  if (!controls_->empty() &&
      controls_->Check(group.queue(), in_flight + k - 1, mono) != QueueControls::Gate::kOpen) {
    ready_->MoveClassesOf(group, ReadyClass::Where::kHeld, aside);
    return;
  }
  Resources total;
  for (const TaskRecord* r : members) AddResources(NeedOf(r->spec.placement()), &total);
  if (!total.empty() && !ready_->WithinQuota(group.queue(), total)) {
    Release(group.id());
    ready_->MoveClassesOf(group, ReadyClass::Where::kOverQuota, aside);
    return;
  }
  // Each on an agent of its own, none where a sibling succeeded: where
  // each fits now (counting the room reserved for it)...
  absl::flat_hash_set<std::string> taken = ReplicaAgents(group);
  std::vector<AgentRecord*> now_on;
  for (const TaskRecord* r : members) {
    AgentRecord* a =
        Pick(r->spec.placement(), NeedOf(r->spec.placement()), agents, &taken, group.id());
    if (a == nullptr) break;
    taken.insert(a->id);
    now_on.push_back(a);
  }
  GangState& g = gangs_[group.id()];
  if (now_on.size() == members.size()) {
    Release(group.id());
    for (size_t i = 0; i < members.size(); ++i) {
      host.StartOn(*members[i], NeedOf(members[i]->spec.placement()), *now_on[i]);
    }
    return;
  }
  // ...else it waits. Parked while fewer connected agents than it has
  // members could ever run one each (an agent connecting unparks it).
  g.group = group.id();
  g.size = static_cast<int32_t>(members.size());
  g.fit_now = static_cast<int32_t>(now_on.size());
  g.agents_could = AgentsCould(group, members);
  if (g.agents_could < g.size) {
    Unreserve(g);
    ready_->MoveClassesOf(group, ReadyClass::Where::kParked, aside);
    return;
  }
  const absl::Duration wait = GangWait(group);
  if (!g.started) {
    g.started = true;
    g.reserving = true;
    g.phase_end = mono + wait;
  }
  if (mono >= g.phase_end) {
    // Reserving and not reserving take turns, `wait` each.
    absl::Duration rest;
    const int64_t turns = absl::IDivDuration(mono - g.phase_end, wait, &rest) + 1;
    if (turns % 2 == 1) g.reserving = !g.reserving;
    g.phase_end += turns * wait;
  }
  Unreserve(g);
  if (g.reserving) Reserve(group, members, &g);
  ready_->MoveClassesOf(group, ReadyClass::Where::kAside, aside);
}

int32_t Gangs::AgentsCould(const TaskRecord& group, const std::vector<TaskRecord*>& members) const {
  absl::flat_hash_set<std::string> used = ReplicaAgents(group);
  int32_t n = 0;
  for (const TaskRecord* r : members) {
    const v1::Placement& p = r->spec.placement();
    const Resources need = NeedOf(p);
    for (const auto& [id, a] : agents_->all()) {
      if (!a->takes_work() || used.contains(id) || !Matches(p, need, *a)) continue;
      used.insert(id);
      ++n;
      break;
    }
  }
  return n;
}

void Gangs::Reserve(const TaskRecord& group, const std::vector<TaskRecord*>& members,
                    GangState* g) {
  // An agent for each member that no other gang reserved: those with room
  // for it now first, then those it reserved before, then the most free
  // slots. All or none: two gangs each holding part of what both need
  // would wait for each other forever.
  absl::flat_hash_set<std::string> used = ReplicaAgents(group);
  std::vector<AgentRecord*> chosen;
  for (const TaskRecord* r : members) {
    const v1::Placement& p = r->spec.placement();
    const Resources need = NeedOf(p);
    auto rank = [&](const AgentRecord& a) {
      return std::make_tuple(a.HasRoom(SlotsOf(p), need, group.id()), a.free_slots(),
                             -static_cast<int64_t>(a.last_assigned));
    };
    AgentRecord* best = nullptr;
    for (const auto& [id, a] : agents_->all()) {
      if (!a->takes_work() || used.contains(id) || !Matches(p, need, *a)) continue;
      if (!a->reserved_for.empty()) continue;
      if (best == nullptr || rank(*a) > rank(*best)) best = a.get();
    }
    if (best == nullptr) return;
    used.insert(best->id);
    chosen.push_back(best);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    AgentRecord& a = *chosen[i];
    a.reserved_for = group.id();
    a.reserved_slots = SlotsOf(members[i]->spec.placement());
    a.reserved = NeedOf(members[i]->spec.placement());
    g->reserved.push_back(a.id);
  }
}

std::string Gangs::Reason(const TaskRecord& group, absl::Duration mono) const {
  const std::vector<TaskRecord*> members = GangMembers(group);
  const size_t waiting = std::count_if(members.begin(), members.end(), [](const TaskRecord* r) {
    return r->state == v1::TASK_STATE_PENDING;
  });
  const std::string head = absl::StrCat("gang of ", members.size(), " starts together: ");
  if (waiting < members.size()) {
    return absl::StrCat(head, members.size() - waiting, " of its replicas ",
                        members.size() - waiting == 1 ? "has" : "have",
                        " not stopped or are not ready yet");
  }
  Resources total;
  for (const TaskRecord* r : members) AddResources(NeedOf(r->spec.placement()), &total);
  if (const std::string over = ready_->QuotaReason(group.queue(), total); !over.empty()) {
    return head + over;
  }
  auto it = gangs_.find(group.id());
  if (it == gangs_.end()) return "";
  const GangState& g = it->second;
  if (g.agents_could < g.size) {
    return absl::StrCat(head, "only ", g.agents_could, " connected agent",
                        g.agents_could == 1 ? "" : "s", " could run one each");
  }
  const absl::Duration left = g.phase_end - mono;
  if (g.reserving && !g.reserved.empty()) {
    return absl::StrCat(head, g.fit_now, " of ", g.size, " fit now; room reserved on ",
                        absl::StrJoin(g.reserved, ", "), " for ", Seconds(left), " more");
  }
  if (g.reserving) {
    return absl::StrCat(head, g.fit_now, " of ", g.size,
                        " fit now; the agents it needs hold another gang's reservation");
  }
  return absl::StrCat(head, g.fit_now, " of ", g.size, " fit now; it held room for ",
                      Seconds(GangWait(group)), " without starting, so it reserves none for ",
                      Seconds(left), " more");
}

std::string Gangs::CheckInvariants(
    absl::FunctionRef<const TaskRecord*(const std::string&)> find) const {
  // A reservation belongs to a gang that waits and lists it.
  for (const auto& [id, a] : agents_->all()) {
    if (!a->reserved_for.empty()) {
      auto g = gangs_.find(a->reserved_for);
      if (g == gangs_.end() || !g->second.reserving ||
          std::find(g->second.reserved.begin(), g->second.reserved.end(), id) ==
              g->second.reserved.end()) {
        return absl::StrCat("agent ", id, " holds a reservation gang ", a->reserved_for,
                            " does not list");
      }
    } else if (a->reserved_slots != 0 || !a->reserved.empty()) {
      return absl::StrCat("agent ", id, " has room reserved for no gang");
    }
  }
  // A gang holds state only while every member waits to start (it starts
  // as a whole, or a member's change releases it).
  for (const auto& [gid, g] : gangs_) {
    const TaskRecord* group = find(gid);
    if (group == nullptr || !group->spec.replicas().gang() || g.group != gid) {
      return absl::StrCat("gang state for ", gid, ", which is no gang");
    }
    for (const TaskRecord* r : GangMembers(*group)) {
      if (r->state != v1::TASK_STATE_PENDING) {
        return absl::StrCat("gang ", gid, " keeps its state while replica ", r->id(), " is ",
                            StateName(r->state));
      }
    }
    // (An agent it lists may have been forgotten, or be a new record
    // under the same id, since: the gang drops it at its next look.)
    size_t holding = 0;
    for (const auto& [aid, a] : agents_->all()) holding += a->reserved_for == gid ? 1 : 0;
    if (holding > g.reserved.size()) {
      return absl::StrCat("gang ", gid, " holds ", holding, " reservations but lists ",
                          g.reserved.size());
    }
  }
  return "";
}

}  // namespace taskgrid::core
