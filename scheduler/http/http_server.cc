#include "scheduler/http/http_server.h"

#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "scheduler/http/tls_material.h"
#include "spdlog/spdlog.h"

namespace taskgrid::http {

namespace {

std::vector<std::string> Segments(absl::string_view path) { return absl::StrSplit(path, '/'); }

// gnutls's certificate callback has no pointer of ours, and libmicrohttpd
// sets none on the session: the server is found by the local port of the
// connection's socket (one HTTPS server per port in a process).
std::mutex tls_servers_mu;
std::map<int, const TlsMaterial*> tls_servers;  // by port; guarded by tls_servers_mu

int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (fd < 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

int ServeCertificate(gnutls_session_t session, const gnutls_datum_t* /*req_ca_dn*/, int /*nreqs*/,
                     const gnutls_pk_algorithm_t* /*pk_algos*/, int /*pk_algos_length*/,
                     gnutls_pcert_st** chain, unsigned int* length, gnutls_privkey_t* key) {
  const int port = LocalPort(gnutls_transport_get_int(session));
  std::lock_guard<std::mutex> lock(tls_servers_mu);
  auto it = tls_servers.find(port);
  if (it == tls_servers.end()) return -1;  // fails the handshake
  it->second->Current(chain, length, key);
  return 0;
}

// A listening TCP socket on host:port (non-blocking, close-on-exec,
// SO_REUSEADDR so a restart need not wait out TIME_WAIT, never
// SO_REUSEPORT, with which a second process would take half the
// requests), or -1.
int Listen(const std::string& host, int port, int* family) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 512) != 0) {
      close(fd);
      fd = -1;
      continue;
    }
    *family = a->ai_family;
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view flag,
                                                          absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", address, ": ", why,
                                                   " (want HOST:PORT, e.g. 127.0.0.1:9090)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return bad("an IPv6 host goes in brackets");
  }
  if (host.empty()) return bad("no host");
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return bad("the port must be a number from 0 to 65535");
  }
  return std::pair<std::string, int>(std::string(host), port);
}

std::string Request::Header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? "" : it->second;
}

struct HttpServer::Impl {
  struct Route {
    std::string method;  // GET or POST
    std::vector<std::string> segments;
    Handler handler;  // or
    AsyncHandler async;
  };

  // The answer to a request of an async route, while its connection is
  // suspended: Answer resumes the connection once, and the next call of
  // OnRequest sends `response`. Its own lock, so a late answer (after
  // Stop, after the server is gone) touches nothing but this.
  struct Deferred {
    std::mutex mu;
    MHD_Connection* connection;  // suspended until done
    std::string path;            // the request's, for the error page
    bool done = false;           // guarded by mu
    Response response;           // guarded by mu

    // False when it was answered already.
    bool Answer(Response r) {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return false;
      done = true;
      response = std::move(r);
      MHD_resume_connection(connection);
      return true;
    }
  };

  // One TCP connection, from MHD's STARTED notice to its CLOSED notice
  // (which comes before MHD closes the socket, so `fd` is still this
  // connection's while it is in `connections`).
  struct Connection {
    int fd = -1;
    // Waiting for a whole request, which must have come by `deadline`.
    bool waiting = true;
    absl::Time deadline;
    // The client certificate's check (mTLS), done at the first request.
    bool checked = false;
    std::string client_problem;
  };

  // One request while its body comes in (and, for an async route, while
  // its answer is awaited).
  struct Pending {
    std::shared_ptr<Deferred> deferred;
    std::string body;
  };

  Options opts;
  std::vector<Route> routes;  // fixed once Start ran
  ErrorPage error_page;
  std::unique_ptr<TlsMaterial> tls;  // with Options::tls
  int port = -1;                     // bound, while the daemon runs
  MHD_Daemon* daemon = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::unordered_set<Connection*> connections;  // guarded by mu
  // Requests of async routes not yet completed; guarded by mu.
  std::unordered_set<std::shared_ptr<Deferred>> deferred;
  bool stopping = false;  // guarded by mu
  std::thread watchdog;

  // Whether `path` is one the route's pattern matches; fills `params`.
  static bool Matches(const Route& route, const std::vector<std::string>& path,
                      std::map<std::string, std::string>* params) {
    if (route.segments.size() != path.size()) return false;
    std::map<std::string, std::string> found;
    for (size_t i = 0; i < path.size(); ++i) {
      const std::string& want = route.segments[i];
      if (want.size() > 2 && want.front() == '{' && want.back() == '}') {
        if (path[i].empty()) return false;
        found[want.substr(1, want.size() - 2)] = path[i];
      } else if (want != path[i]) {
        return false;
      }
    }
    *params = std::move(found);
    return true;
  }

  // The route for `r` (filling r.params), or null with the error page to
  // answer in *error (404, 405).
  const Route* Find(Request& r, Response* error) const {
    const std::string method = r.method == "HEAD" ? "GET" : r.method;
    const std::vector<std::string> path = Segments(r.path);
    std::vector<std::string> allowed;
    for (const Route& route : routes) {
      std::map<std::string, std::string> params;
      if (!Matches(route, path, &params)) continue;
      if (route.method == method) {
        r.params = std::move(params);
        return &route;
      }
      allowed.push_back(route.method == "GET" ? "GET, HEAD" : route.method);
    }
    if (allowed.empty()) {
      *error = error_page(r, 404, "not found: " + r.path);
      return nullptr;
    }
    const std::string allow = absl::StrJoin(allowed, ", ");
    *error = error_page(
        r, 405, absl::StrCat("method not allowed: ", r.path, " takes ", allow, ", not ", r.method));
    error->headers.emplace_back("Allow", allow);
    return nullptr;
  }

  // Answers `r` on the caller's thread, waiting for an async route.
  Response Dispatch(Request& r) const {
    Response out;
    const Route* route = Find(r, &out);
    if (route == nullptr) return out;
    if (route->handler) return route->handler(r);
    auto done = std::make_shared<std::promise<Response>>();
    std::future<Response> answer = done->get_future();
    route->async(r, [done](Response resp) { done->set_value(std::move(resp)); });
    return answer.get();
  }

  static MHD_Result Send(MHD_Connection* c, const Response& r) {
    MHD_Response* res = MHD_create_response_from_buffer(
        r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
    if (res == nullptr) return MHD_NO;
    MHD_add_response_header(res, "Content-Type", r.content_type.c_str());
    for (const auto& [name, value] : r.headers) {
      MHD_add_response_header(res, name.c_str(), value.c_str());
    }
    const MHD_Result queued = MHD_queue_response(c, static_cast<unsigned int>(r.status), res);
    MHD_destroy_response(res);
    return queued;
  }

  static Connection* Of(MHD_Connection* c) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == nullptr ? nullptr : static_cast<Connection*>(info->socket_context);
  }

  // "" when the connection's client presented a certificate the client CA
  // (as served now) signed and it is valid now; else what was wrong.
  std::string ClientCertificateProblem(MHD_Connection* c) const {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info == nullptr || info->tls_session == nullptr) return "not a TLS connection";
    return tls->CheckClient(static_cast<gnutls_session_t>(info->tls_session));
  }

  // The request is all in: its deadline no longer runs. Checks the client
  // certificate once per connection; returns what is wrong with it.
  std::string Received(MHD_Connection* c) {
    Connection* conn = Of(c);
    if (conn == nullptr) return "";
    bool check = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      conn->waiting = false;
      check = !conn->checked && !opts.tls.client_ca.empty();
      conn->checked = true;
    }
    if (check) conn->client_problem = ClientCertificateProblem(c);
    return conn->client_problem;
  }

  Response ErrorFor(MHD_Connection* c, const char* url, const char* method, int status,
                    const std::string& message) const {
    Request r = Head(c, url, method);
    return error_page(r, status, message);
  }

  static Request Head(MHD_Connection* c, const char* url, const char* method) {
    Request r;
    r.method = method;
    r.path = url;
    MHD_get_connection_values(
        c, MHD_GET_ARGUMENT_KIND,
        [](void* cls, MHD_ValueKind, const char* key, const char* value) {
          static_cast<Request*>(cls)->query.emplace_back(key, value == nullptr ? "" : value);
          return MHD_YES;
        },
        &r);
    MHD_get_connection_values(
        c, MHD_HEADER_KIND,
        [](void* cls, MHD_ValueKind, const char* key, const char* value) {
          static_cast<Request*>(cls)->headers.emplace(absl::AsciiStrToLower(key),
                                                      value == nullptr ? "" : value);
          return MHD_YES;
        },
        &r);
    return r;
  }

  static MHD_Result OnRequest(void* cls, MHD_Connection* c, const char* url, const char* method,
                              const char* /*version*/, const char* upload, size_t* upload_size,
                              void** request_state) {
    Impl* impl = static_cast<Impl*>(cls);
    auto* pending = static_cast<Pending*>(*request_state);
    if (pending == nullptr) {  // the head is in
      *request_state = new Pending;
      const char* length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
      uint64_t n = 0;
      if (length != nullptr && absl::SimpleAtoi(length, &n) && n > impl->opts.max_request_bytes) {
        const std::string problem = impl->Received(c);
        if (!problem.empty()) return impl->RefuseClient(c, url, method, problem);
        return Send(c, impl->ErrorFor(c, url, method, 413,
                                      absl::StrCat("request body too large: at most ",
                                                   impl->opts.max_request_bytes, " bytes")));
      }
      return MHD_YES;
    }
    if (*upload_size > 0) {
      // A chunked body past the limit: no answer can be queued mid-body.
      if (pending->body.size() + *upload_size > impl->opts.max_request_bytes) return MHD_NO;
      pending->body.append(upload, *upload_size);
      *upload_size = 0;
      return MHD_YES;
    }
    if (pending->deferred != nullptr) {  // resumed: the answer is in
      std::lock_guard<std::mutex> lock(pending->deferred->mu);
      return Send(c, pending->deferred->response);
    }
    const std::string problem = impl->Received(c);
    if (!problem.empty()) return impl->RefuseClient(c, url, method, problem);
    Request r = Head(c, url, method);
    r.body = std::move(pending->body);
    Response error;
    const Route* route = impl->Find(r, &error);
    if (route == nullptr) return Send(c, error);
    if (route->handler) return Send(c, route->handler(r));
    auto deferred = std::make_shared<Deferred>();
    deferred->connection = c;
    deferred->path = r.path;
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      if (impl->stopping) return Send(c, impl->error_page(r, 503, "the server is stopping"));
      impl->deferred.insert(deferred);
    }
    pending->deferred = deferred;
    MHD_suspend_connection(c);
    route->async(r, [deferred](Response resp) { deferred->Answer(std::move(resp)); });
    return MHD_YES;
  }

  MHD_Result RefuseClient(MHD_Connection* c, const char* url, const char* method,
                          const std::string& problem) const {
    return Send(c, ErrorFor(c, url, method, 403,
                            "this HTTPS port takes only clients with a certificate signed by "
                            "its client CA (--tls_ca): " +
                                problem));
  }

  static void OnCompleted(void* cls, MHD_Connection* c, void** request_state,
                          MHD_RequestTerminationCode) {
    Impl* impl = static_cast<Impl*>(cls);
    auto* pending = static_cast<Pending*>(*request_state);
    if (pending != nullptr && pending->deferred != nullptr) {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->deferred.erase(pending->deferred);
      impl->cv.notify_all();
    }
    delete pending;
    *request_state = nullptr;
    Connection* conn = Of(c);
    if (conn == nullptr) return;
    std::lock_guard<std::mutex> lock(impl->mu);
    conn->waiting = true;  // for the next request on this connection
    conn->deadline = absl::Now() + impl->opts.request_deadline;
  }

  static void OnConnection(void* cls, MHD_Connection* c, void** socket_context,
                           MHD_ConnectionNotificationCode code) {
    Impl* impl = static_cast<Impl*>(cls);
    std::lock_guard<std::mutex> lock(impl->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      auto* conn = new Connection;
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
      conn->fd = info == nullptr ? -1 : info->connect_fd;
      conn->deadline = absl::Now() + impl->opts.request_deadline;
      impl->connections.insert(conn);
      *socket_context = conn;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      auto* conn = static_cast<Connection*>(*socket_context);
      impl->connections.erase(conn);
      delete conn;
      *socket_context = nullptr;
    }
  }

  void ForgetPort() {
    if (port < 0) return;
    std::lock_guard<std::mutex> lock(tls_servers_mu);
    tls_servers.erase(port);
    port = -1;
  }

  // Reads the TLS files again when they changed, and says what came of it.
  void ReloadTls() {
    std::string problem;
    if (!tls->ReloadIfChanged(&problem)) return;
    if (problem.empty()) {
      spdlog::info("HTTPS: serving the renewed {}, {}{} from the next connection on", opts.tls.cert,
                   opts.tls.key,
                   opts.tls.client_ca.empty() ? "" : " and client CA " + opts.tls.client_ca);
    } else {
      spdlog::warn("HTTPS: {}; still serving the files as they were", problem);
    }
  }

  // Cuts off every connection whose request is overdue: shutdown() makes
  // its event loop see the end and close it. Checks every 100 ms; with
  // TLS, looks at the TLS files every Tls::reload_every.
  void Watch() {
    absl::Time next_reload = absl::Now() + opts.tls.reload_every;
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      const absl::Time now = absl::Now();
      for (Connection* conn : connections) {
        if (!conn->waiting || now < conn->deadline || conn->fd < 0) continue;
        conn->waiting = false;
        shutdown(conn->fd, SHUT_RDWR);
      }
      if (tls != nullptr && now >= next_reload) {
        next_reload = now + opts.tls.reload_every;
        lock.unlock();  // reading files must not hold up the event loops
        ReloadTls();
        lock.lock();
      }
    }
  }
};

HttpServer::HttpServer(Options opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  impl_->error_page = [](const Request&, int status, const std::string& message) {
    return Response{status, "text/plain; charset=utf-8", message + "\n", {}};
  };
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Impl::Route{"GET", Segments(pattern), std::move(handler), nullptr});
}

Response HttpServer::Handle(Request request) const { return impl_->Dispatch(request); }

void HttpServer::Post(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Impl::Route{"POST", Segments(pattern), std::move(handler), nullptr});
}

void HttpServer::PostAsync(const std::string& pattern, AsyncHandler handler) {
  impl_->routes.push_back(Impl::Route{"POST", Segments(pattern), nullptr, std::move(handler)});
}

void HttpServer::GetAsync(const std::string& pattern, AsyncHandler handler) {
  impl_->routes.push_back(Impl::Route{"GET", Segments(pattern), nullptr, std::move(handler)});
}

void HttpServer::SetErrorPage(ErrorPage page) { impl_->error_page = std::move(page); }

std::vector<std::string> HttpServer::Routes() const {
  std::vector<std::string> out;
  for (const Impl::Route& r : impl_->routes) {
    out.push_back(absl::StrCat(r.method, " ", absl::StrJoin(r.segments, "/")));
  }
  return out;
}

bool HttpServer::tls() const { return !impl_->opts.tls.cert.empty(); }

size_t HttpServer::connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->connections.size();
}

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  Impl& im = *impl_;
  const Options& o = im.opts;
  if (tls()) {
    absl::StatusOr<std::unique_ptr<TlsMaterial>> material =
        TlsMaterial::Load(o.tls.cert, o.tls.key, o.tls.client_ca);
    if (!material.ok()) return material.status();
    im.tls = *std::move(material);
  }
  int family = AF_INET;
  const int fd = Listen(host, port, &family);
  const int bound = fd < 0 ? -1 : LocalPort(fd);
  if (bound <= 0) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", host, ":", port,
                     " (address in use, or not an address of this machine)"));
  }
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_LISTEN_SOCKET, fd, nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, static_cast<intptr_t>(o.max_connections), nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, static_cast<intptr_t>(o.max_connections_per_address),
       nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT,
       static_cast<intptr_t>(std::max<int64_t>(1, absl::ToInt64Seconds(o.idle_timeout))), nullptr},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&Impl::OnConnection), &im},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::OnCompleted), &im},
  };
  if (o.threads > 1) {
    items.push_back({MHD_OPTION_THREAD_POOL_SIZE, static_cast<intptr_t>(o.threads), nullptr});
  }
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
  if (family == AF_INET6) flags |= MHD_USE_IPv6;
  if (tls()) {
    flags |= MHD_USE_TLS;
    // The chain and key come from the callback, per handshake, so that
    // renewed ones are served without a restart. The CA given here only
    // makes libmicrohttpd ask clients for a certificate; it is checked
    // against the CA as served now (ClientCertificateProblem).
    items.push_back(
        {MHD_OPTION_HTTPS_CERT_CALLBACK, 0, reinterpret_cast<void*>(&ServeCertificate)});
    if (!im.tls->first_client_ca().empty()) {
      items.push_back(
          {MHD_OPTION_HTTPS_MEM_TRUST, 0, const_cast<char*>(im.tls->first_client_ca().c_str())});
    }
    std::lock_guard<std::mutex> lock(tls_servers_mu);
    tls_servers[bound] = im.tls.get();
    im.port = bound;
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  im.daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::OnRequest, &im, MHD_OPTION_ARRAY,
                               items.data(), MHD_OPTION_END);
  if (im.daemon == nullptr) {
    close(fd);
    im.ForgetPort();
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", host, ":", bound, " (libmicrohttpd did not start)"));
  }
  im.watchdog = std::thread([&im] { im.Watch(); });
  return bound;
}

void HttpServer::Stop() {
  Impl& im = *impl_;
  if (im.daemon == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    im.stopping = true;
  }
  im.cv.notify_all();
  im.watchdog.join();
  // libmicrohttpd stops only with no connection suspended: answer every
  // request still waiting.
  std::unordered_set<std::shared_ptr<Impl::Deferred>> waiting;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    waiting = im.deferred;
  }
  for (const auto& d : waiting) {
    Request r;
    r.path = d->path;
    d->Answer(im.error_page(r, 503, "the server is stopping"));
  }
  {
    // Their event loops send the answers (a second at most).
    std::unique_lock<std::mutex> lock(im.mu);
    im.cv.wait_for(lock, std::chrono::seconds(1), [&] { return im.deferred.empty(); });
  }
  MHD_stop_daemon(im.daemon);  // closes the listening socket and every connection
  im.daemon = nullptr;
  im.ForgetPort();
  std::lock_guard<std::mutex> lock(im.mu);
  for (Impl::Connection* conn : im.connections) delete conn;
  im.connections.clear();
}

}  // namespace taskgrid::http
