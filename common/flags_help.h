// --help for the binaries: Abseil lists only flags defined in files named
// like the program, which ours are not (scheduler/main.cc). This tells it
// which file holds the binary's own flags, and sets the usage text.
#pragma once

namespace taskgrid {

// `main_file_suffix` e.g. "scheduler/main.cc"; call before ParseCommandLine.
void SetUsage(const char* usage, const char* main_file_suffix);

}  // namespace taskgrid
