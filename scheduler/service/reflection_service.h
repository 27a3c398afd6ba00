// Server reflection (grpc.reflection.v1alpha.ServerReflection and
// grpc.reflection.v1.ServerReflection, one protocol in two packages) on the
// callback API: one bidi reactor per stream, no thread. It answers
// list_services (the names given), file_by_filename,
// file_containing_symbol, file_containing_extension and
// all_extension_numbers_of_type from the generated descriptor pool, each
// file with the files it depends on, as gRPC's own service
// (src/cpp/ext/proto_server_reflection.cc, which this replaces: it served
// each stream with a thread of its own and no cap). What the pool lacks is
// an error_response with NOT_FOUND.
//
// A stream's requests are answered one by one: the next is read only once
// the answer to the last is written, so a stream holds at most one request
// and one answer, however fast its client sends. Streams are capped
// (stream_caps.h), both versions' together: past `limits`,
// RESOURCE_EXHAUSTED.
//
// Thread-safe. Must outlive the server it is registered with.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/service/stream_caps.h"

namespace taskgrid::service {

class ReflectionService {
 public:
  // `services`: the full names list_services answers with.
  ReflectionService(std::vector<std::string> services, StreamLimits limits);
  ~ReflectionService();

  // Both versions' services.
  void Register(grpc::ServerBuilder& builder);

  const StreamCaps& streams() const;

  // The names of both versions' services, for a list of what a server
  // serves.
  static std::vector<std::string> ServiceNames();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace taskgrid::service
