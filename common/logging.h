// Process-wide logging setup for the binaries (spdlog to stderr).
#pragma once

#include <string>

namespace taskgrid {

// level: trace, debug, info, warn, error. Unknown names fall back to info.
void InitLogging(const std::string& process_name, const std::string& level);

}  // namespace taskgrid
