// One long-poll call (WaitTask, WaitForWork): its waiter lives in the
// Engine until it is answered or its time runs out; a client that goes
// away (cancel, deadline, broken connection) takes its waiter out at once,
// so waiters never pile up.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>

#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/proto_time.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::service {

// How long a long poll asked to wait `timeout` may wait: at most an hour
// (zero: an hour), and it answers 200 ms before the caller's own deadline,
// so the caller gets an answer rather than DEADLINE_EXCEEDED.
inline absl::Duration LongPollWait(const grpc::CallbackServerContext* ctx,
                                   const google::protobuf::Duration& timeout) {
  absl::Duration wait = FromProto(timeout);
  if (wait <= absl::ZeroDuration() || wait > absl::Hours(1)) wait = absl::Hours(1);
  const auto deadline = ctx->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    const absl::Duration left =
        absl::FromChrono(deadline - std::chrono::system_clock::now()) - absl::Milliseconds(200);
    wait = std::max(absl::ZeroDuration(), std::min(wait, left));
  }
  return wait;
}

template <typename Resp>
class LongPoll final : public grpc::ServerUnaryReactor {
 public:
  // `cancel` takes a registered waiter out of the Engine.
  LongPoll(Resp* resp, std::function<void(uint64_t)> cancel)
      : resp_(resp), cancel_(std::move(cancel)) {}

  // The reply to hand to the Engine's call.
  engine::Engine::Reply<Resp> Reply() {
    return [this](absl::StatusOr<Resp> r) {
      if (r.ok()) *resp_ = std::move(*r);
      Finish(ToGrpcStatus(r.status()));
    };
  }
  // The Engine's call returned `waiter` (0: answered at once).
  void Registered(uint64_t waiter) {
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiter_ = waiter;
      cancelled = cancelled_;
    }
    if (cancelled && waiter != 0) cancel_(waiter);
  }

  void OnCancel() override {
    uint64_t waiter;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      waiter = waiter_;
    }
    // Answered already (waiter gone), or not registered yet (Registered
    // cancels it): the cancel is a no-op then.
    if (waiter != 0) cancel_(waiter);
  }

  void OnDone() override { delete this; }

 private:
  Resp* const resp_;
  const std::function<void(uint64_t)> cancel_;
  std::mutex mu_;
  uint64_t waiter_ = 0;     // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

}  // namespace taskgrid::service
