#include "scheduler/service/task_service.h"

#include <utility>

#include "scheduler/service/unary.h"

namespace taskgrid::service {

grpc::ServerUnaryReactor* TaskServiceImpl::SubmitTasks(grpc::CallbackServerContext* ctx,
                                                       const v1::SubmitTasksRequest* req,
                                                       v1::SubmitTasksResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->SubmitTasks(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::GetTask(grpc::CallbackServerContext* ctx,
                                                   const v1::GetTaskRequest* req, v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetTask(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::ListTasks(grpc::CallbackServerContext* ctx,
                                                     const v1::ListTasksRequest* req,
                                                     v1::ListTasksResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ListTasks(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::CancelTask(grpc::CallbackServerContext* ctx,
                                                      const v1::CancelTaskRequest* req,
                                                      v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->CancelTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::RetryTask(grpc::CallbackServerContext* ctx,
                                                     const v1::RetryTaskRequest* req,
                                                     v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->RetryTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::ResetTask(grpc::CallbackServerContext* ctx,
                                                     const v1::ResetTaskRequest* req,
                                                     v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ResetTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::PauseTask(grpc::CallbackServerContext* ctx,
                                                     const v1::PauseTaskRequest* req,
                                                     v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->PauseTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::ResumeTask(grpc::CallbackServerContext* ctx,
                                                      const v1::ResumeTaskRequest* req,
                                                      v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->ResumeTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::GetQueueStats(grpc::CallbackServerContext* ctx,
                                                         const v1::GetQueueStatsRequest* req,
                                                         v1::GetQueueStatsResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetQueueStats(*req, std::move(reply));
  return reactor;
}

}  // namespace taskgrid::service
