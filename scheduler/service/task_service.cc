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

// One WatchTasks stream.
// Lifecycle: 1. created: subscribe (an error finishes at once);
// 2. SendMore(): take the next events from the Watch and write them one at a
// time; when there are none, wait for the Watch's wake (a commit brought
// some); 3. a Watch error (too slow) finishes with it; the client's cancel
// finishes; 4. OnDone: unsubscribe, cut the wake handle, delete.
class WatchStream final : public grpc::ServerWriteReactor<v1::TaskEvent> {
 public:
  WatchStream(engine::Engine* engine, grpc::CallbackServerContext* ctx,
              const v1::WatchTasksRequest& req)
      : engine_(engine), ctx_(ctx), handle_(std::make_shared<Handle>()) {
    handle_->stream = this;
    auto watch = engine_->StartWatch(req, [handle = handle_] {
      std::lock_guard<std::mutex> lock(handle->mu);
      if (handle->stream != nullptr) handle->stream->SendMore();
    });
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
    std::lock_guard<std::mutex> lock(handle_->mu);
    SendMore();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
        return;
      }
      watch_->Sent(batch_[next_].revision());
      if (++next_ < batch_.size()) {
        StartWrite(&batch_[next_]);
        return;
      }
      writing_ = false;
    }
    std::lock_guard<std::mutex> lock(handle_->mu);
    SendMore();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(handle_->mu);
      handle_->stream = nullptr;
    }
    if (watch_) engine_->StopWatch(watch_);
    delete this;
  }

 private:
  struct Handle {
    std::mutex mu;  // held while a wake runs, so OnDone waits for it
    WatchStream* stream = nullptr;
  };

  // Ends the watch with `why`; where it may resume goes along as trailing
  // metadata (the message names it too, for people). Needs mu_.
  void FailLocked(const absl::Status& why) {
    if (const std::optional<int64_t> after = engine::ResumeAfterOf(why)) {
      ctx_->AddTrailingMetadata(kResumeAfterKey, absl::StrCat(*after));
    }
    FinishLocked(ToGrpcStatus(why));
  }

  // Needs handle_->mu.
  void SendMore() {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finished_) return;
    auto next = watch_->Next(64);
    if (!next.ok()) {
      FailLocked(next.status());
      return;
    }
    if (next->empty()) return;  // the Watch wakes us when a commit brings events
    batch_ = std::move(*next);
    next_ = 0;
    writing_ = true;
    StartWrite(&batch_[0]);
  }

  void FinishLocked(const grpc::Status& s) {
    if (finished_) return;
    finished_ = true;
    Finish(s);
  }

  engine::Engine* const engine_;
  grpc::CallbackServerContext* const ctx_;
  std::shared_ptr<Handle> handle_;
  std::shared_ptr<engine::Watch> watch_;
  std::mutex mu_;
  std::vector<v1::TaskEvent> batch_;  // guarded by mu_
  size_t next_ = 0;                   // guarded by mu_
  bool writing_ = false;              // guarded by mu_
  bool finished_ = false;             // guarded by mu_
};

// One StreamTaskOutput stream, built as WatchStream is.
// Lifecycle: 1. created: follow (an error finishes at once); 2. SendMore():
// take the next messages from the relay and write them one at a time; when
// there are none, wait for the follower's wake (output came, the attempt
// or the task changed); 3. the relay says that was all: finish OK; a relay
// error (too slow, the server stops) finishes with it; so does the
// client's cancel; 4. OnDone: stop following, cut the wake handle, delete.
class OutputFollowStream final : public grpc::ServerWriteReactor<v1::StreamTaskOutputResponse> {
 public:
  OutputFollowStream(engine::Engine* engine, const v1::StreamTaskOutputRequest& req)
      : engine_(engine), handle_(std::make_shared<Handle>()) {
    handle_->stream = this;
    auto follower = engine_->StartOutput(req, [handle = handle_] {
      std::lock_guard<std::mutex> lock(handle->mu);
      if (handle->stream != nullptr) handle->stream->SendMore();
    });
    if (!follower.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(ToGrpcStatus(follower.status()));
      return;
    }
    follower_ = *follower;
    std::lock_guard<std::mutex> lock(handle_->mu);
    SendMore();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the follower went away"));
        return;
      }
      if (++next_ < batch_.size()) {
        StartWrite(&batch_[next_]);
        return;
      }
      writing_ = false;
      if (done_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
    }
    std::lock_guard<std::mutex> lock(handle_->mu);
    SendMore();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(handle_->mu);
      handle_->stream = nullptr;
    }
    if (follower_) engine_->StopOutput(follower_);
    delete this;
  }

 private:
  struct Handle {
    std::mutex mu;  // held while a wake runs, so OnDone waits for it
    OutputFollowStream* stream = nullptr;
  };

  // About this much output per turn: a few messages of at most 64 KiB.
  static constexpr size_t kTurnBytes = 256 << 10;

  // Needs handle_->mu.
  void SendMore() {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finished_) return;
    auto next = engine_->NextOutput(follower_, kTurnBytes);
    if (!next.ok()) {
      FinishLocked(ToGrpcStatus(next.status()));
      return;
    }
    done_ = next->done;
    if (next->msgs.empty()) {
      // Nothing now: the relay wakes us when something comes.
      if (done_) FinishLocked(grpc::Status::OK);
      return;
    }
    batch_ = std::move(next->msgs);
    next_ = 0;
    writing_ = true;
    StartWrite(&batch_[0]);
  }

  void FinishLocked(const grpc::Status& s) {
    if (finished_) return;
    finished_ = true;
    Finish(s);
  }

  engine::Engine* const engine_;
  std::shared_ptr<Handle> handle_;
  std::shared_ptr<engine::OutputFollower> follower_;
  std::mutex mu_;
  std::vector<v1::StreamTaskOutputResponse> batch_;  // guarded by mu_
  size_t next_ = 0;                                  // guarded by mu_
  bool writing_ = false;                             // guarded by mu_
  bool done_ = false;                                // guarded by mu_: the batch is the last
  bool finished_ = false;                            // guarded by mu_
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
