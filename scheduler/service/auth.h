// The scheduler's trust boundary for calls: bearer tokens with roles, and
// the binding of an agent's id to its client certificate.
//
// TokenAuth is a grpc::AuthMetadataProcessor set on the server's TLS
// credentials, so gRPC runs it for every call before any handler: it maps
// "authorization: Bearer <token>" to a principal (a name with roles) and
// checks the role the method needs, from the one table MethodRoles(). A
// method missing from the table needs admin. Health and reflection need no
// token. Missing or unknown token: UNAUTHENTICATED; a known principal
// without the role: PERMISSION_DENIED naming the principal and the role.
// Tokens are never logged; the principal's name is.
//
// Immutable after construction; Process() may run on any gRPC thread.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/refusal_log.h"

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

// The AuthContext property TokenAuth sets to the caller's principal name.
inline constexpr char kPrincipalProperty[] = "taskgrid_principal";

class TokenAuth final : public grpc::AuthMetadataProcessor {
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
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Parse(const std::string& text,
                                                          const std::string& origin);
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromFile(const std::string& path);

  // The principal holding `token` (compared in constant time), or null.
  const Principal* Find(const std::string& token) const;
  // OK, or UNAUTHENTICATED / PERMISSION_DENIED for `method` called with
  // `authorization` (the metadata value, "Bearer <token>"; empty: none).
  // Sets *principal to the caller's name when the token is known.
  absl::Status Check(const std::string& method, const std::string& authorization,
                     std::string* principal) const;

  size_t size() const { return principals_.size(); }

  // OK when the principal named `principal` may act as agent id (or board
  // owner) `id`; PERMISSION_DENIED naming both and what it may act as.
  absl::Status CheckActsAs(const std::string& principal, const std::string& id,
                           absl::string_view what) const;

  // grpc::AuthMetadataProcessor: a table lookup, never blocks.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  explicit TokenAuth(std::vector<Principal> principals) : principals_(std::move(principals)) {}
  const std::vector<Principal> principals_;
};

// With mTLS an agent may only use an id its certificate names, and a pull
// worker only such an owner: OK when `agent_id` is one of `cert_names`
// (PeerCertificateNames), else PERMISSION_DENIED naming the id (as `what`:
// "agent id", "owner") and the certificate's names.
absl::Status CheckAgentIdentity(const std::string& agent_id,
                                const std::vector<std::string>& cert_names,
                                absl::string_view what = "agent id");

// The gRPC port's refusals (tokens, roles, agent ids): counted, and
// logged at most once a second (common/refusal_log.h).
RefusalLog& GrpcRefusals();

// Who a caller may act as (a Hello's agent_id, a board call's owner),
// from what it proved: the names of its verified client certificate (with
// mTLS) and its token's principal (with tokens). Either, both or neither
// may apply; each that does must allow the id.
struct CallerIdentity {
  std::optional<std::vector<std::string>> cert_names;  // set with mTLS
  const TokenAuth* tokens = nullptr;                   // set with tokens
  std::string principal;                               // the token's name

  // From the call's auth context: `bind_certificates` when the server
  // requires client certificates, `tokens` (may be null) when it checks
  // tokens.
  static CallerIdentity Of(const grpc::ServerContextBase& ctx, bool bind_certificates,
                           const TokenAuth* tokens);
  // OK, or PERMISSION_DENIED naming `id` (as `what`: "agent id", "owner").
  absl::Status Check(const std::string& id, absl::string_view what = "agent id") const;
};

}  // namespace taskgrid::service
