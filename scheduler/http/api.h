// Api: the HTTP/JSON API under /api/v1/, served by the HttpServer from
// the Engine. Each endpoint stands for one gRPC method: it calls the
// Engine method the gRPC service calls and answers the same response
// message, printed by protobuf's JSON printer with the proto field names,
// so the fields match the gRPC API (and `taskgridctl --json`).
//
//   POST /api/v1/{Service}/{Method}               every unary call of TaskService,
//                                                 JobService, ScheduleService,
//                                                 ClusterService and BoardService
//                                                 (rpc.h), the request as JSON body;
//                                                 WaitTask and WaitForWork as long
//                                                 polls (at most Options::max_wait)
//   POST /api/v1/tasks, POST /api/v1/jobs         SubmitTasks, SubmitJob (JSON body)
//   GET  /api/v1/tasks/{id}/wait?timeout=30s      TaskService/WaitTask (long poll)
//   GET  /api/v1/openapi.json                     the OpenAPI 3 document of every route
//
// and the dashboard's query forms:
//
//   GET  /api/v1/queues[?queue=Q]                 TaskService/GetQueueStats
//   POST /api/v1/queues/{queue}/pause|resume      TaskService/PauseQueue|ResumeQueue
//   GET  /api/v1/tasks?queue=&state=&job=&page_size=&page_token=
//                                                 TaskService/ListTasks
//   GET  /api/v1/tasks/{id}                       TaskService/GetTask
//   POST /api/v1/tasks/{id}/cancel|retry|reset|pause|resume|delete
//                                                 TaskService/CancelTask, ...
//   GET  /api/v1/jobs?state=&page_size=&page_token=   JobService/ListJobs
//   GET  /api/v1/jobs/{id}                        JobService/GetJob
//   POST /api/v1/jobs/{id}/cancel|retry           JobService/CancelJob|RetryJob
//   GET  /api/v1/agents                           ClusterService/ListAgents
//   POST /api/v1/agents/{id}/drain|undrain        ClusterService/DrainAgent|UndrainAgent
//   GET  /api/v1/cluster                          ClusterService/GetClusterStats
//
// Each route describes itself as it is registered, and the OpenAPI
// document is made from those descriptions and the proto descriptors
// (openapi.h), so the document and the routes cannot differ.
//
// Every request, in this order: the Host header must name this scheduler
// (a loopback name, the listening host, or one of Options::hosts), which
// keeps a DNS-rebinding page from reading the API; a POST must carry
// "Content-Type: application/json" or "X-Taskgrid-Request: 1", which no
// cross-site form or simple request can send (either needs a CORS
// preflight this server never grants), so no other web site can make a
// browser act; with tokens, "Authorization: Bearer <token>" must name a
// principal holding the role the gRPC method needs in
// service::MethodRoles() (401 without a known token, 403 without the
// role), and a board call must name an owner the token may act as; then
// the query and the body are checked (unknown parameters or fields, a bad
// state name, a page size outside 1-1000, a malformed name, a body that is
// not the method's request message) before the Engine hears of it. Every
// error is JSON {"code": "NOT_FOUND", "message": "..."} with the HTTP
// status of its gRPC code (HttpStatus), and changes nothing.
//
// Thread-safe: handlers run on the HttpServer's threads, each waiting for
// its Engine reply (at most Options::answer_timeout), except the long
// polls, whose connections wait suspended, without a thread. The Engine
// and the ReloadableTokens are borrowed and must outlive the server the
// Api is registered on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/refusal_log.h"
#include "scheduler/engine/engine.h"
#include "scheduler/http/http_server.h"
#include "scheduler/http/rpc.h"
#include "scheduler/service/tokens.h"

namespace taskgrid::http {

// The header every action (POST) must carry, and its value.
inline constexpr char kActionHeader[] = "X-Taskgrid-Request";
inline constexpr char kActionHeaderValue[] = "1";

class Api {
 public:
  struct Options {
    // Null: no tokens (every call is allowed, as on the gRPC port). Each
    // request is checked with its current table, so a reload applies to
    // the next request.
    const service::ReloadableTokens* tokens = nullptr;
    // The host the server listens on; with the loopback names (localhost,
    // 127.0.0.1, ::1) and `hosts`, what the Host header may name.
    std::string listen_host;
    std::vector<std::string> hosts;
    // How long a request waits for the Engine before it is answered 503.
    absl::Duration answer_timeout = absl::Seconds(10);
    // The longest a long poll (WaitTask, WaitForWork) waits, and what it
    // waits when the request names no timeout: a client that went away is
    // not seen before it ends.
    absl::Duration max_wait = absl::Minutes(5);
    // How long GET /api/v1/tasks/ID/output waits for the agent of a
    // running attempt to send what it holds: a quick answer or none, so
    // that an agent that froze holds no server thread long.
    absl::Duration output_wait = absl::Seconds(2);
    // The gRPC port binds board owners to client certificates (mTLS),
    // which this API does not see: board calls naming an owner are refused.
    bool bind_owners = false;
  };

  // The largest JSON body the scheduler's HTTP server takes (a submit of a
  // batch; larger batches go over gRPC, or in several calls).
  static constexpr size_t kMaxBodyBytes = 1 << 20;

  Api(engine::Engine* engine, Options opts);

  // Registers every endpoint on `server`, and an error page that answers
  // JSON under /api/ and plain text elsewhere. Call before server->Start.
  void Register(HttpServer* server) const;

  // The HTTP status of a gRPC (absl) status code: INVALID_ARGUMENT and
  // OUT_OF_RANGE 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403,
  // NOT_FOUND 404, ALREADY_EXISTS, FAILED_PRECONDITION and ABORTED 409,
  // RESOURCE_EXHAUSTED 429, UNAVAILABLE and CANCELLED 503,
  // DEADLINE_EXCEEDED 504, UNIMPLEMENTED 501, others 500.
  static int HttpStatus(absl::StatusCode code);

  // {"code": "...", "message": "..."} with that status.
  static Response ErrorResponse(const absl::Status& status);

  // With tokens: OK when the request's bearer token names a principal
  // holding the role `grpc_method` needs (MethodRoles()), else
  // UNAUTHENTICATED or PERMISSION_DENIED naming the principal and the
  // role. Without tokens: OK. (For /metrics, which is not in the API.)
  // Sets *principal (when not null) to the token's principal.
  absl::Status Authorize(const Request& req, const std::string& grpc_method,
                         std::string* principal = nullptr) const;

  // This port's refusals: counted, and logged at most once a second.
  const RefusalLog& refusals() const { return refusals_; }

 private:
  mutable RefusalLog refusals_;
  struct Endpoint;
  // Host, action header and role checks; OK or the error to answer.
  absl::Status Admit(const Request& req, const std::string& method, bool action,
                     std::string* principal) const;
  absl::Status CheckHost(const Request& req) const;
  // One unary method from its JSON body: the response's JSON, or the error.
  absl::StatusOr<std::string> CallRpc(const RpcMethod& m, const Request& req,
                                      const std::string& principal, absl::Duration timeout) const;
  bool HostAllowed(const std::string& host_header) const;

  engine::Engine* const engine_;
  const Options opts_;
};

}  // namespace taskgrid::http
