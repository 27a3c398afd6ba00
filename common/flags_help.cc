#include "common/flags_help.h"

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace taskgrid {

namespace {

absl::FlagsUsageConfig BaseConfig() {
  absl::FlagsUsageConfig config;
  config.version_string = [] {
    return std::string("taskgrid ") + kVersion + " (" + BuildType() + " build)\n";
  };
  // "scheduler/main.cc", not the path it was built at.
  config.normalize_filename = [](absl::string_view file) {
    const size_t last = file.rfind('/');
    if (last == absl::string_view::npos || last == 0) return std::string(file);
    const size_t dir = file.rfind('/', last - 1);
    return std::string(dir == absl::string_view::npos ? file : file.substr(dir + 1));
  };
  return config;
}

}  // namespace

const char* BuildType() { return TASKGRID_BUILD_TYPE; }

void SetVersionAndFileNames() { absl::SetFlagsUsageConfig(BaseConfig()); }

void SetUsage(const char* usage, const char* main_file_suffix) {
  // Services keep their flags in a file (a systemd unit's one argument).
  absl::SetProgramUsageMessage(absl::StrCat(
      usage,
      "\n\nAny flag may also come from a file: --flagfile=FILE reads one --flag=value a line "
      "('#' starts a comment line)."));
  const std::string suffix = main_file_suffix;
  absl::FlagsUsageConfig config = BaseConfig();
  config.contains_help_flags = [suffix](absl::string_view file) {
    return absl::EndsWith(file, suffix);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace taskgrid
