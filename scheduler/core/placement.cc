#include "scheduler/core/placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace taskgrid::core {

int32_t SlotsOf(const v1::Placement& p) { return p.slots() > 0 ? p.slots() : 1; }

Resources NeedOf(const v1::Placement& p) {
  if (p.resources().empty()) return {};
  absl::StatusOr<Resources> need = ParseResourceMap(p.resources());
  return need.ok() ? *std::move(need) : Resources{};
}

namespace {

// Offers every amount of `need` in total.
bool Offers(const AgentRecord& agent, const Resources& need) {
  for (const auto& [name, amount] : need) {
    if (AmountOf(agent.resources, name) < amount) return false;
  }
  return true;
}

// What fraction of its offer an agent has left of what `need` names once
// `need` is placed there: 0 for a perfect fit.
double LeftOver(const AgentRecord& agent, const Resources& need) {
  double left = 0;
  for (const auto& [name, amount] : need) {
    const int64_t offer = AmountOf(agent.resources, name);
    const int64_t free = offer - AmountOf(agent.held, name);
    left += static_cast<double>(free - amount) / static_cast<double>(offer);
  }
  return left;
}

}  // namespace

bool AgentRecord::HasFree(const Resources& need) const {
  for (const auto& [name, amount] : need) {
    if (AmountOf(resources, name) - AmountOf(held, name) < amount) return false;
  }
  return true;
}

bool AgentRecord::HasRoom(int32_t want_slots, const Resources& need,
                          const std::string& gang) const {
  if (reserved_for.empty() || reserved_for == gang) {
    return free_slots() >= want_slots && HasFree(need);
  }
  if (free_slots() - reserved_slots < want_slots) return false;
  for (const auto& [name, amount] : need) {
    if (AmountOf(resources, name) - AmountOf(held, name) - AmountOf(reserved, name) < amount) {
      return false;
    }
  }
  return true;
}

bool Matches(const v1::Placement& p, const AgentRecord& agent) {
  return Matches(p, NeedOf(p), agent);
}

bool Matches(const v1::Placement& p, const Resources& need, const AgentRecord& agent) {
  if (!p.agent_ids().empty() &&
      std::find(p.agent_ids().begin(), p.agent_ids().end(), agent.id) == p.agent_ids().end()) {
    return false;
  }
  for (const auto& [k, v] : p.required_labels()) {
    auto it = agent.labels.find(k);
    if (it == agent.labels.end() || it->second != v) return false;
  }
  return SlotsOf(p) <= agent.slots && Offers(agent, need);
}

AgentRecord* Pick(const v1::Placement& p, const Resources& need,
                  const std::vector<AgentRecord*>& agents,
                  const absl::flat_hash_set<std::string>* exclude, const std::string& gang) {
  const int32_t slots = SlotsOf(p);
  AgentRecord* best = nullptr;
  double best_left = 0;
  for (AgentRecord* a : agents) {
    if (!a->takes_work() || !a->HasRoom(slots, need, gang) || !Matches(p, need, *a)) {
      continue;
    }
    if (exclude != nullptr && exclude->contains(a->id)) continue;
    if (need.empty()) {
      if (best == nullptr || a->free_slots() > best->free_slots() ||
          (a->free_slots() == best->free_slots() && a->last_assigned < best->last_assigned)) {
        best = a;
      }
      continue;
    }
    const double left = LeftOver(*a, need);
    if (best == nullptr || left < best_left ||
        (left == best_left && a->last_assigned < best->last_assigned)) {
      best = a;
      best_left = left;
    }
  }
  return best;
}

std::string PlacementClass(const v1::Placement& p) {
  // Most tasks ask for neither labels nor agents: no map, no joins (a
  // restart computes this for every stored task).
  if (p.required_labels().empty() && p.agent_ids().empty() && p.resources().empty()) {
    return absl::StrCat(SlotsOf(p), "||");
  }
  std::map<std::string, std::string> labels(p.required_labels().begin(), p.required_labels().end());
  std::vector<std::string> ids(p.agent_ids().begin(), p.agent_ids().end());
  std::sort(ids.begin(), ids.end());
  // Resources as one spelling ("2" and "2000m" are one class), after a
  // third '|' only when named, so the classes of tasks without them stay
  // as they were.
  return absl::StrCat(SlotsOf(p), "|", absl::StrJoin(labels, ",", absl::PairFormatter("=")), "|",
                      absl::StrJoin(ids, ","), p.resources().empty() ? "" : "|",
                      FormatResources(NeedOf(p)));
}

std::string TaskClass(const v1::TaskSpec& spec) {
  // Its queue first (a queue's controls hold its classes, and only
  // those), then a placement's key, which starts with a digit, or a
  // replica's, with 'R' and its task's id. Names have no '|'.
  if (spec.replica_of().empty())
    return absl::StrCat(spec.queue(), "|", PlacementClass(spec.placement()));
  return absl::StrCat(spec.queue(), "|R", spec.replica_of(), "|", PlacementClass(spec.placement()));
}

std::string WhyUnplaceable(const v1::Placement& p, const std::vector<const AgentRecord*>& agents) {
  std::vector<const AgentRecord*> live;
  for (const AgentRecord* a : agents) {
    if (a->takes_work()) live.push_back(a);
  }
  if (live.empty()) {
    for (const AgentRecord* a : agents) {
      if (a->connected()) return "every connected agent is draining";
    }
    return "no agent is connected";
  }
  for (const AgentRecord* a : live) {
    if (Matches(p, *a)) return "";
  }
  // Name the first requirement that no live agent meets.
  if (!p.agent_ids().empty()) {
    bool any = false;
    for (const AgentRecord* a : live) {
      any |= std::find(p.agent_ids().begin(), p.agent_ids().end(), a->id) != p.agent_ids().end();
    }
    if (!any) {
      return absl::StrCat("none of the agents ", absl::StrJoin(p.agent_ids(), ", "),
                          " is connected and taking work");
    }
  }
  std::map<std::string, std::string> labels(p.required_labels().begin(), p.required_labels().end());
  for (const auto& [k, v] : labels) {
    bool any = false;
    for (const AgentRecord* a : live) {
      auto it = a->labels.find(k);
      any |= it != a->labels.end() && it->second == v;
    }
    if (!any) return absl::StrCat("no agent has label ", k, "=", v);
  }
  int32_t most = 0;
  for (const AgentRecord* a : live) most = std::max(most, a->slots);
  if (SlotsOf(p) > most) {
    return absl::StrCat("the task needs ", SlotsOf(p), " slots; the largest agent has ", most);
  }
  for (const auto& [name, amount] : NeedOf(p)) {
    int64_t largest = 0;
    for (const AgentRecord* a : live) largest = std::max(largest, AmountOf(a->resources, name));
    if (amount <= largest) continue;
    const std::string needs = absl::StrCat("needs ", name, "=", FormatResourceAmount(name, amount));
    if (largest == 0) return absl::StrCat(needs, "; no agent offers ", name);
    return absl::StrCat(needs, "; the largest agent has ", name, "=",
                        FormatResourceAmount(name, largest));
  }
  return "no agent meets all of its placement at once";
}

}  // namespace taskgrid::core
