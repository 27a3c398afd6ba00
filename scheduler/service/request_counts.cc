#include "scheduler/service/request_counts.h"

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"

namespace taskgrid::service {

namespace {

using grpc::experimental::InterceptionHookPoints;

class RequestCountInterceptor final : public grpc::experimental::Interceptor {
 public:
  RequestCountInterceptor(RequestCounts* counts, const char* method)
      : counts_(counts), method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      counts_->Count(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  RequestCounts* const counts_;
  const char* const method_;
};

}  // namespace

void RequestCounts::Count(absl::string_view method, int code) {
  if (code < 0 || code >= kNumCodes) code = static_cast<int>(absl::StatusCode::kUnknown);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(method);
  if (it == counts_.end()) {
    it = counts_.try_emplace(Defined(method) ? method : kUnknownMethod).first;
  }
  ++it->second[code];
}

bool RequestCounts::Defined(absl::string_view method) {
  // "/package.Service/Method"
  if (method.size() < 4 || method[0] != '/') return false;
  const size_t slash = method.rfind('/');
  if (slash == 0 || slash + 1 == method.size()) return false;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(method.substr(1, slash - 1)));
  return service != nullptr &&
         service->FindMethodByName(std::string(method.substr(slash + 1))) != nullptr;
}

std::map<std::string, std::map<std::string, int64_t>> RequestCounts::Counts() const {
  std::map<std::string, std::map<std::string, int64_t>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [method, codes] : counts_) {
    for (int c = 0; c < kNumCodes; ++c) {
      if (codes[c] == 0) continue;
      out[method][absl::StatusCodeToString(static_cast<absl::StatusCode>(c))] = codes[c];
    }
  }
  return out;
}

RequestCounts& GrpcRequests() {
  static RequestCounts* counts = new RequestCounts();
  return *counts;
}

grpc::experimental::Interceptor* RequestCountInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RequestCountInterceptor(counts_, info->method());
}

}  // namespace taskgrid::service
