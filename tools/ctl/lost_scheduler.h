// Patience with a scheduler that answered before and is gone now (killed,
// restarting, the network): the long-running commands (wait, job wait,
// logs -f) keep asking for up to --timeout from the first failure, and
// never past their own deadline.
//
// Not thread-safe: one per command.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <iostream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace taskgrid::ctl {

inline bool IsLostScheduler(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

class LostScheduler {
 public:
  explicit LostScheduler(absl::Duration timeout) : timeout_(timeout) {}

  // A call got an answer: the next failure starts a new loss.
  void Answered() { since_ = absl::InfiniteFuture(); }

  // After `s` failed a call: true, after a short pause, when it should be
  // made again. `say` tells of the loss once, at its first failure.
  bool TryAgain(const grpc::Status& s, absl::Time deadline, const std::function<void()>& say) {
    if (!IsLostScheduler(s)) return false;
    if (since_ == absl::InfiniteFuture()) {
      since_ = absl::Now();
      say();
    }
    if (absl::Now() - since_ >= timeout_ || absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(250));
    return true;
  }

  // As above, saying so on stderr for a wait for `what`.
  bool TryAgain(const grpc::Status& s, const std::string& what, absl::Time deadline) {
    return TryAgain(s, deadline, [&] {
      std::cerr << "note: lost the scheduler while waiting for " << what << " ("
                << s.error_message() << "); trying again for up to "
                << absl::FormatDuration(timeout_) << "\n";
    });
  }

 private:
  const absl::Duration timeout_;
  absl::Time since_ = absl::InfiniteFuture();
};

}  // namespace taskgrid::ctl
