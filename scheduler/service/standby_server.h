// What a standby scheduler serves on its --listen address while another
// scheduler leads the same PostgreSQL schema: every call is answered
// UNAVAILABLE, naming the leader's address in the message and in the
// trailing metadata kLeaderKey, with kStandbyKey (common/grpc_status.h:
// the call was not run and may be made again), so agents and
// taskgridctl given the list of schedulers go to the leader at once. The
// standard health service says NOT_SERVING, for load balancers and probes;
// reflection describes health and reflection only. Both capped as on the
// real server.
// The same credentials and tokens as the real server guard it: a caller
// that may not call learns nothing of the leader.
//
// When the standby takes over it shuts this server down and starts the
// SchedulerServer on the same port.
//
// Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/service/server.h"

namespace taskgrid::service {

class StandbyServer {
 public:
  // Listens on opts.listen with opts' credentials and tokens.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(const ServerOptions& opts);
  ~StandbyServer();

  int port() const { return port_; }
  // The scheduler that leads now and its lease epoch, named in every later
  // answer; "" while none does (this one is taking over).
  void SetLeader(const std::string& address, int64_t epoch);
  // Stops listening; calls under way end.
  void Shutdown();

 private:
  class Service;
  explicit StandbyServer(const ServerOptions& opts);
  std::unique_ptr<Service> service_;
  HealthService health_;
  ReflectionService reflection_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace taskgrid::service
