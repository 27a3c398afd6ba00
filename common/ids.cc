#include "common/ids.h"

#include "absl/strings/str_cat.h"

namespace taskgrid {

namespace {
bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '-';
}
// Names become file and directory names (a dependency's output, an
// attempt's directory): "." and ".." would name another directory.
bool IsDotName(absl::string_view name) { return name == "." || name == ".."; }
}  // namespace

bool IsValidName(absl::string_view name, size_t max_len) {
  if (name.empty() || name.size() > max_len || IsDotName(name)) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

absl::Status CheckName(absl::string_view field, absl::string_view name, size_t max_len) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (name.size() > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", name.size(), " characters long; the limit is ", max_len));
  }
  if (IsDotName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " \"", name, "\" is not a name"));
  }
  for (char c : name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", name, "\" has a character outside [A-Za-z0-9._:-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace taskgrid
