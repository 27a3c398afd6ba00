// Process-wide setup for the binaries: logging (spdlog to stderr) and the
// runtime settings every binary wants.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace taskgrid {

// level: trace, debug, info, warn, error. Unknown names fall back to info.
// Also turns off absl::Mutex lock-order tracking, which Debian's Abseil
// (built without NDEBUG) does on every lock gRPC takes: 8 % of the
// scheduler's CPU with 10,000 agent streams (taskgrid-bench W6).
// Every line goes through EscapeControlBytes first: text from the network
// (a method path, an HTTP path, a name a client sent) cannot write escape
// sequences to an operator's terminal or forge a line of its own.
void InitLogging(const std::string& process_name, const std::string& level);

// `text` with each control byte (below 0x20, and 0x7f) written as \xHH.
std::string EscapeControlBytes(absl::string_view text);

}  // namespace taskgrid
