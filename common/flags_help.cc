#include "common/flags_help.h"

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace taskgrid {

void SetUsage(const char* usage, const char* main_file_suffix) {
  absl::SetProgramUsageMessage(usage);
  const std::string suffix = main_file_suffix;
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [suffix](absl::string_view file) {
    return absl::EndsWith(file, suffix);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [] { return std::string("taskgrid 0.1.0\n"); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace taskgrid
