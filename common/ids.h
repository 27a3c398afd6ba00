// Names that cross the API: task ids, queue names, agent ids, label keys.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace taskgrid {

inline constexpr size_t kMaxIdLength = 128;
inline constexpr size_t kMaxQueueNameLength = 64;
// A label's value (an agent's labels, a placement's required ones).
inline constexpr size_t kMaxLabelValueBytes = 256;
inline constexpr char kDefaultQueue[] = "default";

// True for 1..max_len characters of [A-Za-z0-9._:-].
bool IsValidName(absl::string_view name, size_t max_len);

// InvalidArgument naming `field` when `name` is not a valid name.
absl::Status CheckName(absl::string_view field, absl::string_view name, size_t max_len);

}  // namespace taskgrid
