#include "common/connect.h"

#include "absl/time/clock.h"

namespace taskgrid {

bool ConnectsWithin(grpc::Channel* channel, absl::Duration within) {
  const auto deadline = absl::ToChronoTime(absl::Now() + within);
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel->WaitForStateChange(state, deadline)) return false;  // the deadline passed
    state = channel->GetState(/*try_to_connect=*/true);
  }
  return true;
}

}  // namespace taskgrid
