#include "tools/bench/workloads.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_time.h"
#include "tools/bench/child_process.h"
#include "tools/bench/pipeline.h"
#include "tools/bench/workload_util.h"

namespace taskgrid::bench {

Sizes Sizes::Smoke() {
  Sizes s;
  s.w1_tasks = 1000;
  s.w2_tasks = 2000;
  s.w3_samples = 100;
  s.w3_warmup = 10;
  s.w4_tasks = 10;
  s.w5_table = 20000;
  s.w5_drain = 1000;
  s.w5_drain_rounds = 1;
  s.w6_agents = {50};
  s.w6_window = absl::Seconds(3);
  s.w6_per_process = 50;
  s.w7_tasks = 1000;
  s.w8_submits = 2000;
  s.w9_table = 2000;
  s.w10_agents = 200;
  s.w10_tasks = 20000;
  return s;
}

// ---------------------------------------------------------------------------
// W1: submit throughput, no agents (tasks stay PENDING).

absl::Status RunW1Submit(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w1");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const int64_t n = z.w1_tasks;
  const std::string queue = Queue(ctx, "w1");
  const auto base = With(c.BaseSettings(), {I("agents", 0), I("payload_bytes", z.payload_bytes)});

  // (a) One awaited SubmitTasks at a time.
  if (z.w1_one) {
    const absl::Duration t0 = MonoNow();
    for (int64_t i = 0; i < n; ++i) {
      v1::SubmitTasksRequest req;
      *req.add_tasks() = NoopTask(Id(ctx, "w1a", i), queue, z.payload_bytes);
      v1::SubmitTasksResponse resp;
      grpc::ClientContext rpc;
      SetDeadline(&rpc, kRpcDeadline);
      const grpc::Status s = c.tasks()->SubmitTasks(&rpc, req, &resp);
      if (!s.ok()) return RpcError(absl::StrCat("SubmitTasks #", i), s);
    }
    const double secs = Seconds(MonoNow() - t0);
    out->push_back({"W1", "submit_one_at_a_time", n / secs, "tasks/s", n,
                    With(base, {I("batch", 1), I("in_flight", 1)})});
    spdlog::info("W1 one at a time: {} tasks in {:.2f} s", n, secs);
  }
  // (b) `w1_in_flight` single-task calls in flight (callback API).
  if (z.w1_pipelined) {
    const absl::Duration t0 = MonoNow();
    absl::Status s = SubmitPipelined(
        c.tasks(), n, 1, z.w1_in_flight, Budget(absl::Seconds(60), n, absl::Milliseconds(5)),
        [&](int64_t i) { return NoopTask(Id(ctx, "w1b", i), queue, z.payload_bytes); });
    if (!s.ok()) return s;
    const double secs = Seconds(MonoNow() - t0);
    out->push_back({"W1", absl::StrCat("submit_", z.w1_in_flight, "_in_flight"), n / secs,
                    "tasks/s", n, With(base, {I("batch", 1), I("in_flight", z.w1_in_flight)})});
    spdlog::info("W1 {} in flight: {} tasks in {:.2f} s", z.w1_in_flight, n, secs);
  }
  // (c) Batches of `w1_batch`, one awaited call at a time.
  if (z.w1_batched) {
    const absl::Duration t0 = MonoNow();
    absl::Status s = SubmitPipelined(
        c.tasks(), n, z.w1_batch, 1, Budget(absl::Seconds(60), n, absl::Milliseconds(5)),
        [&](int64_t i) { return NoopTask(Id(ctx, "w1c", i), queue, z.payload_bytes); });
    if (!s.ok()) return s;
    const double secs = Seconds(MonoNow() - t0);
    out->push_back({"W1", absl::StrCat("submit_batch_", z.w1_batch), n / secs, "tasks/s", n,
                    With(base, {I("batch", z.w1_batch), I("in_flight", 1)})});
    spdlog::info("W1 batches of {}: {} tasks in {:.2f} s", z.w1_batch, n, secs);
  }
  const int modes = z.w1_one + z.w1_pipelined + z.w1_batched;
  auto counts = c.QueueCounts(queue);
  if (!counts.ok()) return counts.status();
  if ((*counts)["PENDING"] != modes * n) {
    return absl::InternalError(absl::StrCat("W1: expected ", modes * n, " PENDING tasks in ", queue,
                                            ", the scheduler counts ", (*counts)["PENDING"]));
  }
  if (c.external()) {
    // Leave nothing for the next workload's agents to run.
    spdlog::info("W1: cancelling the {} tasks submitted (--addr)", modes * n);
    std::vector<const char*> parts;
    if (z.w1_one) parts.push_back("w1a");
    if (z.w1_pipelined) parts.push_back("w1b");
    if (z.w1_batched) parts.push_back("w1c");
    for (const char* part : parts) {
      absl::Status s = RunPipelined(
          "CancelTask", n, 64, Budget(absl::Seconds(60), n, absl::Milliseconds(5)),
          [&, part](int64_t i, grpc::ClientContext* rpc,
                    std::function<void(const grpc::Status&)> done) {
            auto req = std::make_shared<v1::CancelTaskRequest>();
            req->set_id(Id(ctx, part, i));
            auto resp = std::make_shared<v1::Task>();
            c.tasks()->async()->CancelTask(rpc, req.get(), resp.get(),
                                           [req, resp, done](grpc::Status st) { done(st); });
          });
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// W2: dispatch throughput of pre-submitted tasks.

absl::Status RunW2Drain(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w2");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const std::string queue = Queue(ctx, "w2");
  if (absl::Status s = FillQueue(c, ctx, queue, "w2", z.w2_tasks, 0); !s.ok()) return s;
  auto d = DrainWithAgents(c, queue, z.w2_tasks, z.w2_agents, z.w2_slots, "w2-agent");
  if (!d.ok()) return d.status();
  const auto settings =
      With(c.BaseSettings(), {I("agents", z.w2_agents), I("slots", z.w2_agents * z.w2_slots),
                              I("payload_bytes", z.payload_bytes)});
  out->push_back({"W2", "drain_rate", d->rate, "tasks/s", d->tasks, settings});
  out->push_back({"W2", "drain_seconds", d->seconds, "s", d->tasks, settings});
  if (d->retried > 0) spdlog::warn("W2: {} task(s) needed more than one attempt", d->retried);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// W3: latency of one task at a time, submit -> WaitTask says SUCCEEDED.

absl::Status RunW3Latency(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w3");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const std::string queue = Queue(ctx, "w3");
  const std::string agent_id = "w3-agent";
  if (auto a = c.StartAgent(agent_id, z.w3_slots); !a.ok()) return a.status();
  if (absl::Status s = c.WaitAgentsActive({agent_id}, absl::Seconds(30)); !s.ok()) return s;

  std::vector<double> samples_ms;
  const int64_t total = z.w3_warmup + z.w3_samples;
  for (int64_t i = 0; i < total; ++i) {
    const std::string id = Id(ctx, "w3", i);
    const absl::Duration t0 = MonoNow();
    {
      v1::SubmitTasksRequest req;
      *req.add_tasks() = NoopTask(id, queue, z.payload_bytes);
      v1::SubmitTasksResponse resp;
      grpc::ClientContext rpc;
      SetDeadline(&rpc, kRpcDeadline);
      const grpc::Status s = c.tasks()->SubmitTasks(&rpc, req, &resp);
      if (!s.ok()) return RpcError(absl::StrCat("SubmitTasks ", id), s);
    }
    v1::WaitTaskResponse resp;
    {
      v1::WaitTaskRequest req;
      req.set_id(id);
      *req.mutable_timeout() = ToProto(absl::Seconds(30));
      grpc::ClientContext rpc;
      SetDeadline(&rpc, absl::Seconds(35));
      const grpc::Status s = c.tasks()->WaitTask(&rpc, req, &resp);
      if (!s.ok()) return RpcError(absl::StrCat("WaitTask ", id), s);
    }
    const absl::Duration took = MonoNow() - t0;
    if (!resp.done() || resp.task().state() != v1::TASK_STATE_SUCCEEDED) {
      return absl::InternalError(absl::StrCat("W3: task ", id, " is ",
                                              StateName(resp.task().state()), " after 30 s (",
                                              resp.task().reason(), ")"));
    }
    if (i >= z.w3_warmup) samples_ms.push_back(absl::ToDoubleMilliseconds(took));
  }
  const int64_t n = static_cast<int64_t>(samples_ms.size());
  const auto settings =
      With(c.BaseSettings(), {I("agents", 1), I("slots", z.w3_slots), I("in_flight", 1),
                              I("warmup", z.w3_warmup), I("payload_bytes", z.payload_bytes)});
  out->push_back({"W3", "latency_p50", Percentile(samples_ms, 50), "ms", n, settings});
  out->push_back({"W3", "latency_p99", Percentile(samples_ms, 99), "ms", n, settings});
  out->push_back({"W3", "latency_max", Percentile(samples_ms, 100), "ms", n, settings});
  spdlog::info("W3: p50 {:.3f} ms, p99 {:.3f} ms, max {:.3f} ms over {} samples",
               Percentile(samples_ms, 50), Percentile(samples_ms, 99), Percentile(samples_ms, 100),
               n);
  return c.StopAllAgents();
}

// ---------------------------------------------------------------------------
// W4: recovery from an agent killed with SIGKILL while it runs tasks.

namespace {

// Collects every event of one queue from revision 0 on, on its own thread,
// until Stop().
class EventCollector {
 public:
  EventCollector(v1::TaskService::Stub* stub, const std::string& queue) {
    v1::WatchTasksRequest req;
    req.set_queue(queue);
    req.set_after_revision(0);
    thread_ = std::thread([this, stub, req] {
      auto reader = stub->WatchTasks(&ctx_, req);
      v1::TaskEvent ev;
      while (reader->Read(&ev)) {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(ev);
      }
      const grpc::Status s = reader->Finish();
      std::lock_guard<std::mutex> lock(mu_);
      end_ = s;
    });
  }
  ~EventCollector() { Stop(); }

  void Stop() {
    if (!thread_.joinable()) return;
    ctx_.TryCancel();
    thread_.join();
  }
  std::vector<v1::TaskEvent> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // The stream's end; CANCELLED after Stop() is expected.
  grpc::Status end() {
    std::lock_guard<std::mutex> lock(mu_);
    return end_;
  }

 private:
  grpc::ClientContext ctx_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<v1::TaskEvent> events_;  // guarded by mu_
  grpc::Status end_;                   // guarded by mu_
};

}  // namespace

absl::Status RunW4Recovery(const RunContext& ctx, std::vector<Figure>* out) {
  auto cluster = StartCluster(ctx, "w4");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const Sizes& z = ctx.sizes;
  const int64_t n = z.w4_tasks;
  const std::string queue = Queue(ctx, "w4");
  const std::string victim = absl::StrCat("w4-victim-", ctx.tag);
  const std::string healthy = absl::StrCat("w4-healthy-", ctx.tag);
  const int slots = static_cast<int>(n);

  if (auto a = c.StartAgent(victim, slots, {"--log_level=info"}); !a.ok()) return a.status();
  if (absl::Status s = c.WaitAgentsActive({victim}, absl::Seconds(30)); !s.ok()) return s;
  EventCollector events(c.tasks(), queue);

  // First attempt sleeps; any later attempt succeeds at once. The agent sets
  // TASKGRID_ATTEMPT.
  const std::string script =
      absl::StrCat("test \"$TASKGRID_ATTEMPT\" -gt 1 || sleep ", z.w4_sleep_seconds);
  absl::Status submitted = c.SubmitGenerated(n, static_cast<int>(n), [&](int64_t i) {
    v1::TaskSpec t;
    t.set_id(Id(ctx, "w4", i));
    t.set_queue(queue);
    v1::ExecStep* exec = t.add_steps()->mutable_exec();
    exec->add_argv("/bin/sh");
    exec->add_argv("-c");
    exec->add_argv(script);
    return t;
  });
  if (!submitted.ok()) return submitted;

  // Every task RUNNING on the victim before the healthy agent exists.
  std::string where;
  absl::Status running = WaitFor(
      absl::StrCat("the ", n, " tasks to run on ", victim), absl::Seconds(60),
      absl::Milliseconds(20),
      [&]() -> absl::StatusOr<bool> {
        if (absl::Status a = c.CheckSchedulerAlive(); !a.ok()) return a;
        auto tasks = c.ListAll(queue, {v1::TASK_STATE_RUNNING});
        if (!tasks.ok()) return tasks.status();
        int64_t on_victim = 0;
        for (const auto& t : *tasks) on_victim += t.agent_id() == victim;
        where = absl::StrCat(on_victim, " running on the victim");
        return on_victim == n;
      },
      [&] { return where; });
  if (!running.ok()) return running;
  if (auto a = c.StartAgent(healthy, slots, {"--log_level=info"}); !a.ok()) return a.status();
  if (absl::Status s = c.WaitAgentsActive({healthy, victim}, absl::Seconds(30)); !s.ok()) return s;

  spdlog::info("W4: {} tasks run on {}; killing it with SIGKILL", n, victim);
  const absl::Time kill_time = absl::Now();
  const absl::Duration kill_mono = MonoNow();
  c.agent(victim)->Kill();
  absl::Status done = c.WaitQueueState(queue, "SUCCEEDED", n, absl::Seconds(60));
  const double observed = Seconds(MonoNow() - kill_mono);
  // Room for a late second commit to show up before counting.
  absl::SleepFor(absl::Seconds(1));
  auto tasks = c.ListAll(queue, {});
  events.Stop();
  const int orphans = KillOrphans();
  spdlog::info("W4: ended {} step process(es) the victim left behind", orphans);
  if (!tasks.ok()) return tasks.status();

  int64_t lost = 0, double_commits = 0;
  absl::Time last_success = absl::InfinitePast();
  for (const v1::Task& t : *tasks) {
    if (t.state() != v1::TASK_STATE_SUCCEEDED) {
      ++lost;
      spdlog::warn("W4: task {} ended {} ({})", t.spec().id(), StateName(t.state()), t.reason());
      continue;
    }
    last_success = std::max(last_success, FromProto(t.update_time()));
    int succeeded_attempts = 0;
    for (const auto& a : t.attempts()) {
      succeeded_attempts += a.result().outcome() == v1::OUTCOME_SUCCEEDED;
    }
    if (succeeded_attempts > 1) ++double_commits;
  }
  lost += n - static_cast<int64_t>(tasks->size());
  // The watch's view: more than one SUCCEEDED event for a task is a double
  // commit too; the first event out of RUNNING after the kill dates the
  // detection.
  std::map<std::string, int> succeeded_events;
  absl::Time first_requeue = absl::InfiniteFuture();
  for (const v1::TaskEvent& ev : events.events()) {
    if (ev.to_state() == v1::TASK_STATE_SUCCEEDED) ++succeeded_events[ev.task_id()];
    if (ev.from_state() == v1::TASK_STATE_RUNNING && ev.to_state() != v1::TASK_STATE_SUCCEEDED) {
      first_requeue = std::min(first_requeue, FromProto(ev.time()));
    }
  }
  int64_t watch_doubles = 0;
  for (const auto& [id, k] : succeeded_events) watch_doubles += k > 1;
  double_commits = std::max(double_commits, watch_doubles);
  const grpc::Status watch_end = events.end();
  if (watch_end.error_code() != grpc::StatusCode::CANCELLED) {
    spdlog::warn("W4: the watch ended early: {}: {}", watch_end.error_code(),
                 watch_end.error_message());
  }
  if (!done.ok()) {
    spdlog::error("W4: {}", done.ToString());
  }
  const double recovery =
      last_success > kill_time ? Seconds(last_success - kill_time) : std::nan("");
  const double detection =
      first_requeue < absl::InfiniteFuture() ? Seconds(first_requeue - kill_time) : std::nan("");
  const auto settings = With(c.BaseSettings(), {I("tasks", n), I("victim_slots", slots),
                                                I("healthy_slots", slots), S("retry", "default")});
  out->push_back({"W4", "recovery_seconds", recovery, "s", n, settings});
  out->push_back({"W4", "requeue_after_kill_seconds", detection, "s", n, settings});
  out->push_back({"W4", "tasks_lost", static_cast<double>(lost), "count", n, settings});
  out->push_back(
      {"W4", "double_commits", static_cast<double>(double_commits), "count", n, settings});
  spdlog::info(
      "W4: all {} SUCCEEDED {:.3f} s after the kill (bench saw it after {:.3f} s); re-queued "
      "after {:.3f} s; lost {}, double commits {}",
      n, recovery, observed, detection, lost, double_commits);
  if (!done.ok()) return done;
  return c.StopAllAgents();
}

// ---------------------------------------------------------------------------
// W5: restart with a large table.

namespace {

struct RestartResult {
  double to_serving = 0;
  double recovered_logged = 0;
  double rss_mib = 0;
  Drain drain;
};

// Stops the scheduler, starts it again on the same table, measures, then
// drains `queue` (`n` tasks at priority 1) with 2 agents.
absl::StatusOr<RestartResult> RestartAndDrain(Cluster& c, const RunContext& ctx,
                                              const std::string& queue, int64_t n,
                                              const std::string& agent_prefix) {
  const Sizes& z = ctx.sizes;
  const absl::Duration t0 = MonoNow();
  if (absl::Status s = c.StopScheduler(absl::Seconds(300)); !s.ok()) return s;
  spdlog::info("scheduler stopped (SIGTERM) in {:.2f} s; starting it again",
               Seconds(MonoNow() - t0));
  RestartResult r;
  absl::Duration to_serving;
  if (absl::Status s = c.RestartScheduler(&to_serving); !s.ok()) return s;
  r.to_serving = Seconds(to_serving);
  r.recovered_logged = RecoveredSeconds(c.scheduler()->log_path());
  auto rss = ReadRssKiB(c.scheduler_pid());
  if (!rss.ok()) return rss.status();
  r.rss_mib = MiB(*rss);
  spdlog::info("serving {:.3f} s after start (recovery logged {:.3f} s), RSS {:.1f} MiB",
               r.to_serving, r.recovered_logged, r.rss_mib);
  auto d = DrainWithAgents(c, queue, n, z.w2_agents, z.w2_slots, agent_prefix);
  if (!d.ok()) return d.status();
  r.drain = *d;
  return r;
}

}  // namespace

// After RestartAndDrain's drain, `rounds - 1` more of `n` fresh tasks at
// priority 1 (each in its own queue) on the same scheduler; `r.drain`
// becomes the drain with the median rate.
absl::Status MoreDrains(Cluster& c, const RunContext& ctx, const std::string& name, int64_t n,
                        int rounds, RestartResult* r) {
  const Sizes& z = ctx.sizes;
  std::vector<Drain> drains = {r->drain};
  for (int k = 2; k <= rounds; ++k) {
    const std::string q = Queue(ctx, absl::StrCat(name, "-", k));
    if (absl::Status s = FillQueue(c, ctx, q, absl::StrCat(name, "r", k), n, 1); !s.ok()) return s;
    auto d = DrainWithAgents(c, q, n, z.w2_agents, z.w2_slots, absl::StrCat(name, "-", k));
    if (!d.ok()) return d.status();
    drains.push_back(*d);
  }
  std::sort(drains.begin(), drains.end(),
            [](const Drain& a, const Drain& b) { return a.rate < b.rate; });
  r->drain = drains[drains.size() / 2];
  return absl::OkStatus();
}

absl::Status RunW5Restart(const RunContext& ctx, std::vector<Figure>* out) {
  if (ctx.opts.addr.size() > 0) {
    spdlog::warn("W5 skipped: it restarts the scheduler, which --addr does not allow");
    return absl::OkStatus();
  }
  const Sizes& z = ctx.sizes;
  const int64_t drain = z.w5_drain;
  const int64_t succeeded = static_cast<int64_t>(z.w5_table * z.w5_succeeded_fraction);
  const int64_t cancelled = static_cast<int64_t>(z.w5_table * z.w5_cancelled_fraction);
  const int64_t pending = z.w5_table - drain - succeeded - cancelled;
  if (pending < 0) return absl::InvalidArgumentError("W5: the table is smaller than the drain");

  RestartResult big, small;
  std::vector<Setting> settings;
  {
    auto cluster = StartCluster(ctx, "w5-large");
    if (!cluster.ok()) return cluster.status();
    Cluster& c = **cluster;
    settings = c.BaseSettings();
    // Terminal tasks: some run to SUCCEEDED, some CANCELLED.
    const std::string done_q = Queue(ctx, "w5-done");
    if (absl::Status s = FillQueue(c, ctx, done_q, "w5done", succeeded, 0); !s.ok()) return s;
    if (succeeded > 0) {
      auto d = DrainWithAgents(c, done_q, succeeded, z.w2_agents, z.w2_slots, "w5-pre");
      if (!d.ok()) return d.status();
    }
    const std::string cancel_q = Queue(ctx, "w5-cancel");
    if (absl::Status s = FillQueue(c, ctx, cancel_q, "w5cancel", cancelled, 0); !s.ok()) return s;
    absl::Status s = RunPipelined(
        "CancelTask", cancelled, 64, Budget(absl::Seconds(60), cancelled, absl::Milliseconds(5)),
        [&](int64_t i, grpc::ClientContext* rpc, std::function<void(const grpc::Status&)> done) {
          auto req = std::make_shared<v1::CancelTaskRequest>();
          req->set_id(Id(ctx, "w5cancel", i));
          auto resp = std::make_shared<v1::Task>();
          c.tasks()->async()->CancelTask(rpc, req.get(), resp.get(),
                                         [req, resp, done](grpc::Status st) { done(st); });
        });
    if (!s.ok()) return s;
    // The PENDING bulk, then the tasks drained after the restart, ahead of it
    // by priority.
    if (absl::Status f = FillQueue(c, ctx, Queue(ctx, "w5-pending"), "w5pending", pending, 0);
        !f.ok()) {
      return f;
    }
    const std::string drain_q = Queue(ctx, "w5-drain");
    if (absl::Status f = FillQueue(c, ctx, drain_q, "w5drain", drain, 1); !f.ok()) return f;
    auto rss = ReadRssKiB(c.scheduler_pid());
    spdlog::info("W5: table of {} tasks ({} SUCCEEDED, {} CANCELLED), scheduler RSS {:.1f} MiB",
                 z.w5_table, succeeded, cancelled, rss.ok() ? MiB(*rss) : -1.0);
    auto r = RestartAndDrain(c, ctx, drain_q, drain, "w5-large");
    if (!r.ok()) return r.status();
    big = *r;
    if (absl::Status s = MoreDrains(c, ctx, "w5-large", drain, z.w5_drain_rounds, &big); !s.ok()) {
      return s;
    }
  }
  {
    auto cluster = StartCluster(ctx, "w5-small");
    if (!cluster.ok()) return cluster.status();
    Cluster& c = **cluster;
    const std::string drain_q = Queue(ctx, "w5-small");
    if (absl::Status f = FillQueue(c, ctx, drain_q, "w5small", drain, 1); !f.ok()) return f;
    auto r = RestartAndDrain(c, ctx, drain_q, drain, "w5-small");
    if (!r.ok()) return r.status();
    small = *r;
    if (absl::Status s = MoreDrains(c, ctx, "w5-small", drain, z.w5_drain_rounds, &small);
        !s.ok()) {
      return s;
    }
  }
  const auto large_s = With(
      settings, {I("table_tasks", z.w5_table), I("pending", pending + drain),
                 I("succeeded", succeeded), I("cancelled", cancelled), I("agents", z.w2_agents),
                 I("slots", z.w2_agents * z.w2_slots), I("drain_rounds", z.w5_drain_rounds)});
  const auto small_s =
      With(settings, {I("table_tasks", drain), I("agents", z.w2_agents),
                      I("slots", z.w2_agents * z.w2_slots), I("drain_rounds", z.w5_drain_rounds)});
  out->push_back({"W5", "restart_to_serving", big.to_serving, "s", z.w5_table, large_s});
  out->push_back({"W5", "recovery_logged", big.recovered_logged, "s", z.w5_table, large_s});
  out->push_back({"W5", "scheduler_rss_after_start", big.rss_mib, "MiB", z.w5_table, large_s});
  out->push_back(
      {"W5", "dispatch_rate_large_table", big.drain.rate, "tasks/s", big.drain.tasks, large_s});
  out->push_back({"W5", "restart_to_serving_small_table", small.to_serving, "s", drain, small_s});
  out->push_back({"W5", "scheduler_rss_small_table", small.rss_mib, "MiB", drain, small_s});
  out->push_back(
      {"W5", "dispatch_rate_small_table", small.drain.rate, "tasks/s", small.drain.tasks, small_s});
  out->push_back({"W5", "dispatch_rate_large_vs_small", 100.0 * big.drain.rate / small.drain.rate,
                  "%", big.drain.tasks, large_s});
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// W6: many agent streams heartbeating.

namespace {

// The last SIMSTATS line of simulated-agent logs, summed over processes.
struct SimStatsSum {
  int64_t opened = 0, welcomed = 0, ended = 0, heartbeats = 0, late = 0;
  int64_t max_late_ms = 0;
};

SimStatsSum ParseSimStats(const std::vector<std::string>& logs) {
  static const std::regex re(
      "SIMSTATS opened=([0-9]+) welcomed=([0-9]+) ended=([0-9]+) heartbeats=([0-9]+) "
      "late=([0-9]+) max_late_ms=([0-9]+)");
  SimStatsSum sum;
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line)) {
      if (line.find("SIMSTATS") != std::string::npos) last = line;
    }
    std::smatch m;
    if (!std::regex_search(last, m, re)) continue;
    sum.opened += std::stoll(m[1]);
    sum.welcomed += std::stoll(m[2]);
    sum.ended += std::stoll(m[3]);
    sum.heartbeats += std::stoll(m[4]);
    sum.late += std::stoll(m[5]);
    sum.max_late_ms = std::max<int64_t>(sum.max_late_ms, std::stoll(m[6]));
  }
  return sum;
}

}  // namespace

absl::Status RunW6ManyAgents(const RunContext& ctx, std::vector<Figure>* out) {
  const Sizes& z = ctx.sizes;
  for (const int64_t agents : z.w6_agents) {
    auto cluster = StartCluster(ctx, absl::StrCat("w6-", agents));
    if (!cluster.ok()) return cluster.status();
    Cluster& c = **cluster;
    const pid_t pid = c.scheduler_pid();
    const std::string prefix = absl::StrCat("sim-", ctx.tag, "-");
    const int64_t procs = (agents + z.w6_per_process - 1) / z.w6_per_process;
    const absl::Duration connect_budget = Budget(absl::Seconds(60), agents, absl::Milliseconds(20));
    const absl::Duration max_run = connect_budget + z.w6_window + absl::Seconds(60);
    const absl::Duration t0 = MonoNow();
    std::vector<std::string> logs;
    for (int64_t p = 0; p < procs; ++p) {
      const int64_t share = std::min<int64_t>(z.w6_per_process, agents - p * z.w6_per_process);
      std::vector<std::string> argv = {
          ctx.opts.self_exe, absl::StrCat("--sim_agents=", share),
          absl::StrCat("--addr=", c.addr()), absl::StrCat("--sim_id_prefix=", prefix, p, "-"),
          absl::StrCat("--sim_max_seconds=", absl::ToInt64Seconds(max_run))};
      if (!ctx.opts.tls_dir.empty()) argv.push_back("--tls_dir=" + ctx.opts.tls_dir);
      auto child = c.StartChild(absl::StrCat("sim-", p), argv);
      if (!child.ok()) return child.status();
      logs.push_back((*child)->log_path());
    }
    auto count_active = [&]() -> absl::StatusOr<int64_t> {
      auto resp = c.ListAgents();
      if (!resp.ok()) return resp.status();
      int64_t k = 0;
      for (const auto& a : resp->agents()) {
        k += a.state() == v1::AGENT_STATE_ACTIVE && a.id().rfind(prefix, 0) == 0;
      }
      return k;
    };
    // Until every stream is connected per ListAgents, or every stream was
    // opened and the count has not grown for 10 s (some were refused or
    // dropped: that is the result), or the budget is spent.
    int64_t active = 0, best = 0;
    absl::Duration best_at = MonoNow();
    absl::Status connected = WaitFor(
        absl::StrCat(agents, " simulated agents to connect"), connect_budget,
        // ListAgents of thousands of agents is itself load: ask less often.
        agents > 2000 ? absl::Seconds(1) : absl::Milliseconds(100),
        [&]() -> absl::StatusOr<bool> {
          if (absl::Status a = c.CheckSchedulerAlive(); !a.ok()) return a;
          auto k = count_active();
          if (!k.ok()) return k.status();
          active = *k;
          if (active > best) {
            best = active;
            best_at = MonoNow();
          }
          if (active >= agents) return true;
          return ParseSimStats(logs).opened >= agents && MonoNow() - best_at > absl::Seconds(10);
        },
        [&] { return absl::StrCat(active, " connected"); });
    if (!connected.ok() && connected.code() != absl::StatusCode::kDeadlineExceeded) {
      return connected;
    }
    const double connect_s = Seconds(MonoNow() - t0);
    const SimStatsSum at_connect = ParseSimStats(logs);
    if (active < agents) {
      spdlog::warn(
          "W6: only {} of {} agents connected ({} streams opened, {} ended); measuring "
          "what is there",
          active, agents, at_connect.opened, at_connect.ended);
    }
    if (active == 0) return absl::UnavailableError("W6: no simulated agent could connect");
    spdlog::info("W6: {} of {} agents connected after {:.2f} s; measuring for {}", active, agents,
                 connect_s, absl::FormatDuration(z.w6_window));

    std::vector<Setting> settings =
        With(c.BaseSettings(), {I("agents", agents), I("processes", procs),
                                D("window", z.w6_window), S("connections", "one_per_agent")});
    double cpu_pct = std::nan(""), rss = std::nan(""), peak = std::nan("");
    const absl::Duration w0 = MonoNow();
    absl::StatusOr<double> cpu0 = pid > 0 ? ReadCpuSeconds(pid) : absl::NotFoundError("no pid");
    const SimStatsSum before = ParseSimStats(logs);
    absl::SleepFor(z.w6_window);
    absl::StatusOr<double> cpu1 = pid > 0 ? ReadCpuSeconds(pid) : absl::NotFoundError("no pid");
    const double window = Seconds(MonoNow() - w0);
    if (cpu0.ok() && cpu1.ok()) cpu_pct = 100.0 * (*cpu1 - *cpu0) / window;
    if (pid > 0) {
      auto r = ReadRssKiB(pid);
      auto h = ReadPeakRssKiB(pid);
      if (r.ok()) rss = MiB(*r);
      if (h.ok()) peak = MiB(*h);
    }
    if (absl::Status a = c.CheckSchedulerAlive(); !a.ok()) return a;
    auto held = count_active();
    if (!held.ok()) return held.status();
    // What the scheduler tells agents now (longer than --heartbeat_interval
    // when the fleet would exceed --max_heartbeats_per_second).
    auto stats = c.GetClusterStats();
    if (!stats.ok()) return stats.status();
    const double interval_s = absl::ToDoubleSeconds(FromProto(stats->heartbeat_interval()));
    absl::SleepFor(absl::Seconds(1.5));  // the sims' next SIMSTATS line
    const SimStatsSum after = ParseSimStats(logs);
    out->push_back(
        {"W6", "agents_connected", static_cast<double>(active), "count", agents, settings});
    out->push_back({"W6", "connect_seconds", connect_s, "s", agents, settings});
    out->push_back({"W6", "agents_held", static_cast<double>(*held), "count", agents, settings});
    out->push_back({"W6", "agent_heartbeat_interval", interval_s, "s", agents, settings});
    out->push_back({"W6", "heartbeats_per_second",
                    static_cast<double>(after.heartbeats - before.heartbeats) / window, "1/s",
                    std::max<int64_t>(1, after.heartbeats - before.heartbeats), settings});
    if (pid > 0) {
      out->push_back({"W6", "scheduler_rss", rss, "MiB", agents, settings});
      out->push_back({"W6", "scheduler_peak_rss", peak, "MiB", agents, settings});
      out->push_back({"W6", "scheduler_cpu", cpu_pct, "%", agents, settings});
    }
    // The load generator's own health: heartbeats it wrote late in the
    // window mean the simulated agents, not the scheduler, fell behind.
    out->push_back({"W6", "sim_late_heartbeats", static_cast<double>(after.late - before.late),
                    "count", std::max<int64_t>(1, after.heartbeats - before.heartbeats), settings});
    out->push_back({"W6", "sim_max_heartbeat_delay", static_cast<double>(after.max_late_ms), "ms",
                    std::max<int64_t>(1, after.heartbeats), settings});
    spdlog::info(
        "W6: {} of {} agents held; scheduler RSS {:.1f} MiB (peak {:.1f}), CPU {:.1f} % of one "
        "core; agents told to heartbeat every {:.1f} s; the sims wrote {} heartbeats in the "
        "window, {} late (max delay {} ms)",
        *held, agents, rss, peak, cpu_pct, interval_s, after.heartbeats - before.heartbeats,
        after.late - before.late, after.max_late_ms);
    c.KillChildren();
    if (*held < agents) {
      spdlog::warn("W6: only {} of {} agents held; not trying more", *held, agents);
      break;
    }
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
