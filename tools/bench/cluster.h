// A scheduler for one workload of taskgrid-bench, its agents, and the
// client calls the workloads share.
//
// Either the bench starts the scheduler itself (taskgrid-scheduler from the
// bench's own directory, a fresh data directory under a temporary
// directory, --listen=127.0.0.1:0 with --port_file) or it targets --addr.
// Agents are real taskgrid-agent processes. Everything started is stopped
// and reaped when the Cluster is destroyed (and by the interrupt handler of
// child_process.h on SIGINT), and its temporary directory removed unless
// --keep.
//
// Not thread-safe: owned by the bench's main thread. The stubs may be used
// from any thread (gRPC's are thread-safe) while the Cluster lives.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "taskgrid/v1/board_service.grpc.pb.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "taskgrid/v1/task_service.grpc.pb.h"
#include "tools/bench/child_process.h"
#include "tools/bench/report.h"

namespace taskgrid::bench {

struct BenchOptions {
  // HOST:PORT of a running scheduler; empty: each workload starts its own.
  std::string addr;
  // With addr: the scheduler's pid, for RSS and CPU figures (0: not measured).
  pid_t scheduler_pid = 0;
  std::string scheduler_bin;
  std::string agent_bin;
  std::string ctl_bin;   // taskgridctl, for the workloads that run it as a user would
  std::string self_exe;  // re-executed for simulated agents
  std::string durability = "full";
  // Empty or "sqlite": each scheduler on SQLite in its cluster's directory.
  // A postgres:// URL: on that database, each cluster in a schema of its
  // own named after its directory (the scheduler makes it).
  std::string store;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  absl::Duration reconnect_grace = absl::Seconds(5);
  double max_heartbeats_per_second = 1000;
  std::string tmp_base = "/tmp";
  bool keep = false;  // keep the temporary directories (data, logs)
  std::string agent_log_level = "warn";
  std::string scheduler_log_level = "info";
  // Empty: plaintext. Else a directory made by deploy/make-certs.sh: the
  // scheduler started here serves TLS with head.pem/head.key (no client
  // certificates asked, so agents need none of their own), and every client
  // (this program, agents, simulated agents) trusts ca.pem and presents
  // client.pem/client.key.
  std::string tls_dir;

  TlsFiles ClientTls() const;
  // The agent flags of ClientTls(); none without tls_dir.
  std::vector<std::string> AgentTlsFlags() const;
};

// Polls `pred` every `interval` until it returns true. An error from pred is
// remembered and polling goes on; after `timeout` the result is
// DeadlineExceeded naming `what` and the last error or `detail()`.
absl::Status WaitFor(const std::string& what, absl::Duration timeout, absl::Duration interval,
                     const std::function<absl::StatusOr<bool>()>& pred,
                     const std::function<std::string()>& detail = nullptr);

// A task of one builtin noop step with `payload_bytes` of payload.
v1::TaskSpec NoopTask(const std::string& id, const std::string& queue, int payload_bytes,
                      int priority = 0);

std::string StateName(v1::TaskState s);  // "PENDING"

class Cluster {
 public:
  // Makes the working directory <tmp_base>/taskgrid-bench-<name>-XXXXXX.
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const BenchOptions& opts,
                                                         const std::string& name);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  bool external() const { return !opts_.addr.empty(); }
  const std::string& addr() const { return addr_; }
  const std::string& dir() const { return dir_; }
  // 0 when unknown (an --addr scheduler without --scheduler_pid).
  pid_t scheduler_pid() const;
  ChildProcess* scheduler() { return scheduler_.get(); }

  // Starts the scheduler (or, with --addr, checks that it serves) and waits
  // until it serves. `extra_flags` are added to its command line.
  absl::Status StartScheduler(const std::vector<std::string>& extra_flags = {});
  // SIGTERM, then waits for the exit (SIGKILL and an error after timeout).
  absl::Status StopScheduler(absl::Duration timeout);
  // Starts the scheduler again on the same data directory; *to_serving is the
  // time from just before fork() to the first health check answered SERVING.
  absl::Status RestartScheduler(absl::Duration* to_serving);
  // An error naming the scheduler's exit and its last log lines when it is
  // no longer running (self-started only), else OK.
  absl::Status CheckSchedulerAlive();
  // PostgreSQL only: a second scheduler on the same schema with the same
  // flags (plus `extra_flags`), which waits as a standby answering with the
  // leader's address. Returns its address once it answers.
  absl::StatusOr<std::string> StartStandby(const std::vector<std::string>& extra_flags = {});
  // SIGKILL to the scheduler (reaped); the standby becomes the cluster's
  // scheduler: its address, stubs and log. Call StartStandby first.
  void KillSchedulerForStandby();

  // Starts a taskgrid-agent with --id and --slots (plus `extra_flags`).
  absl::StatusOr<ChildProcess*> StartAgent(const std::string& id, int slots,
                                           const std::vector<std::string>& extra_flags = {});
  ChildProcess* agent(const std::string& id);
  // SIGINT (the agent hands its tasks back) and a bounded wait; SIGKILL after.
  absl::Status StopAgent(const std::string& id);
  absl::Status StopAllAgents();
  // Any other child (simulated agents): killed with the cluster.
  absl::StatusOr<ChildProcess*> StartChild(const std::string& name,
                                           const std::vector<std::string>& argv);
  void KillChildren();

  v1::TaskService::Stub* tasks() { return tasks_.get(); }
  v1::ClusterService::Stub* cluster() { return cluster_.get(); }
  v1::BoardService::Stub* board() { return board_.get(); }

  // Waits until every id in `ids` is listed ACTIVE by ListAgents.
  absl::Status WaitAgentsActive(const std::vector<std::string>& ids, absl::Duration timeout);
  // Submits `count` tasks made by `make(i)`, `batch` per awaited call.
  absl::Status SubmitGenerated(int64_t count, int batch,
                               const std::function<v1::TaskSpec(int64_t)>& make);
  // GetQueueStats(queue).counts, e.g. {"PENDING": 10}.
  absl::StatusOr<std::map<std::string, int64_t>> QueueCounts(const std::string& queue);
  // Polls QueueCounts(queue) until counts[state] >= n; fails early when the
  // scheduler died.
  absl::Status WaitQueueState(const std::string& queue, const std::string& state, int64_t n,
                              absl::Duration timeout);
  // Every task of `queue` in `states` (all pages).
  absl::StatusOr<std::vector<v1::Task>> ListAll(const std::string& queue,
                                                const std::vector<v1::TaskState>& states);
  absl::StatusOr<v1::ListAgentsResponse> ListAgents();
  absl::StatusOr<v1::ClusterStats> GetClusterStats();
  // Health check answered SERVING.
  absl::Status CheckServing(absl::Duration deadline);

  // durability and the heartbeat settings, for figures.
  std::vector<Setting> BaseSettings() const;
  // The scheduler's --store: sqlite, or the URL with this cluster's schema.
  std::string StoreFlag() const;

 private:
  Cluster(BenchOptions opts, std::string dir) : opts_(std::move(opts)), dir_(std::move(dir)) {}
  // (Re)creates the channel and stubs for addr_.
  void Connect();
  // Spawns the scheduler on data_dir with a fresh port file and waits for it.
  absl::Status SpawnScheduler(const std::vector<std::string>& extra_flags);
  // The scheduler's command line, writing its port to `port_file`.
  std::vector<std::string> SchedulerArgv(const std::string& port_file,
                                         const std::vector<std::string>& extra_flags) const;
  // Waits for `port_file` while `proc` runs; the port in it.
  absl::StatusOr<int> WaitPortFile(ChildProcess* proc, const std::string& port_file);

  const BenchOptions opts_;
  const std::string dir_;
  std::string addr_;
  std::vector<std::string> scheduler_flags_;  // extra flags of the last start
  int scheduler_starts_ = 0;
  std::unique_ptr<ChildProcess> scheduler_;
  std::unique_ptr<ChildProcess> standby_;
  std::string standby_addr_;
  std::map<std::string, std::unique_ptr<ChildProcess>> agents_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TaskService::Stub> tasks_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
  std::unique_ptr<v1::BoardService::Stub> board_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// A ClientContext deadline `d` from now.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration d);
// "RPC X failed: CODE: message".
absl::Status RpcError(const std::string& what, const grpc::Status& s);

}  // namespace taskgrid::bench
