// taskgridctl board ...: the BoardService calls (pull mode).

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/client.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

namespace {
// "ID STATE", or the JSON of the whole answer.
template <typename Resp>
void PrintTaskState(const Resp& resp, bool json) {
  if (json) {
    std::cout << ToJson(resp);
  } else {
    std::cout << resp.task().spec().id() << " " << core::StateName(resp.task().state()) << "\n";
  }
}
}  // namespace

int Client::BoardClaim(const v1::ClaimRequest& req) {
  v1::ClaimResponse resp;
  // A claim made twice holds two tasks: never repeated once sent.
  if (!Call([&](grpc::ClientContext* ctx) { return board_stub_->Claim(ctx, req, &resp); },
            /*repeatable=*/false)) {
    return kExitRpcFailed;
  }
  std::cout << (opts_.json ? ToJson(resp) : FormatClaims(resp));
  return kExitOk;
}

int Client::BoardExtend(const v1::ExtendClaimRequest& req) {
  v1::ExtendClaimResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return board_stub_->ExtendClaim(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  if (opts_.json) {
    std::cout << ToJson(resp);
  } else {
    std::cout << req.claim().task_id() << " attempt " << req.claim().attempt() << " claimed by "
              << req.claim().owner() << " until " << FormatTime(resp.expire_time()) << "\n";
  }
  return kExitOk;
}

int Client::BoardComplete(const v1::CompleteClaimRequest& req) {
  v1::CompleteClaimResponse resp;
  if (!Call(
          [&](grpc::ClientContext* ctx) { return board_stub_->CompleteClaim(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  PrintTaskState(resp, opts_.json);
  return kExitOk;
}

int Client::BoardAbandon(const v1::AbandonClaimRequest& req) {
  v1::AbandonClaimResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return board_stub_->AbandonClaim(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  PrintTaskState(resp, opts_.json);
  return kExitOk;
}

int Client::BoardTrash(const v1::TrashClaimRequest& req) {
  v1::TrashClaimResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return board_stub_->TrashClaim(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  PrintTaskState(resp, opts_.json);
  return kExitOk;
}

int Client::BoardRestore(const std::string& id) {
  v1::RestoreTaskRequest req;
  req.set_id(id);
  v1::RestoreTaskResponse resp;
  if (!Call([&](grpc::ClientContext* ctx) { return board_stub_->RestoreTask(ctx, req, &resp); })) {
    return kExitRpcFailed;
  }
  PrintTaskState(resp, opts_.json);
  return kExitOk;
}

int Client::BoardWait(const v1::WaitForWorkRequest& req) {
  v1::WaitForWorkResponse resp;
  grpc::ClientContext ctx;
  // The wait itself, plus --timeout for the call to come and go.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + FromProto(req.timeout()) + opts_.timeout));
  const grpc::Status s = board_stub_->WaitForWork(&ctx, req, &resp);
  if (!s.ok()) {
    Report(s);
    return kExitRpcFailed;
  }
  if (opts_.json) {
    std::cout << ToJson(resp);
  } else {
    std::cout << resp.ready() << " ready\n";
  }
  return resp.ready() > 0 ? kExitOk : kExitWaitTimedOut;
}

}  // namespace taskgrid::ctl
