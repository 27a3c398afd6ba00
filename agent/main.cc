// taskgrid-agent: runs tasks for a taskgrid-scheduler.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/landlock.h"
#include "common/address.h"
#include "common/flags_help.h"
#include "common/ids.h"
#include "common/key_values.h"
#include "common/logging.h"
#include "common/resources.h"
#include "common/secret_file.h"
#include "common/tls.h"

ABSL_FLAG(std::string, scheduler, "",
          "HOST:PORT of the taskgrid-scheduler, or a comma-separated list of a leader and its "
          "standbys, which the agent follows to whichever leads (default: $TASKGRID_ADDR, else "
          "127.0.0.1:7070)");
ABSL_FLAG(std::string, id, "",
          "This agent's id, unique in the cluster (default: HOSTNAME-PID). Keep it across "
          "restarts so the scheduler can hand running tasks back after a reconnect");
ABSL_FLAG(int32_t, slots, 0,
          "Tasks (slots) it runs at once. 0: the default, 2, or 64 with --resources (what "
          "tasks ask of those bounds it then)");
ABSL_FLAG(std::string, labels, "", "Labels tasks can require, e.g. 'gpu=1,zone=a'");
ABSL_FLAG(std::string, resources, "",
          "What it offers tasks that ask for resources, e.g. 'cpu=8,memory=32GiB,gpu=2': cpu in "
          "cores or millicores (500m), memory in bytes with a unit (KiB MiB GiB TiB, or KB MB GB "
          "TB), any other name a whole count. A task only comes here when what it asks for is "
          "free; tasks that ask for nothing take only a slot. Default: none");
ABSL_FLAG(int64_t, max_output_bytes, 64 << 10,
          "Bytes of stdout and of stderr kept per attempt (the scheduler may ask for fewer)");
ABSL_FLAG(absl::Duration, kill_grace, absl::Seconds(2),
          "Between SIGTERM and SIGKILL when a step is stopped (timeout, cancel)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM, how long running tasks may take to finish; those still running then "
          "are stopped and released to the scheduler, which re-queues them at once");
ABSL_FLAG(absl::Duration, keep_steps, absl::ZeroDuration(),
          "On SIGTERM, keep the running steps instead of draining: the agent exits at once and "
          "its steps run on; an agent started again with the same --id (and --work_dir) within "
          "this long takes them back, and their tasks finish as the same attempt (an upgrade). "
          "Not back in time: the steps are killed and the tasks move, not counted as attempts. "
          "The scheduler holds them at most its --restart_grace. 0: SIGTERM drains");
ABSL_FLAG(bool, confine_steps, true,
          "Run each step in a Landlock domain of its own (Linux 6.12 or later): it cannot "
          "signal, stop or connect to any process outside the step (this agent, its step "
          "supervisor, other tasks' steps). For an agent that is not root it also sets "
          "no_new_privs on the step (setuid programs gain nothing). Where the kernel lacks "
          "it, the agent says so at start and runs steps without it");
ABSL_FLAG(absl::Duration, stop_on_lost_after, absl::ZeroDuration(),
          "Stop the running tasks after hearing nothing from the scheduler for this long "
          "(before it gives them to another agent). 0: what the scheduler says, else 4s");
ABSL_FLAG(std::string, work_dir, "",
          "Each attempt runs with a directory of its own under this one (its inputs and its "
          "output file), removed when the attempt ends. Default: $TMPDIR (or /tmp), then "
          "taskgrid-agent-<id>");
ABSL_FLAG(std::string, step_supervisor, "",
          "The taskgrid-step-supervisor binary each step runs under; it kills the step, with "
          "every process the step started, when the step ends or this agent dies. Default: "
          "the one next to taskgrid-agent");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signed the scheduler's certificate: connect with TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate of this agent (mTLS, with --tls_key); a scheduler that "
          "checks certificates accepts only an --id this certificate names");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(absl::Duration, tls_reload, absl::Minutes(1),
          "How often --tls_ca, --tls_cert and --tls_key are read again: renewed files are used "
          "from the next connection to the scheduler on, without a restart (replace each file "
          "whole, e.g. with mv). At least 1s");
ABSL_FLAG(std::string, token_file, "",
          "File holding this agent's bearer token (role agent), for a scheduler with "
          "--tokens_file; needs --tls_ca");
ABSL_FLAG(absl::Duration, refused_retry_max, absl::Seconds(30),
          "When the scheduler refuses this agent (no or an unknown token, a role or --id it may "
          "not use), the agent logs why once and tries again after 1s, 2s, 4s, ... up to this, "
          "reading --token_file and the certificate files again each time: fixing either file, "
          "or the scheduler's --tokens_file (then SIGHUP the scheduler), needs no restart");
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
      "SIGTSTP: take no more work; running tasks finish.\n"
      "SIGTERM: the same, then exit when they finished (at most --drain_timeout; tasks still "
      "running then are stopped and handed back to the scheduler); with --keep_steps, exit at "
      "once leaving the steps running for the next agent.\n"
      "SIGINT: stop the running tasks at once, hand them back, exit. A second SIGINT or "
      "SIGTERM during a drain ends it at once.",
      "agent/main.cc");
  absl::ParseCommandLine(argc, argv);
  taskgrid::InitLogging("agent", absl::GetFlag(FLAGS_log_level));

  // Blocked in every thread (gRPC's inherit the mask): only the waiter
  // below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGTSTP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  taskgrid::agent::AgentOptions opts;
  opts.scheduler = taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_scheduler), "TASKGRID_ADDR",
                                       taskgrid::kDefaultAddress);
  if (auto list = taskgrid::SchedulerAddresses::Parse(opts.scheduler); !list.ok()) {
    spdlog::error("--scheduler: {}", std::string(list.status().message()));
    return 2;
  }
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
  {
    // Made again from the files after a refusal (Agent::Run), so a fixed
    // token or certificate file needs no restart.
    const taskgrid::TlsFiles tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                    absl::GetFlag(FLAGS_tls_ca),
                                    std::max(absl::Seconds(1), absl::GetFlag(FLAGS_tls_reload))};
    const std::string token_file = absl::GetFlag(FLAGS_token_file);
    auto make_credentials =
        [tls, token_file]() -> absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> {
      std::string token;
      if (!token_file.empty()) {
        absl::StatusOr<std::string> t = taskgrid::ReadToken(token_file);
        if (!t.ok()) return t.status();
        token = *std::move(t);
      }
      return taskgrid::ChannelCredentials(tls, token);
    };
    if (std::string w = taskgrid::OthersMayReadWarning(token_file, "--token_file");
        !token_file.empty() && !w.empty()) {
      spdlog::warn("{}", w);
    }
    auto creds = make_credentials();
    if (!creds.ok()) {
      spdlog::error("{}", std::string(creds.status().message()));
      return 2;
    }
    opts.credentials = *std::move(creds);
    opts.reload_credentials = make_credentials;
    opts.token_file = token_file;
    opts.tls_files = {tls.ca, tls.cert, tls.key};
  }
  opts.refused_retry_max = absl::GetFlag(FLAGS_refused_retry_max);
  if (opts.refused_retry_max < absl::Seconds(1)) {
    spdlog::error("--refused_retry_max must be at least 1s");
    return 2;
  }
  absl::StatusOr<taskgrid::Resources> resources =
      taskgrid::ParseResourceList(absl::GetFlag(FLAGS_resources));
  if (!resources.ok()) {
    spdlog::error("--resources: {}", std::string(resources.status().message()));
    return 2;
  }
  for (const auto& [name, amount] : *resources) {
    opts.resources[name] = taskgrid::FormatResourceAmount(name, amount);
  }
  opts.slots = absl::GetFlag(FLAGS_slots);
  if (opts.slots == 0) opts.slots = resources->empty() ? 2 : 64;
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
  opts.exec.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (opts.exec.work_dir.empty()) opts.exec.work_dir = taskgrid::agent::DefaultWorkDir(opts.id);
  opts.exec.step_supervisor = absl::GetFlag(FLAGS_step_supervisor);
  if (opts.exec.step_supervisor.empty()) {
    opts.exec.step_supervisor = taskgrid::agent::FindStepSupervisor();
  }
  if (opts.exec.step_supervisor.empty() || access(opts.exec.step_supervisor.c_str(), X_OK) != 0) {
    spdlog::error(
        "cannot run steps: {} is not an executable file (install taskgrid-step-supervisor next "
        "to taskgrid-agent, or name it with --step_supervisor)",
        opts.exec.step_supervisor.empty() ? "taskgrid-step-supervisor" : opts.exec.step_supervisor);
    return 2;
  }
  // Whatever a step leaves when its supervisor is killed from outside
  // comes to us, and is killed (agent/process.h, KillOrphans).
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    spdlog::warn(
        "cannot become a child subreaper ({}): a step that kills its own supervisor "
        "may leave processes behind",
        strerror(errno));
  }
  if (absl::GetFlag(FLAGS_confine_steps)) {
    opts.exec.confine_steps = taskgrid::agent::landlock::ScopesAvailable();
    if (!opts.exec.confine_steps) {
      spdlog::warn(
          "steps are not confined: this kernel has no Landlock scopes (Linux 6.12 or later, "
          "Landlock ABI 6; this one has ABI {}), so a step can signal processes outside it",
          taskgrid::agent::landlock::Abi());
    }
  }
  opts.stop_on_lost_after = absl::GetFlag(FLAGS_stop_on_lost_after);
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  const absl::Duration keep_steps = absl::GetFlag(FLAGS_keep_steps);
  if (opts.stop_on_lost_after < absl::ZeroDuration() || drain_timeout < absl::ZeroDuration() ||
      keep_steps < absl::ZeroDuration()) {
    spdlog::error("--stop_on_lost_after, --drain_timeout and --keep_steps must not be negative");
    return 2;
  }
  if (keep_steps > absl::ZeroDuration() && absl::GetFlag(FLAGS_id).empty()) {
    spdlog::error(
        "--keep_steps needs --id: the agent that takes the steps back must have the same id");
    return 2;
  }

  taskgrid::agent::Agent agent(opts);
  std::atomic<bool> done{false};
  std::thread waiter([&agent, &done, signals, drain_timeout, keep_steps] {
    bool draining = false;
    // Wakes every 200 ms to notice that Run() returned.
    const timespec poll = {0, 200 * 1000 * 1000};
    while (!done.load()) {
      const int sig = sigtimedwait(&signals, nullptr, &poll);
      if (sig < 0) continue;  // EAGAIN (timeout) or EINTR
      if (sig == SIGTSTP) {
        spdlog::info("received SIGTSTP: taking no more work");
        agent.StopTakingWork();
      } else if (sig == SIGINT || draining) {
        spdlog::info("received {}: stopping the running tasks now",
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
        agent.Drain(absl::ZeroDuration());
        draining = true;
      } else if (keep_steps > absl::ZeroDuration()) {
        spdlog::info("received SIGTERM: exiting, keeping the running steps for up to {}",
                     absl::FormatDuration(keep_steps));
        agent.Restart(keep_steps, drain_timeout);
        draining = true;
      } else {
        spdlog::info("received SIGTERM: draining for up to {}",
                     absl::FormatDuration(drain_timeout));
        agent.Drain(drain_timeout);
        draining = true;
      }
    }
  });
  spdlog::info("agent {} with {} slots{}{}, scheduler {} ({}), work dir {}", opts.id, opts.slots,
               resources->empty() ? "" : " and ", taskgrid::FormatResources(*resources),
               opts.scheduler,
               absl::GetFlag(FLAGS_tls_ca).empty()     ? "plaintext"
               : absl::GetFlag(FLAGS_tls_cert).empty() ? "TLS"
                                                       : "mTLS",
               opts.exec.work_dir);
  agent.Run();
  spdlog::info("stopped");
  done.store(true);
  waiter.join();
  return 0;
}
