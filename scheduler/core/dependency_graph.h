// The dependency graph's rules, as functions of the records: whether a
// task may run, why it waits, the cycle check of a new request, and the
// chain a dispatch may push along. The Scheduler keeps the edges
// (TaskRecord::deps, dependents) and changes states; these decide.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/core/model.h"

namespace taskgrid::core {

// on_upstream_failure is not RUN: a failed dependency cancels it.
bool CancelsOnUpstreamFailure(const TaskRecord& t);
// Its dependencies allow it to run (all SUCCEEDED; or, for
// on_upstream_failure = run, all terminal).
bool DepsMet(const TaskRecord& t);
// Some dependency ended FAILED or CANCELLED.
inline bool DepFailed(const TaskRecord& t) { return t.deps_unsucceeded > t.deps_unfinished; }
// "waiting for a, b, c and 2 more".
std::string BlockedReason(const TaskRecord& t);

// Adds the edge t -> d (t depends on d) and counts d's state.
void LinkDependency(TaskRecord& t, TaskRecord& d);
// `t` went from `from` to `to`: its dependents' counters follow, and
// those whose counters moved are appended to `to_settle`.
void NoteStateChange(const TaskRecord& t, v1::TaskState from, v1::TaskState to,
                     std::deque<TaskRecord*>* to_settle);

// The next link of a chain after `cur` (being dispatched at `now`), or
// nullptr: its only dependent, BLOCKED on it alone, same placement, due.
TaskRecord* ChainSuccessor(const TaskRecord& cur, absl::Time now);

// New tasks of one request (specs[i] for the indexes in `fresh`; `index`
// maps every id of the request to its position): every depends_on entry
// names a task of the request or one that `exists`, and the new tasks form
// no cycle (the error names one, at most 20 tasks of it).
absl::Status CheckDependencies(const std::vector<v1::TaskSpec>& specs,
                               const std::vector<size_t>& fresh,
                               const absl::flat_hash_map<std::string, size_t>& index,
                               const std::function<bool(const std::string&)>& exists);

}  // namespace taskgrid::core
