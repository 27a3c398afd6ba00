// The client services' unary methods as one table, so the HTTP API can
// serve each of them from JSON: TaskService, JobService, ScheduleService,
// ClusterService and BoardService, every method that is not a stream or a
// long poll. Each entry calls the Engine method its gRPC handler calls
// (scheduler/service/*_service.cc), with the same request message, and
// answers the same response message.
//
// Thread-safe: Call may run on any thread; the Engine is borrowed and must
// outlive the table.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::http {

using RpcReply = std::function<void(absl::StatusOr<std::unique_ptr<google::protobuf::Message>>)>;

struct RpcMethod {
  const google::protobuf::MethodDescriptor* descriptor;
  // "/taskgrid.v1.TaskService/SubmitTasks": the gRPC path, which names the
  // role the method needs (service::MethodRoles()).
  std::string grpc_path;
  // A new, empty request message.
  std::function<std::unique_ptr<google::protobuf::Message>()> new_request;
  // Board calls: the owner the request acts as (checked against the
  // caller's token before Call); null for other methods.
  std::function<std::string(const google::protobuf::Message&)> owner;
  // Runs the method on a request made by new_request; `done` runs once
  // with the response (after what it changed is durable) or the error.
  std::function<void(const google::protobuf::Message&, RpcReply done)> call;
};

// Every unary method of the five client services, in the order of their
// .proto files.
std::vector<RpcMethod> RpcMethods(engine::Engine* engine);

// The names of the services RpcMethods serves ("taskgrid.v1.TaskService", ...).
const std::vector<std::string>& RpcServiceNames();

}  // namespace taskgrid::http
