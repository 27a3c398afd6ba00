#include "scheduler/service/server.h"

#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/service/parse_errors.h"
#include "scheduler/service/request_counts.h"

namespace taskgrid::service {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const ServerOptions& opts) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!opts.tls.cert.empty() || !opts.tls.key.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls = ServerCredentials(opts.tls);
    if (!tls.ok()) return tls.status();
    creds = *std::move(tls);
  } else if (!opts.tls.ca.empty()) {
    return absl::InvalidArgumentError("--tls_ca needs --tls_cert and --tls_key");
  }
  if (opts.tokens != nullptr) {
    // gRPC runs the processor only on secure connections.
    if (opts.tls.cert.empty()) return absl::InvalidArgumentError("tokens need TLS (--tls_cert)");
    creds->SetAuthMetadataProcessor(opts.tokens);
  }
  return creds;
}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(engine::Engine* engine,
                                                                        const ServerOptions& opts) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ListenCredentials(opts);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<SchedulerServer> s(
      new SchedulerServer(engine, !opts.tls.ca.empty(), opts.agent_outbox,
                          opts.tokens == nullptr ? nullptr : &opts.tokens->tokens()));
  grpc::ServerBuilder builder;
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<ParseErrorInterceptorFactory>());
    // After it: counts the status it rewrote.
    creators.push_back(std::make_unique<RequestCountInterceptorFactory>(&GrpcRequests()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  builder.AddListeningPort(opts.listen, *creds, &s->port_);
  builder.SetMaxReceiveMessageSize(opts.max_message_bytes);
  builder.SetMaxSendMessageSize(opts.max_message_bytes + kReplyHeadroomBytes);
  // Agents send keepalive pings only after a stretch with nothing read (30 s
  // for taskgrid-agent, agent/agent.cc); gRPC's default would answer a
  // second ping within 5 minutes with no data sent meanwhile as abuse
  // (GOAWAY too_many_pings), which a long heartbeat interval can make
  // happen. Pings every 10 s or longer are fine.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Bandwidth-delay probing stays on. Off, it saved a ping per incoming
  // heartbeat (W6 at 10,000 agents: 11.8 -> 8.6 % of a core), but many
  // concurrent unary submits lost about a sixth (W1 64 in flight: 14,900
  // -> 12,300 /s, three alternating runs each), and the heartbeat rate
  // bound already keeps W6 far below its target.
  builder.RegisterService(&s->tasks_);
  builder.RegisterService(&s->agents_);
  builder.RegisterService(&s->cluster_);
  builder.RegisterService(&s->jobs_);
  builder.RegisterService(&s->board_);
  builder.RegisterService(&s->schedules_);
  // Health and reflection: ours, capped (gRPC's reflection plugin held a
  // thread per stream, and neither it nor the default health service
  // capped their streams).
  s->health_ = std::make_unique<HealthService>(true, opts.health_watches);
  builder.RegisterService(s->health_.get());
  std::vector<std::string> names = {
      v1::TaskService::service_full_name(),         v1::AgentService::service_full_name(),
      v1::ClusterService::service_full_name(),      v1::JobService::service_full_name(),
      v1::BoardService::service_full_name(),        v1::ScheduleService::service_full_name(),
      grpc::health::v1::Health::service_full_name()};
  for (std::string& name : ReflectionService::ServiceNames()) names.push_back(std::move(name));
  s->reflection_ = std::make_unique<ReflectionService>(std::move(names), opts.reflection_streams);
  s->reflection_->Register(builder);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opts.listen,
                                               " (in use, or not a HOST:PORT this host has)"));
  }
  return s;
}

void SchedulerServer::Shutdown(absl::Duration deadline) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  health_->SetServing(false);
  engine_->EndCalls(
      absl::UnavailableError("the scheduler is shutting down; reconnect to the next one"));
  // Watches end once they have said NOT_SERVING, so they do not hold the
  // shutdown up.
  health_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(deadline));
  server_->Wait();
}

SchedulerServer::~SchedulerServer() { Shutdown(absl::Seconds(1)); }

}  // namespace taskgrid::service
