// The scheduler's tunables: limits on input and the timing of agents.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace taskgrid::core {

struct SchedulerOptions {
  // Input limits.
  int64_t max_payload_bytes = 1 << 20;
  // Encoded size of a TaskSpec apart from its payload and depends_on (which
  // have limits of their own): argv, env, cwd, builtin args, labels, agent
  // ids, exit codes and the rest together (--max_spec_bytes).
  int64_t max_spec_bytes = 64 << 10;
  int max_batch_size = 10'000;
  int max_steps = 1'000;
  int max_attempts_limit = 100;
  // Tasks in one SubmitJob.
  int max_job_tasks = 10'000;

  // Jobs. At most this many tasks of a chain go to one agent in one Assign
  // (the rest follow as the chain proceeds).
  int max_chain_length = 100;
  // Finished attempts kept per task (--max_attempt_history); older ones are
  // dropped and counted.
  int max_attempt_history = 100;
  // The most slots one agent may announce (--max_agent_slots).
  int32_t max_agent_slots = 1024;
  // Outputs of a task's dependencies sent with it (all together); a task
  // whose inputs are larger fails instead of being dispatched.
  int64_t max_input_bytes = 16 << 20;
  // Largest TaskResult.output taken from an agent (the agent enforces it
  // too); a larger one fails the attempt.
  int64_t max_task_output_bytes = 1 << 20;

  // Queue lengths (non-terminal tasks); 0 means no limit.
  int64_t default_queue_max_length = 0;
  absl::flat_hash_map<std::string, int64_t> queue_max_length;

  // Pull mode (BoardService): the lease of a claim when the worker names
  // none, the longest it may ask for, and the most tasks one Claim takes.
  absl::Duration default_claim_lease = absl::Seconds(60);
  absl::Duration max_claim_lease = absl::Hours(1);
  int max_claims_per_call = 1'000;
  // Schedules fired (or skipped by their misfire policy) per Tick at most:
  // many due at once are spread over ticks instead of holding up one.
  int max_schedule_fires_per_tick = 100;
  // MISFIRE_POLICY_CATCH_UP (the default): after a restart, a schedule's
  // latest missed fire runs once when it is at most this old
  // (--schedule_catch_up); older ones are skipped.
  absl::Duration schedule_catch_up = absl::Minutes(1);
  // Delivery by merge key: what one task may gather (payloads and their
  // bytes, --max_merged_payloads, --max_merged_payload_bytes); a submit
  // past either is RESOURCE_EXHAUSTED.
  int64_t max_merged_payloads = 10'000;
  int64_t max_merged_payload_bytes = 16 << 20;

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

  // Agents. The interval, timeout and lease below are for a small fleet:
  // see max_heartbeats_per_second.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // The most heartbeats per second the scheduler asks of all its agents
  // together (0: no bound). Each heartbeat and its ack cost the scheduler
  // about 70 us of CPU, nearly all of it TCP and HTTP/2, so the interval,
  // not the code, decides what a large fleet costs. When the connected
  // agents would send more, adaptive agents (Hello.adaptive_heartbeat) are
  // told a longer interval: a whole multiple of heartbeat_interval, with
  // the heartbeat timeout and the lease scaled alike. Nomad's server does
  // the same (max_heartbeats_per_second, TTL = nodes / rate).
  double max_heartbeats_per_second = 1000;
  // A lost agent that reconnects within this keeps its tasks.
  absl::Duration reconnect_grace = absl::Seconds(5);
  // After a restart (or a standby's takeover) every agent that held an
  // attempt gets this long to come back with it (--restart_grace). Agents
  // learn it in Welcome and keep running their tasks that long while the
  // scheduler refuses connections (its process gone, its host up), so a
  // restart or an upgrade shorter than this re-runs nothing. Never shorter
  // than reconnect_grace.
  absl::Duration restart_grace = absl::Minutes(10);
  // Added to attempt_timeout before the scheduler expires a running attempt
  // itself (the agent kills it at attempt_timeout and normally reports).
  absl::Duration attempt_timeout_slack = absl::Seconds(5);
  int64_t max_output_bytes = 64 << 10;
  // How long the event history (WatchTasks resume) is kept.
  absl::Duration event_retention = absl::Hours(24);
  // A lost agent stays listed (state LOST) this long after its tasks moved.
  absl::Duration lost_agent_retention = absl::Minutes(10);

  // Finished tasks (cold.cc). One leaves memory this long after it
  // finished, once its last change is committed and nothing in memory
  // needs it (--finished_in_memory); from then on it lives on disk only.
  absl::Duration finished_in_memory = absl::Seconds(5);
  // Finished tasks are deleted this long after they finished: SUCCEEDED
  // and CANCELLED ones (--retention), FAILED and TRASHED ones, the dead
  // letter (--failed_retention). Zero keeps them; a queue may say
  // otherwise (SetQueueRetention).
  absl::Duration retention = absl::Hours(24 * 7);
  absl::Duration failed_retention = absl::Hours(24 * 30);
  // Bounds on the work of one call: tasks moved out of memory per Evict,
  // tasks deleted by retention per Tick (so neither holds up a commit).
  int max_evictions_per_call = 10'000;
  int max_deletes_per_tick = 1'000;

  // How long a restarted scheduler waits for an agent with restored
  // attempts, and what Welcome tells agents they may hold tasks for while
  // it refuses them: restart_grace, never less than reconnect_grace.
  absl::Duration RestartGrace() const { return std::max(restart_grace, reconnect_grace); }

  // What Welcome tells agents: stop running tasks after this long without
  // contact. Inside the grace (so they stop before their tasks move) and at
  // least 3 heartbeats (so a healthy agent never does).
  absl::Duration StopOnLostAfter() const {
    return std::max(reconnect_grace - absl::Seconds(1), reconnect_grace * 3 / 4);
  }

  // The multiple of heartbeat_interval for `agents` connected agents, given
  // the one in use now. It grows as soon as the agents would exceed
  // max_heartbeats_per_second, and shrinks only once they would stay 10 %
  // below it, so a fleet hovering at a step does not retune every agent
  // back and forth.
  int64_t HeartbeatFactor(int64_t agents, int64_t current) const {
    if (max_heartbeats_per_second <= 0) return 1;
    const double per_interval =
        max_heartbeats_per_second * absl::ToDoubleSeconds(heartbeat_interval);
    auto need = [&](double headroom) {
      return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(agents) *
                                                                 headroom / per_interval)));
    };
    const int64_t up = need(1.0);
    return up >= current ? up : std::min(current, need(1.1));
  }
  // The silence after which an agent heartbeating every `interval` is lost.
  absl::Duration HeartbeatTimeoutFor(absl::Duration interval) const {
    return heartbeat_timeout * absl::FDivDuration(interval, heartbeat_interval);
  }
  // What an adaptive agent heartbeating every `interval` may run its tasks
  // for after it sent a heartbeat that was answered (Welcome.
  // heartbeat_lease). The scheduler cannot move them before the agent's
  // heartbeat timeout plus the grace after that heartbeat arrived; this is
  // StopOnLostAfter() (shorter than the grace) longer than the extra
  // timeout, so it ends well before that, yet still spans about 5
  // intervals by default.
  absl::Duration HeartbeatLeaseFor(absl::Duration interval) const {
    return StopOnLostAfter() +
           std::max(HeartbeatTimeoutFor(interval) - heartbeat_timeout, absl::ZeroDuration());
  }

  int64_t QueueMaxLength(const std::string& queue) const {
    auto it = queue_max_length.find(queue);
    return it == queue_max_length.end() ? default_queue_max_length : it->second;
  }
};

}  // namespace taskgrid::core
