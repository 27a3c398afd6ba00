#include "scheduler/service/agent_service.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/batching.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "scheduler/core/validate.h"
#include "scheduler/service/auth.h"

namespace taskgrid::service {

namespace {

using Reactor = grpc::ServerBidiReactor<grpc::ByteBuffer, v1::SchedulerMessage>;

constexpr char kConnectMethod[] = "/taskgrid.v1.AgentService/Connect";

// "ipv4:10.0.0.5:53211" -> "ipv4:10.0.0.5".
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos || colon < peer.find(':') + 1 ? peer : peer.substr(0, colon);
}

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
// meanwhile queues, and goes as SchedulerBatches of at most kMaxBatchBytes
// when the agent reads batches (a commit's ResultAcks and its Assign, for
// instance). An agent that stops reading would let the queue grow without
// end: past `limits`, with the write in flight not taken for
// limits.stuck_after, the stream is cancelled (the agent's reconnect grace
// starts as for any broken stream). A burst to an agent that reads (a
// dispatch of many large tasks at once) may pass the limits for a moment.
class Outbox final : public engine::AgentChannel {
 public:
  Outbox(Reactor* reactor, grpc::CallbackServerContext* ctx, OutboxLimits limits)
      : reactor_(reactor), ctx_(ctx), limits_(limits) {}

  void Send(v1::SchedulerMessage msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    if (!writing_ && queue_.empty()) {  // the common case: nothing to batch or count
      in_flight_ = std::move(msg);
      StartWriteLocked();
      return;
    }
    const size_t size = msg.ByteSizeLong();
    queued_bytes_ += static_cast<int64_t>(size);
    queue_.push_back(std::move(msg));
    sizes_.push_back(size);
    if (!writing_) {
      StartNextWriteLocked();
    } else if ((queued_bytes_ > limits_.max_bytes ||
                static_cast<int64_t>(queue_.size()) > limits_.max_messages) &&
               absl::Now() - write_started_ > limits_.stuck_after) {
      spdlog::warn(
          "agent {} is not reading its stream: {} messages ({} bytes) wait behind a write it "
          "has not taken for {} (limits {} messages, {} bytes); ending the stream",
          agent_id_, queue_.size(), queued_bytes_,
          absl::FormatDuration(absl::Now() - write_started_), limits_.max_messages,
          limits_.max_bytes);
      queue_.clear();
      sizes_.clear();
      queued_bytes_ = 0;
      finish_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             "the agent stopped reading its stream");
      // The write in flight may never complete, so a Finish after it might
      // never come: cancel, which fails that write and ends the stream.
      ctx_->TryCancel();
    }
  }

  // Ends the stream now: with `why` when no write is in flight, else by
  // cancelling it, since that write may never complete (an agent gone
  // silent may have stopped reading too).
  void Close(const absl::Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || finish_.has_value()) return;
    finish_ = ToGrpcStatus(why);
    if (writing_) {
      ctx_->TryCancel();
    } else {
      reactor_->Finish(*finish_);
    }
  }

  // After Hello: whose stream it is (for the log), and whether it reads
  // batches.
  void SetAgentId(std::string agent_id, bool batches) {
    std::lock_guard<std::mutex> lock(mu_);
    agent_id_ = std::move(agent_id);
    batches_ = batches;
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
      sizes_.clear();
      queued_bytes_ = 0;
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
    sizes_.clear();
    queued_bytes_ = 0;
  }

 private:
  void StartNextWriteLocked() {
    size_t taken = 0;
    in_flight_ = TakeBatch(queue_, batches_, kMaxBatchBytes, &sizes_, &taken);
    queued_bytes_ -= static_cast<int64_t>(taken);
    StartWriteLocked();
  }

  void StartWriteLocked() {
    writing_ = true;
    write_started_ = absl::Now();
    reactor_->StartWrite(&in_flight_);
  }

  std::mutex mu_;
  Reactor* reactor_;                        // guarded by mu_; null after Detach
  grpc::CallbackServerContext* const ctx_;  // valid while reactor_ is
  const OutboxLimits limits_;
  std::deque<v1::SchedulerMessage> queue_;   // guarded by mu_; not yet written
  std::deque<size_t> sizes_;                 // guarded by mu_; ByteSizeLong() of each in queue_
  int64_t queued_bytes_ = 0;                 // guarded by mu_; of queue_
  v1::SchedulerMessage in_flight_;           // guarded by mu_; valid while writing_
  bool writing_ = false;                     // guarded by mu_
  absl::Time write_started_;                 // guarded by mu_; of in_flight_
  bool batches_ = false;                     // guarded by mu_
  std::string agent_id_ = "(before hello)";  // guarded by mu_; for the log
  std::optional<grpc::Status> finish_;       // guarded by mu_
};

class AgentStream final : public Reactor {
 public:
  // cert_names: the verified client certificate's names when agent ids are
  // bound to certificates (mTLS), else nullopt.
  AgentStream(engine::Engine* engine, std::atomic<int64_t>* logged_interval_ns,
              grpc::CallbackServerContext* ctx, OutboxLimits limits, CallerIdentity caller)
      : engine_(engine),
        logged_interval_ns_(logged_interval_ns),
        peer_(ctx->peer()),
        caller_(std::move(caller)),
        outbox_(std::make_shared<Outbox>(this, ctx, limits)) {
    conn_ = engine_->AttachAgent(outbox_);
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_->Finish(grpc::Status::OK);
      return;
    }
    if (!grpc::SerializationTraits<v1::AgentMessage>::Deserialize(&in_bytes_, &in_).ok()) {
      GrpcRefusals().Log(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("agent stream from ", peer_, " sent a message that could not be parsed"));
      outbox_->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "a message on /taskgrid.v1.AgentService/Connect could not be parsed as "
                       "taskgrid.v1.AgentMessage"));
      return;
    }
    if (!hello_seen_) {
      if (!in_.has_hello()) {
        outbox_->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     "the first message on a stream must be hello"));
        return;
      }
      // Read before the check: a reload after it makes the next message
      // look again.
      if (caller_.tokens != nullptr) tokens_checked_ = caller_.tokens->generation();
      absl::Status s = caller_.Check(in_.hello().agent_id());
      if (s.ok()) s = engine_->AgentHello(conn_, in_.hello());
      if (!s.ok()) {
        // The peer without its port: an agent retrying with a fresh
        // connection gives the same line, which the log then leaves out.
        GrpcRefusals().Log(s.code(), absl::StrCat("agent stream from ", PeerHost(peer_),
                                                  " refused: ", s.ToString()));
        outbox_->Finish(ToGrpcStatus(s));
        return;
      }
      hello_seen_ = true;
      agent_id_ = in_.hello().agent_id();
      outbox_->SetAgentId(agent_id_, in_.hello().batches());
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
    } else if (absl::Status gone = CheckTokensStill(); !gone.ok()) {
      // The tokens file was reloaded without this stream's token (or its
      // role or id): the stream ends as a new call with it would.
      GrpcRefusals().Log(gone.code(), absl::StrCat("agent ", agent_id_, " from ", peer_,
                                                   " cut off: ", gone.ToString()));
      outbox_->Finish(ToGrpcStatus(gone));
      return;
    } else {
      engine_->AgentMessage(conn_, in_);
    }
    StartRead(&in_bytes_);
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
  // With tokens: whether this stream's caller may still call Connect as
  // its agent id (CallerIdentity::CheckStill), looked at only once a
  // reload replaced the table since the last look; not per message.
  absl::Status CheckTokensStill() {
    if (caller_.tokens == nullptr) return absl::OkStatus();
    const uint64_t generation = caller_.tokens->generation();
    if (generation == tokens_checked_) return absl::OkStatus();
    absl::Status s = caller_.CheckStill(kConnectMethod, agent_id_);
    if (s.ok()) tokens_checked_ = generation;
    return s;
  }

  engine::Engine* const engine_;
  std::atomic<int64_t>* const logged_interval_ns_;
  const std::string peer_;
  const CallerIdentity caller_;
  std::shared_ptr<Outbox> outbox_;
  uint64_t conn_ = 0;
  bool hello_seen_ = false;      // touched only by reactions, which do not overlap for reads
  uint64_t tokens_checked_ = 0;  // the tokens' generation the caller was checked at
  std::string agent_id_;
  grpc::ByteBuffer in_bytes_;  // what StartRead fills; parsed into in_
  v1::AgentMessage in_;
};

}  // namespace

Reactor* AgentServiceImpl::ConnectRaw(grpc::CallbackServerContext* ctx) {
  return new AgentStream(engine_, &logged_interval_ns_, ctx, outbox_limits_,
                         CallerIdentity::Of(*ctx, bind_agent_ids_, tokens_));
}

}  // namespace taskgrid::service
