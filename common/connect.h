// Whether a channel gets a connection soon: how agents and taskgridctl,
// given several scheduler addresses, pass over one that is down (refused
// at once) or frozen (the TCP connection opens, the HTTP/2 handshake never
// ends) instead of waiting for a call's deadline.
#pragma once

#include <grpcpp/channel.h>

#include "absl/time/time.h"

namespace taskgrid {

// True once `channel` is READY (connecting it if idle); false as soon as
// a connection attempt failed (TRANSIENT_FAILURE), or after `within`.
bool ConnectsWithin(grpc::Channel* channel, absl::Duration within);

}  // namespace taskgrid
