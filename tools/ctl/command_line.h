// taskgridctl's command line before any command runs: the flags checked
// the way Abseil would parse them (a bad one is a usage error, exit 2),
// the shorthands of `logs`, and reading a file or stdin a flag names.
// No gRPC.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace taskgrid::ctl {

// Sets every flag in `args` the way absl::ParseCommandLine would, but
// reports an unknown flag or bad value in `error` (false). Fills `set`
// with the names of the flags given.
bool CheckFlags(const std::vector<std::string>& args, std::set<std::string>* set,
                std::string* error);

// `logs` takes -f for --follow and --stdout / --stderr for
// --stream=stdout / --stream=stderr: when the first word of `args` (the
// command line without the program) is "logs", those are rewritten, up to
// a `--`. Elsewhere -f stays the --file of submit.
std::vector<std::string> LogsShorthands(std::vector<std::string> args);

// The contents of `path` ("-": stdin).
absl::StatusOr<std::string> ReadInput(const std::string& path);

}  // namespace taskgrid::ctl
