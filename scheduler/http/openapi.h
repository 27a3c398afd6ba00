// The OpenAPI 3 document of the HTTP API, made from the routes as they
// are registered (each route of Api::Register describes itself) and from
// the proto descriptors of their messages, so it cannot drift from what
// is served: every path, its parameters, the request body's and the
// response's schema (the proto3 JSON mapping, with the proto field
// names), and the error body.
#pragma once

#include <google/protobuf/descriptor.h>

#include <string>
#include <utility>
#include <vector>

namespace taskgrid::http {

struct OperationDoc {
  std::string method;  // "get" or "post"
  std::string path;    // "/api/v1/tasks/{id}": each {name} is a path parameter
  // The gRPC method it stands for ("/taskgrid.v1.TaskService/GetTask"),
  // whose role it needs.
  std::string grpc_method;
  std::string summary;
  // Query parameters: name and what it means.
  std::vector<std::pair<std::string, std::string>> query;
  // The JSON body's message (null: no body), and the response's.
  const google::protobuf::Descriptor* body = nullptr;
  const google::protobuf::Descriptor* response = nullptr;
};

// The document, as JSON.
std::string OpenApiDocument(const std::vector<OperationDoc>& operations);

}  // namespace taskgrid::http
