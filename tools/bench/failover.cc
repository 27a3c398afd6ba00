// W9: a takeover on PostgreSQL with a large table. A leader holds
// w9_table PENDING tasks; a standby waits on the same schema; a client
// (taskgridctl with both addresses, as a user runs it) submits one task at
// a time, each with an id, without a pause. The leader is killed (SIGKILL):
// how long until the standby serves (its lease wait and its restore of the
// whole table included), what its log says the restore took, and the
// longest any one client call waited for its answer across the takeover.
// Every call must succeed: a failed one fails the workload.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/child_process.h"
#include "tools/bench/workload_util.h"

namespace taskgrid::bench {

namespace {

struct ClientCalls {
  std::atomic<int64_t> made{0};
  int64_t failed = 0;  // read once the client ended
  double longest = 0;  // s
  std::string first_failure;
};

// Runs `argv` to its end (bounded): OK when it exited 0, else why not with
// the end of its output.
absl::Status RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  auto child = ChildProcess::Spawn("taskgridctl", argv, log);
  if (!child.ok()) return child.status();
  // taskgridctl gives up after its --timeout (60 s) of failing calls.
  absl::Status s = WaitFor("taskgridctl to end", absl::Seconds(150), absl::Milliseconds(1),
                           [&]() -> absl::StatusOr<bool> { return !(*child)->Alive(); });
  if (!s.ok()) return s;
  if ((*child)->wait_status() == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("taskgridctl ", (*child)->ExitDescription(), ": ", (*child)->LogTail(2000)));
}

}  // namespace

absl::Status RunW9Failover(const RunContext& ctx, std::vector<Figure>* out) {
  if (!ctx.opts.addr.empty() || !absl::StartsWith(ctx.opts.store, "postgres")) {
    spdlog::warn("W9 skipped: it needs --store=postgres://... and schedulers of its own");
    return absl::OkStatus();
  }
  const Sizes& z = ctx.sizes;
  auto cluster = StartCluster(ctx, "w9");
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  if (absl::Status s = FillQueue(c, ctx, Queue(ctx, "w9-table"), "w9table", z.w9_table, 0);
      !s.ok()) {
    return s;
  }
  const std::string leader = c.addr();
  auto standby = c.StartStandby();
  if (!standby.ok()) return standby.status();
  spdlog::info("W9: {} tasks in the table; leader at {}, standby at {}", z.w9_table, leader,
               *standby);

  // The client: one submit after another until told to stop.
  std::atomic<bool> stop{false};
  ClientCalls calls;
  const std::string queue = Queue(ctx, "w9-client");
  const std::string client_log = absl::StrCat(c.dir(), "/ctl.log");
  std::thread client([&] {
    const std::string& log = client_log;
    for (int64_t i = 0; !stop.load(); ++i) {
      std::vector<std::string> argv = {ctx.opts.ctl_bin,
                                       absl::StrCat("--addr=", leader, ",", *standby),
                                       "--timeout=60s",
                                       "submit",
                                       absl::StrCat("--queue=", queue),
                                       absl::StrCat("--id=", Id(ctx, "w9client", i)),
                                       "--",
                                       "true"};
      // taskgridctl takes the agent's TLS flags.
      const std::vector<std::string> tls = ctx.opts.AgentTlsFlags();
      argv.insert(argv.begin() + 1, tls.begin(), tls.end());
      const absl::Duration t0 = MonoNow();
      const absl::Status status = RunToEnd(argv, log);
      calls.longest = std::max(calls.longest, Seconds(MonoNow() - t0));
      if (!status.ok()) {
        ++calls.failed;
        if (calls.first_failure.empty()) calls.first_failure = std::string(status.message());
      }
      ++calls.made;
    }
  });
  auto join_client = [&] {
    stop = true;
    client.join();
  };
  // A few calls on the leader first.
  absl::Status s = WaitFor("the client's first calls", absl::Seconds(60), absl::Milliseconds(5),
                           [&]() -> absl::StatusOr<bool> { return calls.made >= 3; });
  if (!s.ok()) {
    join_client();
    return s;
  }
  const absl::Duration killed = MonoNow();
  c.KillSchedulerForStandby();
  s = WaitFor("the standby to serve", absl::Seconds(600), absl::Milliseconds(5),
              [&]() -> absl::StatusOr<bool> {
                if (absl::Status a = c.CheckSchedulerAlive(); !a.ok()) return a;
                return c.CheckServing(absl::Seconds(2)).ok();
              });
  const double to_serving = Seconds(MonoNow() - killed);
  if (!s.ok()) {
    join_client();
    return s;
  }
  // A few calls on the new leader, then stop.
  const int64_t at_serving = calls.made;
  s = WaitFor("the client's calls on the new leader", absl::Seconds(300), absl::Milliseconds(5),
              [&]() -> absl::StatusOr<bool> { return calls.made >= at_serving + 3; });
  join_client();
  if (!s.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        s.message(), "; the client's output (", client_log, "):\n", FileTail(client_log, 3000)));
  }
  if (calls.failed > 0) {
    return absl::InternalError(
        absl::StrCat("W9: ", calls.failed, " of ", calls.made.load(),
                     " client calls failed; the first: ", calls.first_failure));
  }
  const double recovered = RecoveredSeconds(c.scheduler()->log_path());
  const auto settings = With(c.BaseSettings(), {I("table_tasks", z.w9_table)});
  out->push_back({"W9", "takeover_to_serving", to_serving, "s", z.w9_table, settings});
  out->push_back({"W9", "takeover_recovery_logged", recovered, "s", z.w9_table, settings});
  out->push_back({"W9", "longest_client_wait", calls.longest, "s", calls.made.load(), settings});
  spdlog::info(
      "W9: the standby served {:.2f} s after the leader was killed (restore logged {:.2f} s); "
      "{} client calls, none failed, the longest waited {:.2f} s",
      to_serving, recovered, calls.made.load(), calls.longest);
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
