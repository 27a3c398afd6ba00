#include "scheduler/service/parse_errors.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace taskgrid::service {

namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request to ", method_,
                       " could not be parsed: not a protobuf of the method's request type")));
    }
    methods->Proceed();
  }

 private:
  const char* const method_;
  bool unparsed_ = false;  // hooks of one call do not overlap
};

}  // namespace

grpc::experimental::Interceptor* ParseErrorInterceptorFactory::CreateServerInterceptor(
    ServerRpcInfo* info) {
  // Streams from the client have no one request to miss.
  if (info->type() != ServerRpcInfo::Type::UNARY &&
      info->type() != ServerRpcInfo::Type::SERVER_STREAMING) {
    return nullptr;
  }
  return new ParseErrorInterceptor(info->method());
}

}  // namespace taskgrid::service
