// JSON text written and recognised by hand, for the few places that need
// it without a message type: taskgrid-bench's report lines and the body an
// HTTP step makes of merged payloads (agent/http_step.h). Pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace taskgrid {

// `s` as a JSON string, quotes included. Control characters are escaped;
// bytes that are not UTF-8 each become U+FFFD, so the result is always
// valid JSON (such bytes cannot be carried by a JSON string).
std::string JsonString(absl::string_view s);

// True when `text` is exactly one JSON value (RFC 8259), with whitespace
// around it allowed: strict (no single quotes, bare words, comments,
// trailing commas, NaN or leading zeros), valid UTF-8, and nested at most
// kMaxJsonDepth arrays and objects deep. Such text can be embedded as is
// in a larger document.
bool IsJsonValue(absl::string_view text);

// Nesting deeper than this is refused by IsJsonValue (the check recurses).
inline constexpr int kMaxJsonDepth = 128;

}  // namespace taskgrid
