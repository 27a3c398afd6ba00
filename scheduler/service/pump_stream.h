// A server-streaming call that pumps messages from a source in the Engine
// (a Watch, an output follower) to one client: WatchTasks and
// StreamTaskOutput.
//
// Lifecycle: 1. the subclass's constructor registers with its source,
// passing Waker(), then calls Start() (or finishes at once on an error);
// 2. SendMore() takes the next turn of messages from the source (NextTurn)
// and writes them one at a time; when there are none it returns, and the
// source's wake calls it again when something comes; 3. a turn marked last
// finishes OK once written, a source error finishes with it (Failed() may
// add trailing metadata), and so does the client's cancel or a failed
// write; 4. OnDone: the wake handle is cut (waiting for a wake that runs),
// the subclass stops its source (Stop), and the reactor deletes itself.
//
// Thread contract: wakes come from the Engine's threads, write completions
// and cancel from gRPC's. `handle_->mu` is held by a wake while it runs,
// so OnDone cannot free the reactor under it; `mu_` guards the write state
// and is held around NextTurn and Sent. A source must not call the wake
// from inside NextTurn.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"

namespace taskgrid::service {

template <typename Msg>
class PumpStream : public grpc::ServerWriteReactor<Msg> {
 public:
  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, gone_));
        return;
      }
      Sent(batch_[next_]);
      if (++next_ < batch_.size()) {
        this->StartWrite(&batch_[next_]);
        return;
      }
      writing_ = false;
      if (last_) {
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
    Stop();
    delete this;
  }

 protected:
  // What NextTurn hands over: messages to write now, and whether they are
  // the last (the call then ends OK once they are written).
  struct Turn {
    std::vector<Msg> msgs;
    bool last = false;
  };

  // `gone`: the message of the CANCELLED status when a write fails (the
  // client went away).
  explicit PumpStream(std::string gone)
      : handle_(std::make_shared<Handle>()), gone_(std::move(gone)) {
    handle_->stream = this;
  }
  virtual ~PumpStream() = default;

  // The wake to give the source: it calls SendMore unless the call is done.
  std::function<void()> Waker() {
    return [handle = handle_] {
      std::lock_guard<std::mutex> lock(handle->mu);
      if (handle->stream != nullptr) handle->stream->SendMore();
    };
  }

  // After the source is registered: the first turn.
  void Start() {
    std::lock_guard<std::mutex> lock(handle_->mu);
    SendMore();
  }

  // Ends the call with `why` (a failed registration or source). Needs mu_.
  void FailLocked(const absl::Status& why) { FinishLocked(Failed(why)); }

  std::mutex mu_;

 private:
  struct Handle {
    std::mutex mu;  // held while a wake runs, so OnDone waits for it
    PumpStream* stream = nullptr;
  };

  // The next messages of the source. Called with mu_ held.
  virtual absl::StatusOr<Turn> NextTurn() = 0;
  // `msg` was written. Called with mu_ held.
  virtual void Sent(const Msg& /*msg*/) {}
  // The status a source error ends the call with. Called with mu_ held.
  virtual grpc::Status Failed(const absl::Status& why) { return ToGrpcStatus(why); }
  // The call is done: let go of the source.
  virtual void Stop() = 0;

  // Needs handle_->mu.
  void SendMore() {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finished_) return;
    absl::StatusOr<Turn> turn = NextTurn();
    if (!turn.ok()) {
      FailLocked(turn.status());
      return;
    }
    last_ = turn->last;
    if (turn->msgs.empty()) {
      // Nothing now: the source wakes us when something comes.
      if (last_) FinishLocked(grpc::Status::OK);
      return;
    }
    batch_ = std::move(turn->msgs);
    next_ = 0;
    writing_ = true;
    this->StartWrite(&batch_[0]);
  }

  void FinishLocked(const grpc::Status& s) {
    if (finished_) return;
    finished_ = true;
    this->Finish(s);
  }

  const std::shared_ptr<Handle> handle_;
  const std::string gone_;
  std::vector<Msg> batch_;  // guarded by mu_
  size_t next_ = 0;         // guarded by mu_
  bool writing_ = false;    // guarded by mu_
  bool last_ = false;       // guarded by mu_: batch_ is the last
  bool finished_ = false;   // guarded by mu_
};

}  // namespace taskgrid::service
