#include "scheduler/http/api.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/address.h"
#include "common/ids.h"
#include "common/json.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/http/openapi.h"

namespace taskgrid::http {

namespace {

using engine::Engine;

constexpr char kJson[] = "application/json";
constexpr char kApiPrefix[] = "/api/";

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

Response JsonResponse(int status, std::string body) {
  return Response{status, kJson, std::move(body), {{"Cache-Control", "no-store"}}};
}

// Calls the Engine and waits for its reply, which comes once what the call
// changed (or the commits queued before a read) is durable.
template <typename T>
absl::StatusOr<T> Await(absl::Duration timeout, const std::function<void(Engine::Reply<T>)>& call) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<T>> result;
  };
  auto state = std::make_shared<State>();
  call([state](absl::StatusOr<T> r) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->result = std::move(r);
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_for(lock, absl::ToChronoSeconds(timeout),
                          [&] { return state->result.has_value(); })) {
    return absl::UnavailableError(absl::StrCat("the scheduler did not answer within ",
                                               absl::FormatDuration(timeout), "; try again"));
  }
  return std::move(*state->result);
}

// StreamTaskOutput without follow, gathered into one answer: what a
// finished task's result keeps, or what the agent of a running attempt
// still holds (asked of the agent, so this waits for its answer, at most
// `timeout`: an agent that does not answer is UNAVAILABLE).
absl::StatusOr<v1::TaskOutputSnapshot> GatherOutput(Engine* e,
                                                    const v1::StreamTaskOutputRequest& req,
                                                    absl::Duration timeout) {
  struct Wakes {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
  };
  auto wakes = std::make_shared<Wakes>();
  auto follower = e->StartOutput(req, [wakes] {
    std::lock_guard<std::mutex> lock(wakes->mu);
    wakes->woken = true;
    wakes->cv.notify_all();
  });
  if (!follower.ok()) return follower.status();
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  v1::TaskOutputSnapshot out;
  absl::Status status;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(wakes->mu);
      wakes->woken = false;  // a wake from now on is seen below
    }
    auto next = e->NextOutput(*follower, 256 << 10);
    if (!next.ok()) {
      status = next.status();
      break;
    }
    const bool empty = next->msgs.empty();
    for (v1::StreamTaskOutputResponse& m : next->msgs) *out.add_messages() = std::move(m);
    if (next->done) break;
    // The relay wakes a follower only after it found nothing: until then,
    // more may be there at once.
    if (!empty) continue;
    std::unique_lock<std::mutex> lock(wakes->mu);
    if (!wakes->cv.wait_until(lock, deadline, [&] { return wakes->woken; })) {
      status = absl::UnavailableError(absl::StrCat("the agent running task ", req.id(),
                                                   " did not send its output within ",
                                                   absl::FormatDuration(timeout), "; try again"));
      break;
    }
  }
  e->StopOutput(*follower);
  if (!status.ok()) return status;
  return out;
}

template <typename T>
absl::StatusOr<std::string> Print(absl::StatusOr<T> r) {
  if (!r.ok()) return r.status();
  return ToJson(*r);
}

// A request's query, checked against the names its endpoint takes.
class Query {
 public:
  static absl::StatusOr<Query> Of(const Request& req, std::initializer_list<const char*> known) {
    for (const auto& [name, value] : req.query) {
      bool ok = false;
      for (const char* k : known) ok = ok || name == k;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown query parameter \"", name, "\"",
            known.size() == 0
                ? std::string(": this endpoint takes none")
                : absl::StrCat(" (this endpoint takes ", absl::StrJoin(known, ", "), ")")));
      }
    }
    return Query(req);
  }

  // The last value given for `name`, or "".
  std::string Get(const std::string& name) const {
    std::string out;
    for (const auto& [n, v] : req_->query) {
      if (n == name) out = v;
    }
    return out;
  }

  // Every value of `name`, each split at commas (state=a,b&state=c).
  std::vector<std::string> List(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& [n, v] : req_->query) {
      if (n != name) continue;
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
        out.emplace_back(absl::StripAsciiWhitespace(part));
      }
    }
    return out;
  }

  // Every value of `name`, whole (label=a=1&label=b=x,y).
  std::vector<std::string> All(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& [n, v] : req_->query) {
      if (n == name) out.push_back(v);
    }
    return out;
  }

 private:
  explicit Query(const Request& req) : req_(&req) {}
  const Request* req_;
};

// page_size: absent (the Engine's default) or 1-1000.
absl::Status ParsePageSize(const Query& q, int32_t* out) {
  const std::string text = q.Get("page_size");
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, out) || *out < 1 || *out > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be a number from 1 to 1000, not \"", text, "\""));
  }
  return absl::OkStatus();
}

// A flag: absent, "false" or "0" is false; "true" or "1" is true.
absl::Status ParseFlag(const Query& q, const std::string& name, bool* out) {
  const std::string text = q.Get(name);
  if (text.empty() || text == "false" || text == "0") {
    *out = false;
  } else if (text == "true" || text == "1") {
    *out = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be true or false, not \"", text, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseTaskStates(const Query& q, google::protobuf::RepeatedField<int>* out) {
  for (const std::string& name : q.List("state")) {
    v1::TaskState s;
    if (!core::ParseStateName(name, &s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state \"", name, "\" is not a task state (", core::AllStateNames(), ")"));
    }
    out->Add(s);
  }
  return absl::OkStatus();
}

// label=key=value, repeated: the task labels a listing asks for (the
// Engine checks them as it checks a task's).
absl::Status ParseLabels(const Query& q, google::protobuf::Map<std::string, std::string>* out) {
  for (const std::string& label : q.All("label")) {
    const size_t eq = label.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("label \"", label, "\" is not key=value"));
    }
    const std::string key = label.substr(0, eq);
    if (out->contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("label \"", key, "\" is given twice"));
    }
    (*out)[key] = label.substr(eq + 1);
  }
  return absl::OkStatus();
}

absl::Status ParseJobStates(const Query& q, google::protobuf::RepeatedField<int>* out) {
  for (const std::string& name : q.List("state")) {
    v1::JobState s;
    if (!core::ParseJobStateName(name, &s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state \"", name, "\" is not a job state (", core::AllJobStateNames(), ")"));
    }
    out->Add(s);
  }
  return absl::OkStatus();
}

// An optional name in the query: empty, or valid.
absl::Status CheckOptionalName(const std::string& field, const std::string& value, size_t max_len) {
  return value.empty() ? absl::OkStatus() : CheckName(field, value, max_len);
}

std::string Method(absl::string_view service, absl::string_view name) {
  return absl::StrCat("/taskgrid.v1.", service, "/", name);
}

// How long a long poll asked to wait `timeout` waits: at most `most`,
// which is also what it waits when it names no timeout.
absl::Duration HttpWait(const google::protobuf::Duration& timeout, absl::Duration most) {
  const absl::Duration wait = FromProto(timeout);
  return wait <= absl::ZeroDuration() || wait > most ? most : wait;
}

// The request's JSON body into `out` (an empty body is an empty message).
absl::Status ParseBody(const Request& req, google::protobuf::Message* out) {
  if (absl::StripAsciiWhitespace(req.body).empty()) return absl::OkStatus();
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(req.body, out, opts); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body is not a ", out->GetDescriptor()->name(),
                     " in JSON (the proto3 JSON mapping): ", std::string(s.message())));
  }
  return absl::OkStatus();
}

// GET /api/v1/tasks/{id}/wait?timeout=30s as a WaitTaskRequest.
absl::Status WaitQuery(const Request& req, v1::WaitTaskRequest* out) {
  auto q = Query::Of(req, {"timeout"});
  if (!q.ok()) return q.status();
  out->set_id(req.params.at("id"));
  const std::string text = q->Get("timeout");
  absl::Duration d;
  if (!text.empty() && (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout must be a duration such as 30s or 5m, not \"", text, "\""));
  }
  if (!text.empty()) *out->mutable_timeout() = ToProto(d);
  return absl::OkStatus();
}

}  // namespace

Api::Api(engine::Engine* engine, Options opts) : engine_(engine), opts_(std::move(opts)) {}

int Api::HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

Response Api::ErrorResponse(const absl::Status& status) {
  Response r =
      JsonResponse(HttpStatus(status.code()),
                   absl::StrCat("{\"code\":", JsonString(absl::StatusCodeToString(status.code())),
                                ",\"message\":", JsonString(status.message()), "}"));
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"taskgrid\"");
  }
  return r;
}

bool Api::HostAllowed(const std::string& host_header) const {
  std::string host = absl::AsciiStrToLower(absl::StripAsciiWhitespace(host_header));
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  } else if (host.find(':') != std::string::npos) {
    return false;  // an IPv6 address goes in brackets
  }
  if (host.empty()) return false;
  if (absl::EqualsIgnoreCase(host, opts_.listen_host)) return true;
  for (const std::string& h : opts_.hosts) {
    if (absl::EqualsIgnoreCase(host, h)) return true;
  }
  // A loopback name or address (not "unix:", which names no host here).
  const std::string address =
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:0") : host + ":0";
  return !absl::StartsWith(host, "unix") && IsLoopbackAddress(address);
}

absl::Status Api::CheckHost(const Request& req) const {
  const std::string host = req.Header("host");
  if (HostAllowed(host)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("Host \"", host,
                   "\" is not a name of this scheduler (a page of another site may not read "
                   "it); use the address it listens on, localhost, or a name given in "
                   "--http_hosts"));
}

absl::Status Api::Admit(const Request& req, const std::string& method, bool action,
                        std::string* principal) const {
  if (absl::Status s = CheckHost(req); !s.ok()) return s;
  // A page of another site can make a browser send neither this header nor
  // a JSON body (either needs a CORS preflight this server never grants).
  const std::string type = absl::AsciiStrToLower(req.Header("content-type"));
  const bool json = type == kJson || absl::StartsWith(type, "application/json;");
  if (action && !json &&
      req.Header(absl::AsciiStrToLower(kActionHeader)) != std::string(kActionHeaderValue)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "an action needs \"Content-Type: application/json\" or the header ", kActionHeader, ": ",
        kActionHeaderValue,
        " (a form of another site can send neither, so it cannot act through this page)"));
  }
  return Authorize(req, method, principal);
}

absl::Status Api::Authorize(const Request& req, const std::string& grpc_method,
                            std::string* principal) const {
  if (opts_.tokens == nullptr) return absl::OkStatus();
  std::string name;
  absl::Status s = opts_.tokens->Current()->Check(grpc_method, req.Header("authorization"), &name);
  if (!s.ok()) {
    refusals_.Log(s.code(),
                  absl::StrCat("refused HTTP ", req.method, " ", req.path, " (", grpc_method,
                               ") from ", name.empty() ? "a caller" : name, ": ", s.message()));
  }
  if (principal != nullptr) *principal = name;
  return s;
}

absl::StatusOr<std::string> Api::CallRpc(const RpcMethod& m, const Request& req,
                                         const std::string& principal,
                                         absl::Duration timeout) const {
  if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
  std::unique_ptr<google::protobuf::Message> request = m.new_request();
  if (absl::Status s = ParseBody(req, request.get()); !s.ok()) return s;
  if (m.owner) {
    const std::string owner = m.owner(*request);
    if (opts_.bind_owners) {
      return absl::PermissionDeniedError(
          absl::StrCat("owner ", owner,
                       ": this scheduler binds board owners to client certificates (--tls_ca), "
                       "which its HTTP API does not see; make board calls over gRPC"));
    }
    if (opts_.tokens != nullptr) {
      if (absl::Status s = opts_.tokens->Current()->CheckActsAs(principal, owner, "owner");
          !s.ok()) {
        return s;
      }
    }
  }
  auto resp = Await<std::unique_ptr<google::protobuf::Message>>(
      timeout, [&](auto reply) { m.call(*request, std::move(reply)); });
  if (!resp.ok()) return resp.status();
  return ToJson(**resp);
}

void Api::Register(HttpServer* server) const {
  server->SetErrorPage([](const Request& req, int status, const std::string& message) {
    if (!absl::StartsWith(req.path, kApiPrefix)) {
      return Response{status, "text/plain; charset=utf-8", message + "\n", {}};
    }
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
    if (status == 403) code = absl::StatusCode::kPermissionDenied;  // no client certificate
    if (status == 404) code = absl::StatusCode::kNotFound;
    if (status == 405) code = absl::StatusCode::kUnimplemented;
    if (status == 413) code = absl::StatusCode::kResourceExhausted;
    if (status == 503) code = absl::StatusCode::kUnavailable;  // the server stops
    Response r = ErrorResponse(absl::Status(code, message));
    r.status = status;  // the server's own status (405 is not UNIMPLEMENTED's 501)
    return r;
  });

  // Every route describes itself for the OpenAPI document.
  auto docs = std::make_shared<std::vector<OperationDoc>>();
  // Admits the request for the route's gRPC method, runs `fn` with the
  // caller's principal (with tokens), and answers its JSON.
  using Fn = std::function<absl::StatusOr<std::string>(const Request&, const std::string&)>;
  auto serve = [this, server, docs](OperationDoc doc, Fn fn) {
    const bool post = doc.method == "post";
    Handler h = [this, post, method = doc.grpc_method, fn = std::move(fn)](const Request& req) {
      std::string principal;
      if (absl::Status s = Admit(req, method, post, &principal); !s.ok()) return ErrorResponse(s);
      absl::StatusOr<std::string> body = fn(req, principal);
      if (!body.ok()) return ErrorResponse(body.status());
      return JsonResponse(200, std::move(*body));
    };
    if (post) {
      server->Post(doc.path, std::move(h));
    } else {
      server->Get(doc.path, std::move(h));
    }
    docs->push_back(std::move(doc));
  };
  // The dashboard's routes, which take no body: the principal is not theirs
  // to check.
  auto route = [&serve](bool post, const std::string& pattern, const std::string& method,
                        const google::protobuf::Descriptor* response,
                        std::vector<std::pair<std::string, std::string>> query,
                        std::function<absl::StatusOr<std::string>(const Request&)> fn) {
    OperationDoc doc;
    doc.method = post ? "post" : "get";
    doc.path = pattern;
    doc.grpc_method = method;
    doc.summary = absl::StrCat(method.substr(method.rfind('.') + 1), " (query form)");
    doc.query = std::move(query);
    doc.response = response;
    serve(std::move(doc),
          [fn = std::move(fn)](const Request& req, const std::string&) { return fn(req); });
  };
  Engine* const e = engine_;
  const absl::Duration timeout = opts_.answer_timeout;

  // Every unary method of the client services, its request message as the
  // JSON body: POST /api/v1/TaskService/SubmitTasks. Submit and submit a
  // job also answer POST /api/v1/tasks and /api/v1/jobs.
  auto methods = std::make_shared<const std::vector<RpcMethod>>(RpcMethods(e));
  for (size_t i = 0; i < methods->size(); ++i) {
    const RpcMethod& m = (*methods)[i];
    const std::string service = m.descriptor->service()->name();
    std::vector<std::string> paths = {absl::StrCat("/api/v1/", service, "/", m.descriptor->name())};
    if (m.grpc_path == Method("TaskService", "SubmitTasks")) paths.push_back("/api/v1/tasks");
    if (m.grpc_path == Method("JobService", "SubmitJob")) paths.push_back("/api/v1/jobs");
    for (const std::string& path : paths) {
      OperationDoc doc;
      doc.method = "post";
      doc.path = path;
      doc.grpc_method = m.grpc_path;
      doc.summary = absl::StrCat(service, "/", m.descriptor->name());
      doc.body = m.descriptor->input_type();
      doc.response = m.descriptor->output_type();
      serve(std::move(doc),
            [this, methods, i, timeout](const Request& req, const std::string& principal) {
              return CallRpc((*methods)[i], req, principal, timeout);
            });
    }
  }

  // The long polls, answered when their task ends (or work comes), or when
  // their time is up: the connection waits without a thread.
  using AsyncFn =
      std::function<void(const Request&, std::function<void(absl::StatusOr<std::string>)>)>;
  auto serve_async = [this, server, docs](OperationDoc doc, AsyncFn fn) {
    const bool post = doc.method == "post";
    AsyncHandler h = [this, post, method = doc.grpc_method, fn = std::move(fn)](const Request& req,
                                                                                Responder respond) {
      std::string principal;
      if (absl::Status s = Admit(req, method, post, &principal); !s.ok()) {
        return respond(ErrorResponse(s));
      }
      fn(req, [respond](absl::StatusOr<std::string> body) {
        respond(body.ok() ? JsonResponse(200, std::move(*body)) : ErrorResponse(body.status()));
      });
    };
    if (post) {
      server->PostAsync(doc.path, std::move(h));
    } else {
      server->GetAsync(doc.path, std::move(h));
    }
    docs->push_back(std::move(doc));
  };
  const absl::Duration most = opts_.max_wait;
  auto wait_task = [e, most](const v1::WaitTaskRequest& r, auto done) {
    e->WaitTask(r.id(), HttpWait(r.timeout(), most),
                [done](absl::StatusOr<v1::WaitTaskResponse> resp) { done(Print(resp)); });
  };
  for (const bool by_query : {false, true}) {
    OperationDoc doc;
    doc.method = by_query ? "get" : "post";
    doc.path = by_query ? "/api/v1/tasks/{id}/wait" : "/api/v1/TaskService/WaitTask";
    doc.grpc_method = Method("TaskService", "WaitTask");
    doc.summary = absl::StrCat("TaskService/WaitTask", by_query ? " (query form)" : "",
                               ": answers when the task has ended, or when the timeout (at most ",
                               absl::FormatDuration(most), ") is up");
    if (by_query) {
      doc.query = {{"timeout", "how long to wait, as 30s or 5m (default and most: " +
                                   absl::FormatDuration(most) + ")"}};
    } else {
      doc.body = v1::WaitTaskRequest::descriptor();
    }
    doc.response = v1::WaitTaskResponse::descriptor();
    serve_async(std::move(doc), [by_query, wait_task](const Request& req, auto done) {
      v1::WaitTaskRequest r;
      absl::Status s = by_query ? WaitQuery(req, &r) : ParseBody(req, &r);
      if (!s.ok()) return done(s);
      wait_task(r, done);
    });
  }
  {
    OperationDoc doc;
    doc.method = "post";
    doc.path = "/api/v1/BoardService/WaitForWork";
    doc.grpc_method = Method("BoardService", "WaitForWork");
    doc.summary = absl::StrCat(
        "BoardService/WaitForWork: answers when the queue has work a worker with these labels "
        "could claim, or when the timeout (at most ",
        absl::FormatDuration(most), ") is up");
    doc.body = v1::WaitForWorkRequest::descriptor();
    doc.response = v1::WaitForWorkResponse::descriptor();
    serve_async(std::move(doc), [e, most](const Request& req, auto done) {
      v1::WaitForWorkRequest r;
      if (absl::Status s = ParseBody(req, &r); !s.ok()) return done(s);
      e->WaitForWork(r, HttpWait(r.timeout(), most),
                     [done](absl::StatusOr<v1::WaitForWorkResponse> resp) { done(Print(resp)); });
    });
  }

  // Queues.
  route(false, "/api/v1/queues", Method("TaskService", "GetQueueStats"),
        v1::GetQueueStatsResponse::descriptor(),
        {{"queue", "only this queue"},
         {"history", "true: also each queue's last hour, minute by minute"}},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          auto q = Query::Of(req, {"queue", "history"});
          if (!q.ok()) return q.status();
          v1::GetQueueStatsRequest r;
          r.set_queue(q->Get("queue"));
          bool history = false;
          for (absl::Status s : {CheckOptionalName("queue", r.queue(), kMaxQueueNameLength),
                                 ParseFlag(*q, "history", &history)}) {
            if (!s.ok()) return s;
          }
          r.set_with_history(history);
          return Print(Await<v1::GetQueueStatsResponse>(
              timeout, [&](auto reply) { e->GetQueueStats(r, std::move(reply)); }));
        });
  for (const bool pause : {true, false}) {
    route(true, absl::StrCat("/api/v1/queues/{queue}/", pause ? "pause" : "resume"),
          Method("TaskService", pause ? "PauseQueue" : "ResumeQueue"), v1::QueueStats::descriptor(),
          {}, [e, timeout, pause](const Request& req) -> absl::StatusOr<std::string> {
            if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
            return Print(Await<v1::QueueStats>(timeout, [&](auto reply) {
              e->PauseQueue(req.params.at("queue"), pause, std::move(reply));
            }));
          });
  }

  // Tasks.
  route(false, "/api/v1/tasks", Method("TaskService", "ListTasks"),
        v1::ListTasksResponse::descriptor(),
        {{"queue", "only this queue"},
         {"state", "only these states (PENDING, RUNNING, ...; several, or comma-separated)"},
         {"job", "only the tasks of this job"},
         {"id_prefix", "only the tasks whose id starts with this"},
         {"label", "only the tasks carrying this label: key=value (repeat for several)"},
         {"newest_first", "true: newest first (pass it with page_token too)"},
         {"page_size", "at most this many (1-1000)"},
         {"page_token", "the next_page_token of the previous page"}},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          auto q = Query::Of(req, {"queue", "state", "job", "id_prefix", "label", "newest_first",
                                   "page_size", "page_token"});
          if (!q.ok()) return q.status();
          v1::ListTasksRequest r;
          r.set_queue(q->Get("queue"));
          r.set_job_id(q->Get("job"));
          r.set_id_prefix(q->Get("id_prefix"));
          r.set_page_token(q->Get("page_token"));
          int32_t size = 0;
          bool newest_first = false;
          for (absl::Status s :
               {CheckOptionalName("queue", r.queue(), kMaxQueueNameLength),
                CheckOptionalName("job", r.job_id(), kMaxIdLength), ParsePageSize(*q, &size),
                ParseTaskStates(*q, r.mutable_states()), ParseLabels(*q, r.mutable_labels()),
                ParseFlag(*q, "newest_first", &newest_first)}) {
            if (!s.ok()) return s;
          }
          r.set_page_size(size);
          r.set_newest_first(newest_first);
          return Print(Await<v1::ListTasksResponse>(
              timeout, [&](auto reply) { e->ListTasks(r, std::move(reply)); }));
        });
  route(false, "/api/v1/tasks/{id}", Method("TaskService", "GetTask"), v1::Task::descriptor(), {},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
          v1::GetTaskRequest r;
          r.set_id(req.params.at("id"));
          return Print(
              Await<v1::Task>(timeout, [&](auto reply) { e->GetTask(r, std::move(reply)); }));
        });
  route(false, "/api/v1/tasks/{id}/output", Method("TaskService", "StreamTaskOutput"),
        v1::TaskOutputSnapshot::descriptor(), {{"stream", "stdout or stderr; absent: both"}},
        [e, wait = opts_.output_wait](const Request& req) -> absl::StatusOr<std::string> {
          auto q = Query::Of(req, {"stream"});
          if (!q.ok()) return q.status();
          v1::StreamTaskOutputRequest r;
          r.set_id(req.params.at("id"));
          if (const std::string stream = q->Get("stream"); stream == "stdout") {
            r.set_stream(v1::OUTPUT_STREAM_STDOUT);
          } else if (stream == "stderr") {
            r.set_stream(v1::OUTPUT_STREAM_STDERR);
          } else if (!stream.empty()) {
            return absl::InvalidArgumentError(
                absl::StrCat("stream must be stdout or stderr, not \"", stream, "\""));
          }
          return Print(GatherOutput(e, r, wait));
        });
  using TaskOp = void (Engine::*)(const std::string&, Engine::Reply<v1::Task>);
  const std::vector<std::tuple<const char*, const char*, TaskOp>> task_ops = {
      {"cancel", "CancelTask", &Engine::CancelTask},
      {"retry", "RetryTask", &Engine::RetryTask},
      {"reset", "ResetTask", &Engine::ResetTask},
      {"pause", "PauseTask", &Engine::PauseTask},
      {"resume", "ResumeTask", &Engine::ResumeTask}};
  for (const auto& [verb, name, op] : task_ops) {
    route(true, absl::StrCat("/api/v1/tasks/{id}/", verb), Method("TaskService", name),
          v1::Task::descriptor(), {},
          [e, timeout, op = op](const Request& req) -> absl::StatusOr<std::string> {
            if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
            return Print(Await<v1::Task>(
                timeout, [&](auto reply) { (e->*op)(req.params.at("id"), std::move(reply)); }));
          });
  }

  route(true, "/api/v1/tasks/{id}/delete", Method("TaskService", "DeleteTask"),
        v1::DeleteTaskResponse::descriptor(), {},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
          return Print(Await<v1::DeleteTaskResponse>(
              timeout, [&](auto reply) { e->DeleteTask(req.params.at("id"), std::move(reply)); }));
        });

  // Jobs.
  route(
      false, "/api/v1/jobs", Method("JobService", "ListJobs"), v1::ListJobsResponse::descriptor(),
      {{"state", "only these states (several, or comma-separated)"},
       {"page_size", "at most this many (1-1000)"},
       {"page_token", "the next_page_token of the previous page"}},
      [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
        auto q = Query::Of(req, {"state", "page_size", "page_token"});
        if (!q.ok()) return q.status();
        v1::ListJobsRequest r;
        r.set_page_token(q->Get("page_token"));
        int32_t size = 0;
        for (absl::Status s : {ParsePageSize(*q, &size), ParseJobStates(*q, r.mutable_states())}) {
          if (!s.ok()) return s;
        }
        r.set_page_size(size);
        return Print(Await<v1::ListJobsResponse>(
            timeout, [&](auto reply) { e->ListJobs(r, std::move(reply)); }));
      });
  route(false, "/api/v1/jobs/{id}", Method("JobService", "GetJob"), v1::Job::descriptor(), {},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
          return Print(Await<v1::Job>(
              timeout, [&](auto reply) { e->GetJob(req.params.at("id"), std::move(reply)); }));
        });
  using JobOp = void (Engine::*)(const std::string&, Engine::Reply<v1::Job>);
  const std::vector<std::tuple<const char*, const char*, JobOp>> job_ops = {
      {"cancel", "CancelJob", &Engine::CancelJob}, {"retry", "RetryJob", &Engine::RetryJob}};
  for (const auto& [verb, name, op] : job_ops) {
    route(true, absl::StrCat("/api/v1/jobs/{id}/", verb), Method("JobService", name),
          v1::Job::descriptor(), {},
          [e, timeout, op = op](const Request& req) -> absl::StatusOr<std::string> {
            if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
            return Print(Await<v1::Job>(
                timeout, [&](auto reply) { (e->*op)(req.params.at("id"), std::move(reply)); }));
          });
  }

  // Agents and the cluster.
  route(false, "/api/v1/agents", Method("ClusterService", "ListAgents"),
        v1::ListAgentsResponse::descriptor(), {},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
          return Print(Await<v1::ListAgentsResponse>(
              timeout, [&](auto reply) { e->ListAgents(std::move(reply)); }));
        });
  using AgentOp = void (Engine::*)(const std::string&, Engine::Reply<v1::Agent>);
  const std::vector<std::tuple<const char*, const char*, AgentOp>> agent_ops = {
      {"drain", "DrainAgent", &Engine::DrainAgent},
      {"undrain", "UndrainAgent", &Engine::UndrainAgent}};
  for (const auto& [verb, name, op] : agent_ops) {
    route(true, absl::StrCat("/api/v1/agents/{id}/", verb), Method("ClusterService", name),
          v1::Agent::descriptor(), {},
          [e, timeout, op = op](const Request& req) -> absl::StatusOr<std::string> {
            if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
            return Print(Await<v1::Agent>(
                timeout, [&](auto reply) { (e->*op)(req.params.at("id"), std::move(reply)); }));
          });
  }
  route(false, "/api/v1/cluster", Method("ClusterService", "GetClusterStats"),
        v1::ClusterStats::descriptor(), {},
        [e, timeout](const Request& req) -> absl::StatusOr<std::string> {
          if (auto q = Query::Of(req, {}); !q.ok()) return q.status();
          return Print(Await<v1::ClusterStats>(
              timeout, [&](auto reply) { e->GetClusterStats(std::move(reply)); }));
        });

  // The document of every route above, itself included.
  OperationDoc self;
  self.method = "get";
  self.path = "/api/v1/openapi.json";
  self.summary = "this document (OpenAPI 3)";
  docs->push_back(self);
  auto document = std::make_shared<const std::string>(OpenApiDocument(*docs));
  server->Get(self.path, [this, document](const Request& req) {
    // The document is what the repository's .proto files say: no token.
    if (absl::Status s = CheckHost(req); !s.ok()) return ErrorResponse(s);
    return JsonResponse(200, *document);
  });
}

}  // namespace taskgrid::http
