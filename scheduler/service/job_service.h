// JobService over the callback API: thin handlers over the Engine.
// Thread-safe; the Engine is borrowed.
#pragma once

#include "scheduler/engine/engine.h"
#include "taskgrid/v1/job_service.grpc.pb.h"

namespace taskgrid::service {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* RetryJob(grpc::CallbackServerContext* ctx,
                                     const v1::RetryJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace taskgrid::service
