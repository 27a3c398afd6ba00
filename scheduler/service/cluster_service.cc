#include "scheduler/service/cluster_service.h"

#include "scheduler/service/unary.h"

namespace taskgrid::service {

grpc::ServerUnaryReactor* ClusterServiceImpl::ListAgents(grpc::CallbackServerContext* ctx,
                                                         const v1::ListAgentsRequest*,
                                                         v1::ListAgentsResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ListAgents(std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::DrainAgent(grpc::CallbackServerContext* ctx,
                                                         const v1::DrainAgentRequest* req,
                                                         v1::Agent* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DrainAgent(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::UndrainAgent(grpc::CallbackServerContext* ctx,
                                                           const v1::UndrainAgentRequest* req,
                                                           v1::Agent* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->UndrainAgent(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::GetClusterStats(grpc::CallbackServerContext* ctx,
                                                              const v1::GetClusterStatsRequest*,
                                                              v1::ClusterStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetClusterStats(std::move(reply));
  return reactor;
}

}  // namespace taskgrid::service
