// The workloads of taskgrid-bench. Each starts what it needs
// (a scheduler of its own unless --addr, real taskgrid-agent processes,
// simulated agents), measures, appends its Figures, and stops everything it
// started before returning, on success and on error alike.
//
// Called from main() on its thread, one workload at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tools/bench/cluster.h"
#include "tools/bench/report.h"

namespace taskgrid::bench {

// How big each workload is. Full() is the issue's; Smoke() runs each in a
// few seconds.
struct Sizes {
  int payload_bytes = 100;
  int64_t w1_tasks = 20000;
  int w1_in_flight = 64;
  int w1_batch = 100;
  // Which of W1's three modes run (all by default; fewer for profiling one).
  bool w1_one = true, w1_pipelined = true, w1_batched = true;
  int64_t w2_tasks = 20000;
  int w2_agents = 2;
  int w2_slots = 50;  // per agent
  int64_t w3_samples = 1000;
  int64_t w3_warmup = 100;
  int w3_slots = 4;
  int64_t w4_tasks = 50;
  int w4_sleep_seconds = 30;
  int64_t w5_table = 1000000;
  int64_t w5_drain = 10000;  // drained after restart; also the small table's size
  // Drains of w5_drain tasks per table after the restart; the median rate
  // counts (one drain lasts a quarter second and scatters by +-15 %).
  int w5_drain_rounds = 3;
  double w5_succeeded_fraction = 0.02;
  double w5_cancelled_fraction = 0.01;
  std::vector<int64_t> w6_agents = {2000, 10000};
  absl::Duration w6_window = absl::Seconds(60);
  int w6_per_process = 1000;
  int64_t w7_tasks = 20000;
  int w7_claimers = 16;
  int64_t w8_submits = 20000;
  int w8_keys = 100;
  int64_t w9_table = 1000000;
  int64_t w10_agents = 10000;
  int64_t w10_tasks = 1000000;
  int w10_queues = 10;

  static Sizes Full() { return Sizes(); }
  static Sizes Smoke();
};

struct RunContext {
  BenchOptions opts;
  Sizes sizes;
  std::string tag;  // unique per bench run: part of every task id and queue
};

absl::Status RunW1Submit(const RunContext& ctx, std::vector<Figure>* out);
absl::Status RunW2Drain(const RunContext& ctx, std::vector<Figure>* out);
absl::Status RunW3Latency(const RunContext& ctx, std::vector<Figure>* out);
absl::Status RunW4Recovery(const RunContext& ctx, std::vector<Figure>* out);
absl::Status RunW5Restart(const RunContext& ctx, std::vector<Figure>* out);
absl::Status RunW6ManyAgents(const RunContext& ctx, std::vector<Figure>* out);
// board.cc: pull mode.
absl::Status RunW7Claims(const RunContext& ctx, std::vector<Figure>* out);
// merge.cc: delivery by merge key.
absl::Status RunW8MergeKeys(const RunContext& ctx, std::vector<Figure>* out);
// failover.cc: a takeover on PostgreSQL with a large table.
absl::Status RunW9Failover(const RunContext& ctx, std::vector<Figure>* out);
// placement.cc: placement at fleet scale, in the scheduler's core.
absl::Status RunW10Placement(const RunContext& ctx, std::vector<Figure>* out);

}  // namespace taskgrid::bench
