// taskgrid-scheduler: owns the durable task table and serves gRPC.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/clock.h"
#include "common/flags_help.h"
#include "common/ids.h"
#include "common/key_values.h"
#include "common/logging.h"
#include "common/prometheus.h"
#include "scheduler/engine/engine.h"
#include "scheduler/http/api.h"
#include "scheduler/http/dashboard.h"
#include "scheduler/http/http_server.h"
#include "scheduler/http/metrics_page.h"
#include "scheduler/leadership.h"
#include "scheduler/service/request_counts.h"
#include "scheduler/service/server.h"
#include "scheduler/service/standby_server.h"
#include "scheduler/store/postgres_lease.h"
#include "scheduler/store/postgres_store.h"
#include "scheduler/store/redact.h"
#include "scheduler/store/sqlite_store.h"

ABSL_FLAG(std::string, listen, "",
          "HOST:PORT to serve gRPC on (default: $TASKGRID_ADDR, else 127.0.0.1:7070); port 0 "
          "picks a free port (see --port_file)");
ABSL_FLAG(std::string, data_dir, "",
          "Directory of the task table with --store=sqlite: taskgrid.db, its WAL, and a LOCK "
          "file (default: "
          "$TASKGRID_DATA_DIR, else taskgrid-data)");
ABSL_FLAG(std::string, store, "",
          "Where the task table lives: sqlite (taskgrid.db in --data_dir) or a PostgreSQL URL, "
          "postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAM=VALUE&...] (libpq's parameters: "
          "sslmode, options=-csearch_path%3DSCHEMA, ...; the tables go into the first schema "
          "of the search_path). Default: $TASKGRID_STORE, else sqlite");
ABSL_FLAG(bool, standby, true,
          "With a PostgreSQL --store: when another scheduler leads the schema, wait as a standby "
          "and take over once its lease expires; meanwhile --listen answers every call "
          "UNAVAILABLE naming the leader's address (false: exit with status 1 instead)");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(6),
          "With a PostgreSQL --store: how long the leader's lease lasts without a renewal (it "
          "renews every third of it; a standby polls every second, so it takes over within "
          "--lease_ttl + 1s of the leader's last renewal)");
ABSL_FLAG(std::string, advertise, "",
          "With a PostgreSQL --store: the address standbys report for this scheduler while it "
          "leads (default: the --listen host and its port, or this host's name when --listen is "
          "every interface)");
ABSL_FLAG(std::string, durability, "full",
          "full: every acknowledged change survives power loss (synchronous=FULL). normal: "
          "survives a crash of the process, may lose the last changes on power loss");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written to this file once serving (for scripts and tests)");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT to serve HTTP on (default: off): the web dashboard at /, its JSON API at "
          "/api/v1/, and Prometheus metrics at GET /metrics. HTTPS with --tls_cert and "
          "--tls_key (client certificates with --tls_ca); with --tokens_file the API and "
          "/metrics need a token. Port 0 picks a free port (see --http_port_file). An address "
          "other machines can reach needs client certificates or tokens, as --listen does, "
          "or --insecure");
ABSL_FLAG(std::string, metrics_listen, "",
          "The former name of --http_listen, still accepted (it now serves the dashboard too)");
ABSL_FLAG(std::string, http_port_file, "",
          "If set, the bound HTTP port is written to this file once serving");
ABSL_FLAG(std::string, metrics_port_file, "", "The former name of --http_port_file");
ABSL_FLAG(std::vector<std::string>, http_hosts, {},
          "Names the dashboard may be reached by besides the --http_listen host and localhost "
          "(e.g. head-node.example.com): the API refuses a Host header naming anything else, so "
          "a page of another site cannot read it through DNS rebinding");
ABSL_FLAG(int64_t, max_payload_bytes, 1 << 20, "Largest task payload accepted");
ABSL_FLAG(bool, check_invariants, false,
          "Check every invariant of the task table after each operation and abort on a broken "
          "one (costs O(tasks) per operation: for tests and debugging)");
ABSL_FLAG(int64_t, max_spec_bytes, 64 << 10,
          "Largest task spec accepted, counted without its payload and depends_on (argv, env, "
          "cwd, builtin args, labels, agent ids, exit codes together)");
ABSL_FLAG(int32_t, max_job_tasks, 10'000, "Most tasks in one job (SubmitJob)");
ABSL_FLAG(int32_t, max_chain_length, 100,
          "Most tasks of a dependency chain pushed to one agent in one Assign");
ABSL_FLAG(int32_t, max_attempt_history, 100,
          "Finished attempts kept per task (the newest); older ones are dropped and counted");
ABSL_FLAG(bool, insecure, false,
          "Allow --listen on an address other machines can reach, with no TLS and no tokens: "
          "anyone who reaches the port can then run programs on every agent. Also allows "
          "--http_listen on such an address without client certificates or tokens");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this scheduler: serve TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate: every client and agent must present a certificate it signed "
          "(mTLS), and an agent's id must be a name of its certificate");
ABSL_FLAG(absl::Duration, tls_reload, absl::Minutes(1),
          "How often --tls_cert, --tls_key and --tls_ca are read again, on the gRPC and the HTTP "
          "port: a renewed certificate, key or CA is used from the next connection on, without "
          "a restart (replace each file whole, e.g. with mv; a key that does not match its "
          "certificate is not taken until both are in place). At least 1s");
ABSL_FLAG(std::string, tokens_file, "",
          "Bearer tokens with roles, one 'NAME ROLE[,ROLE...] TOKEN' a line (roles: reader, "
          "submitter, agent, admin; optional 4th field ids=ID[,ID...]: the agent ids it may act "
          "as); every call then needs a token with the right role. Needs --tls_cert. Read again "
          "on SIGHUP (kill -HUP PID): the next call on either port, and the next message of a "
          "connected agent, is checked with the new file; a file that does not parse is logged "
          "(file:line) and the tokens from before stay");
ABSL_FLAG(int32_t, max_agent_slots, 1024,
          "Most slots one agent may announce; an agent asking for more is refused");
ABSL_FLAG(int64_t, default_queue_max_length, 0,
          "Most non-terminal tasks a queue may hold (0: no limit), unless --queue_max_length "
          "names the queue");
ABSL_FLAG(std::string, queue_max_length, "", "Per-queue limits, e.g. 'emails=1000,reports=50'");
ABSL_FLAG(int32_t, default_max_attempts, 3, "Attempts of a task that does not set max_attempts");
ABSL_FLAG(absl::Duration, default_ack_timeout, absl::Seconds(10),
          "Dispatch -> agent accepts, for tasks that do not set ack_timeout");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "Heartbeat interval told to agents (while --max_heartbeats_per_second allows it)");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5),
          "An agent silent this long is lost (its stream is ended); scaled with the interval");
ABSL_FLAG(double, max_heartbeats_per_second, 1000,
          "Most heartbeats per second asked of all agents together (0: no bound): beyond "
          "heartbeat_interval x this many agents, the interval (and the timeout) grow by whole "
          "multiples, e.g. 10s for 10,000 agents");
ABSL_FLAG(absl::Duration, reconnect_grace, absl::ZeroDuration(),
          "A lost agent that reconnects within this keeps its tasks; after it they are retried. "
          "0: 5s, or with a PostgreSQL --store --lease_ttl + 6s, so that agents keep their "
          "running tasks through a standby's takeover");
ABSL_FLAG(absl::Duration, restart_grace, absl::Minutes(10),
          "After a restart of the scheduler (a crash, kill -9, an upgrade) or a standby's "
          "takeover, how long each agent has to come back with the tasks it was running. Agents "
          "keep running their tasks this long while the scheduler refuses connections (its "
          "process gone, its host up), so an outage shorter than this re-runs nothing. At least "
          "--reconnect_grace");
ABSL_FLAG(int64_t, max_output_bytes, 64 << 10, "Bytes of stdout and of stderr kept per attempt");
ABSL_FLAG(absl::Duration, event_retention, absl::Hours(24),
          "How long state changes are kept for WatchTasks to resume from");
ABSL_FLAG(absl::Duration, retention, absl::Hours(24 * 7),
          "Finished tasks that SUCCEEDED or were CANCELLED are deleted this long after they "
          "finished (0: kept until deleted); a queue may say otherwise (taskgridctl queue "
          "retention)");
ABSL_FLAG(absl::Duration, failed_retention, absl::Hours(24 * 30),
          "The same for FAILED and TRASHED tasks, the dead letter (0: kept until deleted)");
ABSL_FLAG(absl::Duration, finished_in_memory, absl::Seconds(5),
          "A finished task stays in memory this long, then lives on disk only (reads of it "
          "go to the store), once nothing unfinished needs it");
ABSL_FLAG(absl::Duration, schedule_catch_up, absl::Minutes(1),
          "Schedules with the catch_up misfire policy (the default): after the scheduler was "
          "down, the latest fire it missed runs once if it is at most this late; older ones "
          "are skipped (and counted)");
ABSL_FLAG(int64_t, max_watches, 10'000,
          "Most WatchTasks streams open at once; past it a new one is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_waits, 100'000,
          "Most WaitTask calls waiting at once; past it a new one is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_output_follows, 1'000,
          "Most StreamTaskOutput streams (taskgridctl logs) open at once; past it a new one is "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_merged_payloads, 10'000,
          "Delivery by merge key: most payloads one task gathers; past it a submit is "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_merged_payload_bytes, 16 << 20,
          "Delivery by merge key: most bytes of payloads one task gathers");
ABSL_FLAG(absl::Duration, default_claim_lease, absl::Seconds(60),
          "Pull mode: how long a claim holds when the worker asks for no lease");
ABSL_FLAG(absl::Duration, max_claim_lease, absl::Hours(1),
          "Pull mode: the longest lease a worker may ask for in Claim or ExtendClaim");
ABSL_FLAG(int64_t, max_agent_outbox_bytes, 64 << 20,
          "Bytes that may wait for an agent behind a write it has not taken for 10s; past "
          "them its stream is ended (an agent that stopped reading)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn or error");

namespace {

// A flag that has a former name, and the name it was given by (the
// new one when neither was given); both only when they agree.
struct RenamedFlagValue {
  std::string name;
  std::string value;
};
absl::StatusOr<RenamedFlagValue> RenamedFlag(const char* name, const std::string& value,
                                             const char* old_name, const std::string& old_value) {
  if (!old_value.empty() && !value.empty() && old_value != value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", old_name, " is the former name of --", name, ": give one of them"));
  }
  if (value.empty() && !old_value.empty()) return RenamedFlagValue{old_name, old_value};
  return RenamedFlagValue{name, value};
}

absl::Status ParseQueueLimits(const std::string& spec,
                              absl::flat_hash_map<std::string, int64_t>* out) {
  auto kv = taskgrid::ParseKeyValues("queue_max_length", spec);
  if (!kv.ok()) return kv.status();
  for (const auto& [queue, value] : *kv) {
    int64_t n = 0;
    if (absl::Status s =
            taskgrid::CheckName("--queue_max_length queue", queue, taskgrid::kMaxQueueNameLength);
        !s.ok()) {
      return s;
    }
    if (!absl::SimpleAtoi(value, &n) || n < 0) {
      return absl::InvalidArgumentError("--queue_max_length: the limit of queue " + queue +
                                        " must be a number >= 0, not '" + value + "'");
    }
    (*out)[queue] = n;
  }
  return absl::OkStatus();
}

// Written whole under a temporary name, then renamed: readers never see half.
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

// How long a scheduler stopped by a failure may take to stop.
constexpr int kFailedStopLimitSeconds = 10;

int main(int argc, char** argv) {
  taskgrid::SetUsage(
      "The Taskgrid scheduler: owns the durable task table (SQLite, or PostgreSQL) and serves "
      "gRPC to clients (taskgridctl, grpcurl) and agents.\n\n"
      "  taskgrid-scheduler --listen=127.0.0.1:7070 --data_dir=/var/lib/taskgrid\n"
      "  PGPASSWORD=... taskgrid-scheduler --store=postgres://taskgrid@db.example.com/taskgrid\n\n"
      "Stops cleanly on SIGINT or SIGTERM; reads --tokens_file again on SIGHUP.",
      "scheduler/main.cc");
  absl::ParseCommandLine(argc, argv);
  taskgrid::InitLogging("scheduler", absl::GetFlag(FLAGS_log_level));

  // Block the stop signals and SIGHUP (reload) in every thread (gRPC's
  // inherit the mask); one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  taskgrid::engine::EngineOptions opts;
  opts.check_invariants = absl::GetFlag(FLAGS_check_invariants);
  taskgrid::core::SchedulerOptions& so = opts.scheduler;
  so.max_payload_bytes = absl::GetFlag(FLAGS_max_payload_bytes);
  so.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  so.max_job_tasks = absl::GetFlag(FLAGS_max_job_tasks);
  so.max_chain_length = absl::GetFlag(FLAGS_max_chain_length);
  so.max_attempt_history = absl::GetFlag(FLAGS_max_attempt_history);
  so.default_claim_lease = absl::GetFlag(FLAGS_default_claim_lease);
  so.max_merged_payloads = absl::GetFlag(FLAGS_max_merged_payloads);
  so.max_merged_payload_bytes = absl::GetFlag(FLAGS_max_merged_payload_bytes);
  so.max_claim_lease = absl::GetFlag(FLAGS_max_claim_lease);
  so.max_agent_slots = absl::GetFlag(FLAGS_max_agent_slots);
  so.default_queue_max_length = absl::GetFlag(FLAGS_default_queue_max_length);
  so.default_max_attempts = absl::GetFlag(FLAGS_default_max_attempts);
  so.default_ack_timeout = absl::GetFlag(FLAGS_default_ack_timeout);
  so.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  so.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  so.max_heartbeats_per_second = absl::GetFlag(FLAGS_max_heartbeats_per_second);
  so.reconnect_grace = absl::GetFlag(FLAGS_reconnect_grace);
  const bool grace_given = so.reconnect_grace != absl::ZeroDuration();
  if (!grace_given) so.reconnect_grace = absl::Seconds(5);
  so.restart_grace = absl::GetFlag(FLAGS_restart_grace);
  so.max_output_bytes = absl::GetFlag(FLAGS_max_output_bytes);
  so.event_retention = absl::GetFlag(FLAGS_event_retention);
  so.retention = absl::GetFlag(FLAGS_retention);
  so.failed_retention = absl::GetFlag(FLAGS_failed_retention);
  so.finished_in_memory = absl::GetFlag(FLAGS_finished_in_memory);
  so.schedule_catch_up = absl::GetFlag(FLAGS_schedule_catch_up);
  for (const auto& [flag, d] : {std::pair<const char*, absl::Duration>{"retention", so.retention},
                                {"failed_retention", so.failed_retention},
                                {"finished_in_memory", so.finished_in_memory}}) {
    if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      spdlog::error("--{} must be a duration of 0 or more, not {}", flag, absl::FormatDuration(d));
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_max_watches) < 1 || absl::GetFlag(FLAGS_max_waits) < 1 ||
      absl::GetFlag(FLAGS_max_output_follows) < 1) {
    spdlog::error("--max_watches, --max_waits and --max_output_follows must be at least 1");
    return 2;
  }
  opts.max_watches = static_cast<size_t>(absl::GetFlag(FLAGS_max_watches));
  opts.max_waits = static_cast<size_t>(absl::GetFlag(FLAGS_max_waits));
  opts.output.max_followers = static_cast<size_t>(absl::GetFlag(FLAGS_max_output_follows));
  if (absl::Status s =
          ParseQueueLimits(absl::GetFlag(FLAGS_queue_max_length), &so.queue_max_length);
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  const std::string listen =
      taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_listen), "TASKGRID_ADDR", taskgrid::kDefaultAddress);
  taskgrid::service::ServerOptions server_opts;
  server_opts.listen = listen;
  server_opts.agent_outbox.max_bytes = absl::GetFlag(FLAGS_max_agent_outbox_bytes);
  server_opts.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_ca),
                     std::max(absl::Seconds(1), absl::GetFlag(FLAGS_tls_reload))};
  const bool tls = !server_opts.tls.cert.empty() || !server_opts.tls.key.empty();
  const bool mtls = tls && !server_opts.tls.ca.empty();
  if (tls && (server_opts.tls.cert.empty() || server_opts.tls.key.empty())) {
    spdlog::error("--tls_cert and --tls_key go together");
    return 2;
  }
  if (!tls && !server_opts.tls.ca.empty()) {
    spdlog::error("--tls_ca (client certificates) needs TLS: give --tls_cert and --tls_key too");
    return 2;
  }
  const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file);
  // Shared by both ports; SIGHUP reloads it.
  std::shared_ptr<taskgrid::service::ReloadableTokens> tokens;
  if (!tokens_file.empty()) {
    if (!tls) {
      spdlog::error(
          "--tokens_file needs --tls_cert and --tls_key: a token sent in plaintext can be read "
          "off the network");
      return 2;
    }
    auto loaded = taskgrid::service::ReloadableTokens::FromFile(tokens_file);
    if (!loaded.ok()) {
      spdlog::error("{}", std::string(loaded.status().message()));
      return 2;
    }
    tokens = std::move(*loaded);
    spdlog::info("{} bearer tokens from {} (SIGHUP reads it again)", tokens->Current()->size(),
                 tokens_file);
    server_opts.tokens = std::make_shared<taskgrid::service::TokenAuth>(tokens);
  }
  const bool protected_port = mtls || (tls && server_opts.tokens != nullptr);
  if (!taskgrid::IsLoopbackAddress(listen) && !protected_port && !absl::GetFlag(FLAGS_insecure)) {
    spdlog::error(
        "--listen={} can be reached from other machines, and this scheduler has {}: whoever "
        "reaches it can run any program on every agent. Listen on 127.0.0.1, require client "
        "certificates (--tls_cert, --tls_key, --tls_ca) or tokens (--tokens_file with TLS), "
        "or pass --insecure to serve a network you trust anyway",
        listen, tls ? "TLS but neither client certificates nor tokens" : "no TLS or tokens");
    return 2;
  }
  auto http_listen = RenamedFlag("http_listen", absl::GetFlag(FLAGS_http_listen), "metrics_listen",
                                 absl::GetFlag(FLAGS_metrics_listen));
  auto http_port_file = RenamedFlag("http_port_file", absl::GetFlag(FLAGS_http_port_file),
                                    "metrics_port_file", absl::GetFlag(FLAGS_metrics_port_file));
  for (const auto* flag : {&http_listen, &http_port_file}) {
    if (!flag->ok()) {
      spdlog::error("{}", std::string(flag->status().message()));
      return 2;
    }
  }
  const std::string& http_flag = http_listen->name;  // as given, for messages
  std::pair<std::string, int> http_address;
  if (!http_listen->value.empty()) {
    auto split = taskgrid::http::SplitHostPort(http_flag, http_listen->value);
    if (!split.ok()) {
      spdlog::error("{}", std::string(split.status().message()));
      return 2;
    }
    http_address = *split;
    // As for --listen: the API can cancel and drain, so a reachable address
    // needs TLS with client certificates or tokens. Without TLS a token
    // would cross the network in plaintext, so tokens never go that way.
    if (!taskgrid::IsLoopbackAddress(http_listen->value) && !protected_port &&
        !absl::GetFlag(FLAGS_insecure)) {
      spdlog::error(
          "--{}={} can be reached from other machines, and this scheduler has {}: whoever "
          "reaches it can cancel tasks and drain agents through the dashboard's API. Listen on "
          "127.0.0.1, require client certificates (--tls_cert, --tls_key, --tls_ca) or tokens "
          "(--tokens_file with TLS), or pass --insecure to serve a network you trust anyway",
          http_flag, http_listen->value,
          tls ? "TLS but neither client certificates nor tokens" : "no TLS or tokens");
      return 2;
    }
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"max_job_tasks", so.max_job_tasks},
        {"max_chain_length", so.max_chain_length},
        {"max_agent_slots", so.max_agent_slots},
        {"max_attempt_history", so.max_attempt_history},
        {"max_merged_payloads", so.max_merged_payloads},
        {"max_merged_payload_bytes", so.max_merged_payload_bytes}}) {
    if (value < 1) {
      spdlog::error("--{} must be at least 1, not {}", flag, value);
      return 2;
    }
  }
  if (so.heartbeat_interval <= absl::ZeroDuration() ||
      so.heartbeat_timeout < 2 * so.heartbeat_interval ||
      so.reconnect_grace < 4 * so.heartbeat_interval) {
    // Agents stop their own tasks after StopOnLostAfter() without a heartbeat
    // ack: with a grace this short they would do so while healthy.
    spdlog::error(
        "--heartbeat_timeout must be at least 2 and --reconnect_grace at least 4 times "
        "--heartbeat_interval (got {}, {} and {})",
        absl::FormatDuration(so.heartbeat_timeout), absl::FormatDuration(so.reconnect_grace),
        absl::FormatDuration(so.heartbeat_interval));
    return 2;
  }
  if (so.schedule_catch_up < absl::ZeroDuration()) {
    spdlog::error("--schedule_catch_up must not be negative, not {}",
                  absl::FormatDuration(so.schedule_catch_up));
    return 2;
  }
  if (so.restart_grace < so.reconnect_grace) {
    spdlog::error("--restart_grace must be at least --reconnect_grace (got {} and {})",
                  absl::FormatDuration(so.restart_grace), absl::FormatDuration(so.reconnect_grace));
    return 2;
  }
  if (!(so.max_heartbeats_per_second >= 0)) {
    spdlog::error("--max_heartbeats_per_second must be >= 0 (0: no bound)");
    return 2;
  }
  if (so.default_claim_lease <= absl::ZeroDuration() ||
      so.max_claim_lease < so.default_claim_lease ||
      so.max_claim_lease == absl::InfiniteDuration()) {
    spdlog::error(
        "--default_claim_lease must be positive and at most --max_claim_lease (got {} and {})",
        absl::FormatDuration(so.default_claim_lease), absl::FormatDuration(so.max_claim_lease));
    return 2;
  }
  if (so.event_retention < absl::Seconds(1)) {
    spdlog::error("--event_retention must be at least 1s, not {}",
                  absl::FormatDuration(so.event_retention));
    return 2;
  }
  if (so.default_max_attempts < 1 || so.default_max_attempts > so.max_attempts_limit) {
    spdlog::error("--default_max_attempts must be in [1, {}]", so.max_attempts_limit);
    return 2;
  }

  const std::string store_url =
      taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_store), "TASKGRID_STORE", "sqlite");
  const bool postgres =
      absl::StartsWith(store_url, "postgres://") || absl::StartsWith(store_url, "postgresql://");
  if (store_url != "sqlite" && !postgres) {
    spdlog::error("--store must be sqlite or a postgres:// URL, not '{}'",
                  taskgrid::store::RedactPasswords(store_url));
    return 2;
  }
  const std::string durability = absl::GetFlag(FLAGS_durability);
  if (durability != "full" && durability != "normal") {
    spdlog::error("--durability must be full or normal, not '{}'", durability);
    return 2;
  }
  std::unique_ptr<taskgrid::store::Store> store;
  // With PostgreSQL: the lease that says whether this scheduler leads.
  std::unique_ptr<taskgrid::store::PostgresLease> lease;
  taskgrid::store::PostgresStore* pg_store = nullptr;
  const absl::Duration lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  if (postgres) {
    // Durability is the server's: a commit returns when its
    // synchronous_commit says so (WAL flushed, by default).
    if (durability != "full") {
      spdlog::error(
          "--durability is SQLite's; with PostgreSQL the server's synchronous_commit "
          "decides");
      return 2;
    }
    if (lease_ttl < absl::Seconds(1)) {
      spdlog::error("--lease_ttl must be at least 1s, not {}", absl::FormatDuration(lease_ttl));
      return 2;
    }
    // A standby takes over within --lease_ttl + 1s of the last renewal,
    // then restores and listens: agents must keep their tasks that long
    // (they stop them after StopOnLostAfter() without a scheduler).
    const absl::Duration failover_grace = lease_ttl + absl::Seconds(6);
    if (!grace_given) {
      so.reconnect_grace = std::max(so.reconnect_grace, failover_grace);
    } else if (so.reconnect_grace < failover_grace) {
      spdlog::warn(
          "--reconnect_grace={} is shorter than --lease_ttl + 6s: agents stop their running "
          "tasks before a standby can take over, and the new leader runs them again",
          absl::FormatDuration(so.reconnect_grace));
    }
    taskgrid::store::PostgresOptions pg_opts{store_url};
    pg_opts.writer_idle_limit = lease_ttl;
    auto pg = taskgrid::store::PostgresStore::Open(pg_opts);
    if (!pg.ok()) {
      spdlog::error("{}", std::string(pg.status().message()));
      return 1;
    }
    spdlog::info("task table {} (schema {}, schema version {})", (*pg)->display_name(),
                 (*pg)->schema(), (*pg)->schema_version());
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    auto l = taskgrid::store::PostgresLease::Open(
        {store_url, absl::StrCat(host, ":", getpid(), ":", absl::ToUnixMicros(absl::Now())), "",
         lease_ttl});
    if (!l.ok()) {
      spdlog::error("{}", std::string(l.status().message()));
      return 1;
    }
    lease = std::move(*l);
    pg_store = pg->get();
    store = std::move(*pg);
  } else {
    taskgrid::store::SqliteOptions store_opts;
    store_opts.data_dir =
        taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_data_dir), "TASKGRID_DATA_DIR", "taskgrid-data");
    store_opts.durability = durability == "full" ? taskgrid::store::Durability::kFull
                                                 : taskgrid::store::Durability::kNormal;
    if (durability == "normal") {
      spdlog::warn("--durability=normal: acknowledged changes may be lost on power loss");
    }
    auto lite = taskgrid::store::SqliteStore::Open(store_opts);
    if (!lite.ok()) {
      spdlog::error("{}", std::string(lite.status().message()));
      return 1;
    }
    spdlog::info("task table {} (schema version {}, durability {})", (*lite)->db_path(),
                 (*lite)->schema_version(), durability);
    store = std::move(*lite);
  }

  taskgrid::StopSignal stop;
  // Where standbys send callers to this scheduler once it leads.
  auto advertised = [&listen](int port) {
    const std::string flag = absl::GetFlag(FLAGS_advertise);
    return flag.empty() ? taskgrid::AdvertisedAddress(listen, port) : flag;
  };
  // From here on a stop signal ends the start too (a standby waits long).
  std::thread waiter([&stop, stop_signals, tokens] {
    int sig = 0;
    while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
      if (tokens == nullptr) {
        spdlog::info("received SIGHUP: nothing to reload (no --tokens_file)");
      } else {
        spdlog::info("received SIGHUP: reading {} again", tokens->path());
        tokens->ReloadAndLog();
      }
    }
    spdlog::info("received {}, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    stop.Fire(0);
  });
  auto finish = [&waiter, &stop] {
    // The waiter may still block in sigwait (a fatal error stopped us): leave it.
    if (stop.exit_code == 0 && stop.stop) {
      waiter.join();
    } else {
      waiter.detach();
    }
    return stop.exit_code;
  };
  std::mutex lease_mu;  // the lease: the renewer's, and the address's setter
  std::thread renewer;
  // While another scheduler leads: answers callers on --listen with its
  // address, until this one takes over and serves there itself.
  std::unique_ptr<taskgrid::service::StandbyServer> standby;
  if (lease != nullptr) {
    std::chrono::steady_clock::time_point taken_at;
    auto waiting = [&](const taskgrid::store::LeaseState& st) {
      if (standby == nullptr) {
        auto s = taskgrid::service::StandbyServer::Start(server_opts);
        if (!s.ok()) {
          spdlog::error("{}", std::string(s.status().message()));
          return false;
        }
        standby = std::move(*s);
        // A free port picked now is kept, also once this one leads.
        if (absl::EndsWith(listen, ":0")) {
          server_opts.listen =
              absl::StrCat(listen.substr(0, listen.size() - 2), ":", standby->port());
        }
        WritePortFile(absl::GetFlag(FLAGS_port_file), standby->port());
        lease->set_address(advertised(standby->port()));
        spdlog::info("standby: answering on port {} with the leader's address", standby->port());
      }
      standby->SetLeader(st.holder.empty() ? "" : st.address, st.epoch);
      return true;
    };
    if (int code = taskgrid::LeadOrWait(lease.get(), pg_store, absl::GetFlag(FLAGS_standby),
                                        waiting, &stop, &taken_at);
        code >= 0) {
      stop.Fire(code);
      return finish();
    }
    // Until the real server listens: "taking over, try again".
    if (standby != nullptr) standby->SetLeader("", lease->epoch());
    renewer = std::thread([&, taken_at] {
      taskgrid::RenewLease(lease.get(), &lease_mu, pg_store, lease_ttl, taken_at, &stop);
    });
  }
  // Ends the lease (at once, for the standbys) once nothing writes.
  auto let_go = [&] {
    if (renewer.joinable()) renewer.join();
    if (lease != nullptr) {
      std::lock_guard<std::mutex> lock(lease_mu);
      if (absl::Status s = lease->Release(); !s.ok()) {
        spdlog::warn("releasing the lease: {}", std::string(s.message()));
      }
    }
  };
  // A submit commits on its own thread when nothing else is being written
  // (one thread hand-off less), but not on PostgreSQL (see
  // GroupCommitWriter::Options::caller_commits).
  opts.writer.caller_commits = !postgres;
  taskgrid::engine::Engine engine(store.get(), taskgrid::RealClock::Get(), opts);
  engine.set_on_fatal([&stop](const absl::Status& s) {
    spdlog::critical("{}", s.ToString());
    stop.Fire(1);
  });
  const absl::Time start = absl::Now();
  if (absl::Status s = engine.Start(); !s.ok()) {
    spdlog::error("recovery failed: {}", s.ToString());
    stop.Fire(1);
    let_go();
    return finish();
  }
  size_t in_memory = 0, on_disk = 0;
  engine.Inspect([&](const taskgrid::core::Scheduler& s) {
    in_memory = s.task_count();
    on_disk = s.cold_task_count();
  });
  spdlog::info("recovered {} tasks in {} ({} in memory, {} finished ones on disk only)",
               in_memory + on_disk, absl::FormatDuration(absl::Now() - start), in_memory, on_disk);

  // The dashboard, its API and the metrics page, before gRPC so a port
  // taken fails before anyone is served. The Api is made before the
  // server, so the server (and its threads) is gone before the Api.
  taskgrid::http::Api::Options api_opts;
  api_opts.tokens = tokens.get();
  api_opts.listen_host = http_address.first;
  api_opts.hosts = absl::GetFlag(FLAGS_http_hosts);
  api_opts.bind_owners = mtls;
  taskgrid::http::Api api(&engine, api_opts);
  taskgrid::http::HttpServer::Options http_opts;
  // A submit of a batch as JSON; larger ones go over gRPC.
  http_opts.max_request_bytes = taskgrid::http::Api::kMaxBodyBytes;
  // A page loads its files and a few API calls at once.
  http_opts.threads = 4;
  if (tls) {
    http_opts.tls = {server_opts.tls.cert, server_opts.tls.key, server_opts.tls.ca,
                     server_opts.tls.reload_every};
  }
  taskgrid::http::HttpServer http(http_opts);
  if (!http_listen->value.empty()) {
    taskgrid::http::ProcessInfo process;
    process.start_time = start;
    http.Get("/metrics", [&engine, &api, process](const taskgrid::http::Request& req) {
      // With tokens, what GetQueueStats needs (reader): the page shows
      // queue names and counts.
      if (absl::Status s = api.Authorize(req, "/taskgrid.v1.TaskService/GetQueueStats"); !s.ok()) {
        return taskgrid::http::Response{taskgrid::http::Api::HttpStatus(s.code()),
                                        "text/plain; charset=utf-8",
                                        std::string(s.message()) + "\n",
                                        {}};
      }
      taskgrid::http::ProcessInfo now = process;
      now.refused["grpc"] = taskgrid::service::GrpcRefusals().Counts();
      now.grpc_requests = taskgrid::service::GrpcRequests().Counts();
      now.refused["http"] = api.refusals().Counts();
      if (auto stats = taskgrid::prometheus::ReadProcessStats(); stats.ok()) now.stats = *stats;
      return taskgrid::http::Response{200,
                                      taskgrid::prometheus::kContentType,
                                      taskgrid::http::MetricsPage(engine.Metrics(), now),
                                      {}};
    });
    api.Register(&http);
    taskgrid::http::AddDashboard(&http);
    auto port = http.Start(http_address.first, http_address.second);
    if (!port.ok()) {
      spdlog::error("--{}: {}", http_flag, std::string(port.status().message()));
      stop.Fire(1);
      engine.Stop();
      let_go();
      return finish();
    }
    WritePortFile(http_port_file->value, *port);
    const std::string host = http_listen->value.substr(0, http_listen->value.rfind(':'));
    const std::string url = absl::StrCat(http.tls() ? "https://" : "http://", host, ":", *port);
    if (taskgrid::IsLoopbackAddress(http_listen->value)) {
      spdlog::info("dashboard on {}/ and metrics on {}/metrics", url, url);
    } else if (protected_port) {
      spdlog::info("dashboard on {}/ and metrics on {}/metrics, reachable from other machines; {}",
                   url, url,
                   server_opts.tokens != nullptr ? "the API and metrics need a token"
                                                 : "clients need a certificate from --tls_ca");
    } else {
      spdlog::warn(
          "--insecure: dashboard on {}/ and metrics on {}/metrics, reachable from other "
          "machines without {}",
          url, url, tls ? "client certificates or tokens" : "TLS or tokens");
    }
  }

  if (standby != nullptr) standby->Shutdown();
  auto server = taskgrid::service::SchedulerServer::Start(&engine, server_opts);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    stop.Fire(1);
    http.Stop();
    engine.Stop();
    let_go();
    return finish();
  }
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  spdlog::info("serving on port {} (pid {})", (*server)->port(), getpid());
  if (lease != nullptr) {
    // Written now, for standbys to tell; a failure is the renewer's to judge.
    std::lock_guard<std::mutex> lock(lease_mu);
    lease->set_address(advertised((*server)->port()));
    if (absl::Status s = lease->Renew(); !s.ok()) {
      spdlog::warn("writing the lease's address: {}", std::string(s.message()));
    }
  }
  std::string protection;
  if (mtls && server_opts.tokens != nullptr) {
    protection =
        "mTLS and bearer tokens: callers need a certificate from --tls_ca and a token "
        "with the role of the call";
  } else if (mtls) {
    protection =
        "mTLS: callers need a certificate from --tls_ca (any such certificate may call "
        "everything; agents only under their certificate's names)";
  } else if (server_opts.tokens != nullptr) {
    protection = "TLS and bearer tokens: callers need a token with the role of the call";
  } else if (tls) {
    protection = "TLS without client authentication: anyone who reaches it can call everything";
  }
  if (taskgrid::IsLoopbackAddress(listen)) {
    spdlog::info("listening on {} only: agents and clients on other machines cannot reach it{}{}",
                 listen, protection.empty() ? "" : "; ", protection);
  } else if (protected_port) {
    spdlog::info("listening on {}, reachable from other machines; {}", listen, protection);
  } else {
    spdlog::warn(
        "--insecure: {} serves without {}; anyone who reaches it can run programs on every "
        "agent",
        listen, tls ? "client certificates or tokens" : "TLS or tokens");
  }

  {
    std::unique_lock<std::mutex> lock(stop.mu);
    stop.cv.wait(lock, [&stop] { return stop.stop; });
  }
  if (stop.exit_code != 0) {
    // Stopped by a failure (a lease that ran out, a lost database): what
    // is left to do may wait on a database that does not answer. Nothing
    // uncommitted was acknowledged, so leave in bounded time whatever
    // hangs; a clean stop (SIGTERM) waits for its last commits.
    std::thread([code = stop.exit_code] {
      std::this_thread::sleep_for(std::chrono::seconds(kFailedStopLimitSeconds));
      spdlog::critical("stopping took longer than {}s (the database does not answer); exiting",
                       kFailedStopLimitSeconds);
      spdlog::default_logger()->flush();
      _exit(code);
    }).detach();
  }
  http.Stop();
  (*server)->Shutdown(absl::Seconds(2));
  engine.Stop();
  let_go();
  spdlog::info("stopped");
  return finish();
}
