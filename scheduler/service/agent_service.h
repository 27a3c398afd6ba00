// AgentService: one bidi reactor per agent stream.
//
// Lifecycle of a stream (AgentStream):
//   1. Created by Connect(); attaches an Outbox to the Engine and reads.
//   2. Each message is read as bytes and parsed here: bytes that do not
//      parse as an AgentMessage end the stream with INVALID_ARGUMENT
//      saying so (gRPC's own parse would end it with OK, as if the agent
//      had half-closed). The first message must be Hello. With mTLS its agent_id must be a
//      name of the client certificate (else PERMISSION_DENIED, before the
//      Engine hears of it); then the Engine validates it (an error ends the
//      stream with that status).
//   3. Every later message goes to the Engine; reads continue until the
//      agent half-closes or the stream breaks.
//   4. The Engine sends through the Outbox from any thread: the Outbox
//      queues and keeps one write in flight (a batch of at most
//      kMaxBatchBytes). Close() (a silent agent, a shutdown) finishes the
//      stream, cancelling it when a write is in flight. An agent that stops reading, so that
//      more than OutboxLimits wait behind that write, has its stream
//      cancelled.
//   5. OnDone: detach from the Engine (it starts the agent's reconnect
//      grace), cut the Outbox loose, delete the reactor.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "scheduler/engine/engine.h"
#include "scheduler/service/auth.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"

namespace taskgrid::service {

// What may wait for an agent behind a write it has not taken for
// `stuck_after`, before its stream is cancelled.
struct OutboxLimits {
  int64_t max_bytes = 64 << 20;
  int64_t max_messages = 100'000;
  absl::Duration stuck_after = absl::Seconds(10);
};

class AgentServiceImpl final : public v1::AgentService::CallbackService {
 public:
  // bind_agent_ids: clients present verified certificates (mTLS), and a
  // Hello's agent_id must be one of the certificate's names. tokens (if
  // not null): the server checks tokens, and a Hello's agent_id must be
  // one the caller's token may act as.
  explicit AgentServiceImpl(engine::Engine* engine, bool bind_agent_ids = false,
                            OutboxLimits outbox_limits = {},
                            const ReloadableTokens* tokens = nullptr)
      : engine_(engine),
        bind_agent_ids_(bind_agent_ids),
        outbox_limits_(outbox_limits),
        tokens_(tokens) {
    // Connect (method 0) served with raw reads, as the generated
    // WithRawCallbackMethod_Connect does, but with typed writes.
    MarkMethodRawCallback(
        0, new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, v1::SchedulerMessage>(
               [this](grpc::CallbackServerContext* ctx) { return ConnectRaw(ctx); }));
  }

  // Connect's reactor: reads raw bytes (parsed by the reactor, see above),
  // writes SchedulerMessages.
  grpc::ServerBidiReactor<grpc::ByteBuffer, v1::SchedulerMessage>* ConnectRaw(
      grpc::CallbackServerContext* ctx);

 private:
  engine::Engine* const engine_;
  const bool bind_agent_ids_;
  const OutboxLimits outbox_limits_;
  const ReloadableTokens* const tokens_;
  // The heartbeat interval last logged (0: none yet).
  std::atomic<int64_t> logged_interval_ns_{0};
};

}  // namespace taskgrid::service
