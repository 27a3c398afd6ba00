#include "scheduler/http/openapi.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace taskgrid::http {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Struct;
using google::protobuf::Value;

Value Str(const std::string& s) {
  Value v;
  v.set_string_value(s);
  return v;
}

Value Bool(bool b) {
  Value v;
  v.set_bool_value(b);
  return v;
}

// An object from name/value pairs.
Value Obj(std::initializer_list<std::pair<const std::string, Value>> fields) {
  Value v;
  Struct* s = v.mutable_struct_value();
  for (const auto& [name, value] : fields) (*s->mutable_fields())[name] = value;
  return v;
}

Value& Field(Value* obj, const std::string& name) {
  return (*obj->mutable_struct_value()->mutable_fields())[name];
}

Value Ref(const Descriptor* d) {
  return Obj({{"$ref", Str(absl::StrCat("#/components/schemas/", d->full_name()))}});
}

// The schemas of messages, by full name, each once.
class Schemas {
 public:
  Value Of(const Descriptor* d) {
    if (d->full_name() == "google.protobuf.Duration") {
      return Obj({{"type", Str("string")},
                  {"description", Str("a duration in seconds with the suffix s, as \"1.5s\"")}});
    }
    if (d->full_name() == "google.protobuf.Timestamp") {
      return Obj({{"type", Str("string")}, {"format", Str("date-time")}});
    }
    Add(d);
    return Ref(d);
  }

  Value All() const {
    Value v = Obj({});
    for (const auto& [name, schema] : done_) Field(&v, name) = schema;
    return v;
  }

 private:
  void Add(const Descriptor* d) {
    if (done_.count(d->full_name()) != 0) return;
    done_[d->full_name()] = Value();  // taken, for recursive messages
    Value schema = Obj({{"type", Str("object")}});
    Value props = Obj({});
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      Field(&props, f->name()) = OfField(f);
    }
    Field(&schema, "properties") = props;
    done_[d->full_name()] = schema;
  }

  Value OfField(const FieldDescriptor* f) {
    if (f->is_map()) {
      return Obj({{"type", Str("object")},
                  {"additionalProperties", OfSingle(f->message_type()->map_value())}});
    }
    if (f->is_repeated()) return Obj({{"type", Str("array")}, {"items", OfSingle(f)}});
    return OfSingle(f);
  }

  Value OfSingle(const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        return Obj({{"type", Str("integer")}, {"format", Str("int32")}});
      case FieldDescriptor::CPPTYPE_UINT32:
        return Obj({{"type", Str("integer")}, {"format", Str("uint32")}});
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
        // The proto3 JSON mapping prints 64-bit integers as strings.
        return Obj({{"type", Str("string")}, {"format", Str("int64")}});
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        return Obj({{"type", Str("number")}});
      case FieldDescriptor::CPPTYPE_BOOL:
        return Obj({{"type", Str("boolean")}});
      case FieldDescriptor::CPPTYPE_ENUM: {
        Value names;
        for (int i = 0; i < f->enum_type()->value_count(); ++i) {
          *names.mutable_list_value()->add_values() = Str(f->enum_type()->value(i)->name());
        }
        return Obj({{"type", Str("string")}, {"enum", names}});
      }
      case FieldDescriptor::CPPTYPE_STRING:
        if (f->type() == FieldDescriptor::TYPE_BYTES) {
          return Obj({{"type", Str("string")}, {"format", Str("byte")}});
        }
        return Obj({{"type", Str("string")}});
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return Of(f->message_type());
    }
    return Obj({});
  }

  std::map<std::string, Value> done_;
};

Value JsonContent(Value schema) {
  return Obj({{"application/json", Obj({{"schema", std::move(schema)}})}});
}

}  // namespace

std::string OpenApiDocument(const std::vector<OperationDoc>& operations) {
  Schemas schemas;
  Value paths = Obj({});
  for (const OperationDoc& op : operations) {
    Value operation = Obj({{"operationId", Str(absl::StrCat(op.method, op.path))},
                           {"summary", Str(op.summary)},
                           {"x-grpc-method", Str(op.grpc_method)}});
    Value params;
    for (absl::string_view seg : absl::StrSplit(op.path, '/')) {
      if (seg.size() < 3 || seg.front() != '{' || seg.back() != '}') continue;
      *params.mutable_list_value()->add_values() =
          Obj({{"name", Str(std::string(seg.substr(1, seg.size() - 2)))},
               {"in", Str("path")},
               {"required", Bool(true)},
               {"schema", Obj({{"type", Str("string")}})}});
    }
    for (const auto& [name, what] : op.query) {
      *params.mutable_list_value()->add_values() =
          Obj({{"name", Str(name)},
               {"in", Str("query")},
               {"description", Str(what)},
               {"schema", Obj({{"type", Str("string")}})}});
    }
    if (params.has_list_value()) Field(&operation, "parameters") = params;
    if (op.body != nullptr) {
      Field(&operation, "requestBody") =
          Obj({{"required", Bool(false)}, {"content", JsonContent(schemas.Of(op.body))}});
    }
    Field(&operation, "responses") = Obj(
        {{"200",
          Obj({{"description", Str("OK")},
               {"content", JsonContent(op.response == nullptr ? Obj({{"type", Str("object")}})
                                                              : schemas.Of(op.response))}})},
         {"default",
          Obj({{"description",
                Str("an error: the gRPC status code's name and a message, with the HTTP status of "
                    "that code")},
               {"content", JsonContent(Obj({{"$ref", Str("#/components/schemas/Error")}}))}})}});
    Value& path = Field(&paths, op.path);
    if (!path.has_struct_value()) path = Obj({});
    Field(&path, op.method) = operation;
  }

  Value components = Obj({{"schemas", schemas.All()}});
  Field(&Field(&components, "schemas"), "Error") =
      Obj({{"type", Str("object")},
           {"properties", Obj({{"code", Obj({{"type", Str("string")}})},
                               {"message", Obj({{"type", Str("string")}})}})},
           {"required", [] {
              Value v;
              *v.mutable_list_value()->add_values() = Str("code");
              *v.mutable_list_value()->add_values() = Str("message");
              return v;
            }()}});
  Value security_schemes =
      Obj({{"bearer", Obj({{"type", Str("http")}, {"scheme", Str("bearer")}})}});
  Field(&components, "securitySchemes") = security_schemes;

  Value doc = Obj(
      {{"openapi", Str("3.0.3")},
       {"info",
        Obj({{"title", Str("Taskgrid HTTP API")},
             {"version", Str("v1")},
             {"description",
              Str("Every call of the gRPC API's TaskService, JobService, ScheduleService, "
                  "ClusterService and BoardService, with the same messages in the proto3 JSON "
                  "mapping (proto field names), the same roles and tokens, and the same errors. "
                  "A POST needs \"Content-Type: application/json\" or the header "
                  "\"X-Taskgrid-Request: 1\".")}})},
       {"paths", paths},
       {"components", components}});
  // A bearer token when the scheduler has a tokens file; none otherwise.
  Value security;
  *security.mutable_list_value()->add_values() = Obj({});
  Value no_scopes;
  no_scopes.mutable_list_value();
  *security.mutable_list_value()->add_values() = Obj({{"bearer", no_scopes}});
  Field(&doc, "security") = security;

  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(doc.struct_value(), &out, opts);
  return out;
}

}  // namespace taskgrid::http
