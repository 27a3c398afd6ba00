// The scheduler's tunables: limits on input and the timing of agents.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace taskgrid::core {

struct SchedulerOptions {
  // Input limits.
  int64_t max_payload_bytes = 1 << 20;
  int max_batch_size = 10'000;
  int max_steps = 1'000;
  int max_attempts_limit = 100;
  // Tasks in one SubmitJob.
  int max_job_tasks = 10'000;

  // Jobs. At most this many tasks of a chain go to one agent in one Assign
  // (the rest follow as the chain proceeds).
  int max_chain_length = 100;
  // Outputs of a task's dependencies sent with it (all together); a task
  // whose inputs are larger fails instead of being dispatched.
  int64_t max_input_bytes = 16 << 20;
  // Largest TaskResult.output taken from an agent (the agent enforces it
  // too); a larger one fails the attempt.
  int64_t max_task_output_bytes = 1 << 20;

  // Queue lengths (non-terminal tasks); 0 means no limit.
  int64_t default_queue_max_length = 0;
  absl::flat_hash_map<std::string, int64_t> queue_max_length;

  // Task defaults.
  int32_t default_max_attempts = 3;
  absl::Duration default_ack_timeout = absl::Seconds(10);
  absl::Duration default_initial_backoff = absl::Seconds(1);
  absl::Duration default_max_backoff = absl::Minutes(5);
  double default_backoff_multiplier = 2.0;
  // A retry waits backoff * (1 - backoff_jitter * u), u uniform in [0, 1):
  // tasks that failed together do not all come back at once.
  double backoff_jitter = 0.2;
  // Source of u; unset: a seeded generator. Tests inject a fixed one.
  std::function<double()> random;

  // Agents.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // A lost agent that reconnects within this keeps its tasks; after a
  // scheduler restart every agent gets a fresh window of this length.
  absl::Duration reconnect_grace = absl::Seconds(5);
  // Added to attempt_timeout before the scheduler expires a running attempt
  // itself (the agent kills it at attempt_timeout and normally reports).
  absl::Duration attempt_timeout_slack = absl::Seconds(5);
  int64_t max_output_bytes = 64 << 10;
  // How long the event history (WatchTasks resume) is kept.
  absl::Duration event_retention = absl::Hours(24);
  // A lost agent stays listed (state LOST) this long after its tasks moved.
  absl::Duration lost_agent_retention = absl::Minutes(10);

  // What Welcome tells agents: stop running tasks after this long without
  // contact. Inside the grace (so they stop before their tasks move) and at
  // least 3 heartbeats (so a healthy agent never does).
  absl::Duration StopOnLostAfter() const {
    return std::max(reconnect_grace - absl::Seconds(1), reconnect_grace * 3 / 4);
  }

  int64_t QueueMaxLength(const std::string& queue) const {
    auto it = queue_max_length.find(queue);
    return it == queue_max_length.end() ? default_queue_max_length : it->second;
  }
};

}  // namespace taskgrid::core
