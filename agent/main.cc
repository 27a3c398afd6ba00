// taskgrid-agent: runs tasks for a taskgrid-scheduler.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/flags_help.h"
#include "common/ids.h"
#include "common/key_values.h"
#include "common/logging.h"

ABSL_FLAG(std::string, scheduler, "127.0.0.1:7070", "HOST:PORT of the taskgrid-scheduler");
ABSL_FLAG(std::string, id, "",
          "This agent's id, unique in the cluster (default: HOSTNAME-PID). Keep it across "
          "restarts so the scheduler can hand running tasks back after a reconnect");
ABSL_FLAG(int32_t, slots, 2, "Tasks (slots) it runs at once");
ABSL_FLAG(std::string, labels, "", "Labels tasks can require, e.g. 'gpu=1,zone=a'");
ABSL_FLAG(int64_t, max_output_bytes, 64 << 10,
          "Bytes of stdout and of stderr kept per attempt (the scheduler may ask for fewer)");
ABSL_FLAG(absl::Duration, kill_grace, absl::Seconds(2),
          "Between SIGTERM and SIGKILL when a step is stopped (timeout, cancel)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn or error");

namespace {

absl::Status ParseLabels(const std::string& spec, std::map<std::string, std::string>* out) {
  auto kv = taskgrid::ParseKeyValues("labels", spec);
  if (!kv.ok()) return kv.status();
  for (const auto& [key, value] : *kv) {
    if (absl::Status s = taskgrid::CheckName("--labels key", key, taskgrid::kMaxIdLength);
        !s.ok()) {
      return s;
    }
  }
  *out = std::move(*kv);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  taskgrid::SetUsage(
      "The Taskgrid agent: connects to a scheduler, runs the tasks it is given as real "
      "processes (or built-in steps), and reports their results.\n\n"
      "  taskgrid-agent --scheduler=127.0.0.1:7070 --slots=4 --labels=gpu=1 --id=worker-1\n\n"
      "SIGINT or SIGTERM: stop the running tasks, report them, exit.",
      "agent/main.cc");
  absl::ParseCommandLine(argc, argv);
  taskgrid::InitLogging("agent", absl::GetFlag(FLAGS_log_level));

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  taskgrid::agent::AgentOptions opts;
  opts.scheduler = absl::GetFlag(FLAGS_scheduler);
  opts.id = absl::GetFlag(FLAGS_id);
  if (opts.id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    opts.id = absl::StrCat(host, "-", getpid());
  }
  if (absl::Status s = taskgrid::CheckName("--id", opts.id, taskgrid::kMaxIdLength); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  opts.slots = absl::GetFlag(FLAGS_slots);
  if (opts.slots < 1) {
    spdlog::error("--slots must be at least 1");
    return 2;
  }
  if (absl::Status s = ParseLabels(absl::GetFlag(FLAGS_labels), &opts.labels); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  opts.exec.max_output_bytes = absl::GetFlag(FLAGS_max_output_bytes);
  opts.exec.kill_grace = absl::GetFlag(FLAGS_kill_grace);

  taskgrid::agent::Agent agent(opts);
  std::thread waiter([&agent, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    spdlog::info("received {}, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    agent.Stop();
  });
  spdlog::info("agent {} with {} slots, scheduler {}", opts.id, opts.slots, opts.scheduler);
  agent.Run();
  spdlog::info("stopped");
  // Run() returns only after Stop(), so the waiter has its signal.
  waiter.join();
  return 0;
}
