// The RPC half of taskgridctl: one method per command, each sends its
// request(s) to the scheduler, prints the answer (table or JSON) on stdout
// and returns the process exit code. Requests arrive already validated and
// built from the command line (taskgridctl.cc).
//
// Not thread-safe; one Client per process.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "taskgrid/v1/task_service.grpc.pb.h"

namespace taskgrid::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcFailed = 1;
inline constexpr int kExitUsage = 2;

enum class Action { kCancel, kRetry, kReset, kPause, kResume };

struct ClientOptions {
  std::string addr;                            // HOST:PORT of the scheduler
  bool json = false;                           // print proto3 JSON instead of tables
  absl::Duration timeout = absl::Seconds(30);  // deadline of each RPC
};

class Client {
 public:
  explicit Client(ClientOptions opts);

  int Submit(const v1::SubmitTasksRequest& req);
  int Get(const std::string& id);
  // `all`: follows next_page_token until the last page.
  int List(v1::ListTasksRequest req, bool all);
  int Act(Action action, const std::string& id);
  int Stats(const std::string& queue);
  // ClusterService: the table of agents, draining one, the cluster's counts.
  int Agents();
  int Drain(const std::string& agent_id);
  int ClusterStats();

 private:
  // Runs `rpc` with a fresh context carrying the deadline. On failure prints
  // "error: CODE: message" on stderr and returns false.
  template <typename Rpc>
  bool Call(Rpc&& rpc);

  ClientOptions opts_;
  std::unique_ptr<v1::TaskService::Stub> stub_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_stub_;  // same channel as stub_
};

}  // namespace taskgrid::ctl
