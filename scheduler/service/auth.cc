#include "scheduler/service/auth.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/tls.h"

namespace taskgrid::service {

grpc::Status TokenAuth::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                OutputMetadata* consumed_auth_metadata,
                                OutputMetadata* /*response_metadata*/) {
  std::string method;
  std::string authorization;
  for (const auto& [key, value] : auth_metadata) {
    if (key == ":path") method.assign(value.data(), value.size());
    if (key == "authorization") {
      authorization.assign(value.data(), value.size());
      // Handlers never see the token.
      consumed_auth_metadata->insert({std::string(key.data(), key.size()), authorization});
    }
  }
  std::string principal;
  absl::Status s = tokens_->Current()->Check(method, authorization, &principal);
  if (!s.ok()) {
    GrpcRefusals().Log(s.code(),
                       absl::StrCat("refused ", method, " from ",
                                    principal.empty() ? "a caller" : principal, ": ", s.message()));
    return ToGrpcStatus(s);
  }
  if (!principal.empty()) context->AddProperty(kPrincipalProperty, principal);
  return grpc::Status::OK;
}

RefusalLog& GrpcRefusals() {
  static RefusalLog* const log = new RefusalLog();
  return *log;
}

CallerIdentity CallerIdentity::Of(const grpc::ServerContextBase& ctx, bool bind_certificates,
                                  const ReloadableTokens* tokens) {
  CallerIdentity who;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (bind_certificates) {
    who.cert_names = auth == nullptr ? std::vector<std::string>{} : PeerCertificateNames(*auth);
  }
  if (tokens != nullptr) {
    who.tokens = tokens;
    if (auth != nullptr) {
      for (const grpc::string_ref& v : auth->FindPropertyValues(kPrincipalProperty)) {
        who.principal.assign(v.data(), v.size());
      }
    }
  }
  return who;
}

absl::Status CallerIdentity::Check(const std::string& id, absl::string_view what) const {
  if (cert_names.has_value()) {
    if (absl::Status s = CheckAgentIdentity(id, *cert_names, what); !s.ok()) return s;
  }
  if (tokens != nullptr) return tokens->Current()->CheckActsAs(principal, id, what);
  return absl::OkStatus();
}

absl::Status CallerIdentity::CheckStill(const std::string& method, const std::string& id,
                                        absl::string_view what) const {
  if (tokens == nullptr) return absl::OkStatus();
  const std::shared_ptr<const TokenTable> table = tokens->Current();
  if (absl::Status s = table->CheckPrincipal(principal, method); !s.ok()) return s;
  return table->CheckActsAs(principal, id, what);
}

absl::Status CheckAgentIdentity(const std::string& agent_id,
                                const std::vector<std::string>& cert_names,
                                absl::string_view what) {
  if (std::find(cert_names.begin(), cert_names.end(), agent_id) != cert_names.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, " ", agent_id, " is not a name of the client certificate (its names: ",
                   cert_names.empty() ? "none" : absl::StrJoin(cert_names, ", "), "): a ", what,
                   " may only be a name its certificate names"));
}

}  // namespace taskgrid::service
