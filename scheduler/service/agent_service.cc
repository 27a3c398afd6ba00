#include "scheduler/service/agent_service.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "common/grpc_status.h"

namespace taskgrid::service {

namespace {

using Reactor = grpc::ServerBidiReactor<v1::AgentMessage, v1::SchedulerMessage>;

// Logs the interval agents are told when it changed (as agents come and go).
void LogHeartbeatInterval(const engine::Engine& engine) {
  static std::atomic<int64_t> logged_ns{0};
  const absl::Duration now = engine.heartbeat_interval();
  const int64_t ns = absl::ToInt64Nanoseconds(now);
  int64_t prev = logged_ns.load();
  if (ns == prev || !logged_ns.compare_exchange_strong(prev, ns)) return;
  // The first value is the configured one: worth no line.
  if (prev != 0) {
    spdlog::info("agents are now told to heartbeat every {} (was {})", absl::FormatDuration(now),
                 absl::FormatDuration(absl::Nanoseconds(prev)));
  }
}

// The Engine's handle on one stream. Outlives the reactor: after Detach()
// every Send is dropped.
class Outbox final : public engine::AgentChannel {
 public:
  explicit Outbox(Reactor* reactor) : reactor_(reactor) {}

  void Send(const v1::SchedulerMessage& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    queue_.push_back(msg);
    if (!writing_) {
      writing_ = true;
      reactor_->StartWrite(&queue_.front());
    }
  }

  void Close(const absl::Status& why) override { Finish(ToGrpcStatus(why)); }

  // Finishes the stream, after the write in flight if there is one.
  void Finish(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    finish_ = status;
    if (!writing_) reactor_->Finish(status);
  }

  // From OnWriteDone.
  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    if (reactor_ == nullptr) return;
    if (!ok) {
      // The stream is broken; OnDone follows once it is finished. A Finish
      // that waited for this write is due now too: without it the reactor
      // never finishes and the server's shutdown waits for it forever.
      queue_.clear();
      writing_ = false;
      if (!finish_.has_value()) {
        finish_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
      }
      reactor_->Finish(*finish_);
      return;
    }
    if (finish_.has_value()) {
      writing_ = false;
      reactor_->Finish(*finish_);
    } else if (!queue_.empty()) {
      reactor_->StartWrite(&queue_.front());
    } else {
      writing_ = false;
    }
  }

  // From OnDone: the reactor is about to be deleted.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

 private:
  std::mutex mu_;
  Reactor* reactor_;                        // guarded by mu_; null after Detach
  std::deque<v1::SchedulerMessage> queue_;  // guarded by mu_; front() is in flight
  bool writing_ = false;                    // guarded by mu_
  std::optional<grpc::Status> finish_;      // guarded by mu_
};

class AgentStream final : public Reactor {
 public:
  AgentStream(engine::Engine* engine, std::string peer)
      : engine_(engine), peer_(std::move(peer)), outbox_(std::make_shared<Outbox>(this)) {
    conn_ = engine_->AttachAgent(outbox_);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_->Finish(grpc::Status::OK);
      return;
    }
    if (!hello_seen_) {
      if (!in_.has_hello()) {
        outbox_->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "the first message on a stream must be hello"));
        return;
      }
      absl::Status s = engine_->AgentHello(conn_, in_.hello());
      if (!s.ok()) {
        spdlog::warn("agent stream from {} refused: {}", peer_, s.ToString());
        outbox_->Finish(ToGrpcStatus(s));
        return;
      }
      hello_seen_ = true;
      agent_id_ = in_.hello().agent_id();
      spdlog::info("agent {} connected from {} with {} slots", agent_id_, peer_,
                   in_.hello().slots());
      LogHeartbeatInterval(*engine_);
    } else if (in_.has_hello()) {
      outbox_->Finish(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "hello may be sent once per stream"));
      return;
    } else {
      engine_->AgentMessage(conn_, in_);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { outbox_->WriteDone(ok); }

  void OnDone() override {
    if (hello_seen_) spdlog::info("agent {} disconnected", agent_id_);
    engine_->DetachAgent(conn_);
    LogHeartbeatInterval(*engine_);
    outbox_->Detach();
    delete this;
  }

 private:
  engine::Engine* const engine_;
  const std::string peer_;
  std::shared_ptr<Outbox> outbox_;
  uint64_t conn_ = 0;
  bool hello_seen_ = false;  // touched only by reactions, which do not overlap for reads
  std::string agent_id_;
  v1::AgentMessage in_;
};

}  // namespace

Reactor* AgentServiceImpl::Connect(grpc::CallbackServerContext* ctx) {
  return new AgentStream(engine_, ctx->peer());
}

}  // namespace taskgrid::service
