// ClusterService over the callback API: the agent pool, thin handlers over
// the Engine. Thread-safe; the Engine is borrowed.
#pragma once

#include "scheduler/engine/engine.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"

namespace taskgrid::service {

class ClusterServiceImpl final : public v1::ClusterService::CallbackService {
 public:
  explicit ClusterServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* ListAgents(grpc::CallbackServerContext* ctx,
                                       const v1::ListAgentsRequest* req,
                                       v1::ListAgentsResponse* resp) override;
  grpc::ServerUnaryReactor* DrainAgent(grpc::CallbackServerContext* ctx,
                                       const v1::DrainAgentRequest* req, v1::Agent* resp) override;
  grpc::ServerUnaryReactor* UndrainAgent(grpc::CallbackServerContext* ctx,
                                         const v1::UndrainAgentRequest* req,
                                         v1::Agent* resp) override;
  grpc::ServerUnaryReactor* GetClusterStats(grpc::CallbackServerContext* ctx,
                                            const v1::GetClusterStatsRequest* req,
                                            v1::ClusterStats* resp) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace taskgrid::service
