#include "tools/ctl/command_line.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace taskgrid::ctl {

namespace {

// Flags Abseil itself defines (--helpfull, --flagfile, ...): left to it.
bool IsAbseilFlag(const absl::CommandLineFlag& f) {
  return absl::StrContains(f.Filename(), "absl/flags/");
}

}  // namespace

bool CheckFlags(const std::vector<std::string>& args, std::set<std::string>* set,
                std::string* error) {
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') continue;  // positional
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    bool has_value = eq != absl::string_view::npos;
    std::string value = has_value ? std::string(arg.substr(eq + 1)) : "";
    // Abseil's usage flags are not in the registry; ParseCommandLine serves them.
    if (name == "helpfull" || name == "helpshort" || name == "helppackage" || name == "helpon" ||
        name == "helpmatch" || name == "version" || name == "only_check_args") {
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !has_value) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && !flag->IsOfType<bool>()) flag = nullptr;
      has_value = true;
      value = "false";
    }
    if (flag == nullptr) {
      *error = absl::StrCat("unknown flag --", name);
      return false;
    }
    if (!has_value && !flag->IsOfType<bool>()) {
      if (i + 1 == args.size()) {
        *error = absl::StrCat("--", name, " needs a value: --", name, "=VALUE");
        return false;
      }
      value = args[++i];
      has_value = true;
    }
    if (IsAbseilFlag(*flag)) continue;
    if (!has_value) value = "true";
    std::string why;
    if (!flag->ParseFrom(value, &why)) {
      *error = absl::StrCat("--", name, "=", value, ": ", why);
      return false;
    }
    set->insert(std::string(flag->Name()));
  }
  return true;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return s.str();
}

std::vector<std::string> LogsShorthands(std::vector<std::string> args) {
  auto first = std::find_if(args.begin(), args.end(),
                            [](const std::string& a) { return a.empty() || a[0] != '-'; });
  if (first == args.end() || *first != "logs") return args;
  for (std::string& a : args) {
    if (a == "--") break;
    if (a == "-f") {
      a = "--follow";
    } else if (a == "--stdout" || a == "-stdout") {
      a = "--stream=stdout";
    } else if (a == "--stderr" || a == "-stderr") {
      a = "--stream=stderr";
    }
  }
  return args;
}

}  // namespace taskgrid::ctl
