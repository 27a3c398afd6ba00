#include "scheduler/service/task_service.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/proto_time.h"
#include "scheduler/service/long_poll.h"
#include "scheduler/service/pump_stream.h"
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

grpc::ServerUnaryReactor* TaskServiceImpl::DeleteByMergeKey(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteByMergeKeyRequest* req,
                                                            v1::Task* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DeleteByMergeKey(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::PauseQueue(grpc::CallbackServerContext* ctx,
                                                      const v1::PauseQueueRequest* req,
                                                      v1::QueueStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->PauseQueue(req->queue(), /*paused=*/true, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::ResumeQueue(grpc::CallbackServerContext* ctx,
                                                       const v1::ResumeQueueRequest* req,
                                                       v1::QueueStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->PauseQueue(req->queue(), /*paused=*/false, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::SetQueueLimits(grpc::CallbackServerContext* ctx,
                                                          const v1::SetQueueLimitsRequest* req,
                                                          v1::QueueStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->SetQueueLimits(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::SetQueueWeight(grpc::CallbackServerContext* ctx,
                                                          const v1::SetQueueWeightRequest* req,
                                                          v1::QueueStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->SetQueueWeight(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::CancelTasks(grpc::CallbackServerContext* ctx,
                                                       const v1::BulkTasksRequest* req,
                                                       v1::BulkTasksResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->CancelTasks(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::RetryTasks(grpc::CallbackServerContext* ctx,
                                                      const v1::BulkTasksRequest* req,
                                                      v1::BulkTasksResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->RetryTasks(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::DeleteTask(grpc::CallbackServerContext* ctx,
                                                      const v1::DeleteTaskRequest* req,
                                                      v1::DeleteTaskResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DeleteTask(req->id(), std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::DeleteTasks(grpc::CallbackServerContext* ctx,
                                                       const v1::BulkTasksRequest* req,
                                                       v1::BulkTasksResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->DeleteTasks(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::SetQueueRetention(
    grpc::CallbackServerContext* ctx, const v1::SetQueueRetentionRequest* req,
    v1::QueueStats* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->SetQueueRetention(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::GetQueueStats(grpc::CallbackServerContext* ctx,
                                                         const v1::GetQueueStatsRequest* req,
                                                         v1::GetQueueStatsResponse* resp) {
  auto [reactor, reply] = Unary(ctx, resp);
  engine_->GetQueueStats(*req, std::move(reply));
  return reactor;
}

grpc::ServerUnaryReactor* TaskServiceImpl::WaitTask(grpc::CallbackServerContext* ctx,
                                                    const v1::WaitTaskRequest* req,
                                                    v1::WaitTaskResponse* resp) {
  auto* call = new LongPoll<v1::WaitTaskResponse>(
      resp, [engine = engine_](uint64_t waiter) { engine->CancelWait(waiter); });
  call->Registered(engine_->WaitTask(req->id(), LongPollWait(ctx, req->timeout()), call->Reply()));
  return call;
}

namespace {

// One WatchTasks stream: the events of a Watch, which wakes it when a
// commit brings some; a Watch error (too slow) ends it, with where it may
// resume as trailing metadata.
class WatchStream final : public PumpStream<v1::TaskEvent> {
 public:
  WatchStream(engine::Engine* engine, grpc::CallbackServerContext* ctx,
              const v1::WatchTasksRequest& req)
      : PumpStream("the watcher went away"), engine_(engine), ctx_(ctx) {
    auto watch = engine_->StartWatch(req, Waker());
    if (!watch.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(watch.status());
      return;
    }
    watch_ = *watch;
    // The client learns that its watch is registered (every change committed
    // from now on reaches it), and where it starts.
    ctx_->AddInitialMetadata(kWatchStartsAfterKey, absl::StrCat(watch_->starts_after()));
    StartSendInitialMetadata();
    Start();
  }

 private:
  absl::StatusOr<Turn> NextTurn() override {
    auto next = watch_->Next(64);
    if (!next.ok()) return next.status();
    return Turn{std::move(*next), false};
  }

  void Sent(const v1::TaskEvent& event) override { watch_->Sent(event.revision()); }

  // Where the watch may resume goes along as trailing metadata (the message
  // names it too, for people).
  grpc::Status Failed(const absl::Status& why) override {
    if (const std::optional<int64_t> after = engine::ResumeAfterOf(why)) {
      ctx_->AddTrailingMetadata(kResumeAfterKey, absl::StrCat(*after));
    }
    return ToGrpcStatus(why);
  }

  void Stop() override {
    if (watch_) engine_->StopWatch(watch_);
  }

  engine::Engine* const engine_;
  grpc::CallbackServerContext* const ctx_;
  std::shared_ptr<engine::Watch> watch_;
};

// One StreamTaskOutput stream: the output of a task's attempt from the
// relay, which wakes it when output comes or the attempt or task changes;
// ends OK when the relay says that was all, or with the relay's error (too
// slow, the server stops).
class OutputFollowStream final : public PumpStream<v1::StreamTaskOutputResponse> {
 public:
  OutputFollowStream(engine::Engine* engine, const v1::StreamTaskOutputRequest& req)
      : PumpStream("the follower went away"), engine_(engine) {
    auto follower = engine_->StartOutput(req, Waker());
    if (!follower.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(follower.status());
      return;
    }
    follower_ = *follower;
    Start();
  }

 private:
  // About this much output per turn: a few messages of at most 64 KiB.
  static constexpr size_t kTurnBytes = 256 << 10;

  absl::StatusOr<Turn> NextTurn() override {
    auto next = engine_->NextOutput(follower_, kTurnBytes);
    if (!next.ok()) return next.status();
    return Turn{std::move(next->msgs), next->done};
  }

  void Stop() override {
    if (follower_) engine_->StopOutput(follower_);
  }

  engine::Engine* const engine_;
  std::shared_ptr<engine::OutputFollower> follower_;
};

}  // namespace

grpc::ServerWriteReactor<v1::StreamTaskOutputResponse>* TaskServiceImpl::StreamTaskOutput(
    grpc::CallbackServerContext* /*ctx*/, const v1::StreamTaskOutputRequest* req) {
  return new OutputFollowStream(engine_, *req);
}

grpc::ServerWriteReactor<v1::TaskEvent>* TaskServiceImpl::WatchTasks(
    grpc::CallbackServerContext* ctx, const v1::WatchTasksRequest* req) {
  return new WatchStream(engine_, ctx, *req);
}

}  // namespace taskgrid::service
