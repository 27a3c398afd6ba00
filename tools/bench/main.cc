// taskgrid-bench: the load generator. Runs the workloads W1-W10
// against a scheduler it starts (or --addr) with real taskgrid-agent
// processes, and prints one figure per line: a table, and with --json one
// JSON object per figure on stdout (the table then goes to stderr).
//
// Also the simulated-agent child of W6: `taskgrid-bench --sim_agents=N
// --addr=HOST:PORT` (see sim_agents.h).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags_help.h"
#include "common/logging.h"
#include "common/tls.h"
#include "tools/bench/child_process.h"
#include "tools/bench/cluster.h"
#include "tools/bench/report.h"
#include "tools/bench/sim_agents.h"
#include "tools/bench/workloads.h"

ABSL_FLAG(std::string, workloads, "all",
          "Comma-separated workloads to run: w1 (submit), w2 (drain), w3 (latency), w4 "
          "(recovery), w5 (restart), w6 (many agents), w7 (claims), w8 (merge keys), w9 (failover, "
          "PostgreSQL only), w10 (placement at fleet scale, in process), or all");
ABSL_FLAG(bool, smoke, false, "Run every workload tiny (a few seconds each), for tests");
ABSL_FLAG(bool, json, false,
          "Print one JSON object per figure on stdout (the table goes to stderr)");
ABSL_FLAG(std::string, addr, "",
          "HOST:PORT of a running scheduler to measure instead of starting one per workload "
          "(W5 is skipped; it should be idle, with no agents of its own)");
ABSL_FLAG(int32_t, scheduler_pid, 0, "With --addr: the scheduler's pid, for RSS and CPU figures");
ABSL_FLAG(std::string, durability, "full", "full or normal: passed to the scheduler it starts");
ABSL_FLAG(std::string, store, "sqlite",
          "sqlite, or a postgres:// URL: the --store of the schedulers it starts; with a URL "
          "each workload's scheduler works in a fresh schema of that database "
          "(bench_<its directory>)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "Passed to the scheduler it starts (its default)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5),
          "Passed to the scheduler it starts (its default)");
ABSL_FLAG(absl::Duration, reconnect_grace, absl::Seconds(5),
          "Passed to the scheduler it starts (its default)");
ABSL_FLAG(double, max_heartbeats_per_second, 1000,
          "Passed to the scheduler it starts (its default; 0: every agent heartbeats at "
          "--heartbeat_interval however many there are)");
ABSL_FLAG(std::string, bin_dir, "",
          "Where taskgrid-scheduler and taskgrid-agent are (default: this binary's directory)");
ABSL_FLAG(std::string, tmp_dir, "",
          "Parent of the temporary directories (data, logs); default $TMPDIR or /tmp");
ABSL_FLAG(bool, keep, false, "Keep the temporary directories (task tables and logs)");
ABSL_FLAG(std::string, agent_log_level, "warn",
          "--log_level of the agents it starts (info logs two lines per task)");
ABSL_FLAG(std::string, log_level, "info", "This program's log level (stderr)");
ABSL_FLAG(std::string, tls_dir, "",
          "Run over TLS with the files deploy/make-certs.sh made in this directory: the "
          "scheduler started here serves head.pem/head.key; this program, its agents and "
          "simulated agents trust ca.pem and present client.pem/client.key");

// Sizes; 0 keeps the workload's default (full, or --smoke's).
ABSL_FLAG(int64_t, w1_tasks, 0, "W1: tasks per submit mode (default 20000)");
ABSL_FLAG(std::string, w1_modes, "one,inflight,batch",
          "W1: which modes run: one (one call at a time), inflight (64 at once), batch (100 "
          "tasks per call)");
ABSL_FLAG(int64_t, w2_tasks, 0, "W2: tasks drained (default 20000)");
ABSL_FLAG(int32_t, w2_slots, 0, "W2 and W5: slots per agent (default 50, two agents)");
ABSL_FLAG(int64_t, w3_samples, 0, "W3: latency samples after the warm-up (default 1000)");
ABSL_FLAG(int64_t, w4_tasks, 0, "W4: tasks on the killed agent (default 50)");
ABSL_FLAG(int64_t, w5_table, 0, "W5: tasks in the large table (default 1000000)");
ABSL_FLAG(int64_t, w9_table, 0, "W9: tasks in the table a standby takes over (default 1000000)");
ABSL_FLAG(int64_t, w10_agents, 0, "W10: simulated agents of four shapes (default 10000)");
ABSL_FLAG(int64_t, w10_tasks, 0, "W10: PENDING tasks across 10 weighted queues (default 1000000)");
ABSL_FLAG(int64_t, w5_drain, 0, "W5: tasks drained after the restart (default 10000)");
ABSL_FLAG(double, w5_succeeded, -1,
          "W5: the share of the large table run to SUCCEEDED before the restart, 0-1 (default "
          "0.02); 0.9 of 1,100,000 makes the 1,000,000 finished + 100,000 unfinished table");
ABSL_FLAG(std::string, w6_agents, "",
          "W6: agent counts to try in turn, e.g. 2000,10000 (the default); stops at the first "
          "that does not hold");
ABSL_FLAG(absl::Duration, w6_window, absl::ZeroDuration(),
          "W6: how long the agents heartbeat while measured (default 60s)");

// The simulated-agent child (W6).
ABSL_FLAG(int64_t, sim_agents, 0,
          "Run as W6's simulated agents: open this many agent streams to --addr and heartbeat");
ABSL_FLAG(std::string, sim_id_prefix, "sim-", "Simulated agents: id prefix");
ABSL_FLAG(int32_t, sim_slots, 1, "Simulated agents: slots said in Hello");
ABSL_FLAG(int64_t, sim_max_seconds, 1800, "Simulated agents: exit after this long");

namespace tb = taskgrid::bench;

namespace {

const std::vector<std::string> kAll = {"w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10"};

absl::Status ParseWorkloads(const std::string& spec, std::vector<std::string>* out) {
  static const std::vector<std::pair<std::string, std::string>> kAliases = {
      {"submit", "w1"},   {"drain", "w2"},     {"latency", "w3"}, {"recovery", "w4"},
      {"restart", "w5"},  {"agents", "w6"},    {"claims", "w7"},  {"merge", "w8"},
      {"failover", "w9"}, {"placement", "w10"}};
  std::set<std::string> chosen;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::string w = absl::AsciiStrToLower(absl::StripAsciiWhitespace(part));
    for (const auto& [alias, name] : kAliases) {
      if (w == alias) w = name;
    }
    if (w == "all") {
      chosen.insert(kAll.begin(), kAll.end());
    } else if (std::find(kAll.begin(), kAll.end(), w) != kAll.end()) {
      chosen.insert(w);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--workloads: unknown workload '", w, "' (w1..w10, their names, or all)"));
    }
  }
  if (chosen.empty()) return absl::InvalidArgumentError("--workloads is empty");
  for (const std::string& w : kAll) {
    if (chosen.count(w)) out->push_back(w);
  }
  return absl::OkStatus();
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown";
}

int RunSim() {
  tb::SimAgentOptions o;
  o.addr = absl::GetFlag(FLAGS_addr);
  o.agents = absl::GetFlag(FLAGS_sim_agents);
  o.id_prefix = absl::GetFlag(FLAGS_sim_id_prefix);
  o.slots = absl::GetFlag(FLAGS_sim_slots);
  o.max_run = absl::Seconds(absl::GetFlag(FLAGS_sim_max_seconds));
  tb::BenchOptions tls;
  tls.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  auto creds = taskgrid::ChannelCredentials(tls.ClientTls());
  if (!creds.ok()) {
    spdlog::error("{}", std::string(creds.status().message()));
    return 2;
  }
  o.credentials = *std::move(creds);
  if (o.addr.empty()) {
    spdlog::error("--sim_agents needs --addr");
    return 2;
  }
  absl::Status s = tb::RunSimAgents(o);
  if (!s.ok()) {
    spdlog::error("{}", s.ToString());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  taskgrid::SetUsage(
      "The Taskgrid load generator: measures submit throughput (W1), dispatch "
      "throughput (W2), latency (W3), recovery from a killed agent (W4), restart with a large "
      "table (W5), many connected agents (W6), pull workers racing for claims (W7) and "
      "submits gathered by merge key (W8), and a standby taking over a large table on PostgreSQL "
      "(W9).\n\n"
      "  taskgrid-bench                      # every workload, full size (about 5 minutes)\n"
      "  taskgrid-bench --smoke --json       # every workload tiny, JSON lines\n"
      "  taskgrid-bench --workloads=w1,w3 --durability=normal\n\n"
      "It starts taskgrid-scheduler and taskgrid-agent from its own directory, each workload "
      "on a fresh temporary data directory; SIGINT stops everything it started.",
      "tools/bench/main.cc");
  absl::ParseCommandLine(argc, argv);
  const bool sim = absl::GetFlag(FLAGS_sim_agents) > 0;
  if (!sim) tb::InstallInterruptHandler();
  taskgrid::InitLogging(sim ? "bench-sim" : "bench", absl::GetFlag(FLAGS_log_level));
  if (sim) return RunSim();

  tb::RunContext ctx;
  std::vector<std::string> workloads;
  if (absl::Status s = ParseWorkloads(absl::GetFlag(FLAGS_workloads), &workloads); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  tb::BenchOptions& o = ctx.opts;
  o.addr = absl::GetFlag(FLAGS_addr);
  o.scheduler_pid = absl::GetFlag(FLAGS_scheduler_pid);
  o.durability = absl::GetFlag(FLAGS_durability);
  o.store = absl::GetFlag(FLAGS_store);
  if (o.durability != "full" && o.durability != "normal") {
    spdlog::error("--durability must be full or normal, not '{}'", o.durability);
    return 2;
  }
  o.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  o.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  o.reconnect_grace = absl::GetFlag(FLAGS_reconnect_grace);
  o.max_heartbeats_per_second = absl::GetFlag(FLAGS_max_heartbeats_per_second);
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = tb::SelfDir();
  o.scheduler_bin = bin_dir + "/taskgrid-scheduler";
  o.agent_bin = bin_dir + "/taskgrid-agent";
  o.ctl_bin = bin_dir + "/taskgridctl";
  o.self_exe = tb::SelfExe();
  o.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  if (auto creds = taskgrid::ChannelCredentials(o.ClientTls()); !creds.ok()) {
    spdlog::error("--tls_dir: {}", std::string(creds.status().message()));
    return 2;
  }
  o.tmp_base = absl::GetFlag(FLAGS_tmp_dir);
  if (o.tmp_base.empty()) {
    const char* t = getenv("TMPDIR");
    o.tmp_base = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  o.keep = absl::GetFlag(FLAGS_keep);
  o.agent_log_level = absl::GetFlag(FLAGS_agent_log_level);
  for (const std::string& bin : {o.agent_bin, o.addr.empty() ? o.scheduler_bin : o.agent_bin}) {
    if (access(bin.c_str(), X_OK) != 0) {
      spdlog::error("{} is not an executable (set --bin_dir)", bin);
      return 2;
    }
  }

  tb::Sizes& z = ctx.sizes;
  z = absl::GetFlag(FLAGS_smoke) ? tb::Sizes::Smoke() : tb::Sizes::Full();
  auto override_size = [](int64_t flag, int64_t* size) {
    if (flag > 0) *size = flag;
  };
  override_size(absl::GetFlag(FLAGS_w1_tasks), &z.w1_tasks);
  override_size(absl::GetFlag(FLAGS_w2_tasks), &z.w2_tasks);
  {
    z.w1_one = z.w1_pipelined = z.w1_batched = false;
    for (absl::string_view m :
         absl::StrSplit(absl::GetFlag(FLAGS_w1_modes), ',', absl::SkipWhitespace())) {
      m = absl::StripAsciiWhitespace(m);
      if (m == "one") {
        z.w1_one = true;
      } else if (m == "inflight") {
        z.w1_pipelined = true;
      } else if (m == "batch") {
        z.w1_batched = true;
      } else {
        spdlog::error("--w1_modes: unknown mode '{}' (one, inflight, batch)", std::string(m));
        return 2;
      }
    }
    if (!z.w1_one && !z.w1_pipelined && !z.w1_batched) {
      spdlog::error("--w1_modes is empty");
      return 2;
    }
  }
  override_size(absl::GetFlag(FLAGS_w3_samples), &z.w3_samples);
  if (absl::GetFlag(FLAGS_w2_slots) > 0) z.w2_slots = absl::GetFlag(FLAGS_w2_slots);
  override_size(absl::GetFlag(FLAGS_w4_tasks), &z.w4_tasks);
  override_size(absl::GetFlag(FLAGS_w5_table), &z.w5_table);
  override_size(absl::GetFlag(FLAGS_w9_table), &z.w9_table);
  override_size(absl::GetFlag(FLAGS_w10_agents), &z.w10_agents);
  override_size(absl::GetFlag(FLAGS_w10_tasks), &z.w10_tasks);
  override_size(absl::GetFlag(FLAGS_w5_drain), &z.w5_drain);
  if (const double f = absl::GetFlag(FLAGS_w5_succeeded); f >= 0) {
    if (f > 1 - z.w5_cancelled_fraction) {
      spdlog::error("--w5_succeeded must be in [0, {}]", 1 - z.w5_cancelled_fraction);
      return 2;
    }
    z.w5_succeeded_fraction = f;
  }
  if (const std::string w6 = absl::GetFlag(FLAGS_w6_agents); !w6.empty()) {
    z.w6_agents.clear();
    for (absl::string_view part : absl::StrSplit(w6, ',', absl::SkipWhitespace())) {
      int64_t k = 0;
      if (!absl::SimpleAtoi(part, &k) || k < 1) {
        spdlog::error("--w6_agents: '{}' is not a positive number", std::string(part));
        return 2;
      }
      z.w6_agents.push_back(k);
    }
  }
  if (absl::GetFlag(FLAGS_w6_window) > absl::ZeroDuration()) {
    z.w6_window = absl::GetFlag(FLAGS_w6_window);
  }
  if (z.w4_tasks > 1000 || z.w1_tasks < 1 || z.w2_tasks < 1 || z.w3_samples < 1 || z.w5_drain < 1) {
    spdlog::error("sizes must be at least 1, and --w4_tasks at most 1000");
    return 2;
  }
  ctx.tag = absl::StrFormat("%x%x", absl::ToUnixMillis(absl::Now()), getpid() & 0xfff);

  const bool json = absl::GetFlag(FLAGS_json);
  spdlog::info("taskgrid-bench: workloads {}{}; {} CPU(s), {}; binaries in {}",
               absl::StrJoin(workloads, ","), absl::GetFlag(FLAGS_smoke) ? " (smoke)" : "",
               sysconf(_SC_NPROCESSORS_ONLN), CpuModel(), bin_dir);

  using RunFn = absl::Status (*)(const tb::RunContext&, std::vector<tb::Figure>*);
  const std::vector<std::pair<std::string, RunFn>> runs = {
      {"w1", tb::RunW1Submit},     {"w2", tb::RunW2Drain},     {"w3", tb::RunW3Latency},
      {"w4", tb::RunW4Recovery},   {"w5", tb::RunW5Restart},   {"w6", tb::RunW6ManyAgents},
      {"w7", tb::RunW7Claims},     {"w8", tb::RunW8MergeKeys}, {"w9", tb::RunW9Failover},
      {"w10", tb::RunW10Placement}};
  std::vector<tb::Figure> all;
  std::vector<std::string> failed;
  for (const auto& [name, run] : runs) {
    if (std::find(workloads.begin(), workloads.end(), name) == workloads.end()) continue;
    spdlog::info("---- {} ----", name);
    const absl::Duration t0 = tb::MonoNow();
    std::vector<tb::Figure> figures;
    absl::Status s = run(ctx, &figures);
    // Whatever a workload left behind (task steps of a killed agent).
    if (const int orphans = tb::KillOrphans(); orphans > 0) {
      spdlog::info("{}: ended {} leftover process(es)", name, orphans);
    }
    if (!s.ok()) {
      spdlog::error("{} failed: {}", name, s.ToString());
      failed.push_back(name);
    } else {
      spdlog::info("{} done in {:.1f} s", name, absl::ToDoubleSeconds(tb::MonoNow() - t0));
    }
    if (json) {
      for (const auto& f : figures) std::cout << tb::FigureJson(f) << "\n";
      std::cout.flush();
    }
    all.insert(all.end(), figures.begin(), figures.end());
  }
  const std::string table = tb::FormatTable(all);
  if (json) {
    std::cerr << table;
  } else {
    std::cout << table;
  }
  if (!failed.empty()) {
    spdlog::error("failed: {}", absl::StrJoin(failed, ","));
    return 1;
  }
  return 0;
}
