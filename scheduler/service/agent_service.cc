#include "scheduler/service/agent_service.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/grpc_status.h"
#include "common/tls.h"
#include "scheduler/core/validate.h"
#include "scheduler/service/auth.h"

namespace taskgrid::service {

namespace {

using Reactor = grpc::ServerBidiReactor<v1::AgentMessage, v1::SchedulerMessage>;

// Logs the interval agents are told when it changed (as agents come and
// go); `logged_ns` is the last one logged, shared by the service's streams.
void LogHeartbeatInterval(engine::Engine& engine, std::atomic<int64_t>& logged_ns) {
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
// every Send is dropped. gRPC allows one write in flight; what is sent
// meanwhile queues, and goes as one SchedulerBatch when the agent reads
// batches (a commit's ResultAcks and its Assign, for instance).
class Outbox final : public engine::AgentChannel {
 public:
  explicit Outbox(Reactor* reactor) : reactor_(reactor) {}

  void Send(v1::SchedulerMessage msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    queue_.push_back(std::move(msg));
    if (!writing_) StartNextWriteLocked();
  }

  void Close(const absl::Status& why) override { Finish(ToGrpcStatus(why)); }

  // The agent said Hello.batches.
  void EnableBatches() {
    std::lock_guard<std::mutex> lock(mu_);
    batches_ = true;
  }

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
    writing_ = false;
    if (reactor_ == nullptr) return;
    if (!ok) {
      // The stream is broken; OnDone follows once it is finished. A Finish
      // that waited for this write is due now too: without it the reactor
      // never finishes and the server's shutdown waits for it forever.
      queue_.clear();
      if (!finish_.has_value()) {
        finish_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
      }
      reactor_->Finish(*finish_);
      return;
    }
    if (finish_.has_value()) {
      reactor_->Finish(*finish_);
    } else if (!queue_.empty()) {
      StartNextWriteLocked();
    }
  }

  // From OnDone: the reactor is about to be deleted.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

 private:
  void StartNextWriteLocked() {
    if (queue_.size() == 1 || !batches_) {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
    } else {
      in_flight_.Clear();
      auto* msgs = in_flight_.mutable_batch()->mutable_msgs();
      msgs->Reserve(static_cast<int>(queue_.size()));
      for (v1::SchedulerMessage& m : queue_) *msgs->Add() = std::move(m);
      queue_.clear();
    }
    writing_ = true;
    reactor_->StartWrite(&in_flight_);
  }

  std::mutex mu_;
  Reactor* reactor_;                        // guarded by mu_; null after Detach
  std::deque<v1::SchedulerMessage> queue_;  // guarded by mu_; not yet written
  v1::SchedulerMessage in_flight_;          // guarded by mu_; valid while writing_
  bool writing_ = false;                    // guarded by mu_
  bool batches_ = false;                    // guarded by mu_
  std::optional<grpc::Status> finish_;      // guarded by mu_
};

class AgentStream final : public Reactor {
 public:
  // cert_names: the verified client certificate's names when agent ids are
  // bound to certificates (mTLS), else nullopt.
  AgentStream(engine::Engine* engine, std::atomic<int64_t>* logged_interval_ns, std::string peer,
              std::optional<std::vector<std::string>> cert_names)
      : engine_(engine),
        logged_interval_ns_(logged_interval_ns),
        peer_(std::move(peer)),
        cert_names_(std::move(cert_names)),
        outbox_(std::make_shared<Outbox>(this)) {
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
      absl::Status s = cert_names_.has_value()
                           ? CheckAgentIdentity(in_.hello().agent_id(), *cert_names_)
                           : absl::OkStatus();
      if (s.ok()) s = engine_->AgentHello(conn_, in_.hello());
      if (!s.ok()) {
        spdlog::warn("agent stream from {} refused: {}", peer_, s.ToString());
        outbox_->Finish(ToGrpcStatus(s));
        return;
      }
      hello_seen_ = true;
      if (in_.hello().batches()) outbox_->EnableBatches();
      agent_id_ = in_.hello().agent_id();
      spdlog::info("agent {} connected from {} with {} slots", agent_id_, peer_,
                   in_.hello().slots());
      LogHeartbeatInterval(*engine_, *logged_interval_ns_);
    } else if (in_.has_hello()) {
      outbox_->Finish(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "hello may be sent once per stream"));
      return;
    } else if (absl::Status bad = core::ValidateAgentMessage(in_); !bad.ok()) {
      outbox_->Finish(ToGrpcStatus(bad));
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
    LogHeartbeatInterval(*engine_, *logged_interval_ns_);
    outbox_->Detach();
    delete this;
  }

 private:
  engine::Engine* const engine_;
  std::atomic<int64_t>* const logged_interval_ns_;
  const std::string peer_;
  const std::optional<std::vector<std::string>> cert_names_;
  std::shared_ptr<Outbox> outbox_;
  uint64_t conn_ = 0;
  bool hello_seen_ = false;  // touched only by reactions, which do not overlap for reads
  std::string agent_id_;
  v1::AgentMessage in_;
};

}  // namespace

Reactor* AgentServiceImpl::Connect(grpc::CallbackServerContext* ctx) {
  std::optional<std::vector<std::string>> cert_names;
  if (bind_agent_ids_) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    cert_names = auth == nullptr ? std::vector<std::string>{} : PeerCertificateNames(*auth);
  }
  return new AgentStream(engine_, &logged_interval_ns_, ctx->peer(), std::move(cert_names));
}

}  // namespace taskgrid::service
