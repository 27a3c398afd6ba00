// Builds the scheduler's gRPC server: TaskService, AgentService, the
// standard health service and server reflection (ours, on the callback
// API and capped: health_service.h, reflection_service.h), in plaintext or behind TLS
// (mTLS) and bearer tokens (scheduler/service/auth.h). Used by main() and by the
// in-process integration tests.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/message_limits.h"
#include "common/tls.h"
#include "scheduler/engine/engine.h"
#include "scheduler/service/agent_service.h"
#include "scheduler/service/auth.h"
#include "scheduler/service/board_service.h"
#include "scheduler/service/cluster_service.h"
#include "scheduler/service/health_service.h"
#include "scheduler/service/job_service.h"
#include "scheduler/service/reflection_service.h"
#include "scheduler/service/schedule_service.h"
#include "scheduler/service/stream_caps.h"
#include "scheduler/service/task_service.h"

namespace taskgrid::service {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // port 0 picks a free one
  // The largest request; replies may be kReplyHeadroomBytes larger.
  int max_message_bytes = kMaxRequestBytes;
  // What may queue for an agent that stops reading before its stream is
  // cancelled.
  OutboxLimits agent_outbox;
  // No cert/key: plaintext. cert+key: TLS. ca too: mTLS, every client shows
  // a certificate signed by the CA, and an agent's id must be one of its
  // certificate's names.
  TlsFiles tls;
  // Bearer tokens with roles, checked on every call; needs TLS.
  std::shared_ptr<TokenAuth> tokens;
  // Health watches and reflection streams, which anyone may open (no
  // token): each kind capped on its own, so a flood of one cannot keep a
  // load balancer's watch (or an operator's grpcurl) out.
  StreamLimits health_watches;
  StreamLimits reflection_streams;
};

// The credentials `opts` asks for (plaintext, TLS, mTLS; with the tokens'
// processor), or why they cannot be had.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const ServerOptions& opts);

class SchedulerServer {
 public:
  // Starts serving; the Engine must be started and outlive the server.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(engine::Engine* engine,
                                                                const ServerOptions& opts);
  ~SchedulerServer();

  int port() const { return port_; }
  grpc::Server* server() { return server_.get(); }
  const HealthService& health() const { return *health_; }
  const ReflectionService& reflection() const { return *reflection_; }
  // Stops taking RPCs, tells agents to reconnect (their streams end at
  // once), says NOT_SERVING to health watches (which then end), and
  // cancels what is still open after `deadline`.
  void Shutdown(absl::Duration deadline);

 private:
  SchedulerServer(engine::Engine* engine, bool bind_agent_ids, OutboxLimits agent_outbox,
                  const ReloadableTokens* tokens)
      : engine_(engine),
        tasks_(engine),
        agents_(engine, bind_agent_ids, agent_outbox, tokens),
        cluster_(engine),
        jobs_(engine),
        board_(engine, bind_agent_ids, tokens),
        schedules_(engine) {}
  engine::Engine* const engine_;
  TaskServiceImpl tasks_;
  AgentServiceImpl agents_;
  ClusterServiceImpl cluster_;
  JobServiceImpl jobs_;
  BoardServiceImpl board_;
  ScheduleServiceImpl schedules_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace taskgrid::service
