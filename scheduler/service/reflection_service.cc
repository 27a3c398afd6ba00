#include "scheduler/service/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <mutex>
#include <unordered_set>
#include <utility>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace taskgrid::service {

namespace {

namespace pb = google::protobuf;

// Adds `file` and, depth first, the files it depends on, each once.
template <typename Resp>
void AddFile(const pb::FileDescriptor* file, Resp* resp, std::unordered_set<std::string>* seen) {
  if (!seen->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(resp->mutable_file_descriptor_response()->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFile(file->dependency(i), resp, seen);
}

// The answer to one request (either version: the messages are the same).
template <typename Req, typename Resp>
void Answer(const std::vector<std::string>& services, const Req& req, Resp* resp) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  grpc::Status status;
  // The file a request names (with its dependencies) goes out after the
  // switch; a request that names none sets `status`.
  const pb::FileDescriptor* file = nullptr;
  auto not_found = [&status](const char* what) {
    status = grpc::Status(grpc::StatusCode::NOT_FOUND, what);
  };
  switch (req.message_request_case()) {
    case Req::kFileByFilename:
      file = pool->FindFileByName(req.file_by_filename());
      if (file == nullptr) not_found("File not found.");
      break;
    case Req::kFileContainingSymbol:
      file = pool->FindFileContainingSymbol(req.file_containing_symbol());
      if (file == nullptr) not_found("Symbol not found.");
      break;
    case Req::kFileContainingExtension: {
      const auto& ext = req.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      if (type == nullptr) {
        not_found("Type not found.");
      } else if (field == nullptr) {
        not_found("Extension not found.");
      } else {
        file = field->file();
      }
      break;
    }
    case Req::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type = pool->FindMessageTypeByName(req.all_extension_numbers_of_type());
      if (type == nullptr) {
        not_found("Type not found.");
      } else {
        std::vector<const pb::FieldDescriptor*> exts;
        pool->FindAllExtensions(type, &exts);
        auto* numbers = resp->mutable_all_extension_numbers_response();
        numbers->set_base_type_name(req.all_extension_numbers_of_type());
        for (const pb::FieldDescriptor* f : exts) numbers->add_extension_number(f->number());
      }
      break;
    }
    case Req::kListServices: {
      auto* list = resp->mutable_list_services_response();
      for (const std::string& name : services) list->add_service()->set_name(name);
      break;
    }
    default:
      status = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
  }
  if (file != nullptr) {
    std::unordered_set<std::string> seen;
    AddFile(file, resp, &seen);
  }
  if (!status.ok()) {
    resp->clear_message_response();
    resp->mutable_error_response()->set_error_code(status.error_code());
    resp->mutable_error_response()->set_error_message(status.error_message());
  }
  resp->set_valid_host(req.host());
  *resp->mutable_original_request() = req;
}

// A refused stream: ends at once with `status`.
template <typename Req, typename Resp>
class Refused final : public grpc::ServerBidiReactor<Req, Resp> {
 public:
  explicit Refused(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// One stream: read a request, write its answer, read the next. Only one
// operation is ever in flight, and every callback comes after the one
// before it, so no lock is needed.
template <typename Req, typename Resp>
class Stream final : public grpc::ServerBidiReactor<Req, Resp> {
 public:
  Stream(const std::vector<std::string>* services, StreamCaps* caps, std::string peer)
      : services_(services), caps_(caps), peer_(std::move(peer)) {
    this->StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done sending (or went away)
      this->Finish(grpc::Status::OK);
      return;
    }
    resp_.Clear();
    Answer(*services_, req_, &resp_);
    this->StartWrite(&resp_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream went away"));
      return;
    }
    this->StartRead(&req_);
  }

  void OnDone() override {
    caps_->Give(peer_);
    delete this;
  }

 private:
  const std::vector<std::string>* const services_;
  StreamCaps* const caps_;
  const std::string peer_;
  Req req_;
  Resp resp_;
};

template <typename Base, typename Req, typename Resp>
class Version final : public Base {
 public:
  Version(const std::vector<std::string>* services, StreamCaps* caps)
      : services_(services), caps_(caps) {}

  grpc::ServerBidiReactor<Req, Resp>* ServerReflectionInfo(
      grpc::CallbackServerContext* ctx) override {
    std::string peer = ctx->peer();
    grpc::Status taken = caps_->Take(peer);
    if (!taken.ok()) return new Refused<Req, Resp>(taken);
    return new Stream<Req, Resp>(services_, caps_, std::move(peer));
  }

 private:
  const std::vector<std::string>* const services_;
  StreamCaps* const caps_;
};

namespace v1alpha = grpc::reflection::v1alpha;
namespace v1 = grpc::reflection::v1;

}  // namespace

struct ReflectionService::Impl {
  Impl(std::vector<std::string> names, StreamLimits limits)
      : services(std::move(names)),
        caps("reflection streams", limits),
        alpha(&services, &caps),
        stable(&services, &caps) {}

  const std::vector<std::string> services;
  StreamCaps caps;
  Version<v1alpha::ServerReflection::CallbackService, v1alpha::ServerReflectionRequest,
          v1alpha::ServerReflectionResponse>
      alpha;
  Version<v1::ServerReflection::CallbackService, v1::ServerReflectionRequest,
          v1::ServerReflectionResponse>
      stable;
};

ReflectionService::ReflectionService(std::vector<std::string> services, StreamLimits limits)
    : impl_(std::make_unique<Impl>(std::move(services), limits)) {}

ReflectionService::~ReflectionService() = default;

void ReflectionService::Register(grpc::ServerBuilder& builder) {
  builder.RegisterService(&impl_->alpha);
  builder.RegisterService(&impl_->stable);
}

const StreamCaps& ReflectionService::streams() const { return impl_->caps; }

std::vector<std::string> ReflectionService::ServiceNames() {
  return {v1alpha::ServerReflection::service_full_name(),
          v1::ServerReflection::service_full_name()};
}

}  // namespace taskgrid::service
