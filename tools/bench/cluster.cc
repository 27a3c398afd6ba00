#include "tools/bench/cluster.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "tools/bench/child_process.h"

namespace taskgrid::bench {

namespace {

constexpr absl::Duration kRpcDeadline = absl::Seconds(30);
constexpr absl::Duration kSchedulerStartTimeout = absl::Seconds(120);
constexpr absl::Duration kAgentStopTimeout = absl::Seconds(10);

}  // namespace

void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

absl::Status RpcError(const std::string& what, const grpc::Status& s) {
  const absl::Status as = FromGrpcStatus(s);
  return absl::Status(
      as.code(),
      absl::StrCat(what, " failed: ", absl::StatusCodeToString(as.code()), ": ", as.message()));
}

absl::Status WaitFor(const std::string& what, absl::Duration timeout, absl::Duration interval,
                     const std::function<absl::StatusOr<bool>()>& pred,
                     const std::function<std::string()>& detail) {
  const absl::Duration deadline = MonoNow() + timeout;
  absl::Status last = absl::OkStatus();
  while (true) {
    absl::StatusOr<bool> r = pred();
    if (r.ok() && *r) return absl::OkStatus();
    if (!r.ok()) {
      if (r.status().code() == absl::StatusCode::kAborted) return r.status();  // fatal
      last = r.status();
    }
    if (MonoNow() > deadline) {
      std::string msg =
          absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting for ", what);
      if (!last.ok()) absl::StrAppend(&msg, "; last error: ", last.ToString());
      if (detail) absl::StrAppend(&msg, "; ", detail());
      return absl::DeadlineExceededError(msg);
    }
    absl::SleepFor(interval);
  }
}

v1::TaskSpec NoopTask(const std::string& id, const std::string& queue, int payload_bytes,
                      int priority) {
  v1::TaskSpec t;
  t.set_id(id);
  t.set_queue(queue);
  t.set_priority(priority);
  t.add_steps()->mutable_builtin()->set_name("noop");
  t.set_payload(std::string(static_cast<size_t>(payload_bytes), 'x'));
  return t;
}

std::string StateName(v1::TaskState s) {
  std::string name = v1::TaskState_Name(s);
  absl::string_view v(name);
  absl::ConsumePrefix(&v, "TASK_STATE_");
  return std::string(v);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const BenchOptions& opts,
                                                         const std::string& name) {
  std::string tmpl = absl::StrCat(opts.tmp_base, "/taskgrid-bench-", name, "-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a directory like ", tmpl, ": ", strerror(errno)));
  }
  RegisterTempDir(tmpl);
  std::unique_ptr<Cluster> c(new Cluster(opts, tmpl));
  if (c->external()) {
    c->addr_ = opts.addr;
    c->Connect();
  }
  return c;
}

Cluster::~Cluster() {
  if (external()) {
    StopAllAgents().IgnoreError();
  }
  KillChildren();
  agents_.clear();  // SIGKILL + reap each
  scheduler_.reset();
  standby_.reset();
  tasks_.reset();
  cluster_.reset();
  health_.reset();
  channel_.reset();
  if (opts_.keep) {
    spdlog::info("kept {}", dir_);
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ForgetTempDir(dir_);
}

TlsFiles BenchOptions::ClientTls() const {
  if (tls_dir.empty()) return {};
  return {tls_dir + "/client.pem", tls_dir + "/client.key", tls_dir + "/ca.pem"};
}

std::vector<std::string> BenchOptions::AgentTlsFlags() const {
  if (tls_dir.empty()) return {};
  const TlsFiles f = ClientTls();
  return {"--tls_ca=" + f.ca, "--tls_cert=" + f.cert, "--tls_key=" + f.key};
}

void Cluster::Connect() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // main() checked the files: a failure here is a broken invariant.
  auto creds = ChannelCredentials(opts_.ClientTls());
  if (!creds.ok()) {
    spdlog::critical("{}", creds.status().ToString());
    std::abort();
  }
  channel_ = grpc::CreateCustomChannel(addr_, *creds, args);
  tasks_ = v1::TaskService::NewStub(channel_);
  cluster_ = v1::ClusterService::NewStub(channel_);
  board_ = v1::BoardService::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

pid_t Cluster::scheduler_pid() const {
  if (external()) return opts_.scheduler_pid;
  return scheduler_ ? scheduler_->pid() : 0;
}

absl::Status Cluster::CheckSchedulerAlive() {
  if (external() || scheduler_ == nullptr) return absl::OkStatus();
  if (scheduler_->Alive()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("the scheduler ", scheduler_->ExitDescription(),
                                         "; the end of ", scheduler_->log_path(), ":\n",
                                         scheduler_->LogTail(3000)));
}

absl::Status Cluster::CheckServing(absl::Duration deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  ctx.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = health_->Check(&ctx, req, &resp);
  if (!s.ok()) return RpcError("Health.Check", s);
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("health is not SERVING yet");
  }
  return absl::OkStatus();
}

std::vector<std::string> Cluster::SchedulerArgv(const std::string& port_file,
                                                const std::vector<std::string>& extra_flags) const {
  std::vector<std::string> argv = {
      opts_.scheduler_bin,
      "--listen=127.0.0.1:0",
      absl::StrCat("--data_dir=", dir_, "/data"),
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--durability=", opts_.durability),
      absl::StrCat("--store=", StoreFlag()),
      absl::StrCat("--heartbeat_interval=", absl::FormatDuration(opts_.heartbeat_interval)),
      absl::StrCat("--heartbeat_timeout=", absl::FormatDuration(opts_.heartbeat_timeout)),
      absl::StrCat("--reconnect_grace=", absl::FormatDuration(opts_.reconnect_grace)),
      absl::StrCat("--max_heartbeats_per_second=", opts_.max_heartbeats_per_second),
      absl::StrCat("--log_level=", opts_.scheduler_log_level)};
  if (!opts_.tls_dir.empty()) {
    argv.push_back(absl::StrCat("--tls_cert=", opts_.tls_dir, "/head.pem"));
    argv.push_back(absl::StrCat("--tls_key=", opts_.tls_dir, "/head.key"));
  }
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  return argv;
}

absl::StatusOr<int> Cluster::WaitPortFile(ChildProcess* proc, const std::string& port_file) {
  absl::Status s = WaitFor("the scheduler to write its port file", kSchedulerStartTimeout,
                           absl::Milliseconds(1), [&]() -> absl::StatusOr<bool> {
                             if (!proc->Alive()) {
                               return absl::AbortedError(absl::StrCat(
                                   "the scheduler ", proc->ExitDescription(), "; the end of ",
                                   proc->log_path(), ":\n", proc->LogTail(3000)));
                             }
                             return access(port_file.c_str(), R_OK) == 0;
                           });
  if (!s.ok()) return s;
  std::ifstream in(port_file);
  int port = 0;
  if (!(in >> port) || port <= 0) {
    return absl::InternalError(absl::StrCat("cannot read a port from ", port_file));
  }
  return port;
}

absl::Status Cluster::SpawnScheduler(const std::vector<std::string>& extra_flags) {
  ++scheduler_starts_;
  const std::string port_file = absl::StrCat(dir_, "/port");
  std::error_code ec;
  std::filesystem::remove(port_file, ec);
  const std::string log = absl::StrCat(dir_, "/scheduler-", scheduler_starts_, ".log");
  auto child =
      ChildProcess::Spawn("taskgrid-scheduler", SchedulerArgv(port_file, extra_flags), log);
  if (!child.ok()) return child.status();
  scheduler_ = std::move(*child);
  spdlog::info("scheduler pid {} started (start #{}, log {})", scheduler_->pid(), scheduler_starts_,
               log);
  // The port file appears once the server listens (after recovery).
  absl::StatusOr<int> port = WaitPortFile(scheduler_.get(), port_file);
  if (!port.ok()) return port.status();
  addr_ = absl::StrCat("127.0.0.1:", *port);
  Connect();
  return WaitFor("the scheduler's health check to answer SERVING", absl::Seconds(30),
                 absl::Milliseconds(1), [&]() -> absl::StatusOr<bool> {
                   if (absl::Status a = CheckSchedulerAlive(); !a.ok()) return a;
                   absl::Status h = CheckServing(absl::Seconds(2));
                   if (!h.ok()) return h;
                   return true;
                 });
}

absl::StatusOr<std::string> Cluster::StartStandby(const std::vector<std::string>& extra_flags) {
  if (external() || !absl::StartsWith(opts_.store, "postgres")) {
    return absl::FailedPreconditionError(
        "a standby needs a scheduler of the bench's on PostgreSQL");
  }
  const std::string port_file = absl::StrCat(dir_, "/standby.port");
  std::vector<std::string> flags = scheduler_flags_;
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  auto child = ChildProcess::Spawn("standby taskgrid-scheduler", SchedulerArgv(port_file, flags),
                                   absl::StrCat(dir_, "/standby.log"));
  if (!child.ok()) return child.status();
  standby_ = std::move(*child);
  // A standby writes its port file once it answers with the leader's address.
  absl::StatusOr<int> port = WaitPortFile(standby_.get(), port_file);
  if (!port.ok()) return port.status();
  standby_addr_ = absl::StrCat("127.0.0.1:", *port);
  spdlog::info("standby pid {} answers at {}", standby_->pid(), standby_addr_);
  return standby_addr_;
}

void Cluster::KillSchedulerForStandby() {
  if (scheduler_ != nullptr) scheduler_->Kill();
  scheduler_ = std::move(standby_);
  addr_ = standby_addr_;
  Connect();
}

absl::Status Cluster::StartScheduler(const std::vector<std::string>& extra_flags) {
  if (external()) {
    absl::Status s = CheckServing(absl::Seconds(10));
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the scheduler at --addr=", addr_, " does not serve: ", s.message()));
    }
    return absl::OkStatus();
  }
  scheduler_flags_ = extra_flags;
  return SpawnScheduler(extra_flags);
}

absl::Status Cluster::StopScheduler(absl::Duration timeout) {
  if (external()) return absl::FailedPreconditionError("cannot stop a scheduler given by --addr");
  if (scheduler_ == nullptr) return absl::OkStatus();
  absl::Status s = scheduler_->Stop(SIGTERM, timeout);
  if (!s.ok()) return s;
  const int status = scheduler_->wait_status();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("the scheduler ", scheduler_->ExitDescription(),
                                            " on SIGTERM; the end of its log:\n",
                                            scheduler_->LogTail(3000)));
  }
  return absl::OkStatus();
}

absl::Status Cluster::RestartScheduler(absl::Duration* to_serving) {
  if (external())
    return absl::FailedPreconditionError("cannot restart a scheduler given by --addr");
  if (scheduler_ != nullptr && scheduler_->Alive()) {
    return absl::FailedPreconditionError("the scheduler still runs");
  }
  absl::Status s = SpawnScheduler(scheduler_flags_);
  if (!s.ok()) return s;
  *to_serving = MonoNow() - scheduler_->spawn_mono();
  return absl::OkStatus();
}

absl::StatusOr<ChildProcess*> Cluster::StartAgent(const std::string& id, int slots,
                                                  const std::vector<std::string>& extra_flags) {
  std::vector<std::string> argv = {opts_.agent_bin, absl::StrCat("--scheduler=", addr_),
                                   absl::StrCat("--id=", id), absl::StrCat("--slots=", slots),
                                   absl::StrCat("--log_level=", opts_.agent_log_level)};
  const std::vector<std::string> tls = opts_.AgentTlsFlags();
  argv.insert(argv.end(), tls.begin(), tls.end());
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  auto child = ChildProcess::Spawn(absl::StrCat("agent ", id), argv,
                                   absl::StrCat(dir_, "/agent-", id, ".log"));
  if (!child.ok()) return child.status();
  ChildProcess* p = child->get();
  agents_[id] = std::move(*child);
  return p;
}

ChildProcess* Cluster::agent(const std::string& id) {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.get();
}

absl::Status Cluster::StopAgent(const std::string& id) {
  auto it = agents_.find(id);
  if (it == agents_.end()) return absl::OkStatus();
  absl::Status s = it->second->Stop(SIGINT, kAgentStopTimeout);
  agents_.erase(it);
  return s;
}

absl::Status Cluster::StopAllAgents() {
  // SIGINT to all first, so they drain side by side.
  for (auto& [id, a] : agents_) a->Signal(SIGINT);
  absl::Status first = absl::OkStatus();
  while (!agents_.empty()) {
    absl::Status s = StopAgent(agents_.begin()->first);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

absl::StatusOr<ChildProcess*> Cluster::StartChild(const std::string& name,
                                                  const std::vector<std::string>& argv) {
  auto child = ChildProcess::Spawn(name, argv, absl::StrCat(dir_, "/", name, ".log"));
  if (!child.ok()) return child.status();
  children_.push_back(std::move(*child));
  return children_.back().get();
}

void Cluster::KillChildren() {
  for (auto& c : children_) c->Kill();
  children_.clear();
}

absl::StatusOr<v1::ListAgentsResponse> Cluster::ListAgents() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kRpcDeadline);
  v1::ListAgentsResponse resp;
  const grpc::Status s = cluster_->ListAgents(&ctx, v1::ListAgentsRequest(), &resp);
  if (!s.ok()) return RpcError("ListAgents", s);
  return resp;
}

absl::StatusOr<v1::ClusterStats> Cluster::GetClusterStats() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kRpcDeadline);
  v1::ClusterStats resp;
  const grpc::Status s = cluster_->GetClusterStats(&ctx, v1::GetClusterStatsRequest(), &resp);
  if (!s.ok()) return RpcError("GetClusterStats", s);
  return resp;
}

absl::Status Cluster::WaitAgentsActive(const std::vector<std::string>& ids,
                                       absl::Duration timeout) {
  std::string missing;
  return WaitFor(
      absl::StrCat("agent(s) ", absl::StrJoin(ids, ","), " to connect"), timeout,
      absl::Milliseconds(20),
      [&]() -> absl::StatusOr<bool> {
        if (absl::Status a = CheckSchedulerAlive(); !a.ok()) return a;
        for (const auto& [id, a] : agents_) {
          if (!a->Alive()) {
            return absl::AbortedError(
                absl::StrCat(a->name(), " ", a->ExitDescription(), ":\n", a->LogTail(2000)));
          }
        }
        auto resp = ListAgents();
        if (!resp.ok()) return resp.status();
        std::map<std::string, v1::AgentState> states;
        for (const auto& a : resp->agents()) states[a.id()] = a.state();
        missing.clear();
        for (const std::string& id : ids) {
          auto it = states.find(id);
          if (it == states.end() || it->second != v1::AGENT_STATE_ACTIVE) {
            absl::StrAppend(&missing, missing.empty() ? "" : ",", id);
          }
        }
        return missing.empty();
      },
      [&] { return absl::StrCat("not active: ", missing); });
}

absl::Status Cluster::SubmitGenerated(int64_t count, int batch,
                                      const std::function<v1::TaskSpec(int64_t)>& make) {
  for (int64_t i = 0; i < count;) {
    v1::SubmitTasksRequest req;
    for (int64_t j = 0; j < batch && i < count; ++j, ++i) *req.add_tasks() = make(i);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kRpcDeadline);
    v1::SubmitTasksResponse resp;
    const grpc::Status s = tasks_->SubmitTasks(&ctx, req, &resp);
    if (!s.ok()) {
      absl::Status alive = CheckSchedulerAlive();
      return alive.ok() ? RpcError(absl::StrCat("SubmitTasks (", req.tasks_size(), " tasks)"), s)
                        : alive;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, int64_t>> Cluster::QueueCounts(const std::string& queue) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kRpcDeadline);
  v1::GetQueueStatsRequest req;
  req.set_queue(queue);
  v1::GetQueueStatsResponse resp;
  const grpc::Status s = tasks_->GetQueueStats(&ctx, req, &resp);
  if (!s.ok()) return RpcError("GetQueueStats", s);
  std::map<std::string, int64_t> out;
  for (const auto& q : resp.queues()) {
    if (q.queue() != queue) continue;
    for (const auto& [state, n] : q.counts()) out[state] += n;
  }
  return out;
}

absl::Status Cluster::WaitQueueState(const std::string& queue, const std::string& state, int64_t n,
                                     absl::Duration timeout) {
  std::map<std::string, int64_t> last;
  return WaitFor(
      absl::StrCat(n, " tasks of queue ", queue, " to be ", state), timeout, absl::Milliseconds(50),
      [&]() -> absl::StatusOr<bool> {
        if (absl::Status a = CheckSchedulerAlive(); !a.ok()) return a;
        auto counts = QueueCounts(queue);
        if (!counts.ok()) return counts.status();
        last = *counts;
        return last[state] >= n;
      },
      [&] {
        std::vector<std::string> parts;
        for (const auto& [s, c] : last) parts.push_back(absl::StrCat(s, "=", c));
        return absl::StrCat("last counts: ", absl::StrJoin(parts, " "));
      });
}

absl::StatusOr<std::vector<v1::Task>> Cluster::ListAll(const std::string& queue,
                                                       const std::vector<v1::TaskState>& states) {
  std::vector<v1::Task> out;
  v1::ListTasksRequest req;
  req.set_queue(queue);
  for (v1::TaskState s : states) req.add_states(s);
  req.set_page_size(1000);
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kRpcDeadline);
    v1::ListTasksResponse resp;
    const grpc::Status s = tasks_->ListTasks(&ctx, req, &resp);
    if (!s.ok()) return RpcError("ListTasks", s);
    for (auto& t : *resp.mutable_tasks()) out.push_back(std::move(t));
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  return out;
}

std::string Cluster::StoreFlag() const {
  if (opts_.store.empty() || opts_.store == "sqlite") return "sqlite";
  // A schema per cluster: bench_<the directory's name>, in identifier
  // characters; the URL's own parameters are kept.
  std::string schema = "bench_";
  for (char c : std::filesystem::path(dir_).filename().string()) {
    schema.push_back(absl::ascii_isalnum(c) ? absl::ascii_tolower(c) : '_');
  }
  return absl::StrCat(opts_.store, absl::StrContains(opts_.store, "?") ? "&" : "?",
                      "options=-csearch_path%3D", schema);
}

std::vector<Setting> Cluster::BaseSettings() const {
  if (external()) return {S("scheduler", addr_)};
  return {S("store", opts_.store.empty() || opts_.store == "sqlite" ? "sqlite" : "postgres"),
          S("durability", opts_.durability),
          D("heartbeat_interval", opts_.heartbeat_interval),
          D("heartbeat_timeout", opts_.heartbeat_timeout),
          D("reconnect_grace", opts_.reconnect_grace),
          {"max_heartbeats_per_second", absl::StrCat(opts_.max_heartbeats_per_second), true}};
}

}  // namespace taskgrid::bench
