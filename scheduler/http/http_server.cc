#include "scheduler/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace taskgrid::http {

namespace {

// httplib's ThreadPool queues every accepted connection without bound.
// This one keeps at most `max_queued` waiting; past that the accepting
// thread runs the connection itself, so it stops accepting meanwhile and
// further clients wait in the kernel's listen backlog.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stop_ && queue_.size() < max_queued_) {
        queue_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();  // full (or stopping): served here, which holds back the next accept
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
      cv_.notify_all();
    }
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and every connection was served
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;
};

std::vector<std::string> Segments(absl::string_view path) { return absl::StrSplit(path, '/'); }

std::chrono::microseconds Micros(absl::Duration d) {
  return std::chrono::microseconds(absl::ToInt64Microseconds(d));
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
    Handler handler;
  };

  Options opts;
  std::unique_ptr<httplib::Server> server;
  std::vector<Route> routes;  // fixed once Start ran
  ErrorPage error_page;
  std::thread thread;
  std::atomic<bool> listen_returned{false};

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

  void Dispatch(const httplib::Request& req, httplib::Response& res) const {
    Request r;
    r.method = req.method;
    r.path = req.path;
    for (const auto& [name, value] : req.params) r.query.emplace_back(name, value);
    for (const auto& [name, value] : req.headers)
      r.headers.emplace(absl::AsciiStrToLower(name), value);
    r.body = req.body;
    const std::string method = r.method == "HEAD" ? "GET" : r.method;
    const std::vector<std::string> path = Segments(r.path);
    std::vector<std::string> allowed;
    for (const Route& route : routes) {
      std::map<std::string, std::string> params;
      if (!Matches(route, path, &params)) continue;
      if (route.method == method) {
        r.params = std::move(params);
        Write(route.handler(r), res);
        return;
      }
      allowed.push_back(route.method == "GET" ? "GET, HEAD" : route.method);
    }
    if (allowed.empty()) {
      Write(error_page(r, 404, "not found: " + r.path), res);
      return;
    }
    const std::string allow = absl::StrJoin(allowed, ", ");
    Response page = error_page(
        r, 405, absl::StrCat("method not allowed: ", r.path, " takes ", allow, ", not ", r.method));
    page.headers.emplace_back("Allow", allow);
    Write(std::move(page), res);
  }

  static void Write(Response r, httplib::Response& res) {
    res.status = r.status;
    for (const auto& [name, value] : r.headers) res.set_header(name, value);
    res.set_content(std::move(r.body), r.content_type.c_str());
  }

  static std::string Describe(int status, const Options& opts) {
    switch (status) {
      case 400:
        return "bad request: malformed, or a POST without Content-Length (send an empty "
               "body: curl -d '')";
      case 413:
        return absl::StrCat("request body too large: at most ", opts.max_request_bytes, " bytes");
      case 414:
        return "request line too long";
      default:
        return absl::StrCat("error ", status);
    }
  }
};

HttpServer::HttpServer(Options opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  impl_->error_page = [](const Request&, int status, const std::string& message) {
    return Response{status, "text/plain; charset=utf-8", message + "\n", {}};
  };
  if (opts.tls.cert.empty()) {
    impl_->server = std::make_unique<httplib::Server>();
  } else {
    impl_->server = std::make_unique<httplib::SSLServer>(
        opts.tls.cert.c_str(), opts.tls.key.c_str(),
        opts.tls.client_ca.empty() ? nullptr : opts.tls.client_ca.c_str());
  }
  httplib::Server& s = *impl_->server;
  s.new_task_queue = [threads = opts.threads, queued = opts.max_queued] {
    return new BoundedPool(threads, queued);
  };
  // httplib's default also sets SO_REUSEPORT, with which a second process
  // binds the same port and takes half the requests: reuse the address
  // (a restart need not wait out TIME_WAIT), never the port.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_payload_max_length(opts.max_request_bytes);
  s.set_read_timeout(Micros(opts.read_timeout));
  s.set_write_timeout(Micros(opts.write_timeout));
  s.set_keep_alive_timeout(
      static_cast<time_t>(std::max<int64_t>(1, absl::ToInt64Seconds(opts.keep_alive_timeout))));
  s.set_keep_alive_max_count(opts.keep_alive_max_requests);
  // Every method goes to the one router, which knows 404 from 405.
  auto dispatch = [impl = impl_.get()](const httplib::Request& req, httplib::Response& res) {
    impl->Dispatch(req, res);
  };
  s.Get(".*", dispatch);
  s.Post(".*", dispatch);
  s.Put(".*", dispatch);
  s.Patch(".*", dispatch);
  s.Delete(".*", dispatch);
  s.Options(".*", dispatch);
  // A page for the errors httplib answers itself (413, 400, ...).
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [impl = impl_.get()](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        Request r;
        r.method = req.method;
        r.path = req.path;
        Impl::Write(impl->error_page(r, res.status, Impl::Describe(res.status, impl->opts)), res);
        return httplib::Server::HandlerResponse::Handled;
      }));
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Impl::Route{"GET", Segments(pattern), std::move(handler)});
}

void HttpServer::Post(const std::string& pattern, Handler handler) {
  impl_->routes.push_back(Impl::Route{"POST", Segments(pattern), std::move(handler)});
}

void HttpServer::SetErrorPage(ErrorPage page) { impl_->error_page = std::move(page); }

bool HttpServer::tls() const { return !impl_->opts.tls.cert.empty(); }

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  httplib::Server& s = *impl_->server;
  if (!s.is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve HTTPS with certificate ", impl_->opts.tls.cert, " and key ",
        impl_->opts.tls.key,
        impl_->opts.tls.client_ca.empty() ? "" : " and client CA " + impl_->opts.tls.client_ca,
        ": a file is missing, unreadable, not PEM, or the key does not match"));
  }
  int bound = port;
  if (port == 0) {
    bound = s.bind_to_any_port(host);
  } else if (!s.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", host, ":", port,
                     " (address in use, or not an address of this machine)"));
  }
  impl_->thread = std::thread([this] {
    impl_->server->listen_after_bind();
    impl_->listen_returned = true;
  });
  // stop() only reaches a server that is running: wait until it is, so a
  // Stop right after Start cannot miss it.
  while (!s.is_running() && !impl_->listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

void HttpServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server->stop();
  impl_->thread.join();
}

}  // namespace taskgrid::http
