// Requests the gRPC port answered, by method and status code: what
// /metrics shows as taskgrid_grpc_requests_total, so an error rate by
// method is one query.
//
// A server interceptor counts each call as its status is sent (after
// ParseErrorInterceptorFactory's rewrite). Calls refused before they
// reach a method (no token, a bad certificate) are not here: they are in
// taskgrid_refused_requests_total. A call to a method no service of this
// binary defines (gRPC answers it UNIMPLEMENTED) counts as kUnknownMethod,
// so whatever paths callers send, the series stay bounded.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace taskgrid::service {

class RequestCounts {
 public:
  static constexpr char kUnknownMethod[] = "(unknown)";
  // gRPC's codes are 0 (OK) to 16 (UNAUTHENTICATED).
  static constexpr int kNumCodes = 17;

  // `method` as gRPC names it ("/taskgrid.v1.TaskService/SubmitTasks").
  void Count(absl::string_view method, int code);
  // Whether `method` is "/SERVICE/METHOD" of a service in the protobuf
  // descriptors linked into this binary.
  static bool Defined(absl::string_view method);
  // By method, then by code name ("OK", "NOT_FOUND", ...): only the
  // counts above 0.
  std::map<std::string, std::map<std::string, int64_t>> Counts() const;

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::array<int64_t, kNumCodes>> counts_;  // guarded by mu_
};

// The process's (one gRPC port).
RequestCounts& GrpcRequests();

class RequestCountInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestCountInterceptorFactory(RequestCounts* counts) : counts_(counts) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  RequestCounts* const counts_;
};

}  // namespace taskgrid::service
