// HttpServer: a small embedded HTTP(S) server (GNU libmicrohttpd) for what
// is not gRPC: the /metrics page, the dashboard's static files and its JSON
// API. Handlers are registered by path pattern and method before Start.
//
// Routing: a pattern is a path whose segments are literal or "{name}" (one
// segment, any characters but '/', handed to the handler in
// Request::params). A request whose path no pattern matches gets 404; one
// whose path matches only patterns of other methods gets 405 with an
// Allow header. HEAD is served by the GET handler, without the body.
// Error pages (404, 405, 413, ...) are written by the error page writer
// (SetErrorPage), plain text unless one is set.
//
// Event-driven and bounded, so that clients which are slow on purpose
// cannot take it down: Options::threads event loops (epoll) serve every
// connection, each costing a file descriptor and a few KiB, never a thread
// of its own, and handlers run on those loops (they must be quick). A
// connection must deliver its whole request (the TLS handshake, the head
// and the body) within Options::request_deadline of being accepted or of
// its previous answer, however it trickles the bytes in; it is cut off
// after Options::idle_timeout with nothing moving either way; one client
// address holds at most Options::max_connections_per_address connections
// (more are closed at once) and all clients together at most
// Options::max_connections. Request bodies are capped (413).
//
// TLS: with Options::tls cert and key it serves HTTPS only; with a client
// CA too, a request on a connection without a certificate that CA signed
// is answered 403, saying what was wrong with the certificate. Renewed
// files are served without a restart (Tls::reload_every).
//
// Thread-safe for Start and Stop from one owner; handlers run on the
// server's threads, several at once, and must be thread-safe themselves.
// libmicrohttpd stays inside http_server.cc: this header does not include it.
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
// Answers a request whose answer comes later (a long poll): call it once,
// from any thread; after the server stopped it does nothing.
using Responder = std::function<void(Response)>;
// Starts answering a request, and returns at once: the answer goes to the
// responder when it is ready. Meanwhile the connection costs no thread
// (libmicrohttpd suspends it), and no deadline or idle timeout runs.
using AsyncHandler = std::function<void(const Request&, Responder)>;
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
    // How often the three files are looked at again: when one changed, the
    // new files are served from the next handshake on (files that cannot
    // be used are logged and the old ones kept).
    absl::Duration reload_every = absl::Minutes(1);
  };

  struct Options {
    size_t threads = 2;                  // event loops; handlers run on them
    size_t max_request_bytes = 8 << 10;  // a request body
    // All connections, and those of one client address.
    size_t max_connections = 1024;
    size_t max_connections_per_address = 64;
    // The TLS handshake, request head and body, from the accept (or the
    // end of the previous answer on a kept-alive connection).
    absl::Duration request_deadline = absl::Seconds(10);
    // Nothing read or written for this long ends the connection (whole
    // seconds, at least one).
    absl::Duration idle_timeout = absl::Seconds(5);
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
  // A POST or GET answered later (AsyncHandler). Stop answers those still
  // waiting 503 with the error page.
  void PostAsync(const std::string& pattern, AsyncHandler handler);
  void GetAsync(const std::string& pattern, AsyncHandler handler);
  // Replaces the plain-text error pages. Call before Start.
  void SetErrorPage(ErrorPage page);

  // Answers `request` as a request read from a connection is answered
  // (routing, HEAD, 404 and 405, the error page), without a socket, TLS or
  // the connection limits: for tests and the HTTP fuzz target (an async
  // route's answer is waited for). Thread-safe once the routes are
  // registered.
  Response Handle(Request request) const;

  // Binds host:port (port 0: a free one) and serves on a thread of its
  // own; returns the bound port. UNAVAILABLE when it cannot bind;
  // INVALID_ARGUMENT when the TLS files cannot be read or do not match.
  absl::StatusOr<int> Start(const std::string& host, int port);

  // Every registered route as "METHOD PATTERN" ("GET /api/v1/tasks/{id}"),
  // in registration order: for the test that holds the API's document to
  // the routes.
  std::vector<std::string> Routes() const;

  // Whether it serves HTTPS.
  bool tls() const;

  // Connections open now (accepted and not yet closed).
  size_t connections() const;

  // Stops accepting, ends the connections, and joins the threads. Requests
  // being handled finish first. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace taskgrid::http
