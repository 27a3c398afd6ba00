// What the workloads of taskgrid-bench share: names of their tasks and
// queues, filling a queue, draining it with real agents, starting their
// scheduler. Used by workloads.cc (W1-W6) and board.cc (W7).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/bench/cluster.h"
#include "tools/bench/report.h"
#include "tools/bench/workloads.h"

namespace taskgrid::bench {

inline constexpr absl::Duration kRpcDeadline = absl::Seconds(30);
// Filling tables (not measured): this many SubmitTasks calls of 1,000 at once.
inline constexpr int kFillBatch = 1000;
inline constexpr int kFillInFlight = 4;

double Seconds(absl::Duration d);
// "<what>-<tag>-0000042": the i-th task of one workload of this run.
std::string Id(const RunContext& ctx, const std::string& what, int64_t i);
// "<what>-<tag>": a queue of this run.
std::string Queue(const RunContext& ctx, const std::string& what);
// A bound that grows with the work: at least `base`, plus `per_item` each.
absl::Duration Budget(absl::Duration base, int64_t items, absl::Duration per_item);
std::vector<Setting> With(std::vector<Setting> base, std::vector<Setting> more);
// Submits `count` noop tasks to `queue` in pipelined batches (not measured).
absl::Status FillQueue(Cluster& c, const RunContext& ctx, const std::string& queue,
                       const std::string& id_prefix, int64_t count, int priority);

// What a drain by real agents measured, from the scheduler's timestamps.
struct Drain {
  int64_t tasks = 0;
  double rate = 0;          // tasks / (last commit - first dispatch)
  double seconds = 0;       // last commit - first dispatch
  double wall_seconds = 0;  // agents started -> the bench saw every task SUCCEEDED
  int64_t retried = 0;      // tasks that needed more than one attempt
};

// Starts `agents` agents of `slots` each, waits until `n` tasks of `queue`
// SUCCEEDED, stops the agents, and computes the rate from the first
// DISPATCHED (attempt 1's dispatch time) to the last SUCCEEDED (the task's
// update time) among the queue's tasks.
absl::StatusOr<Drain> DrainWithAgents(Cluster& c, const std::string& queue, int64_t n, int agents,
                                      int slots, const std::string& agent_prefix);

// A Cluster for workload `name` with its scheduler started (`flags` added).
absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const RunContext& ctx,
                                                      const std::string& name,
                                                      const std::vector<std::string>& flags = {});

double MiB(int64_t kib);
// What "recovered 1000000 tasks in 1.234s" in the scheduler's log says, in
// seconds (NaN when it is not there).
double RecoveredSeconds(const std::string& log_path);

}  // namespace taskgrid::bench
