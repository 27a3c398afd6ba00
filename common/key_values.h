// Parsing of the list flags every binary takes ("a,b", "k=v,k2=v2").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace taskgrid {

// "a,b,,c" -> {"a", "b", "c"} (whitespace around items trimmed).
std::vector<std::string> ParseList(absl::string_view text);

// "K=V,K2=V2" -> {K: V, K2: V2}; `flag` names the flag in errors. Keys must
// not be empty; values may be.
absl::StatusOr<std::map<std::string, std::string>> ParseKeyValues(absl::string_view flag,
                                                                  absl::string_view text);

}  // namespace taskgrid
