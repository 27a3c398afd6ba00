// A request that does not parse gets INVALID_ARGUMENT saying so.
//
// gRPC's callback server answers a unary (or server-streaming) request
// whose bytes do not parse as the method's request message with
// UNIMPLEMENTED and no message, which reads as "no such method". This
// server interceptor sees the failed parse (the received message is null
// where the method takes exactly one) and rewrites that status, as it is
// sent, to INVALID_ARGUMENT naming the method. Nothing reached a handler,
// so nothing changed.
#pragma once

#include <grpcpp/support/server_interceptor.h>

namespace taskgrid::service {

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace taskgrid::service
