// HttpServer: a small embedded HTTP server (cpp-httplib) for what is not
// gRPC: the /metrics page today, a dashboard's static files and JSON
// endpoints later. It owns the httplib::Server and the thread that accepts
// on it; handlers are registered by exact path before Start.
//
// Bounded: at most Options::threads requests are served at once, at most
// Options::max_queued accepted connections wait for a thread (past that
// the accepting thread serves the next one itself, so new connections
// wait in the kernel's backlog), request bodies are capped and slow
// clients time out. Unknown paths get 404, methods other than GET and
// HEAD get 405.
//
// Thread-safe for Start and Stop from one owner; handlers run on the
// server's threads, several at once, and must be thread-safe themselves.
// httplib stays inside http_server.cc: this header does not include it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid::http {

struct Request {
  std::string path;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using Handler = std::function<Response(const Request&)>;

// "HOST:PORT" or "[V6]:PORT" split into host and port; INVALID_ARGUMENT,
// naming `flag`, for anything else (no port, a port past 65535).
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view flag,
                                                          absl::string_view address);

class HttpServer {
 public:
  struct Options {
    size_t threads = 2;                  // requests served at once
    size_t max_queued = 16;              // accepted connections waiting for a thread
    size_t max_request_bytes = 8 << 10;  // a request body (GETs have none)
    absl::Duration read_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(5);
    absl::Duration keep_alive_timeout = absl::Seconds(5);
    size_t keep_alive_max_requests = 100;  // per connection
  };

  explicit HttpServer(Options opts);
  HttpServer() : HttpServer(Options{}) {}
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves GET (and HEAD) of exactly `path`. Call before Start.
  void Get(const std::string& path, Handler handler);

  // Binds host:port (port 0: a free one) and serves on a thread of its
  // own; returns the bound port. UNAVAILABLE when it cannot bind.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, ends the connections, and joins the threads. Requests
  // being handled finish first. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace taskgrid::http
