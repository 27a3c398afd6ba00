#include "common/http_rules.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace taskgrid::http {

namespace {

constexpr const char* kMethods[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"};

// RFC 9110's tchar: what a header name is made of.
bool IsTokenChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// NUL, CR and LF end a header line (or a C string) early.
bool HasLineBreakOrNul(absl::string_view s) {
  return s.find_first_of(absl::string_view("\0\r\n", 3)) != absl::string_view::npos;
}

std::optional<std::string> UrlProblem(absl::string_view url) {
  if (url.empty()) return "is empty: the step needs a URL";
  if (url.find_first_of(absl::string_view("\0\r\n ", 4)) != absl::string_view::npos) {
    return "holds a NUL, CR, LF or space (percent-encode it)";
  }
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://") && !absl::ConsumePrefix(&rest, "https://")) {
    return absl::StrCat("\"", absl::CHexEscape(url.substr(0, 64)),
                        "\" must start with http:// or https://");
  }
  if (rest.empty() || rest[0] == '/' || rest[0] == '?' || rest[0] == '#') {
    return "has no host";
  }
  return std::nullopt;
}

}  // namespace

bool IsMethod(absl::string_view method) {
  for (const char* m : kMethods) {
    if (method == m) return true;
  }
  return false;
}

std::string Methods() {
  std::string out;
  for (const char* m : kMethods) absl::StrAppend(&out, out.empty() ? "" : ", ", m);
  return out;
}

absl::string_view MethodOrDefault(absl::string_view method) {
  return method.empty() ? "POST" : method;
}

std::optional<Problem> CheckStep(absl::string_view method, absl::string_view url,
                                 const google::protobuf::Map<std::string, std::string>& headers,
                                 absl::Span<const int32_t> success_codes) {
  if (!method.empty() && !IsMethod(method)) {
    return Problem{"method", absl::StrCat("\"", absl::CHexEscape(method), "\" is not one of ",
                                          Methods(), " (empty means POST)")};
  }
  if (std::optional<std::string> rule = UrlProblem(url)) return Problem{"url", *std::move(rule)};
  if (headers.size() > kMaxHeaders) {
    return Problem{"headers",
                   absl::StrCat("has ", headers.size(), " entries; the limit is ", kMaxHeaders)};
  }
  for (const auto& [name, value] : headers) {
    if (!IsToken(name)) {
      return Problem{"headers", absl::StrCat("has an invalid name \"", absl::CHexEscape(name),
                                             "\" (a header name is letters, digits and "
                                             "!#$%&'*+-.^_`|~)")};
    }
    if (HasLineBreakOrNul(value)) {
      return Problem{absl::StrCat("headers[", name, "]"), "holds a NUL, CR or LF"};
    }
  }
  if (success_codes.size() > static_cast<size_t>(kMaxSuccessCodes)) {
    return Problem{"success_codes", absl::StrCat("has ", success_codes.size(),
                                                 " entries; the limit is ", kMaxSuccessCodes)};
  }
  for (size_t i = 0; i < success_codes.size(); ++i) {
    if (success_codes[i] < kMinStatus || success_codes[i] > kMaxStatus) {
      return Problem{absl::StrCat("success_codes[", i, "]"),
                     absl::StrCat("is ", success_codes[i], "; a status is in [", kMinStatus, ", ",
                                  kMaxStatus, "]")};
    }
  }
  return std::nullopt;
}

}  // namespace taskgrid::http
