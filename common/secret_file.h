// Files holding secrets (bearer tokens): whether other users may read them.
// The scheduler checks its --tokens_file, taskgridctl and the agent their
// --token_file, the same way. gRPC-free; any thread.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace taskgrid {

// "" when only the owner may read or write `path` (or it cannot be
// stat'ed: reading it reports that). Else a warning naming `flag`, the
// file and its mode, and the fix: "--token_file /x can be read by other
// users (mode 644): chmod 600 it".
std::string OthersMayReadWarning(const std::string& path, absl::string_view flag);

}  // namespace taskgrid
