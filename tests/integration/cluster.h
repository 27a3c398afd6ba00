// Test-only: a scheduler (Engine + SQLite + gRPC server on 127.0.0.1, an
// ephemeral port) and agents, all in this process. Every wait is bounded.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "agent/agent.h"
#include "common/clock.h"
#include "scheduler/engine/engine.h"
#include "scheduler/service/server.h"
#include "scheduler/store/sqlite_store.h"
#include "taskgrid/v1/task_service.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace taskgrid::testing {

class InProcessCluster {
 public:
  // `server`: its listen address is replaced by 127.0.0.1 and a free port.
  explicit InProcessCluster(engine::EngineOptions opts = DefaultOptions(),
                            service::ServerOptions server = {});
  ~InProcessCluster();

  static engine::EngineOptions DefaultOptions();

  // Starts an agent in this process (its Run() on a thread), connecting
  // to `scheduler` ("": this cluster's address).
  agent::Agent* AddAgent(const std::string& id, int slots,
                         std::map<std::string, std::string> labels = {},
                         const std::string& scheduler = "");
  void StopAgent(const std::string& id);

  v1::TaskService::Stub& tasks() { return *stub_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(server_->port()); }
  engine::Engine& engine() { return *engine_; }
  service::SchedulerServer& server() { return *server_; }
  store::SqliteStore& store() { return *store_; }

  // A context with a deadline, so a bug fails instead of hanging.
  static std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration d = absl::Seconds(10));

  grpc::Status Submit(const std::vector<v1::TaskSpec>& specs,
                      v1::SubmitTasksResponse* resp = nullptr);
  v1::Task Get(const std::string& id);
  // Polls until the task is in `state`; fails the test after `timeout`.
  v1::Task WaitFor(const std::string& id, v1::TaskState state,
                   absl::Duration timeout = absl::Seconds(20));
  // Polls until pred() holds; false after `timeout`.
  static bool Eventually(const std::function<bool()>& pred,
                         absl::Duration timeout = absl::Seconds(20));

 private:
  struct RunningAgent {
    std::unique_ptr<agent::Agent> agent;
    std::thread thread;
  };
  TempDir dir_;
  std::unique_ptr<store::SqliteStore> store_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<service::SchedulerServer> server_;
  std::unique_ptr<v1::TaskService::Stub> stub_;
  std::map<std::string, RunningAgent> agents_;
};

// Specs for tests.
v1::TaskSpec ExecSpec(const std::string& id, std::vector<std::string> argv);
v1::TaskSpec BuiltinSpec(const std::string& id, const std::string& name,
                         std::vector<std::string> args = {});

}  // namespace taskgrid::testing
