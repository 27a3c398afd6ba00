// BoardService (pull mode) over the callback API: thin handlers that pass
// each request to the Engine and finish the RPC from its reply, which
// comes after the change is durable. With client certificates (mTLS) a
// claim's owner must be one of the caller's certificate names, as an
// agent's id must: a worker cannot act for another. Thread-safe; the
// Engine is borrowed.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/engine/engine.h"
#include "scheduler/service/auth.h"
#include "taskgrid/v1/board_service.grpc.pb.h"

namespace taskgrid::service {

class BoardServiceImpl final : public v1::BoardService::CallbackService {
 public:
  // `bind_owners`: the server checks client certificates (mTLS), and an
  // owner must be one of the certificate's names. `tokens` (if not null):
  // the server checks tokens, and an owner must be one the caller's token
  // may act as.
  BoardServiceImpl(engine::Engine* engine, bool bind_owners,
                   const ReloadableTokens* tokens = nullptr)
      : engine_(engine), bind_owners_(bind_owners), tokens_(tokens) {}

  grpc::ServerUnaryReactor* Claim(grpc::CallbackServerContext* ctx, const v1::ClaimRequest* req,
                                  v1::ClaimResponse* resp) override;
  grpc::ServerUnaryReactor* ExtendClaim(grpc::CallbackServerContext* ctx,
                                        const v1::ExtendClaimRequest* req,
                                        v1::ExtendClaimResponse* resp) override;
  grpc::ServerUnaryReactor* CompleteClaim(grpc::CallbackServerContext* ctx,
                                          const v1::CompleteClaimRequest* req,
                                          v1::CompleteClaimResponse* resp) override;
  grpc::ServerUnaryReactor* AbandonClaim(grpc::CallbackServerContext* ctx,
                                         const v1::AbandonClaimRequest* req,
                                         v1::AbandonClaimResponse* resp) override;
  grpc::ServerUnaryReactor* TrashClaim(grpc::CallbackServerContext* ctx,
                                       const v1::TrashClaimRequest* req,
                                       v1::TrashClaimResponse* resp) override;
  grpc::ServerUnaryReactor* RestoreTask(grpc::CallbackServerContext* ctx,
                                        const v1::RestoreTaskRequest* req,
                                        v1::RestoreTaskResponse* resp) override;
  grpc::ServerUnaryReactor* WaitForWork(grpc::CallbackServerContext* ctx,
                                        const v1::WaitForWorkRequest* req,
                                        v1::WaitForWorkResponse* resp) override;

 private:
  // OK, or PERMISSION_DENIED when `owner` is not a name of the caller's
  // certificate (mTLS) or not one its token may act as (tokens).
  absl::Status CheckOwner(const grpc::CallbackServerContext* ctx, const std::string& owner) const;

  engine::Engine* const engine_;
  const bool bind_owners_;
  const ReloadableTokens* const tokens_;
};

}  // namespace taskgrid::service
