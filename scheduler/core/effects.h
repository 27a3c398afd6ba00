// Effects: what an operation of the core requires once it is done, in
// memory already: the rows to commit (one transaction) and the messages
// to send to agents, the streams to end and the lines to log. The
// Scheduler and each of its components append to one Effects; the caller
// (service/Engine) takes it, commits the batch and only then sends the
// messages and answers its client (invariant 1 in docs/architecture.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/core/model.h"
#include "taskgrid/v1/agent_service.pb.h"

namespace taskgrid::core {

struct Outgoing {
  uint64_t conn = 0;  // the agent stream to send on
  v1::SchedulerMessage msg;
};

struct Effects {
  WriteBatch batch;
  std::vector<Outgoing> messages;     // send after `batch` committed, in order
  std::vector<uint64_t> close_conns;  // streams to end (agent went silent)
  // Lines for the scheduler's log (warnings an operator should see, such
  // as schedule fires skipped); the core itself has no logger.
  std::vector<std::string> notices;
};

}  // namespace taskgrid::core
