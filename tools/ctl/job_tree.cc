#include "tools/ctl/job_tree.h"

#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/core/state_machine.h"
#include "tools/ctl/output.h"

namespace taskgrid::ctl {

namespace {

constexpr size_t kNone = static_cast<size_t>(-1);
// Dependencies named in a NOTE before "and N more".
constexpr int kMaxNamed = 5;
// Code points of a reason in the NOTE column.
constexpr size_t kMaxReason = 60;

std::string TreeCell(size_t depth, const std::string& id) {
  if (depth <= kMaxTreeIndent) return absl::StrCat(std::string(2 * depth, ' '), id);
  return absl::StrCat(std::string(2 * kMaxTreeIndent, ' '), "[", depth, "] ", id);
}

// The agent of the live attempt, else of the last finished one; "-" if none.
std::string AgentOf(const v1::Task& t) {
  if (!t.agent_id().empty()) return t.agent_id();
  if (!t.attempts().empty() && !t.attempts().rbegin()->agent_id().empty()) {
    return t.attempts().rbegin()->agent_id();
  }
  return "-";
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s;
}

// Every dependency of `t` but the one it is drawn under (`skip`, may be
// empty), as "(also after: a, b)" or, for a root, "(after: a, b)".
std::string OtherDeps(const v1::Task& t, const std::string& skip, bool root) {
  std::vector<std::string> names;
  int more = 0;
  bool skipped = false;
  for (const std::string& dep : t.spec().depends_on()) {
    if (!skipped && !skip.empty() && dep == skip) {
      skipped = true;
      continue;
    }
    if (static_cast<int>(names.size()) < kMaxNamed) {
      names.push_back(dep);
    } else {
      ++more;
    }
  }
  if (names.empty()) return "";
  std::string out = absl::StrCat(root ? "(after: " : "(also after: ", absl::StrJoin(names, ", "));
  if (more > 0) absl::StrAppend(&out, " and ", more, " more");
  return out + ")";
}

}  // namespace

std::string FormatJobTree(const std::vector<v1::Task>& tasks) {
  const size_t n = tasks.size();
  std::unordered_map<std::string, size_t> index;
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) index.emplace(tasks[i].spec().id(), i);

  // Each task hangs under its first dependency inside the job.
  std::vector<size_t> parent(n, kNone);
  std::vector<std::vector<size_t>> children(n);
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& dep : tasks[i].spec().depends_on()) {
      auto it = index.find(dep);
      if (it != index.end() && it->second != i) {
        parent[i] = it->second;
        break;
      }
    }
    if (parent[i] != kNone) children[parent[i]].push_back(i);
  }

  Table table({"STATE", "TASK", "ATTEMPTS", "AGENT", "NOTE"});
  std::vector<bool> printed(n, false);
  std::vector<std::pair<size_t, size_t>> stack;  // (task, depth), next on top
  auto draw_from = [&](size_t root) {
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      const auto [i, depth] = stack.back();
      stack.pop_back();
      if (printed[i]) continue;
      printed[i] = true;
      const v1::Task& t = tasks[i];
      const bool is_root = parent[i] == kNone || depth == 0;
      std::vector<std::string> notes;
      const std::string deps = OtherDeps(t, is_root ? "" : tasks[parent[i]].spec().id(), is_root);
      if (!deps.empty()) notes.push_back(deps);
      if (t.state() != v1::TASK_STATE_SUCCEEDED && !t.reason().empty()) {
        notes.push_back(Shorten(OneLine(t.reason()), kMaxReason));
      }
      table.AddRow({TaskStateText(t), TreeCell(depth, t.spec().id()), AttemptsText(t), AgentOf(t),
                    absl::StrJoin(notes, "  ")});
      // Reversed, so the first child comes off the stack first.
      for (auto it = children[i].rbegin(); it != children[i].rend(); ++it) {
        stack.emplace_back(*it, depth + 1);
      }
    }
  };
  for (size_t i = 0; i < n; ++i) {
    if (parent[i] == kNone) draw_from(i);
  }
  // Only a cycle of first dependencies (which the scheduler refuses) is
  // left: drawn from its first task rather than dropped.
  for (size_t i = 0; i < n; ++i) {
    if (!printed[i]) draw_from(i);
  }
  return table.Render();
}

}  // namespace taskgrid::ctl
