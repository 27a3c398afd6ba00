// grpc.health.v1.Health on the callback API: Check, and Watch as a write
// reactor (no thread per stream) that sends the status at once and then
// each change. As gRPC's default service (which this replaces: it capped
// no watches, each some 15 KB): only the overall status ""
// is known, Check of another name is NOT_FOUND and Watch of one answers
// SERVICE_UNKNOWN; after Shutdown the status is NOT_SERVING for good and
// the open watches end (CANCELLED) once they have said so.
//
// Watches are capped (stream_caps.h): past `limits`, RESOURCE_EXHAUSTED.
//
// Thread-safe. Must outlive the server it is registered with; call
// Shutdown before the server's, so open watches do not hold it up.
#pragma once

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <set>

#include "grpc/health/v1/health.grpc.pb.h"
#include "scheduler/service/stream_caps.h"

namespace taskgrid::service {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  HealthService(bool serving, StreamLimits limits);
  ~HealthService() override;

  // The overall status; every watch is sent the change. Ignored after
  // Shutdown.
  void SetServing(bool serving);
  // NOT_SERVING from now on; each open watch ends after writing it.
  void Shutdown();

  const StreamCaps& watches() const { return caps_; }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req) override;

 private:
  class WatchReactor;

  grpc::health::v1::HealthCheckResponse::ServingStatus StatusLocked() const;

  StreamCaps caps_;
  std::mutex mu_;                    // before any WatchReactor's
  bool serving_;                     // guarded by mu_
  bool shut_down_ = false;           // guarded by mu_
  std::set<WatchReactor*> watches_;  // guarded by mu_
};

}  // namespace taskgrid::service
