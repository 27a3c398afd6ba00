// Many unary calls with a fixed number in flight: when one completes, the
// next starts. RunPipelined runs any call through gRPC's callback client
// API; SubmitPipelined runs SubmitTasks on a completion queue that the
// caller's thread polls (W1's 64 in flight and batches, W2's and W8's
// submits, filling tables).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "taskgrid/v1/task_service.grpc.pb.h"

namespace taskgrid::bench {

// Starts call i on `ctx` (deadline already set) and arranges for `done` to
// be called exactly once with its status. Called from the caller's thread
// and from gRPC threads, never after RunPipelined returned.
using StartCallFn = std::function<void(int64_t i, grpc::ClientContext* ctx,
                                       std::function<void(const grpc::Status&)> done)>;

// Runs calls 0..total-1 with at most `in_flight` outstanding. Stops at the
// first failed call (its error, naming `what`). After `timeout` every open
// call is cancelled and the result is DeadlineExceeded.
absl::Status RunPipelined(const std::string& what, int64_t total, int in_flight,
                          absl::Duration timeout, const StartCallFn& start);

// SubmitTasks of `count` tasks made by make(i), `batch` per call, `in_flight`
// calls at once, as RunPipelined (stops at the first failure; cancels what is
// open after `timeout`).
absl::Status SubmitPipelined(v1::TaskService::Stub* stub, int64_t count, int batch, int in_flight,
                             absl::Duration timeout,
                             const std::function<v1::TaskSpec(int64_t)>& make);

}  // namespace taskgrid::bench
