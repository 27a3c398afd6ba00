#include "scheduler/core/claim_board.h"

#include "absl/strings/str_cat.h"

namespace taskgrid::core {
namespace {
absl::Duration SinceEpoch(absl::Time t) { return t - absl::UnixEpoch(); }
}  // namespace

const ClaimBoard::Labels::value_type* ClaimBoard::MissingLabel(const v1::Placement& p,
                                                               const Labels& labels) {
  for (const auto& required : p.required_labels()) {
    auto it = labels.find(required.first);
    if (it == labels.end() || it->second != required.second) return &required;
  }
  return nullptr;
}

bool ClaimBoard::Claimable(const v1::Placement& p, const Labels& labels) {
  // A task pinned to agent ids is meant for those agents alone.
  return p.agent_ids().empty() && MissingLabel(p, labels) == nullptr;
}

void ClaimBoard::AddReady(const TaskRecord& t) {
  if (OnBoard(t)) ready_[t.queue()].insert(ReadyKeyOf(t));
}

void ClaimBoard::RemoveReady(const TaskRecord& t) {
  if (auto q = ready_.find(t.queue()); q != ready_.end()) {
    q->second.erase(ReadyKeyOf(t));
    if (q->second.empty()) ready_.erase(q);
  }
}

template <typename F>
void ClaimBoard::Walk(const std::string& queue, const Labels& labels, F&& take) const {
  auto q = ready_.find(queue);
  if (q == ready_.end()) return;
  int examined = 0;
  for (auto it = q->second.begin(); it != q->second.end() && examined < kMaxScan;
       ++it, ++examined) {
    TaskRecord* t = std::get<2>(*it);
    if (Claimable(t->spec.placement(), labels) && !take(t)) return;
  }
}

std::vector<TaskRecord*> ClaimBoard::Pick(const std::string& queue, int max,
                                          const Labels& labels) const {
  std::vector<TaskRecord*> picked;
  if (max <= 0) return picked;
  Walk(queue, labels, [&](TaskRecord* t) {
    picked.push_back(t);
    return static_cast<int>(picked.size()) < max;
  });
  return picked;
}

int64_t ClaimBoard::Count(const std::string& queue, const Labels& labels) const {
  int64_t n = 0;
  Walk(queue, labels, [&](TaskRecord*) {
    ++n;
    return true;
  });
  return n;
}

bool ClaimBoard::Indexed(const TaskRecord& t) const {
  auto q = ready_.find(t.queue());
  return q != ready_.end() && q->second.contains(ReadyKeyOf(t));
}

void ClaimBoard::Claimed(const TaskRecord& t, absl::Time until) {
  ++claimed_[t.queue()];
  ends_.Set(t.id(), SinceEpoch(until));
}

void ClaimBoard::Extended(const TaskRecord& t, absl::Time until) {
  ends_.Set(t.id(), SinceEpoch(until));
}

void ClaimBoard::Released(const TaskRecord& t) {
  auto it = claimed_.find(t.queue());
  if (it != claimed_.end() && --it->second == 0) claimed_.erase(it);
  ends_.Remove(t.id());
}

std::vector<std::string> ClaimBoard::Expired(absl::Time now) {
  return ends_.PopExpired(SinceEpoch(now));
}

int64_t ClaimBoard::ClaimedIn(const std::string& queue) const {
  auto it = claimed_.find(queue);
  return it == claimed_.end() ? 0 : it->second;
}

std::string ClaimBoard::CheckInvariants(
    size_t claimable, const absl::flat_hash_map<std::string, int64_t>& claimed) const {
  size_t in_queues = 0;
  for (const auto& [queue, set] : ready_) {
    if (set.empty()) return absl::StrCat("the ready index of queue ", queue, " is empty but kept");
    in_queues += set.size();
  }
  if (in_queues != claimable) {
    return absl::StrCat("queue ready indexes hold ", in_queues, " tasks, not ", claimable);
  }
  if (claimed != claimed_) return "claims are counted wrongly by queue";
  size_t n = 0;
  for (const auto& [q, c] : claimed) n += static_cast<size_t>(c);
  if (ends_.size() != n) return absl::StrCat("claim ends are kept for ", ends_.size(), " tasks");
  return "";
}

}  // namespace taskgrid::core
