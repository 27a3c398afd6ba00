// --help for the binaries: Abseil lists only flags defined in files named
// like the program, which ours are not (scheduler/main.cc). This tells it
// which file holds the binary's own flags, and sets the usage text.
#pragma once

namespace taskgrid {

// The release, as --version and the metrics' build info say it.
inline constexpr char kVersion[] = "0.1.0";
// The CMake build type this was built as (Debug, Release, ...).
const char* BuildType();

// `main_file_suffix` e.g. "scheduler/main.cc"; call before ParseCommandLine.
void SetUsage(const char* usage, const char* main_file_suffix);

// What --version prints ("taskgrid 0.1.0 (Release build)") and flag file
// names without the build machine's source path; SetUsage calls it, and a
// binary with help text of its own calls it alone.
void SetVersionAndFileNames();

}  // namespace taskgrid
