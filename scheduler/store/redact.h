// Passwords out of anything that may quote a --store value.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace taskgrid::store {

// `text` with every password in it replaced by "***", however malformed
// the rest is: the one in a URL's user info (scheme://user:PASSWORD@...)
// and the value of every password=... (a keyword of libpq's key=value
// form, or a URL's query parameter, quoted or not). For anything that may
// quote a --store value: libpq's own error messages quote a URL that does
// not parse, whole.
std::string RedactPasswords(absl::string_view text);

}  // namespace taskgrid::store
