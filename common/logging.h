// Process-wide setup for the binaries: logging (spdlog to stderr) and the
// runtime settings every binary wants.
#pragma once

#include <string>

namespace taskgrid {

// level: trace, debug, info, warn, error. Unknown names fall back to info.
// Also turns off absl::Mutex lock-order tracking, which Debian's Abseil
// (built without NDEBUG) does on every lock gRPC takes: 8 % of the
// scheduler's CPU with 10,000 agent streams (taskgrid-bench W6).
void InitLogging(const std::string& process_name, const std::string& level);

}  // namespace taskgrid
