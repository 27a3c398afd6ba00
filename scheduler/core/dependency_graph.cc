#include "scheduler/core/dependency_graph.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

bool CancelsOnUpstreamFailure(const TaskRecord& t) {
  return t.spec.on_upstream_failure() != v1::UPSTREAM_FAILURE_RUN;
}

bool DepsMet(const TaskRecord& t) {
  return CancelsOnUpstreamFailure(t) ? t.deps_unsucceeded == 0 : t.deps_unfinished == 0;
}

void LinkDependency(TaskRecord& t, TaskRecord& d) {
  t.deps.push_back(&d);
  d.dependents.push_back(&t);
  if (ClassOf(d.state) != DepClass::kSucceeded) ++t.deps_unsucceeded;
  if (ClassOf(d.state) == DepClass::kOpen) ++t.deps_unfinished;
}

void NoteStateChange(const TaskRecord& t, v1::TaskState from, v1::TaskState to,
                     std::deque<TaskRecord*>* to_settle) {
  const DepClass was = ClassOf(from), is = ClassOf(to);
  if (was != is) {
    for (TaskRecord* d : t.dependents) {
      d->deps_unsucceeded += (was == DepClass::kSucceeded) - (is == DepClass::kSucceeded);
      d->deps_unfinished += (is == DepClass::kOpen) - (was == DepClass::kOpen);
      to_settle->push_back(d);
    }
  }
}

std::string BlockedReason(const TaskRecord& t) {
  std::vector<std::string> open;
  int n = 0;
  for (const TaskRecord* d : t.deps) {
    const bool waits = CancelsOnUpstreamFailure(t) ? d->state != v1::TASK_STATE_SUCCEEDED
                                                   : ClassOf(d->state) == DepClass::kOpen;
    if (!waits) continue;
    if (++n <= 3) open.push_back(d->id());
  }
  std::string why = absl::StrCat("waiting for ", absl::StrJoin(open, ", "));
  if (n > 3) absl::StrAppend(&why, " and ", n - 3, " more");
  return why;
}

TaskRecord* ChainSuccessor(const TaskRecord& cur, absl::Time now) {
  if (cur.dependents.size() != 1) return nullptr;
  TaskRecord* d = cur.dependents[0];
  if (d->state != v1::TASK_STATE_BLOCKED || d->deps.size() != 1 || !CancelsOnUpstreamFailure(*d) ||
      d->placement_class() != cur.placement_class() || d->pause_requested ||
      !d->spec.replica_of().empty() || ReplicaCount(d->spec) > 0) {
    return nullptr;
  }
  if (FromProto(d->spec.not_before()) > now || d->next_run_time > now) return nullptr;
  return d;
}

absl::Status CheckDependencies(const std::vector<v1::TaskSpec>& specs,
                               const std::vector<size_t>& fresh,
                               const absl::flat_hash_map<std::string, size_t>& index,
                               const std::function<bool(const std::string&)>& exists) {
  // Unknown names first.
  for (size_t i : fresh) {
    const v1::TaskSpec& spec = specs[i];
    for (int j = 0; j < spec.depends_on_size(); ++j) {
      const std::string& dep = spec.depends_on(j);
      if (!index.contains(dep) && !exists(dep)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tasks[", i, "].depends_on[", j, "] names task \"", dep,
                         "\", which is neither in this request nor an existing task"));
      }
    }
  }
  // Cycles can only run through new tasks (an existing task never depends
  // on a new one). Kahn's algorithm over the new tasks of the request.
  absl::flat_hash_map<size_t, int> indegree;  // request index -> new deps not yet done
  absl::flat_hash_map<size_t, std::vector<size_t>> dependents;
  const absl::flat_hash_set<size_t> is_fresh(fresh.begin(), fresh.end());
  for (size_t i : fresh) {
    int& n = indegree[i];
    for (const std::string& dep : specs[i].depends_on()) {
      auto it = index.find(dep);
      if (it == index.end() || !is_fresh.contains(it->second)) continue;
      ++n;
      dependents[it->second].push_back(i);
    }
  }
  std::vector<size_t> ready;
  for (const auto& [i, n] : indegree) {
    if (n == 0) ready.push_back(i);
  }
  size_t done = 0;
  while (!ready.empty()) {
    const size_t i = ready.back();
    ready.pop_back();
    ++done;
    auto it = dependents.find(i);
    if (it == dependents.end()) continue;
    for (size_t d : it->second) {
      if (--indegree[d] == 0) ready.push_back(d);
    }
  }
  if (done == fresh.size()) return absl::OkStatus();
  // Every task left waits on another one left: walk from one of them along
  // such dependencies until a task repeats; from there on it is a cycle.
  size_t start = 0;
  for (size_t i : fresh) {
    if (indegree[i] > 0) {
      start = i;
      break;
    }
  }
  std::vector<size_t> path;
  absl::flat_hash_map<size_t, size_t> pos;
  size_t cur = start;
  while (!pos.contains(cur)) {
    pos[cur] = path.size();
    path.push_back(cur);
    for (const std::string& dep : specs[cur].depends_on()) {
      auto it = index.find(dep);
      if (it != index.end() && is_fresh.contains(it->second) && indegree[it->second] > 0) {
        cur = it->second;
        break;
      }
    }
  }
  std::vector<std::string> names;
  const size_t first = pos[cur];
  const size_t len = path.size() - first;
  for (size_t k = first; k < path.size() && names.size() < 20; ++k) {
    names.push_back(specs[path[k]].id());
  }
  if (len > 20) names.push_back(absl::StrCat("... (", len - 20, " more)"));
  names.push_back(specs[cur].id());
  return absl::InvalidArgumentError(
      absl::StrCat("depends_on forms a cycle of ", len, " task", len == 1 ? "" : "s", ": ",
                   absl::StrJoin(names, " -> "), " (each depends on the next)"));
}

}  // namespace taskgrid::core
