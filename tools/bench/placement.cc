// W10: placement at fleet scale. The scheduler's core (what a scheduler
// runs under its lock for every placement: fit, best fit, quotas, fair
// share between weighted queues, the state machine) in this process, with
// w10_agents simulated agents of four shapes and w10_tasks PENDING tasks
// asking for mixed resources across w10_queues weighted queues. No store
// and no network: W2 measures a drain with those.
//
// The tasks are submitted before any agent connects. Then the agents
// connect (and are filled), and the oldest running attempts finish a few
// hundred at a time, each agent's results in one batch (as a real agent
// sends them), until every task ran. Measured: placements per second over
// the whole run after the fill, and how far the queues' dominant shares
// stay from their weights' proportions while every queue still waits
// with every kind of request.
//
// The same run with tasks and agents that name no resources (slots only)
// is the reference for what resources cost.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/resources.h"
#include "scheduler/core/scheduler.h"
#include "tools/bench/child_process.h"
#include "tools/bench/workload_util.h"

namespace taskgrid::bench {

namespace {

struct Shape {
  const char* resources;
  int per_10;  // of every 10
};

// Agents: many small, fewer large, a tenth with GPUs.
constexpr Shape kAgentShapes[] = {{"cpu=4,memory=16GiB", 4},
                                  {"cpu=16,memory=64GiB", 3},
                                  {"cpu=64,memory=256GiB", 2},
                                  {"cpu=32,memory=128GiB,gpu=4", 1}};
// Tasks: mostly small, some that take a large part of a small agent, a
// tenth wanting a GPU.
constexpr Shape kTaskShapes[] = {{"cpu=1,memory=2GiB", 4},
                                 {"cpu=2,memory=8GiB", 3},
                                 {"cpu=8,memory=32GiB", 2},
                                 {"cpu=4,memory=16GiB,gpu=1", 1}};
constexpr int kSlotsPerAgent = 64;
// Finishes handled per round (grouped into one batch per agent).
constexpr int kFinishesPerRound = 256;

// Which of the four shapes the i-th agent or task has.
int ShapeIndex(const Shape (&shapes)[4], int64_t i) {
  int k = static_cast<int>(i % 10);
  for (int j = 0; j < 4; ++j) {
    if (k < shapes[j].per_10) return j;
    k -= shapes[j].per_10;
  }
  return 0;
}

const char* ShapeOf(const Shape (&shapes)[4], int64_t i) {
  return shapes[ShapeIndex(shapes, i)].resources;
}

// Tasks not yet placed, by queue and request shape.
using Waiting = std::vector<std::array<int64_t, 4>>;

void SetResources(const std::string& spec, google::protobuf::Map<std::string, std::string>* out) {
  ToResourceMap(ParseResourceList(spec).value(), out);
}

struct Running {
  uint64_t conn;
  std::string id;
  int32_t attempt;
};

struct Outcome {
  int64_t placements = 0;  // after the fill
  int64_t filled = 0;      // placed while the agents connected
  double connect_seconds = 0;
  double run_seconds = 0;
  double submit_seconds = 0;
  // Mean and largest (over samples) of the largest relative distance of a
  // queue's share from its fair share; samples taken.
  double share_error_mean = 0;
  double share_error_max = 0;
  int64_t samples = 0;
};

// Appends the attempts the effects assign, and counts them off `waiting`
// (the ids are "w10-q<queue>-<index>").
void TakeAssigned(core::Scheduler& s, std::deque<Running>* running, int64_t* placed,
                  Waiting* waiting) {
  core::Effects fx = s.TakeEffects();
  for (const core::Outgoing& o : fx.messages) {
    if (!o.msg.has_assign()) continue;
    for (const v1::Assignment& a : o.msg.assign().tasks()) {
      running->push_back({o.conn, a.task_id(), a.attempt()});
      ++*placed;
      const std::vector<absl::string_view> parts = absl::StrSplit(a.task_id(), '-');
      int q = 0;
      int64_t i = 0;
      if (parts.size() == 3 && absl::SimpleAtoi(parts[1].substr(1), &q) &&
          absl::SimpleAtoi(parts[2], &i) && q >= 0 && q < static_cast<int>(waiting->size())) {
        --(*waiting)[q][ShapeIndex(kTaskShapes, i)];
      }
    }
  }
}

// Whether every queue still has tasks of every shape waiting: only then
// is each queue's share owed to it in full (a queue whose small tasks all
// ran waits only for GPUs, and cannot take the cores that free up).
bool AllWait(const Waiting& waiting) {
  for (const auto& shapes : waiting) {
    for (int64_t n : shapes) {
      if (n <= 0) return false;
    }
  }
  return true;
}

// How far the queues are from sharing by weight: the largest, over the
// queues, of |part - fair| / fair, where a queue's part is its dominant
// share over the sum of all queues' dominant shares (with several
// resources they sum past 1: a queue bound by GPUs and one bound by cores
// each hold a large share of a different resource) and fair is its weight
// over the sum of weights.
double ShareError(const core::Scheduler& s, int queues) {
  std::vector<std::pair<double, double>> shares;  // dominant share, fair share
  double sum = 0;
  for (const v1::QueueStats& q : s.Stats("")) {
    if (!q.settings().has_weight() || q.fair_share() <= 0) continue;
    shares.emplace_back(q.share(), q.fair_share());
    sum += q.share();
  }
  if (static_cast<int>(shares.size()) != queues || sum <= 0) return -1;
  double worst = 0;
  for (const auto& [share, fair] : shares) {
    worst = std::max(worst, std::abs(share / sum - fair) / fair);
  }
  return worst;
}

absl::StatusOr<Outcome> RunOnce(const RunContext& ctx, bool resources) {
  const Sizes& z = ctx.sizes;
  FakeClock clock;
  core::SchedulerOptions o;
  o.random = [] { return 0.0; };
  core::Scheduler s(&clock, o);
  Outcome out;

  int64_t weights = 0;
  for (int q = 0; q < z.w10_queues; ++q) {
    v1::SetQueueWeightRequest req;
    req.set_queue(absl::StrCat("w10-q", q));
    req.set_weight(q + 1);
    weights += q + 1;
    if (absl::Status st = s.SetQueueWeight(req).status(); !st.ok()) return st;
  }
  // Each queue's tasks in proportion to its weight, so that all run out
  // at about the same time; submitted round-robin in batches.
  absl::Duration t0 = MonoNow();
  std::vector<int64_t> left(z.w10_queues), next(z.w10_queues, 0);
  Waiting waiting(z.w10_queues, {0, 0, 0, 0});
  int64_t total = 0;
  for (int q = 0; q < z.w10_queues; ++q) {
    left[q] = z.w10_tasks * (q + 1) / weights;
    total += left[q];
  }
  for (bool more = true; more;) {
    more = false;
    for (int q = 0; q < z.w10_queues; ++q) {
      std::vector<v1::TaskSpec> batch;
      for (; left[q] > 0 && batch.size() < 1000; --left[q], ++next[q]) {
        ++waiting[q][ShapeIndex(kTaskShapes, next[q])];
        v1::TaskSpec t = NoopTask(absl::StrCat("w10-q", q, "-", next[q]), absl::StrCat("w10-q", q),
                                  z.payload_bytes);
        if (resources) {
          SetResources(ShapeOf(kTaskShapes, next[q]), t.mutable_placement()->mutable_resources());
        }
        batch.push_back(std::move(t));
      }
      if (batch.empty()) continue;
      more = true;
      if (absl::Status st = s.Submit(std::move(batch)).status(); !st.ok()) return st;
      s.TakeEffects();
    }
  }
  out.submit_seconds = Seconds(MonoNow() - t0);

  std::deque<Running> running;
  t0 = MonoNow();
  for (int64_t i = 0; i < z.w10_agents; ++i) {
    v1::Hello h;
    h.set_agent_id(absl::StrCat("w10-agent-", i));
    h.set_version("bench");
    if (resources) {
      h.set_slots(kSlotsPerAgent);
      SetResources(ShapeOf(kAgentShapes, i), h.mutable_resources());
    } else {
      // The same number of places as the resource run's cpus, as slots.
      const Resources r = ParseResourceList(ShapeOf(kAgentShapes, i)).value();
      h.set_slots(static_cast<int32_t>(AmountOf(r, "cpu") / 1000));
    }
    if (absl::Status st = s.Connect(static_cast<uint64_t>(i + 1), h); !st.ok()) return st;
    TakeAssigned(s, &running, &out.filled, &waiting);
  }
  out.connect_seconds = Seconds(MonoNow() - t0);

  // Fair share is sampled every 200th of the tasks, after a warm-up of a
  // tenth of them past the fill, while every queue has tasks of every
  // shape waiting.
  const int64_t sample_every = std::max<int64_t>(1, total / 200);
  const int64_t warmup = total / 10;
  int64_t next_sample = warmup;
  double error_sum = 0;
  absl::Duration in_stats;
  t0 = MonoNow();
  while (!running.empty()) {
    absl::flat_hash_map<uint64_t, v1::AgentMessage> batches;
    for (int k = 0; k < kFinishesPerRound && !running.empty(); ++k) {
      Running& r = running.front();
      v1::AgentMessage* m = batches[r.conn].mutable_batch()->add_msgs();
      m->mutable_result()->set_task_id(std::move(r.id));
      m->mutable_result()->set_attempt(r.attempt);
      m->mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
      running.pop_front();
    }
    for (auto& [conn, msg] : batches) {
      s.OnAgentMessage(conn, msg);
      TakeAssigned(s, &running, &out.placements, &waiting);
    }
    if (out.placements >= next_sample && AllWait(waiting)) {
      next_sample += sample_every;
      const absl::Duration st0 = MonoNow();
      if (const double e = ShareError(s, z.w10_queues); e >= 0) {
        error_sum += e;
        out.share_error_max = std::max(out.share_error_max, e);
        ++out.samples;
      }
      in_stats += MonoNow() - st0;
    }
  }
  // What sampling cost is not placement's.
  out.run_seconds = Seconds(MonoNow() - t0 - in_stats);
  out.share_error_mean = out.samples > 0 ? error_sum / static_cast<double>(out.samples) : NAN;
  const int64_t placed = out.filled + out.placements;
  if (placed != total) {
    return absl::InternalError(
        absl::StrCat("W10: ", placed, " placements for ", total, " tasks (each runs once)"));
  }
  if (absl::Status st = s.CheckInvariants(); !st.ok()) return st;
  return out;
}

}  // namespace

absl::Status RunW10Placement(const RunContext& ctx, std::vector<Figure>* out) {
  const Sizes& z = ctx.sizes;
  for (const bool resources : {true, false}) {
    absl::StatusOr<Outcome> r = RunOnce(ctx, resources);
    if (!r.ok()) return r.status();
    const std::string kind = resources ? "resources" : "slots_only";
    const std::vector<Setting> settings = {
        S("store", "none (in process)"), I("agents", z.w10_agents), I("tasks", z.w10_tasks),
        I("queues", z.w10_queues),
        S("requests", resources ? "mixed cpu/memory/gpu" : "slots only")};
    const double rate = static_cast<double>(r->placements) / r->run_seconds;
    out->push_back(
        {"W10", absl::StrCat("placement_rate_", kind), rate, "tasks/s", r->placements, settings});
    out->push_back({"W10", absl::StrCat("connect_and_fill_", kind), r->connect_seconds, "s",
                    r->filled, settings});
    out->push_back({"W10", absl::StrCat("fair_share_error_mean_", kind), 100 * r->share_error_mean,
                    "%", r->samples, settings});
    out->push_back({"W10", absl::StrCat("fair_share_error_max_", kind), 100 * r->share_error_max,
                    "%", r->samples, settings});
    spdlog::info(
        "W10 ({}): {} tasks submitted in {:.2f} s; {} agents connected in {:.2f} s placing {}; "
        "{} more placed in {:.2f} s ({:.0f}/s); fair share off by {:.2f} % on average, {:.2f} % "
        "at most ({} samples)",
        kind, z.w10_tasks, r->submit_seconds, z.w10_agents, r->connect_seconds, r->filled,
        r->placements, r->run_seconds, rate, 100 * r->share_error_mean, 100 * r->share_error_max,
        r->samples);
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
