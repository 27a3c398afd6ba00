// The builtin steps (task.proto's BuiltinStep): their names and the rules
// for their arguments, in one place for the scheduler (which refuses a bad
// step at submit), the agent (which runs them, and checks again for a
// scheduler that did not) and taskgridctl (which checks --builtin).
//
//   noop              succeeds; no arguments
//   sleep  [SECONDS]  sleeps, then succeeds; 0 to 604800 (a week), fractions allowed
//   fail   [CODE]     fails with exit code CODE, 1 to 255 (default 1)
//   echo   [WORDS..]  writes WORDS joined by spaces and a newline; with none,
//                     the step's stdin as is
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace taskgrid::builtins {

bool IsKnown(absl::string_view name);
// "noop, sleep, fail, echo".
std::string Names();
// "noop, sleep SECONDS, fail [CODE], echo [WORDS...]".
std::string Usages();

// What is wrong with a builtin's arguments: the argument (`index`, or -1
// for the list as a whole) and the rule it breaks, e.g. "is not an exit
// code in [1, 255]".
struct ArgProblem {
  int index;
  std::string rule;
};
// nullopt when `args` suit the builtin `name` (which must be known).
std::optional<ArgProblem> CheckArgs(absl::string_view name, absl::Span<const std::string> args);

// The longest sleep, in seconds.
inline constexpr double kMaxSleepSeconds = 7 * 24 * 3600;

}  // namespace taskgrid::builtins
