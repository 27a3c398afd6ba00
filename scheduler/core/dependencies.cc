// Settling dependents: a task whose dependencies changed is released,
// cancelled or blocked again (the rules are in dependency_graph.h).

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_time.h"
#include "scheduler/core/dependency_graph.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

void Scheduler::SettleDependents() {
  if (settling_) return;  // the loop below is running further up the stack
  settling_ = true;
  while (!settle_queue_.empty()) {
    TaskRecord* t = settle_queue_.front();
    settle_queue_.pop_front();
    Settle(*t);
  }
  settling_ = false;
}

void Scheduler::Settle(TaskRecord& t) {
  switch (t.state) {
    case v1::TASK_STATE_BLOCKED:
      if (DepFailed(t) && CancelsOnUpstreamFailure(t)) {
        const TaskRecord* failed = nullptr;
        for (const TaskRecord* d : t.deps) {
          if (ClassOf(d->state) == DepClass::kFailed) {
            failed = d;
            break;
          }
        }
        start_deadlines_.Remove(t.id());
        Transition(t, v1::TASK_STATE_CANCELLED,
                   absl::StrCat("upstream task ", failed->id(),
                                failed->state == v1::TASK_STATE_FAILED    ? " failed"
                                : failed->state == v1::TASK_STATE_TRASHED ? " was trashed"
                                                                          : " was cancelled"));
      } else if (!t.replicas.empty()) {
        SettleReplicas(t);  // it never runs itself
      } else if (DepsMet(t)) {
        const v1::TaskState to = ReadyOrScheduled(t);
        Transition(t, to,
                   t.deps.size() == 1
                       ? absl::StrCat("dependency ", t.deps[0]->id(), " ",
                                      t.deps[0]->state == v1::TASK_STATE_SUCCEEDED ? "succeeded"
                                                                                   : "finished")
                       : absl::StrCat("all ", t.deps.size(), " dependencies ",
                                      DepFailed(t) ? "finished" : "succeeded"));
      }
      break;
    case v1::TASK_STATE_PENDING:
    case v1::TASK_STATE_SCHEDULED:
      // Released earlier, but a dependency was reset or retried since.
      if (!DepsMet(t)) Transition(t, v1::TASK_STATE_BLOCKED, BlockedReason(t));
      break;
    default:
      break;  // in flight or done: a dependency changing later does not recall it
  }
}

void Scheduler::LinkDependencies(TaskRecord& t) {
  t.deps.reserve(t.spec.depends_on_size());
  for (const std::string& id : t.spec.depends_on()) {
    TaskRecord* d = Mutable(id);
    TASKGRID_CHECK(d != nullptr, absl::StrCat("task ", t.id(), ": unknown dependency ", id));
    LinkDependency(t, *d);
  }
}

}  // namespace taskgrid::core
