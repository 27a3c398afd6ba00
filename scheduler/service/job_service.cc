#include "scheduler/service/job_service.h"

#include "scheduler/service/unary.h"

namespace taskgrid::service {

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitJobRequest* req,
                                                    v1::Job* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->SubmitJob(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req, v1::Job* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetJob(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ListJobs(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->CancelJob(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::RetryJob(grpc::CallbackServerContext* ctx,
                                                   const v1::RetryJobRequest* req, v1::Job* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->RetryJob(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::DeleteJob(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteJobRequest* req,
                                                    v1::DeleteJobResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DeleteJob(req->id(), std::move(reply));
  return reactor;
}

}  // namespace taskgrid::service
