#include "scheduler/service/board_service.h"

#include <memory>
#include <utility>

#include "common/grpc_status.h"
#include "common/tls.h"
#include "scheduler/service/auth.h"
#include "scheduler/service/long_poll.h"
#include "scheduler/service/unary.h"

namespace taskgrid::service {

absl::Status BoardServiceImpl::CheckOwner(const grpc::CallbackServerContext* ctx,
                                          const std::string& owner) const {
  if (!bind_owners_ && tokens_ == nullptr) return absl::OkStatus();
  return CallerIdentity::Of(*ctx, bind_owners_, tokens_).Check(owner, "owner");
}

namespace {
// Runs `call` unless the owner check failed, in which case the RPC ends
// with that error and nothing reaches the Engine.
template <typename Resp, typename Call>
grpc::ServerUnaryReactor* Checked(grpc::CallbackServerContext* ctx, Resp* resp,
                                  const absl::Status& owner_ok, Call call) {
  auto [reactor, reply] = Unary(ctx, resp);
  if (!owner_ok.ok()) {
    reply(owner_ok);
  } else {
    call(std::move(reply));
  }
  return reactor;
}
}  // namespace

grpc::ServerUnaryReactor* BoardServiceImpl::Claim(grpc::CallbackServerContext* ctx,
                                                  const v1::ClaimRequest* req,
                                                  v1::ClaimResponse* resp) {
  return Checked(ctx, resp, CheckOwner(ctx, req->owner()),
                 [&](auto reply) { engine_->Claim(*req, std::move(reply)); });
}

grpc::ServerUnaryReactor* BoardServiceImpl::ExtendClaim(grpc::CallbackServerContext* ctx,
                                                        const v1::ExtendClaimRequest* req,
                                                        v1::ExtendClaimResponse* resp) {
  return Checked(ctx, resp, CheckOwner(ctx, req->claim().owner()),
                 [&](auto reply) { engine_->ExtendClaim(*req, std::move(reply)); });
}

grpc::ServerUnaryReactor* BoardServiceImpl::CompleteClaim(grpc::CallbackServerContext* ctx,
                                                          const v1::CompleteClaimRequest* req,
                                                          v1::CompleteClaimResponse* resp) {
  return Checked(ctx, resp, CheckOwner(ctx, req->claim().owner()),
                 [&](auto reply) { engine_->CompleteClaim(*req, std::move(reply)); });
}

grpc::ServerUnaryReactor* BoardServiceImpl::AbandonClaim(grpc::CallbackServerContext* ctx,
                                                         const v1::AbandonClaimRequest* req,
                                                         v1::AbandonClaimResponse* resp) {
  return Checked(ctx, resp, CheckOwner(ctx, req->claim().owner()),
                 [&](auto reply) { engine_->AbandonClaim(*req, std::move(reply)); });
}

grpc::ServerUnaryReactor* BoardServiceImpl::TrashClaim(grpc::CallbackServerContext* ctx,
                                                       const v1::TrashClaimRequest* req,
                                                       v1::TrashClaimResponse* resp) {
  return Checked(ctx, resp, CheckOwner(ctx, req->claim().owner()),
                 [&](auto reply) { engine_->TrashClaim(*req, std::move(reply)); });
}

grpc::ServerUnaryReactor* BoardServiceImpl::RestoreTask(grpc::CallbackServerContext* ctx,
                                                        const v1::RestoreTaskRequest* req,
                                                        v1::RestoreTaskResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->RestoreTask(req->id(), [reply = std::move(reply)](absl::StatusOr<v1::Task> t) {
    if (!t.ok()) return reply(t.status());
    v1::RestoreTaskResponse r;
    *r.mutable_task() = std::move(*t);
    reply(std::move(r));
  });
  return reactor;
}

grpc::ServerUnaryReactor* BoardServiceImpl::WaitForWork(grpc::CallbackServerContext* ctx,
                                                        const v1::WaitForWorkRequest* req,
                                                        v1::WaitForWorkResponse* resp) {
  auto* call = new LongPoll<v1::WaitForWorkResponse>(
      resp, [engine = engine_](uint64_t waiter) { engine->CancelWorkWait(waiter); });
  call->Registered(engine_->WaitForWork(*req, LongPollWait(ctx, req->timeout()), call->Reply()));
  return call;
}

}  // namespace taskgrid::service
