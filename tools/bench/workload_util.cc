#include "tools/bench/workload_util.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/proto_time.h"
#include "tools/bench/child_process.h"
#include "tools/bench/pipeline.h"

namespace taskgrid::bench {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

std::string Id(const RunContext& ctx, const std::string& what, int64_t i) {
  return absl::StrFormat("%s-%s-%07d", what, ctx.tag, i);
}

std::string Queue(const RunContext& ctx, const std::string& what) {
  return absl::StrCat(what, "-", ctx.tag);
}

absl::Duration Budget(absl::Duration base, int64_t items, absl::Duration per_item) {
  return base + per_item * static_cast<double>(items);
}

std::vector<Setting> With(std::vector<Setting> base, std::vector<Setting> more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

absl::Status FillQueue(Cluster& c, const RunContext& ctx, const std::string& queue,
                       const std::string& id_prefix, int64_t count, int priority) {
  const absl::Duration t0 = MonoNow();
  absl::Status s = SubmitPipelined(
      c.tasks(), count, kFillBatch, kFillInFlight,
      Budget(absl::Seconds(60), count, absl::Milliseconds(1)), [&](int64_t i) {
        return NoopTask(Id(ctx, id_prefix, i), queue, ctx.sizes.payload_bytes, priority);
      });
  if (!s.ok()) {
    absl::Status alive = c.CheckSchedulerAlive();
    return alive.ok() ? s : alive;
  }
  spdlog::info("submitted {} tasks to {} in {:.2f} s", count, queue, Seconds(MonoNow() - t0));
  return absl::OkStatus();
}

absl::StatusOr<Drain> DrainWithAgents(Cluster& c, const std::string& queue, int64_t n, int agents,
                                      int slots, const std::string& agent_prefix) {
  const absl::Duration t0 = MonoNow();
  std::vector<std::string> ids;
  for (int a = 0; a < agents; ++a) {
    ids.push_back(absl::StrCat(agent_prefix, "-", a + 1));
    auto agent = c.StartAgent(ids.back(), slots);
    if (!agent.ok()) return agent.status();
  }
  absl::Status s = c.WaitQueueState(queue, "SUCCEEDED", n,
                                    Budget(absl::Seconds(120), n, absl::Milliseconds(10)));
  const absl::Duration wall = MonoNow() - t0;
  for (const std::string& id : ids) {
    ChildProcess* a = c.agent(id);
    if (a != nullptr && !a->Alive()) {
      spdlog::error("agent {} {} during the drain; its log ends:\n{}", id, a->ExitDescription(),
                    a->LogTail(2000));
    }
  }
  absl::Status stopped = c.StopAllAgents();
  if (!s.ok()) return s;
  if (!stopped.ok()) spdlog::warn("{}", stopped.ToString());

  auto tasks = c.ListAll(queue, {v1::TASK_STATE_SUCCEEDED});
  if (!tasks.ok()) return tasks.status();
  absl::Time first = absl::InfiniteFuture();
  absl::Time last = absl::InfinitePast();
  Drain d;
  for (const v1::Task& t : *tasks) {
    if (t.attempts_size() == 0) continue;
    if (t.attempts_size() > 1) ++d.retried;
    first = std::min(first, FromProto(t.attempts(0).dispatch_time()));
    last = std::max(last, FromProto(t.update_time()));
    ++d.tasks;
  }
  if (d.tasks < n || last <= first) {
    return absl::InternalError(absl::StrCat("expected ", n, " SUCCEEDED tasks in ", queue,
                                            " with timestamps, found ", d.tasks));
  }
  d.seconds = Seconds(last - first);
  d.rate = static_cast<double>(d.tasks) / d.seconds;
  d.wall_seconds = Seconds(wall);
  spdlog::info("drained {} tasks of {} in {:.3f} s ({:.0f} tasks/s; {:.2f} s wall)", d.tasks, queue,
               d.seconds, d.rate, d.wall_seconds);
  return d;
}

absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const RunContext& ctx,
                                                      const std::string& name,
                                                      const std::vector<std::string>& flags) {
  auto c = Cluster::Create(ctx.opts, name);
  if (!c.ok()) return c.status();
  if (absl::Status s = (*c)->StartScheduler(flags); !s.ok()) return s;
  if ((*c)->external()) {
    spdlog::info("{}: scheduler at {}", name, (*c)->addr());
  } else {
    spdlog::info("{}: scheduler pid {} at {} (logs in {})", name, (*c)->scheduler_pid(),
                 (*c)->addr(), (*c)->dir());
  }
  return c;
}

double MiB(int64_t kib) { return static_cast<double>(kib) / 1024.0; }

double RecoveredSeconds(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line;
  static const std::regex re("recovered ([0-9]+) tasks in ([0-9.a-zµ]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) {
      absl::Duration d;
      if (absl::ParseDuration(m[2].str(), &d)) return Seconds(d);
    }
  }
  return std::nan("");
}

}  // namespace taskgrid::bench
