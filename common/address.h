// Listen addresses as gRPC spells them ("host:port", "[v6]:port",
// "unix:/path"): which ones only this machine can reach.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace taskgrid {

// True for loopback hosts (127.0.0.0/8, ::1, localhost) and Unix sockets;
// false for the wildcard (0.0.0.0, ::, empty host) and every other host.
bool IsLoopbackAddress(absl::string_view address);

// `flag` when given; else the environment variable `env` when set and not
// empty; else `fallback`. How every binary reads TASKGRID_ADDR and
// TASKGRID_DATA_DIR.
std::string FlagOrEnv(const std::string& flag, const char* env, absl::string_view fallback);

// Where taskgrid-scheduler listens and where the others find it, when
// neither a flag nor TASKGRID_ADDR says.
inline constexpr char kDefaultAddress[] = "127.0.0.1:7070";

}  // namespace taskgrid
