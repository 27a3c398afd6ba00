// The one place that maps between absl::Status (used inside) and
// grpc::Status (on the wire).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace taskgrid {

// Metadata of WatchTasks. Initial, on every stream: the revision the watch
// starts after (the first event it sends is a later one), so a client that
// watched "from now" and lost the stream can resume without a gap.
inline constexpr char kWatchStartsAfterKey[] = "taskgrid-watch-starts-after";
// Trailing, on a watch ended for falling behind: the revision to resume after.
inline constexpr char kResumeAfterKey[] = "taskgrid-resume-after";

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace taskgrid
