// Bearer tokens with roles, without gRPC: which role each method needs
// (MethodRoles), and the table of principals read from --tokens_file.
//
// The gRPC port checks calls with it through TokenAuth
// (scheduler/service/auth.h); the HTTP API (scheduler/http/api.h) checks
// its requests with the same table and the same method names, so both
// ports agree on who may do what. This header includes no gRPC, so the
// HTTP side builds without it.
//
// Missing or unknown token: UNAUTHENTICATED; a known principal without the
// role: PERMISSION_DENIED naming the principal and the role. Tokens are
// never logged; the principal's name is.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace taskgrid::service {

enum class Role {
  kNone,       // anyone, no token (health, reflection)
  kReader,     // look: Get/List/Wait/Watch, cluster stats and agents
  kSubmitter,  // change tasks and jobs (submit, cancel, retry, ...) + reader
  kAgent,      // AgentService only
  kAdmin,      // everything, cluster and queue changes too (DrainAgent, PauseQueue)
};

// "reader", "submitter", "agent", "admin", "none".
std::string RoleName(Role role);

// Full method name ("/taskgrid.v1.TaskService/SubmitTasks") -> the role it
// needs. Every method the scheduler serves is here.
const std::map<std::string, Role>& MethodRoles();

// The role `method` needs: its entry in MethodRoles(), else admin.
Role RequiredRole(const std::string& method);

// Whether holding `held` lets a caller call a method that needs `needed`.
bool Grants(Role held, Role needed);

// The principals of one tokens file. Immutable after Parse, so any thread
// may use it without a lock.
class TokenTable {
 public:
  struct Principal {
    std::string name;
    std::vector<Role> roles;
    std::string token;
    // The agent ids (and board owners) it may act as: exact names, or
    // prefixes ending in '*' ("*" alone: any). Empty: its own name only.
    std::vector<std::string> ids;
  };

  // Lines "NAME ROLE[,ROLE...] TOKEN [ids=ID[,ID...]]"; '#' starts a
  // comment; blank lines are fine. `origin` (a path) names the file in
  // errors, with the line number.
  static absl::StatusOr<std::unique_ptr<TokenTable>> Parse(const std::string& text,
                                                           const std::string& origin);
  // Parse of the file at `path`; warns when other users may read it.
  static absl::StatusOr<std::unique_ptr<TokenTable>> FromFile(const std::string& path);

  // The principal holding `token` (compared in constant time), or null.
  const Principal* Find(const std::string& token) const;
  // OK, or UNAUTHENTICATED / PERMISSION_DENIED for `method` called with
  // `authorization` (the metadata value, "Bearer <token>"; empty: none).
  // Sets *principal to the caller's name when the token is known.
  absl::Status Check(const std::string& method, const std::string& authorization,
                     std::string* principal) const;

  // OK when the principal named `principal` may act as agent id (or board
  // owner) `id`; PERMISSION_DENIED naming both and what it may act as.
  absl::Status CheckActsAs(const std::string& principal, const std::string& id,
                           absl::string_view what) const;

  // OK when the principal named `principal` is in this table and holds
  // the role `method` needs; UNAUTHENTICATED when it is not in it (its
  // token was removed), PERMISSION_DENIED when it lacks the role. For a
  // call that outlives a reload: a stream checks its caller again.
  absl::Status CheckPrincipal(const std::string& principal, const std::string& method) const;

  size_t size() const { return principals_.size(); }
  const std::vector<Principal>& principals() const { return principals_; }

 private:
  explicit TokenTable(std::vector<Principal> principals) : principals_(std::move(principals)) {}
  const std::vector<Principal> principals_;
};

// The scheduler's current TokenTable, from --tokens_file, replaced whole
// when the file is read again (Reload, on SIGHUP). Both ports hold this
// and take Current() for each call, so a reload is seen by the next call
// on either port, on connections already open too.
//
// Thread-safe: Current() and Reload() may run on any thread. A caller's
// snapshot stays valid (the old table lives on) until it drops it.
class ReloadableTokens {
 public:
  // What a reload changed: principals added, removed, and kept with a
  // different token, roles or ids (by name).
  struct Change {
    size_t size = 0;
    std::vector<std::string> added;
    std::vector<std::string> removed;
    std::vector<std::string> changed;
  };

  ReloadableTokens(std::string path, std::shared_ptr<const TokenTable> table)
      : path_(std::move(path)), table_(std::move(table)) {}
  // The table of the file at `path` (TokenTable::FromFile).
  static absl::StatusOr<std::unique_ptr<ReloadableTokens>> FromFile(const std::string& path);

  std::shared_ptr<const TokenTable> Current() const;

  // Reads the file again. When it parses, its table replaces the current
  // one and the change is returned; when it does not (a bad line, the
  // file unreadable), the current table stays and the error names the
  // file (and line).
  absl::StatusOr<Change> Reload();
  // Reload, logged: the error, or how many tokens and which names were
  // added, removed and changed. Never logs a token.
  void ReloadAndLog();

  // Makes `table` the current one (Reload after reading the file).
  Change Replace(std::shared_ptr<const TokenTable> table);

  const std::string& path() const { return path_; }

  // How many times the table was replaced: a stream that checked its
  // caller at one generation need not look again until it changes.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTable> table_;  // guarded by mu_; never null
  std::atomic<uint64_t> generation_{0};      // bumped under mu_ with table_
};

}  // namespace taskgrid::service
