// The task tree of `taskgridctl job get`: a job's tasks, a DAG joined by
// depends_on, drawn as a tree one row per task. Pure formatting over proto
// values (no gRPC, no I/O).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "taskgrid/v1/task.pb.h"

namespace taskgrid::ctl {

// Rows deeper than this keep this indentation and show their depth ("[57]")
// instead, so a very long chain stays printable.
inline constexpr size_t kMaxTreeIndent = 20;

// `tasks` in submit order (as ListTasks returns a job's tasks). Roots are the
// tasks with no dependency inside `tasks`; every other task sits under its
// first dependency inside `tasks` (indented two spaces per level), children
// in submit order. A task with several dependencies is printed once, under
// its first, noting "(also after: x, y)"; a root's dependencies outside the
// job read "(after: x)". Columns: STATE, TASK, ATTEMPT, AGENT (the live
// attempt's, else the last attempt's), NOTE (those dependencies, and the
// shortened reason of a task not SUCCEEDED).
//
// Iterative (an explicit stack), so a chain of any length is fine.
std::string FormatJobTree(const std::vector<v1::Task>& tasks);

}  // namespace taskgrid::ctl
