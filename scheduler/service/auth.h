// The scheduler's trust boundary for gRPC calls: bearer tokens with roles,
// and the binding of an agent's id to its client certificate.
//
// TokenAuth is a grpc::AuthMetadataProcessor set on the server's TLS
// credentials, so gRPC runs it for every call before any handler: it maps
// "authorization: Bearer <token>" to a principal (a name with roles) and
// checks the role the method needs, with the token table and the one
// method table of scheduler/service/tokens.h (which the HTTP API shares).
// A method missing from the table needs admin. Health and reflection need
// no token.
//
// Thread-safe: Process() may run on any gRPC thread; it checks each call
// with the tokens' current table (ReloadableTokens), so a reloaded tokens
// file applies from the next call on, on open connections too.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/refusal_log.h"
#include "scheduler/service/tokens.h"

namespace taskgrid::service {

// The AuthContext property TokenAuth sets to the caller's principal name.
inline constexpr char kPrincipalProperty[] = "taskgrid_principal";

class TokenAuth final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuth(std::shared_ptr<const ReloadableTokens> tokens) : tokens_(std::move(tokens)) {}

  // The table each call is checked with: its current one, so a reload
  // applies to the next call.
  const ReloadableTokens& tokens() const { return *tokens_; }

  // grpc::AuthMetadataProcessor: a table lookup, never blocks.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::shared_ptr<const ReloadableTokens> tokens_;
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
  // Set with tokens; borrowed, outlives the call. Checks use its current
  // table.
  const ReloadableTokens* tokens = nullptr;
  std::string principal;  // the token's name

  // From the call's auth context: `bind_certificates` when the server
  // requires client certificates, `tokens` (may be null) when it checks
  // tokens.
  static CallerIdentity Of(const grpc::ServerContextBase& ctx, bool bind_certificates,
                           const ReloadableTokens* tokens);
  // OK, or PERMISSION_DENIED naming `id` (as `what`: "agent id", "owner").
  absl::Status Check(const std::string& id, absl::string_view what = "agent id") const;
  // For a stream, on each message: with tokens, OK while the current
  // table still holds the caller's principal with the role `method` needs
  // and lets it act as `id`; else UNAUTHENTICATED or PERMISSION_DENIED
  // (its token was removed or changed by a reload). Without tokens: OK.
  absl::Status CheckStill(const std::string& method, const std::string& id,
                          absl::string_view what = "agent id") const;
};

}  // namespace taskgrid::service
