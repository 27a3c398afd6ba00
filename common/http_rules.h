// The rules of an HTTP step (task.proto's HttpStep), in one place for the
// scheduler (which refuses a bad step at submit) and the agent (which
// makes the request, and checks again for a scheduler that did not: a CR
// or LF that reached a header would let a task write requests of its own).
// Plain values in, so that this stays free of the task messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/map.h"

namespace taskgrid::http {

inline constexpr int kMaxHeaders = 64;
inline constexpr int kMaxSuccessCodes = 64;
inline constexpr int kMinStatus = 100;
inline constexpr int kMaxStatus = 599;

// GET, HEAD, POST, PUT, PATCH or DELETE, as written (upper case).
bool IsMethod(absl::string_view method);
// "GET, HEAD, POST, PUT, PATCH, DELETE".
std::string Methods();
// The method a step sends: `method`, or POST when it is empty.
absl::string_view MethodOrDefault(absl::string_view method);

// What is wrong with one field of an HTTP step: the field, relative to the
// step's `http` ("url", "headers", "headers[X-Key]", "success_codes[2]"),
// and the rule it breaks, e.g. "must start with http:// or https://".
struct Problem {
  std::string field;
  std::string rule;
};

// nullopt when the step may be sent: a known method (or none), an http://
// or https:// URL with a host and no NUL, CR, LF or space, at most
// kMaxHeaders headers whose names are HTTP tokens and whose values hold no
// NUL, CR or LF, and at most kMaxSuccessCodes success codes, each a status
// in [kMinStatus, kMaxStatus].
std::optional<Problem> CheckStep(absl::string_view method, absl::string_view url,
                                 const google::protobuf::Map<std::string, std::string>& headers,
                                 absl::Span<const int32_t> success_codes);

}  // namespace taskgrid::http
