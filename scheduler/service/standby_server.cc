#include "scheduler/service/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace taskgrid::service {

class StandbyServer::Service : public grpc::CallbackGenericService {
 public:
  void SetLeader(const std::string& address, int64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    leader_ = address;
    epoch_ = epoch;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    std::string leader;
    grpc::Status st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leader = leader_;
      st = leader_.empty()
               ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "this scheduler is a standby taking over as the leader; try again "
                              "in a moment")
               : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("this scheduler is a standby; the leader is at ",
                                           leader_, " (lease epoch ", epoch_, ")"));
    }
    return new Answer(ctx, st, leader);
  }

 private:
  // Answers at once; nothing the caller sends is read.
  class Answer : public grpc::ServerGenericBidiReactor {
   public:
    Answer(grpc::GenericCallbackServerContext* ctx, const grpc::Status& st,
           const std::string& leader) {
      ctx->AddTrailingMetadata(kStandbyKey, "1");
      if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderKey, leader);
      Finish(st);
    }
    void OnDone() override { delete this; }
  };

  std::mutex mu_;
  std::string leader_;  // guarded by mu_
  int64_t epoch_ = 0;   // guarded by mu_
};

namespace {

std::vector<std::string> StandbyServiceNames() {
  std::vector<std::string> names = ReflectionService::ServiceNames();
  names.insert(names.begin(), grpc::health::v1::Health::service_full_name());
  return names;
}

}  // namespace

StandbyServer::StandbyServer(const ServerOptions& opts)
    : service_(std::make_unique<Service>()),
      health_(false, opts.health_watches),
      reflection_(StandbyServiceNames(), opts.reflection_streams) {}

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(const ServerOptions& opts) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ListenCredentials(opts);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<StandbyServer> s(new StandbyServer(opts));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(opts.listen, *creds, &s->port_);
  // As the real server: a request it would take is answered UNAVAILABLE
  // here, not refused for its size.
  builder.SetMaxReceiveMessageSize(opts.max_message_bytes);
  // Agents' keepalive pings, as the real server allows them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // NOT_SERVING for as long as it stands by.
  builder.RegisterService(&s->health_);
  s->reflection_.Register(builder);
  builder.RegisterCallbackGenericService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opts.listen,
                                               " (in use, or not a HOST:PORT this host has)"));
  }
  return s;
}

void StandbyServer::SetLeader(const std::string& address, int64_t epoch) {
  service_->SetLeader(address, epoch);
}

void StandbyServer::Shutdown() {
  if (server_ == nullptr) return;
  health_.Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
}

StandbyServer::~StandbyServer() { Shutdown(); }

}  // namespace taskgrid::service
