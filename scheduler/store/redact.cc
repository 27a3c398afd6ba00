#include "scheduler/store/redact.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace taskgrid::store {

std::string RedactPasswords(absl::string_view text) {
  std::string out(text);
  // scheme://user:PASSWORD@host: the user info ends at the last '@'
  // before the next space or quote (a password may hold '@', '/', ...).
  for (size_t at = out.find("://"); at != std::string::npos; at = out.find("://", at + 3)) {
    const size_t start = at + 3;
    size_t end = out.find_first_of(" \t\n'\"", start);
    if (end == std::string::npos) end = out.size();
    const size_t last_at = out.rfind('@', end == 0 ? 0 : end - 1);
    if (last_at == std::string::npos || last_at < start) continue;
    const size_t colon = out.find(':', start);
    if (colon == std::string::npos || colon > last_at) continue;
    out.replace(colon + 1, last_at - colon - 1, "***");
  }
  // password = VALUE, VALUE quoted ('...' with \' escapes) or up to a
  // space, '&' or the end.
  const std::string lower = absl::AsciiStrToLower(out);
  std::string redacted;
  size_t copied = 0;
  for (size_t k = lower.find("password"); k != std::string::npos;
       k = lower.find("password", k + 8)) {
    size_t v = k + 8;
    while (v < out.size() && out[v] == ' ') ++v;
    if (v >= out.size() || out[v] != '=' || k < copied) continue;
    ++v;
    while (v < out.size() && out[v] == ' ') ++v;
    size_t end = v;
    if (end < out.size() && out[end] == '\'') {
      for (++end; end < out.size() && out[end] != '\''; ++end) {
        if (out[end] == '\\') ++end;
      }
      end = std::min(out.size(), end + 1);
    } else {
      while (end < out.size() && out[end] != ' ' && out[end] != '&' && out[end] != '\n' &&
             out[end] != '"') {
        ++end;
      }
    }
    absl::StrAppend(&redacted, absl::string_view(out).substr(copied, v - copied), "***");
    copied = end;
  }
  absl::StrAppend(&redacted, absl::string_view(out).substr(copied));
  return redacted;
}

}  // namespace taskgrid::store
