#include "scheduler/engine/waiters.h"

#include "absl/strings/str_cat.h"

namespace taskgrid::engine {

absl::StatusOr<uint64_t> Waiters::Add(const std::string& task_id, absl::Duration deadline,
                                      Reply done) {
  if (by_id_.size() >= max_) {
    return absl::ResourceExhaustedError(absl::StrCat("too many WaitTask calls in progress (", flag_,
                                                     "=", max_, "); try again later"));
  }
  const uint64_t id = next_id_++;
  by_task_.emplace(task_id, id);
  by_deadline_.emplace(deadline, id);
  by_id_.emplace(id, Waiter{id, task_id, deadline, std::move(done)});
  return id;
}

Waiters::Waiter Waiters::Take(absl::flat_hash_map<uint64_t, Waiter>::iterator it) {
  Waiter w = std::move(it->second);
  by_id_.erase(it);
  by_task_.erase({w.task_id, w.id});
  by_deadline_.erase({w.deadline, w.id});
  return w;
}

bool Waiters::Remove(uint64_t id, Waiter* out) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  *out = Take(it);
  return true;
}

std::vector<Waiters::Waiter> Waiters::TakeTask(const std::string& task_id) {
  std::vector<Waiter> out;
  auto it = by_task_.lower_bound({task_id, 0});
  while (it != by_task_.end() && it->first == task_id) {
    const uint64_t id = it->second;
    ++it;  // Take erases the entry
    out.push_back(Take(by_id_.find(id)));
  }
  return out;
}

std::vector<Waiters::Waiter> Waiters::TakeExpired(absl::Duration now) {
  std::vector<Waiter> out;
  while (!by_deadline_.empty()) {
    ++examined_;
    const auto& [deadline, id] = *by_deadline_.begin();
    if (deadline > now) break;
    out.push_back(Take(by_id_.find(id)));
  }
  return out;
}

std::vector<Waiters::Waiter> Waiters::TakeAll() {
  std::vector<Waiter> out;
  out.reserve(by_id_.size());
  for (auto& [id, w] : by_id_) out.push_back(std::move(w));
  by_id_.clear();
  by_task_.clear();
  by_deadline_.clear();
  return out;
}

}  // namespace taskgrid::engine
