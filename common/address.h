// Listen addresses as gRPC spells them ("host:port", "[v6]:port",
// "unix:/path"): which ones only this machine can reach.
#pragma once

#include "absl/strings/string_view.h"

namespace taskgrid {

// True for loopback hosts (127.0.0.0/8, ::1, localhost) and Unix sockets;
// false for the wildcard (0.0.0.0, ::, empty host) and every other host.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace taskgrid
