// Helpers shared by the files of the core: the Scheduler's own and its
// components' (task_keys.cc uses TASKGRID_CHECK). Not for code outside
// scheduler/core.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "scheduler/core/model.h"

// A broken internal invariant is a bug: fail loudly, never limp on.
#define TASKGRID_CHECK(cond, msg)                                                 \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "CHECK failed: %s: %s\n", #cond, std::string(msg).c_str()); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

namespace taskgrid::core {

// The most of an agent's free-text reason (reject, release) kept.
inline constexpr int64_t kMaxReasonBytes = 1024;

// Text an agent sent, at most `max` bytes: a longer one keeps its start
// and says how much went.
inline std::string Bounded(absl::string_view text, int64_t max) {
  if (static_cast<int64_t>(text.size()) <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "... (", text.size() - max, " bytes cut)");
}

// The tail of an output stream, at most `max` bytes; returns how many went.
inline int64_t CutTail(std::string* tail, int64_t max) {
  if (static_cast<int64_t>(tail->size()) <= max) return 0;
  const int64_t cut = static_cast<int64_t>(tail->size()) - max;
  tail->erase(0, cut);
  return cut;
}

inline v1::TaskResult LostResult(std::string error) {
  v1::TaskResult r;
  r.set_outcome(v1::OUTCOME_LOST);
  r.set_exit_code(-1);
  r.set_error(std::move(error));
  return r;
}

// How a dependency's state counts for its dependents.
enum class DepClass { kOpen, kSucceeded, kFailed };

inline DepClass ClassOf(v1::TaskState s) {
  if (s == v1::TASK_STATE_SUCCEEDED) return DepClass::kSucceeded;
  if (s == v1::TASK_STATE_FAILED || s == v1::TASK_STATE_CANCELLED || s == v1::TASK_STATE_TRASHED) {
    return DepClass::kFailed;
  }
  return DepClass::kOpen;
}

struct ListFilter;

// A queue an operation names: not empty, a valid name.
absl::Status CheckQueue(const std::string& queue);
// The states a bulk change (CancelTasks, RetryTasks, DeleteTasks) applies
// to, checked against `filter->states` (empty: all of them), and its
// queue or job.
absl::Status BulkStates(ListFilter* filter, std::initializer_list<v1::TaskState> allowed,
                        absl::string_view change);

// What a dependent receives from a finished dependency.
inline const std::string& OutputOf(const TaskRecord& t) {
  return t.result().has_output() ? t.result().output() : t.result().stdout_tail();
}

}  // namespace taskgrid::core
