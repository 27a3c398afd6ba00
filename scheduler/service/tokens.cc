#include "scheduler/service/tokens.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/ids.h"
#include "common/secret_file.h"

namespace taskgrid::service {

namespace {

// Shorter tokens are guessable; `openssl rand -hex 32` makes 64 characters.
constexpr size_t kMinTokenLength = 16;

std::optional<Role> ParseRole(absl::string_view name) {
  if (name == "reader") return Role::kReader;
  if (name == "submitter") return Role::kSubmitter;
  if (name == "agent") return Role::kAgent;
  if (name == "admin") return Role::kAdmin;
  return std::nullopt;
}

// Equal without an early exit, so the time taken does not tell how much of
// a guessed token was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// PERMISSION_DENIED naming the principal, its roles and the role `method`
// needs.
absl::Status RoleError(const TokenTable::Principal& p, const std::string& method, Role needed) {
  std::vector<std::string> held;
  for (Role r : p.roles) held.push_back(RoleName(r));
  return absl::PermissionDeniedError(absl::StrCat(p.name, " (", absl::StrJoin(held, ","),
                                                  ") may not call ", method, ": it needs role ",
                                                  RoleName(needed)));
}

}  // namespace

std::string RoleName(Role role) {
  switch (role) {
    case Role::kNone:
      return "none";
    case Role::kReader:
      return "reader";
    case Role::kSubmitter:
      return "submitter";
    case Role::kAgent:
      return "agent";
    case Role::kAdmin:
      return "admin";
  }
  return "admin";
}

const std::map<std::string, Role>& MethodRoles() {
  static const auto* const table = new std::map<std::string, Role>{
      // Anyone: load balancers and probes check health; reflection only
      // describes the API.
      {"/grpc.health.v1.Health/Check", Role::kNone},
      {"/grpc.health.v1.Health/Watch", Role::kNone},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Role::kNone},
      {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Role::kNone},
      // Looking.
      {"/taskgrid.v1.TaskService/GetTask", Role::kReader},
      {"/taskgrid.v1.TaskService/ListTasks", Role::kReader},
      {"/taskgrid.v1.TaskService/GetQueueStats", Role::kReader},
      {"/taskgrid.v1.TaskService/WaitTask", Role::kReader},
      {"/taskgrid.v1.TaskService/WatchTasks", Role::kReader},
      {"/taskgrid.v1.TaskService/StreamTaskOutput", Role::kReader},
      {"/taskgrid.v1.JobService/GetJob", Role::kReader},
      {"/taskgrid.v1.JobService/ListJobs", Role::kReader},
      {"/taskgrid.v1.ClusterService/ListAgents", Role::kReader},
      {"/taskgrid.v1.ClusterService/GetClusterStats", Role::kReader},
      {"/taskgrid.v1.ScheduleService/GetSchedule", Role::kReader},
      {"/taskgrid.v1.ScheduleService/ListSchedules", Role::kReader},
      // Changing tasks and jobs. SubmitTasks runs programs on the agents.
      {"/taskgrid.v1.TaskService/SubmitTasks", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/CancelTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/RetryTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/ResetTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/PauseTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/ResumeTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/DeleteByMergeKey", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/CancelTasks", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/RetryTasks", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/PauseQueue", Role::kAdmin},
      {"/taskgrid.v1.TaskService/ResumeQueue", Role::kAdmin},
      {"/taskgrid.v1.TaskService/SetQueueLimits", Role::kAdmin},
      {"/taskgrid.v1.TaskService/SetQueueWeight", Role::kAdmin},
      {"/taskgrid.v1.TaskService/SetQueueRetention", Role::kAdmin},
      // Deleting finished work: what cancelling unfinished work is.
      {"/taskgrid.v1.TaskService/DeleteTask", Role::kSubmitter},
      {"/taskgrid.v1.TaskService/DeleteTasks", Role::kSubmitter},
      {"/taskgrid.v1.JobService/DeleteJob", Role::kSubmitter},
      {"/taskgrid.v1.JobService/SubmitJob", Role::kSubmitter},
      {"/taskgrid.v1.JobService/CancelJob", Role::kSubmitter},
      {"/taskgrid.v1.JobService/RetryJob", Role::kSubmitter},
      {"/taskgrid.v1.BoardService/RestoreTask", Role::kSubmitter},
      // Schedules submit tasks on their own, so they are a submitter's.
      {"/taskgrid.v1.ScheduleService/CreateSchedule", Role::kSubmitter},
      {"/taskgrid.v1.ScheduleService/PauseSchedule", Role::kSubmitter},
      {"/taskgrid.v1.ScheduleService/ResumeSchedule", Role::kSubmitter},
      {"/taskgrid.v1.ScheduleService/DeleteSchedule", Role::kSubmitter},
      // Agents.
      {"/taskgrid.v1.AgentService/Connect", Role::kAgent},
      // Pull workers do an agent's work: they receive tasks and report.
      {"/taskgrid.v1.BoardService/Claim", Role::kAgent},
      {"/taskgrid.v1.BoardService/ExtendClaim", Role::kAgent},
      {"/taskgrid.v1.BoardService/CompleteClaim", Role::kAgent},
      {"/taskgrid.v1.BoardService/AbandonClaim", Role::kAgent},
      {"/taskgrid.v1.BoardService/TrashClaim", Role::kAgent},
      {"/taskgrid.v1.BoardService/WaitForWork", Role::kAgent},
      // Changing the cluster.
      {"/taskgrid.v1.ClusterService/DrainAgent", Role::kAdmin},
      {"/taskgrid.v1.ClusterService/UndrainAgent", Role::kAdmin},
  };
  return *table;
}

Role RequiredRole(const std::string& method) {
  const auto& table = MethodRoles();
  auto it = table.find(method);
  return it == table.end() ? Role::kAdmin : it->second;
}

bool Grants(Role held, Role needed) {
  if (needed == Role::kNone || held == needed || held == Role::kAdmin) return true;
  return held == Role::kSubmitter && needed == Role::kReader;
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::Parse(const std::string& text,
                                                              const std::string& origin) {
  std::vector<Principal> principals;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const std::string where = absl::StrCat(origin, ":", line_no, ": ");
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 3 && fields.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected 'NAME ROLE[,ROLE...] TOKEN [ids=ID[,ID...]]', got ",
                       fields.size(), " fields"));
    }
    Principal p;
    p.name = std::string(fields[0]);
    for (absl::string_view r : absl::StrSplit(fields[1], ',')) {
      std::optional<Role> role = ParseRole(r);
      if (!role.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "unknown role '", std::string(r), "' (roles: reader, submitter, agent, admin)"));
      }
      p.roles.push_back(*role);
    }
    p.token = std::string(fields[2]);
    if (fields.size() == 4) {
      absl::string_view ids = fields[3];
      if (!absl::ConsumePrefix(&ids, "ids=") || ids.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the fourth field must be ids=ID[,ID...] (the agent ids and board owners ",
            p.name, " may act as; 'name*' for a prefix, '*' for any)"));
      }
      for (absl::string_view id : absl::StrSplit(ids, ',')) {
        absl::string_view stem = id;
        absl::ConsumeSuffix(&stem, "*");
        if (id != "*" && !IsValidName(stem, kMaxIdLength)) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "'", std::string(id), "' in ids= is not an agent id or prefix*"));
        }
        p.ids.emplace_back(id);
      }
    }
    if (p.token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the token of ", p.name,
                                                     " is shorter than ", kMinTokenLength,
                                                     " characters (e.g. openssl rand -hex 32)"));
    }
    for (const Principal& q : principals) {
      if (q.name == p.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "principal ", p.name, " is named twice"));
      }
      if (q.token == p.token) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the token of ", p.name, " is already the token of ", q.name));
      }
    }
    principals.push_back(std::move(p));
  }
  if (principals.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": no tokens in it"));
  }
  return std::unique_ptr<TokenTable>(new TokenTable(std::move(principals)));
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("--tokens_file ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  if (std::string w = OthersMayReadWarning(path, "--tokens_file"); !w.empty()) {
    spdlog::warn("{}", w);
  }
  return Parse(text.str(), path);
}

const TokenTable::Principal* TokenTable::Find(const std::string& token) const {
  const Principal* found = nullptr;
  // Every entry is compared, so the time does not tell which one matched.
  for (const Principal& p : principals_) {
    if (ConstantTimeEquals(p.token, token)) found = &p;
  }
  return found;
}

absl::Status TokenTable::Check(const std::string& method, const std::string& authorization,
                               std::string* principal) const {
  const Role needed = RequiredRole(method);
  if (needed == Role::kNone) return absl::OkStatus();
  absl::string_view value = authorization;
  if (value.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, " needs a bearer token (authorization: Bearer <token>)"));
  }
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  }
  const Principal* p = Find(std::string(absl::StripAsciiWhitespace(value)));
  if (p == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  *principal = p->name;
  for (Role held : p->roles) {
    if (Grants(held, needed)) return absl::OkStatus();
  }
  return RoleError(*p, method, needed);
}

absl::Status TokenTable::CheckPrincipal(const std::string& principal,
                                        const std::string& method) const {
  const Role needed = RequiredRole(method);
  if (needed == Role::kNone) return absl::OkStatus();
  for (const Principal& p : principals_) {
    if (p.name != principal) continue;
    for (Role held : p.roles) {
      if (Grants(held, needed)) return absl::OkStatus();
    }
    return RoleError(p, method, needed);
  }
  return absl::UnauthenticatedError(
      absl::StrCat("the token of ", principal, " is no longer in the tokens file"));
}

absl::Status TokenTable::CheckActsAs(const std::string& principal, const std::string& id,
                                     absl::string_view what) const {
  const Principal* p = nullptr;
  for (const Principal& q : principals_) {
    if (q.name == principal) p = &q;
  }
  if (p == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", id, ": the caller has no token"));
  }
  const std::vector<std::string> own = {p->name};
  const std::vector<std::string>& ids = p->ids.empty() ? own : p->ids;
  for (absl::string_view pattern : ids) {
    if (pattern == id || (absl::ConsumeSuffix(&pattern, "*") && absl::StartsWith(id, pattern))) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, " ", id, " is not one the token of ", p->name, " may act as (it may: ",
                   absl::StrJoin(ids, ", "), "): name it in the token's ids= in --tokens_file"));
}

absl::StatusOr<std::unique_ptr<ReloadableTokens>> ReloadableTokens::FromFile(
    const std::string& path) {
  auto table = TokenTable::FromFile(path);
  if (!table.ok()) return table.status();
  return std::make_unique<ReloadableTokens>(path,
                                            std::shared_ptr<const TokenTable>(std::move(*table)));
}

std::shared_ptr<const TokenTable> ReloadableTokens::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

absl::StatusOr<ReloadableTokens::Change> ReloadableTokens::Reload() {
  auto table = TokenTable::FromFile(path_);
  if (!table.ok()) return table.status();
  return Replace(std::shared_ptr<const TokenTable>(std::move(*table)));
}

ReloadableTokens::Change ReloadableTokens::Replace(std::shared_ptr<const TokenTable> table) {
  std::shared_ptr<const TokenTable> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::exchange(table_, table);
    generation_.fetch_add(1, std::memory_order_release);
  }
  // The old table is compared, and freed, outside the lock.
  Change change;
  change.size = table->size();
  std::map<absl::string_view, const TokenTable::Principal*> before;
  for (const TokenTable::Principal& p : old->principals()) before[p.name] = &p;
  for (const TokenTable::Principal& p : table->principals()) {
    auto it = before.find(p.name);
    if (it == before.end()) {
      change.added.push_back(p.name);
      continue;
    }
    const TokenTable::Principal& q = *it->second;
    if (q.token != p.token || q.roles != p.roles || q.ids != p.ids) {
      change.changed.push_back(p.name);
    }
    before.erase(it);
  }
  for (const auto& [name, p] : before) change.removed.emplace_back(name);
  return change;
}

void ReloadableTokens::ReloadAndLog() {
  absl::StatusOr<Change> change = Reload();
  if (!change.ok()) {
    spdlog::error("tokens not reloaded, the {} tokens from before stay: {}", Current()->size(),
                  std::string(change.status().message()));
    return;
  }
  auto names = [](const std::vector<std::string>& v) {
    return v.empty() ? std::string("none") : absl::StrJoin(v, ", ");
  };
  spdlog::info("reloaded {} bearer tokens from {}: added {}; removed {}; changed {}", change->size,
               path_, names(change->added), names(change->removed), names(change->changed));
}

}  // namespace taskgrid::service
