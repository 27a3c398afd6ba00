// Time for everything that schedules: core and lease logic read a Clock and
// never the system directly, so tests drive time with FakeClock and never
// sleep (invariant 6 in docs/architecture.md).
//
// Two readings: Now() is wall time, for what is stored and shown (create
// times, not_before, retry times). Monotonic() never goes back, for in-memory
// intervals (leases, heartbeats, ack deadlines) that must not jump with the
// wall clock.
//
// Thread-safe: every implementation may be read from any thread.
#pragma once

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace taskgrid {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Time since an arbitrary fixed origin.
  virtual absl::Duration Monotonic() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  absl::Duration Monotonic() const override;

  // A process-wide instance.
  static Clock* Get();
};

// Test-only: time moves only when told. Both readings advance together.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  absl::Duration Monotonic() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return mono_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
    mono_ += d;
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_;                        // guarded by mu_
  absl::Duration mono_ = absl::Hours(1);  // guarded by mu_
};

}  // namespace taskgrid
