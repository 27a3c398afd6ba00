// The shape every unary handler shares: the RPC is finished from the
// Engine's reply, which comes after the change is durable.
#pragma once

#include <grpcpp/grpcpp.h>

#include <utility>

#include "common/grpc_status.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::service {

// Returns the reactor, and a reply that fills `resp` and finishes it.
template <typename Resp>
std::pair<grpc::ServerUnaryReactor*, engine::Engine::Reply<Resp>> Unary(
    grpc::CallbackServerContext* ctx, Resp* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  return {reactor, [reactor, resp](absl::StatusOr<Resp> r) {
            if (r.ok()) *resp = std::move(*r);
            reactor->Finish(ToGrpcStatus(r.status()));
          }};
}

}  // namespace taskgrid::service
