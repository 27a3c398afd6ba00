// The one place that maps between absl::Status (used inside) and
// grpc::Status (on the wire).
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace taskgrid {

// Metadata of WatchTasks. Initial, on every stream: the revision the watch
// starts after (the first event it sends is a later one), so a client that
// watched "from now" and lost the stream can resume without a gap.
inline constexpr char kWatchStartsAfterKey[] = "taskgrid-watch-starts-after";
// Trailing, on a watch ended for falling behind: the revision to resume after.
inline constexpr char kResumeAfterKey[] = "taskgrid-resume-after";

// Trailing metadata of a standby scheduler's UNAVAILABLE answer: the
// address of the scheduler that leads (SchedulerAddresses, common/address.h)
// when one does, and kStandbyKey on every such answer (the call was not
// run, so it may be made again, also a submit without ids).
inline constexpr char kLeaderKey[] = "taskgrid-leader";
inline constexpr char kStandbyKey[] = "taskgrid-standby";
// The leader a finished call's answer named, or "".
std::string LeaderNamedBy(const grpc::ClientContext& ctx);
// Whether a finished call was answered by a standby.
bool AnsweredByStandby(const grpc::ClientContext& ctx);

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace taskgrid
