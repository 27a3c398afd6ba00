#include "common/key_values.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace taskgrid {

std::vector<std::string> ParseList(absl::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ParseKeyValues(absl::string_view flag,
                                                                  absl::string_view text) {
  std::map<std::string, std::string> out;
  for (const std::string& item : ParseList(text)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": expected KEY=VALUE[,KEY=VALUE...], got \"", item, "\""));
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace taskgrid
