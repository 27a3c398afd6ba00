#include "agent/builtins.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace taskgrid::agent::internal {
namespace {

BuiltinResult Usage(int index, const std::string& name, absl::string_view problem) {
  BuiltinResult r;
  r.exit_code = -1;
  r.error = absl::StrCat("step ", index, ": builtin ", name, ": ", problem);
  return r;
}

std::string Quoted(const std::string& s) { return absl::StrCat("'", s, "'"); }

}  // namespace

bool IsInstantBuiltin(const taskgrid::v1::BuiltinStep& step) { return step.name() != "sleep"; }

BuiltinResult RunBuiltin(const taskgrid::v1::BuiltinStep& step, int index,
                         absl::string_view stdin_data, const SleepFn& sleep) {
  const std::string& name = step.name();
  const auto& args = step.args();
  BuiltinResult r;

  if (name == "noop") {
    if (!args.empty()) return Usage(index, name, "takes no arguments");
    return r;
  }

  if (name == "sleep") {
    if (args.size() > 1) return Usage(index, name, "takes at most one argument (SECONDS)");
    double seconds = 0;
    if (!args.empty() &&
        (!absl::SimpleAtod(args[0], &seconds) || !std::isfinite(seconds) || seconds < 0)) {
      return Usage(index, name, absl::StrCat("invalid seconds ", Quoted(args[0])));
    }
    r.stopped_by = sleep(absl::Seconds(seconds));  // huge values: InfiniteDuration
    return r;
  }

  if (name == "fail") {
    if (args.size() > 1) return Usage(index, name, "takes at most one argument (CODE)");
    int32_t code = 1;
    if (!args.empty() && !absl::SimpleAtoi(args[0], &code)) {
      return Usage(index, name, absl::StrCat("invalid exit code ", Quoted(args[0])));
    }
    r.exit_code = code;
    r.error = "builtin fail";
    return r;
  }

  if (name == "echo") {
    if (args.empty()) {
      r.output = std::string(stdin_data);
    } else {
      r.output = absl::StrCat(absl::StrJoin(args, " "), "\n");
    }
    return r;
  }

  r.exit_code = -1;
  r.error = absl::StrCat("step ", index, ": unknown builtin ", Quoted(name));
  return r;
}

}  // namespace taskgrid::agent::internal
