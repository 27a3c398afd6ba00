// taskgridctl's help: every command with its synopsis, summary, example,
// the flags it takes and its details, and the usage texts built from them.
// Kept apart from the command flow so the words can be read (and changed)
// in one place.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace taskgrid::ctl {

// "States: SCHEDULED BLOCKED ...", from the API's enum.
std::string StatesLine();
// "Job states: RUNNING ...".
std::string JobStatesLine();
extern const char kJobCommands[];
extern const char kBoardCommands[];
extern const char kQueueCommands[];
extern const char kScheduleCommands[];

struct Command {
  const char* name;
  const char* synopsis;
  const char* summary;
  const char* example;
  std::vector<std::string> flags;  // besides the global ones
  const char* details;             // more for `help NAME`, may be empty
};

// Every command, in the order `taskgridctl help` lists them.
const std::vector<Command>& Commands();
// nullptr when there is no such command ("job submit" is one name).
const Command* FindCommand(const std::string& name);
// `taskgridctl help`.
std::string UsageText();
// `taskgridctl help GROUP` for a group of commands (job, board, queue,
// schedule): what it is for and its commands; "" when GROUP is none.
std::string GroupUsageText(absl::string_view group);
// `taskgridctl help NAME`.
std::string CommandHelp(const Command& c);
// `taskgridctl help reference`: the overview and every command's help as
// one Markdown page (docs/cli.md).
std::string ReferenceMarkdown();

}  // namespace taskgrid::ctl
