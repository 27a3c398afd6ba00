#include "common/builtins.h"

#include "absl/strings/numbers.h"

namespace taskgrid::builtins {

namespace {

struct Builtin {
  const char* name;
  const char* usage;
};

constexpr Builtin kBuiltins[] = {
    {"noop", "noop"},
    {"sleep", "sleep SECONDS"},
    {"fail", "fail [CODE]"},
    {"echo", "echo [WORDS...]"},
};

}  // namespace

bool IsKnown(absl::string_view name) {
  for (const Builtin& b : kBuiltins) {
    if (name == b.name) return true;
  }
  return false;
}

std::string Names() {
  std::string out;
  for (const Builtin& b : kBuiltins) out += std::string(out.empty() ? "" : ", ") + b.name;
  return out;
}

std::string Usages() {
  std::string out;
  for (const Builtin& b : kBuiltins) out += std::string(out.empty() ? "" : ", ") + b.usage;
  return out;
}

std::optional<ArgProblem> CheckArgs(absl::string_view name, absl::Span<const std::string> args) {
  if (name == "sleep") {
    if (args.size() > 1) return ArgProblem{-1, "takes one number of seconds"};
    double secs = 0;
    if (args.size() == 1 &&
        (!absl::SimpleAtod(args[0], &secs) || !(secs >= 0) || secs > kMaxSleepSeconds)) {
      return ArgProblem{0, "is not a number of seconds in [0, 604800]"};
    }
  } else if (name == "fail") {
    int code = 0;
    if (args.size() > 1) return ArgProblem{-1, "takes one exit code"};
    if (args.size() == 1 && (!absl::SimpleAtoi(args[0], &code) || code < 1 || code > 255)) {
      return ArgProblem{0, "is not an exit code in [1, 255]"};
    }
  } else if (name == "noop" && !args.empty()) {
    return ArgProblem{-1, "must be empty for noop"};
  }
  return std::nullopt;
}

}  // namespace taskgrid::builtins
