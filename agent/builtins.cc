#include "agent/builtins.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/builtins.h"

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

  if (!builtins::IsKnown(name)) {
    r.exit_code = -1;
    r.error = absl::StrCat("step ", index, ": unknown builtin ", Quoted(name));
    return r;
  }
  // The scheduler checked these too; an older one may not have.
  const std::vector<std::string> arg_list(args.begin(), args.end());
  if (const std::optional<builtins::ArgProblem> bad = builtins::CheckArgs(name, arg_list)) {
    return Usage(
        index, name,
        bad->index < 0 ? bad->rule : absl::StrCat(Quoted(arg_list[bad->index]), " ", bad->rule));
  }

  if (name == "noop") return r;

  if (name == "sleep") {
    double seconds = 0;
    if (!args.empty()) (void)absl::SimpleAtod(args[0], &seconds);  // checked above
    r.stopped_by = sleep(absl::Seconds(seconds));
    return r;
  }

  if (name == "fail") {
    int32_t code = 1;
    if (!args.empty()) (void)absl::SimpleAtoi(args[0], &code);  // checked above
    r.exit_code = code;
    r.error = "builtin fail";
    return r;
  }

  // echo
  if (args.empty()) {
    r.output = std::string(stdin_data);
  } else {
    r.output = absl::StrCat(absl::StrJoin(args, " "), "\n");
  }

  return r;  // echo, the last of them
}

}  // namespace taskgrid::agent::internal
