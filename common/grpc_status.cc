#include "common/grpc_status.h"

#include <cctype>
#include <string>

namespace taskgrid {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

bool AnsweredByStandby(const grpc::ClientContext& ctx) {
  return ctx.GetServerTrailingMetadata().count(kStandbyKey) > 0;
}

std::string LeaderNamedBy(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find(kLeaderKey);
  if (it == md.end()) return "";
  // Only what an address may hold: a reply cannot smuggle a flag or a
  // line break into a log or a target.
  std::string leader(it->second.data(), it->second.size());
  if (leader.size() > 256) return "";
  for (char c : leader) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == ':' || c == '-' ||
          c == '_' || c == '[' || c == ']')) {
      return "";
    }
  }
  return leader;
}

}  // namespace taskgrid
