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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

// A path as a regex that matches it and nothing else (httplib routes by
// regex).
std::string ExactPattern(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

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

struct HttpServer::Impl {
  Options opts;
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
};

HttpServer::HttpServer(Options opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  httplib::Server& s = impl_->server;
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
  // Only GET and HEAD (which httplib answers from the GET handlers).
  auto not_allowed = [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content("method not allowed: use GET\n", "text/plain; charset=utf-8");
  };
  s.Post(".*", not_allowed);
  s.Put(".*", not_allowed);
  s.Patch(".*", not_allowed);
  s.Delete(".*", not_allowed);
  s.Options(".*", not_allowed);
  // A body for errors that have none (404 for an unknown path, 413, ...).
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        res.set_content(res.status == 404 ? "not found: " + req.path + "\n"
                                          : absl::StrCat("error ", res.status, "\n"),
                        "text/plain; charset=utf-8");
        return httplib::Server::HandlerResponse::Handled;
      }));
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& path, Handler handler) {
  impl_->server.Get(ExactPattern(path), [handler = std::move(handler)](const httplib::Request& req,
                                                                       httplib::Response& res) {
    Response r = handler(Request{req.path});
    res.status = r.status;
    res.set_content(std::move(r.body), r.content_type.c_str());
  });
}

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  httplib::Server& s = impl_->server;
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
    impl_->server.listen_after_bind();
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
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace taskgrid::http
