#include "scheduler/http/metrics_page.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/flags_help.h"
#include "common/prometheus.h"
#include "common/resources.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::http {

namespace {

using prometheus::ExpositionWriter;
using prometheus::Type;

// A resource amount as the API spells it, in the unit Prometheus expects:
// cpu in cores, memory in bytes, others as counts.
double ResourceValue(const std::string& name, const std::string& amount) {
  const int64_t v = ParseResourceAmount(name, amount).value_or(0);
  return name == "cpu" ? static_cast<double>(v) / 1000 : static_cast<double>(v);
}

// One sample per resource name of `m`, sorted by name, with `labels` first.
template <typename Map>
void ResourceSamples(ExpositionWriter& w, absl::string_view family, prometheus::Labels labels,
                     const Map& m) {
  std::map<std::string, std::string> sorted(m.begin(), m.end());
  for (const auto& [name, amount] : sorted) {
    prometheus::Labels l = labels;
    l.emplace_back("resource", name);
    w.Sample(family, l, ResourceValue(name, amount));
  }
}

// The count of `state` in a queue's or the cluster's counts by state name.
template <typename Map>
double CountOf(const Map& counts, v1::TaskState state) {
  auto it = counts.find(core::StateName(state));
  return it == counts.end() ? 0 : static_cast<double>(it->second);
}

void Queues(const core::SchedulerMetrics& s, ExpositionWriter& w) {
  w.Family("taskgrid_tasks", Type::kGauge, "Tasks by queue and state.");
  for (const v1::QueueStats& q : s.queues) {
    // Every state, zeros too, so a series drops to 0 instead of vanishing.
    for (int st = 1; st < core::kNumTaskStates; ++st) {
      const auto state = static_cast<v1::TaskState>(st);
      w.Sample("taskgrid_tasks", {{"queue", q.queue()}, {"state", core::StateName(state)}},
               CountOf(q.counts(), state));
    }
  }
  w.Family("taskgrid_queue_backlog_tasks", Type::kGauge,
           "Tasks ready to run (PENDING) and waiting for a slot or a claim, by queue.");
  for (const v1::QueueStats& q : s.queues) {
    w.Sample("taskgrid_queue_backlog_tasks", {{"queue", q.queue()}},
             CountOf(q.counts(), v1::TASK_STATE_PENDING));
  }
  w.Family("taskgrid_queue_oldest_pending_age_seconds", Type::kGauge,
           "Seconds since the oldest PENDING task of the queue was submitted (0: none pending).");
  for (size_t i = 0; i < s.queues.size(); ++i) {
    w.Sample("taskgrid_queue_oldest_pending_age_seconds", {{"queue", s.queues[i].queue()}},
             s.oldest_pending_seconds[i]);
  }
  w.Family("taskgrid_queue_resources_held", Type::kGauge,
           "What the queue's tasks on agents hold, by resource (cpu in cores, memory in bytes, "
           "others counted); only resources held.");
  for (const v1::QueueStats& q : s.queues) {
    ResourceSamples(w, "taskgrid_queue_resources_held", {{"queue", q.queue()}}, q.resources_held());
  }
  // Samples only while queues share by weight (some queue has a fair
  // share); the families always, so a dashboard finds them.
  const bool sharing = std::any_of(s.queues.begin(), s.queues.end(),
                                   [](const v1::QueueStats& q) { return q.fair_share() > 0; });
  w.Family("taskgrid_queue_share", Type::kGauge,
           "The dominant share of the connected agents' capacity the queue's tasks hold (0-1), "
           "while queues share by weight.");
  for (size_t i = 0; sharing && i < s.queues.size(); ++i) {
    w.Sample("taskgrid_queue_share", {{"queue", s.queues[i].queue()}}, s.queues[i].share());
  }
  w.Family("taskgrid_queue_fair_share", Type::kGauge,
           "What the queue's weight gives it among the queues with work (0-1), while queues "
           "share by weight.");
  for (size_t i = 0; sharing && i < s.queues.size(); ++i) {
    w.Sample("taskgrid_queue_fair_share", {{"queue", s.queues[i].queue()}},
             s.queues[i].fair_share());
  }
  w.Family("taskgrid_queue_resource_quota", Type::kGauge,
           "The queue's quota, by resource (queue limits --quota).");
  for (const v1::QueueStats& q : s.queues) {
    ResourceSamples(w, "taskgrid_queue_resource_quota", {{"queue", q.queue()}},
                    q.settings().quota());
  }
}

void Counters(const core::TaskCounters& c, ExpositionWriter& w) {
  // By queue, sorted; the queues past the cap together, last.
  std::map<std::string, const core::QueueCounters*> sorted;
  for (const auto& [name, q] : c.by_queue) sorted.emplace(name, &q);
  std::vector<std::pair<std::string, const core::QueueCounters*>> queues(sorted.begin(),
                                                                         sorted.end());
  if (c.by_queue.size() >= core::TaskCounters::kMaxQueues) {
    queues.emplace_back(core::TaskCounters::kOtherQueues, &c.other);
  }
  w.Family("taskgrid_tasks_submitted_total", Type::kCounter,
           "Tasks made by submits since the scheduler started (replicas included), by queue.");
  for (const auto& [name, q] : queues) {
    w.Sample("taskgrid_tasks_submitted_total", {{"queue", name}},
             static_cast<double>(q->submitted));
  }
  w.Single("taskgrid_schedule_fires_skipped_total", Type::kCounter,
           "Fires of schedules that did not run since the scheduler started: by their misfire "
           "policy after the scheduler was down, or all but the latest after a stall.",
           static_cast<double>(c.schedule_fires_skipped));
  w.Single("taskgrid_schedule_fires_total", Type::kCounter,
           "Fires of schedules that made their task since the scheduler started.",
           static_cast<double>(c.schedule_fires));
  w.Single("taskgrid_schedule_fires_refused_total", Type::kCounter,
           "Fires of schedules whose task was refused (a full queue, an invalid template) since "
           "the scheduler started; the schedule's last_error says why.",
           static_cast<double>(c.schedule_fires_refused));
  w.Family("taskgrid_schedule_fire_lag_seconds", Type::kHistogram,
           "Seconds from a schedule's fire time to when its task was made.");
  w.HistogramSamples("taskgrid_schedule_fire_lag_seconds", {}, c.schedule_fire_lag);
  w.Family("taskgrid_tasks_dispatched_total", Type::kCounter,
           "Attempts handed out since the scheduler started: dispatched to agents or claimed "
           "by pull workers, by queue.");
  for (const auto& [name, q] : queues) {
    w.Sample("taskgrid_tasks_dispatched_total", {{"queue", name}},
             static_cast<double>(q->dispatched));
  }
  w.Family("taskgrid_tasks_completed_total", Type::kCounter,
           "Tasks that reached a terminal state since the scheduler started, by queue and that "
           "state.");
  for (const auto& [name, q] : queues) {
    for (int st = 1; st < core::kNumTaskStates; ++st) {
      const auto state = static_cast<v1::TaskState>(st);
      if (!core::IsTerminal(state)) continue;
      w.Sample("taskgrid_tasks_completed_total",
               {{"queue", name}, {"outcome", core::StateName(state)}},
               static_cast<double>(q->ended[st]));
    }
  }
  w.Family("taskgrid_task_start_latency_seconds", Type::kHistogram,
           "Seconds from when a task became ready to run (PENDING: past its not_before, its "
           "dependencies and any retry backoff) to the start of the attempt it got, every "
           "attempt.");
  w.HistogramSamples("taskgrid_task_start_latency_seconds", {}, c.start_latency);
  w.Family("taskgrid_task_submit_to_start_seconds", Type::kHistogram,
           "Seconds from a task's submit to the start of its first attempt, delays it asked for "
           "(not_before, dependencies) included.");
  w.HistogramSamples("taskgrid_task_submit_to_start_seconds", {}, c.submit_to_start);
  w.Family("taskgrid_attempt_run_seconds", Type::kHistogram,
           "Seconds from the start of an attempt to its end.");
  w.HistogramSamples("taskgrid_attempt_run_seconds", {}, c.run_time);
}

void Cluster(const v1::ClusterStats& c, ExpositionWriter& w) {
  w.Single("taskgrid_stale_messages_total", Type::kCounter,
           "Agent and worker messages refused by fencing: about an attempt that is no longer "
           "the live one.",
           static_cast<double>(c.stale_messages()));
  w.Family("taskgrid_agents", Type::kGauge,
           "Agents by state: ACTIVE, DRAINING, or LOST (disconnected, within their reconnect "
           "grace).");
  const std::pair<v1::AgentState, int64_t> agents[] = {
      {v1::AGENT_STATE_ACTIVE, c.agents_active()},
      {v1::AGENT_STATE_DRAINING, c.agents_draining()},
      {v1::AGENT_STATE_LOST, c.agents_lost()}};
  for (const auto& [state, n] : agents) {
    w.Sample("taskgrid_agents", {{"state", core::AgentStateName(state)}}, static_cast<double>(n));
  }
  w.Single("taskgrid_agent_slots", Type::kGauge, "Slots of the connected agents.",
           static_cast<double>(c.slots_total()));
  w.Single("taskgrid_agent_slots_free", Type::kGauge,
           "Slots of the connected agents that no task holds (draining agents' included).",
           static_cast<double>(c.slots_total() - c.slots_used()));
  w.Family("taskgrid_agent_resources", Type::kGauge,
           "What the connected agents offer, by resource (cpu in cores, memory in bytes, others "
           "counted).");
  ResourceSamples(w, "taskgrid_agent_resources", {}, c.resources_total());
  w.Family("taskgrid_agent_resources_held", Type::kGauge,
           "What tasks hold of what the connected agents offer, by resource.");
  std::map<std::string, std::string> held(c.resources_used().begin(), c.resources_used().end());
  // Every offered name, zeros too, so a series drops to 0 instead of vanishing.
  for (const auto& [name, amount] : c.resources_total()) held.emplace(name, "0");
  for (const auto& [name, amount] : held) {
    w.Sample("taskgrid_agent_resources_held", {{"resource", name}},
             amount == "0" ? 0 : ResourceValue(name, amount));
  }
}

void Writer(const store::GroupCommitWriter::Stats& s, ExpositionWriter& w) {
  w.Single("taskgrid_store_commits_total", Type::kCounter,
           "Group commits of the task store since the scheduler started.",
           static_cast<double>(s.commits));
  w.Family("taskgrid_store_commit_seconds", Type::kHistogram,
           "Seconds one group commit (one store transaction) took.");
  w.HistogramSamples("taskgrid_store_commit_seconds", {}, s.commit_seconds);
  w.Family("taskgrid_store_commit_rows", Type::kHistogram,
           "Rows (tasks, events, attempts, ...) one group commit wrote.");
  w.HistogramSamples("taskgrid_store_commit_rows", {}, s.commit_rows);
}

}  // namespace

std::string MetricsPage(const engine::EngineMetrics& m, const ProcessInfo& process) {
  ExpositionWriter w;
  Queues(m.scheduler, w);
  Counters(m.scheduler.counters, w);
  Cluster(m.scheduler.cluster, w);
  w.Family("taskgrid_task_records", Type::kGauge,
           "Task records by where they are kept: in memory (unfinished ones, and finished ones "
           "until --finished_in_memory has passed and nothing needs them), or on disk only.");
  w.Sample("taskgrid_task_records", {{"where", "memory"}},
           static_cast<double>(m.scheduler.tasks_in_memory));
  w.Sample("taskgrid_task_records", {{"where", "disk"}},
           static_cast<double>(m.scheduler.tasks_on_disk));
  w.Single("taskgrid_tasks_deleted_total", Type::kCounter,
           "Finished tasks deleted for good since start-up: by retention, DeleteTask, "
           "DeleteTasks and DeleteJob.",
           static_cast<double>(m.scheduler.tasks_deleted));
  Writer(m.writer, w);
  w.Single("taskgrid_watchers", Type::kGauge, "WatchTasks streams open.",
           static_cast<double>(m.watches));
  w.Single("taskgrid_output_follows", Type::kGauge,
           "StreamTaskOutput streams open (taskgridctl logs).",
           static_cast<double>(m.output_follows));
  w.Family("taskgrid_waiters", Type::kGauge, "Long-poll calls waiting, by call.");
  w.Sample("taskgrid_waiters", {{"call", "WaitTask"}}, static_cast<double>(m.task_waits));
  w.Sample("taskgrid_waiters", {{"call", "WaitForWork"}}, static_cast<double>(m.work_waits));
  w.Family("taskgrid_refused_requests_total", Type::kCounter,
           "Requests refused for want of a token, a role or an identity since start-up, by "
           "port and code (the log has at most one line a second of them).");
  for (const char* port : {"grpc", "http"}) {
    // The two every protected port has, zeros too; any other code seen.
    std::map<std::string, int64_t> codes = {{"PERMISSION_DENIED", 0}, {"UNAUTHENTICATED", 0}};
    if (auto p = process.refused.find(port); p != process.refused.end()) {
      for (const auto& [code, n] : p->second) codes[code] = n;
    }
    for (const auto& [code, n] : codes) {
      w.Sample("taskgrid_refused_requests_total", {{"port", port}, {"code", code}},
               static_cast<double>(n));
    }
  }
  w.Family("taskgrid_grpc_requests_total", Type::kCounter,
           "gRPC calls answered since start-up, by service, method and status code (calls "
           "refused before a method, for want of a token or a certificate, are in "
           "taskgrid_refused_requests_total).");
  for (const auto& [path, codes] : process.grpc_requests) {
    // "/package.Service/Method"; anything else (the "(unknown)" of calls
    // to methods that do not exist) as it is, in both labels.
    const size_t slash = path.rfind('/');
    const bool split = path.size() > 1 && path[0] == '/' && slash > 0;
    const std::string service = split ? path.substr(1, slash - 1) : path;
    const std::string method = split ? path.substr(slash + 1) : path;
    for (const auto& [code, n] : codes) {
      w.Sample("taskgrid_grpc_requests_total",
               {{"service", service}, {"method", method}, {"code", code}}, static_cast<double>(n));
    }
  }
  if (process.stats) {
    prometheus::ProcessSamples(w, *process.stats, process.start_time);
  } else {
    prometheus::StartTimeSample(w, process.start_time);
  }
  w.Family("taskgrid_build_info", Type::kGauge, "Always 1; the labels say which build runs.");
  w.Sample("taskgrid_build_info", {{"version", kVersion}, {"build_type", BuildType()}}, 1);
  return w.text();
}

}  // namespace taskgrid::http
