// TaskService over the callback API: thin handlers that pass each request to
// the Engine and finish the RPC from the Engine's reply (which comes after
// the change is durable). Thread-safe; the Engine is borrowed.
#pragma once

#include "scheduler/engine/engine.h"
#include "taskgrid/v1/task_service.grpc.pb.h"

namespace taskgrid::service {

class TaskServiceImpl final : public v1::TaskService::CallbackService {
 public:
  explicit TaskServiceImpl(engine::Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* SubmitTasks(grpc::CallbackServerContext* ctx,
                                        const v1::SubmitTasksRequest* req,
                                        v1::SubmitTasksResponse* resp) override;
  grpc::ServerUnaryReactor* GetTask(grpc::CallbackServerContext* ctx, const v1::GetTaskRequest* req,
                                    v1::Task* resp) override;
  grpc::ServerUnaryReactor* ListTasks(grpc::CallbackServerContext* ctx,
                                      const v1::ListTasksRequest* req,
                                      v1::ListTasksResponse* resp) override;
  grpc::ServerUnaryReactor* CancelTask(grpc::CallbackServerContext* ctx,
                                       const v1::CancelTaskRequest* req, v1::Task* resp) override;
  grpc::ServerUnaryReactor* RetryTask(grpc::CallbackServerContext* ctx,
                                      const v1::RetryTaskRequest* req, v1::Task* resp) override;
  grpc::ServerUnaryReactor* ResetTask(grpc::CallbackServerContext* ctx,
                                      const v1::ResetTaskRequest* req, v1::Task* resp) override;
  grpc::ServerUnaryReactor* PauseTask(grpc::CallbackServerContext* ctx,
                                      const v1::PauseTaskRequest* req, v1::Task* resp) override;
  grpc::ServerUnaryReactor* ResumeTask(grpc::CallbackServerContext* ctx,
                                       const v1::ResumeTaskRequest* req, v1::Task* resp) override;
  grpc::ServerUnaryReactor* GetQueueStats(grpc::CallbackServerContext* ctx,
                                          const v1::GetQueueStatsRequest* req,
                                          v1::GetQueueStatsResponse* resp) override;
  grpc::ServerUnaryReactor* WaitTask(grpc::CallbackServerContext* ctx,
                                     const v1::WaitTaskRequest* req,
                                     v1::WaitTaskResponse* resp) override;
  grpc::ServerUnaryReactor* PauseQueue(grpc::CallbackServerContext* ctx,
                                       const v1::PauseQueueRequest* req,
                                       v1::QueueStats* resp) override;
  grpc::ServerUnaryReactor* ResumeQueue(grpc::CallbackServerContext* ctx,
                                        const v1::ResumeQueueRequest* req,
                                        v1::QueueStats* resp) override;
  grpc::ServerUnaryReactor* SetQueueLimits(grpc::CallbackServerContext* ctx,
                                           const v1::SetQueueLimitsRequest* req,
                                           v1::QueueStats* resp) override;
  grpc::ServerUnaryReactor* SetQueueWeight(grpc::CallbackServerContext* ctx,
                                           const v1::SetQueueWeightRequest* req,
                                           v1::QueueStats* resp) override;
  grpc::ServerUnaryReactor* CancelTasks(grpc::CallbackServerContext* ctx,
                                        const v1::BulkTasksRequest* req,
                                        v1::BulkTasksResponse* resp) override;
  grpc::ServerUnaryReactor* RetryTasks(grpc::CallbackServerContext* ctx,
                                       const v1::BulkTasksRequest* req,
                                       v1::BulkTasksResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTask(grpc::CallbackServerContext* ctx,
                                       const v1::DeleteTaskRequest* req,
                                       v1::DeleteTaskResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTasks(grpc::CallbackServerContext* ctx,
                                        const v1::BulkTasksRequest* req,
                                        v1::BulkTasksResponse* resp) override;
  grpc::ServerUnaryReactor* SetQueueRetention(grpc::CallbackServerContext* ctx,
                                              const v1::SetQueueRetentionRequest* req,
                                              v1::QueueStats* resp) override;
  grpc::ServerUnaryReactor* DeleteByMergeKey(grpc::CallbackServerContext* ctx,
                                             const v1::DeleteByMergeKeyRequest* req,
                                             v1::Task* resp) override;
  grpc::ServerWriteReactor<v1::TaskEvent>* WatchTasks(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchTasksRequest* req) override;
  grpc::ServerWriteReactor<v1::StreamTaskOutputResponse>* StreamTaskOutput(
      grpc::CallbackServerContext* ctx, const v1::StreamTaskOutputRequest* req) override;

 private:
  engine::Engine* const engine_;
};

}  // namespace taskgrid::service
