// The one place that maps between absl::Status (used inside) and
// grpc::Status (on the wire).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace taskgrid {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace taskgrid
