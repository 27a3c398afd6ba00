// What the servers log about requests they refuse (no token, a role the
// caller lacks, an agent id it may not use). Any client can cause such
// refusals at will, so a line each would let one client fill the disk
// (about 4 GB an hour): each refusal is counted (for /metrics), and at most
// one line a second is written, saying how many were left out since the
// last one. A line the same as one written less than a minute before is
// left out too, so a client that retries the same refused call (an agent
// with a bad token, backing off) adds a line a minute, not one a retry.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace taskgrid {

class RefusalLog {
 public:
  explicit RefusalLog(const Clock* clock = RealClock::Get(),
                      absl::Duration every = absl::Seconds(1),
                      absl::Duration repeat_every = absl::Minutes(1))
      : clock_(clock), every_(every), repeat_every_(repeat_every) {}

  // Counts a refusal with `code`, and returns the line to log (`line`,
  // with how many were left out before it) or "" when this one is not
  // logged.
  std::string Refused(absl::StatusCode code, const std::string& line);
  // Refused(), and the line (if any) logged as a warning.
  void Log(absl::StatusCode code, const std::string& line);

  // Refusals so far by code, e.g. {"PERMISSION_DENIED": 3}.
  std::map<std::string, int64_t> Counts() const;

 private:
  const Clock* const clock_;
  const absl::Duration every_;
  const absl::Duration repeat_every_;
  mutable std::mutex mu_;
  // Lines written, and when (monotonic); pruned of those older than
  // repeat_every_ when it grows, so it stays small.
  std::map<std::string, absl::Duration> written_;         // guarded by mu_
  std::map<std::string, int64_t> counts_;                 // guarded by mu_
  absl::Duration next_line_ = -absl::InfiniteDuration();  // guarded by mu_
  int64_t left_out_ = 0;                                  // guarded by mu_
};

}  // namespace taskgrid
