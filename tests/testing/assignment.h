// Test-only: an Assignment as the scheduler would send it, for the tests
// that run TaskRun (agent/executor.h) on its own.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::testing {

// Attempt 1 of task "task-1" in queue "default", running `steps` in order.
inline v1::Assignment Assignment(std::vector<v1::Step> steps, const std::string& payload = "") {
  v1::Assignment a;
  a.set_task_id("task-1");
  a.set_attempt(1);
  a.set_queue("default");
  for (v1::Step& s : steps) *a.add_steps() = std::move(s);
  a.set_payload(payload);
  return a;
}

}  // namespace taskgrid::testing
