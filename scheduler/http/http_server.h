// HttpServer: a small embedded HTTP(S) server (cpp-httplib) for what is not
// gRPC: the /metrics page, the dashboard's static files and its JSON API.
// It owns the httplib::Server and the thread that accepts on it; handlers
// are registered by path pattern and method before Start.
//
// Routing: a pattern is a path whose segments are literal or "{name}" (one
// segment, any characters but '/', handed to the handler in
// Request::params). A request whose path no pattern matches gets 404; one
// whose path matches only patterns of other methods gets 405 with an
// Allow header. HEAD is served by the GET handler, without the body.
// Error pages (404, 405, 413, ...) are written by the error page writer
// (SetErrorPage), plain text unless one is set.
//
// Bounded: at most Options::threads requests are served at once, at most
// Options::max_queued accepted connections wait for a thread (past that
// the accepting thread serves the next one itself, so new connections
// wait in the kernel's backlog), request bodies are capped and slow
// clients time out.
//
// TLS: with Options::tls cert and key it serves HTTPS only; with a client
// CA too, every connection must present a certificate that CA signed.
//
// Thread-safe for Start and Stop from one owner; handlers run on the
// server's threads, several at once, and must be thread-safe themselves.
// httplib stays inside http_server.cc: this header does not include it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid::http {

struct Request {
  std::string method;  // "GET", "HEAD", "POST", ...
  std::string path;    // decoded, without the query
  // The "{name}" segments of the route's pattern.
  std::map<std::string, std::string> params;
  // Query parameters in order; a name may come several times.
  std::vector<std::pair<std::string, std::string>> query;
  // Header names in lower case; a header sent twice keeps its first value.
  std::map<std::string, std::string> headers;
  std::string body;

  // The header's value, or "" when it was not sent.
  std::string Header(const std::string& lower_case_name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

using Handler = std::function<Response(const Request&)>;
// Writes the page of an error the server answers itself: `status` (404,
// 405, 413, ...) and a sentence saying what was wrong.
using ErrorPage = std::function<Response(const Request&, int status, const std::string& message)>;

// "HOST:PORT" or "[V6]:PORT" split into host and port; INVALID_ARGUMENT,
// naming `flag`, for anything else (no port, a port past 65535).
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view flag,
                                                          absl::string_view address);

class HttpServer {
 public:
  struct Tls {
    std::string cert;       // PEM certificate chain; empty: plain HTTP
    std::string key;        // PEM private key of `cert`
    std::string client_ca;  // PEM CA: require client certificates it signed
  };

  struct Options {
    size_t threads = 2;                  // requests served at once
    size_t max_queued = 16;              // accepted connections waiting for a thread
    size_t max_request_bytes = 8 << 10;  // a request body
    absl::Duration read_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(5);
    absl::Duration keep_alive_timeout = absl::Seconds(5);
    // Requests per connection. httplib holds a thread for a connection's
    // whole life, so a browser's idle kept-alive connections (a page
    // polling every few seconds keeps several) would hold every thread and
    // starve other clients: by default each connection serves one request.
    size_t keep_alive_max_requests = 1;
    Tls tls;
  };

  explicit HttpServer(Options opts);
  HttpServer() : HttpServer(Options{}) {}
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves GET (and HEAD), or POST, of the paths `pattern` matches. Call
  // before Start.
  void Get(const std::string& pattern, Handler handler);
  void Post(const std::string& pattern, Handler handler);
  // Replaces the plain-text error pages. Call before Start.
  void SetErrorPage(ErrorPage page);

  // Binds host:port (port 0: a free one) and serves on a thread of its
  // own; returns the bound port. UNAVAILABLE when it cannot bind;
  // INVALID_ARGUMENT when the TLS files cannot be read or do not match.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Whether it serves HTTPS.
  bool tls() const;

  // Stops accepting, ends the connections, and joins the threads. Requests
  // being handled finish first. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace taskgrid::http
