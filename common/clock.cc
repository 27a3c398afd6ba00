#include "common/clock.h"

#include <time.h>

namespace taskgrid {

absl::Duration RealClock::Monotonic() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return absl::DurationFromTimespec(ts);
}

Clock* RealClock::Get() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace taskgrid
