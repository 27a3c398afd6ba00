#include "scheduler/store/store.h"

#include <string>

#include "absl/container/flat_hash_map.h"

namespace taskgrid::store {

absl::StatusOr<std::vector<core::StoredTask>> Store::LoadTasks() {
  std::vector<core::StoredTask> out;
  absl::flat_hash_map<std::string, size_t> index;
  absl::Status s = ScanTasks([&](std::vector<core::TaskRow>* rows) {
    for (core::TaskRow& r : *rows) {
      index[r.id] = out.size();
      out.emplace_back().row = std::move(r);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  auto attempts = LoadAttempts();
  if (!attempts.ok()) return attempts.status();
  for (core::AttemptRow& a : *attempts) {
    auto it = index.find(a.task_id);
    if (it != index.end()) out[it->second].attempts.push_back(std::move(a));
  }
  auto merged = LoadMerged();
  if (!merged.ok()) return merged.status();
  for (core::MergedRow& m : *merged) {
    auto it = index.find(m.task_id);
    if (it != index.end()) out[it->second].merged.push_back(std::move(m));
  }
  return out;
}

}  // namespace taskgrid::store
