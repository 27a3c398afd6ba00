#include "scheduler/service/health_service.h"

#include <string>

namespace taskgrid::service {

namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A refused watch: ends at once with `status`.
class Refused final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit Refused(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// One Watch. Writes the status it is told of, one write at a time: a
// change that comes while a write is in flight is sent after it (only the
// latest, as gRPC's service does). Registered with the service from
// construction to OnDone; the service's mu_ is held when it is told of a
// change and when it leaves, so it is never told after it is gone.
class HealthService::WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  // Needs service->mu_.
  WatchReactor(HealthService* service, std::string peer, bool known,
               HealthCheckResponse::ServingStatus status)
      : service_(service), peer_(std::move(peer)), known_(known) {
    Tell(known ? status : HealthCheckResponse::SERVICE_UNKNOWN, false);
  }

  // The status now, and whether the service shut down. Needs service_->mu_.
  void Tell(HealthCheckResponse::ServingStatus status, bool shut_down) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!known_) status = HealthCheckResponse::SERVICE_UNKNOWN;
    want_ = status;
    shut_down_ = shut_down;
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> service_lock(service_->mu_);
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watch went away"));
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->mu_);
      service_->watches_.erase(this);
    }
    service_->caps_.Give(peer_);
    delete this;
  }

 private:
  // Writes want_ if it is not what was written last; after shutdown, ends
  // the call once it is.
  void MaybeWriteLocked() {
    if (writing_ || finished_) return;
    if (!sent_any_ || want_ != sent_) {
      sent_ = want_;
      sent_any_ = true;
      resp_.set_status(want_);
      writing_ = true;
      StartWrite(&resp_);
      return;
    }
    if (shut_down_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the server is shutting down"));
    }
  }

  void FinishLocked(const grpc::Status& s) {
    if (finished_) return;
    finished_ = true;
    Finish(s);
  }

  HealthService* const service_;
  const std::string peer_;
  const bool known_;  // the overall status "" was asked for
  std::mutex mu_;
  HealthCheckResponse resp_;                                                // guarded by mu_
  HealthCheckResponse::ServingStatus want_ = HealthCheckResponse::UNKNOWN;  // guarded by mu_
  HealthCheckResponse::ServingStatus sent_ = HealthCheckResponse::UNKNOWN;  // guarded by mu_
  bool sent_any_ = false;                                                   // guarded by mu_
  bool writing_ = false;                                                    // guarded by mu_
  bool shut_down_ = false;                                                  // guarded by mu_
  bool finished_ = false;                                                   // guarded by mu_
};

HealthService::HealthService(bool serving, StreamLimits limits)
    : caps_("health watches", limits), serving_(serving) {}

HealthService::~HealthService() = default;

HealthCheckResponse::ServingStatus HealthService::StatusLocked() const {
  return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_ || serving_ == serving) return;
  serving_ = serving;
  for (WatchReactor* w : watches_) w->Tell(StatusLocked(), false);
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = false;
  shut_down_ = true;
  for (WatchReactor* w : watches_) w->Tell(StatusLocked(), true);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* req,
                                               HealthCheckResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!req->service().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown"));
    return reactor;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    resp->set_status(StatusLocked());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* ctx, const HealthCheckRequest* req) {
  std::string peer = ctx->peer();
  grpc::Status taken = caps_.Take(peer);
  if (!taken.ok()) return new Refused(taken);
  std::lock_guard<std::mutex> lock(mu_);
  auto* w = new WatchReactor(this, std::move(peer), req->service().empty(), StatusLocked());
  watches_.insert(w);
  if (shut_down_) w->Tell(StatusLocked(), true);
  return w;
}

}  // namespace taskgrid::service
