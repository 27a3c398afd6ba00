// The embedded HTTP server on a real loopback socket: routing by pattern
// and method, 404, 405, the request size bound, the thread and queue
// bounds, the read timeout, HTTPS, and a clean stop.
#include "scheduler/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace taskgrid::http {
namespace {

using ::testing::HasSubstr;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Get("/metrics", [this](const Request& req) {
      ++calls_;
      return Response{200, "text/plain; version=0.0.4", "up 1\n# path " + req.path + "\n", {}};
    });
    server_.Get("/items/{id}", [](const Request& req) {
      return Response{200, "text/plain", "item " + req.params.at("id"), {{"X-Item", "yes"}}};
    });
    server_.Post("/items/{id}/touch", [this](const Request& req) {
      ++posts_;
      std::string query;
      for (const auto& [k, v] : req.query) query += k + "=" + v + ";";
      return Response{201,
                      "application/json",
                      "{\"id\":\"" + req.params.at("id") + "\",\"query\":\"" + query +
                          "\",\"x\":\"" + req.Header("x-test") + "\",\"body\":\"" + req.body +
                          "\"}",
                      {}};
    });
    auto port = server_.Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_GT(*port, 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(10, 0);
  }

  HttpServer server_;
  std::unique_ptr<httplib::Client> client_;
  std::atomic<int> calls_{0};
  std::atomic<int> posts_{0};
};

TEST_F(HttpServerTest, ServesARegisteredPath) {
  auto res = client_->Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "up 1\n# path /metrics\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_EQ(calls_.load(), 1);
}

TEST_F(HttpServerTest, UnknownPathsAreNotFound) {
  for (const char* path : {"/", "/metricsx", "/metrics/x", "/xmetrics", "/nope"}) {
    auto res = client_->Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
    EXPECT_THAT(res->body, HasSubstr("not found")) << path;
  }
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(HttpServerTest, MethodsOtherThanTheRoutesAreNotAllowed) {
  auto post = client_->Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  EXPECT_THAT(post->body, HasSubstr("/metrics takes GET, HEAD, not POST"));
  auto del = client_->Delete("/metrics");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto options = client_->Options("/items/7/touch");
  ASSERT_TRUE(options);
  EXPECT_EQ(options->status, 405);
  EXPECT_EQ(options->get_header_value("Allow"), "POST");
  auto get_post_only = client_->Get("/items/7/touch");
  ASSERT_TRUE(get_post_only);
  EXPECT_EQ(get_post_only->status, 405);
  EXPECT_EQ(get_post_only->get_header_value("Allow"), "POST");
  auto head = client_->Head("/metrics");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  EXPECT_EQ(calls_.load(), 1);  // the HEAD only
  EXPECT_EQ(posts_.load(), 0);
}

TEST_F(HttpServerTest, RoutesByPatternAndHandsOverTheRequest) {
  auto get = client_->Get("/items/a:b-1");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "item a:b-1");
  EXPECT_EQ(get->get_header_value("X-Item"), "yes");
  for (const char* path : {"/items", "/items/", "/items/7/x", "/items/7/touch/more"}) {
    auto res = client_->Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
  }
  auto post =
      client_->Post("/items/7/touch?b=2&a=1&a=3", {{"X-Test", "yes"}}, "hello", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 201);
  EXPECT_EQ(post->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(post->body, R"({"id":"7","query":"a=1;a=3;b=2;","x":"yes","body":"hello"})");
  EXPECT_EQ(posts_.load(), 1);
}

TEST_F(HttpServerTest, AnErrorPageWriterWritesEveryError) {
  HttpServer server;
  server.Post("/act", [](const Request&) { return Response{200, "text/plain", "done", {}}; });
  server.SetErrorPage([](const Request& req, int status, const std::string& message) {
    return Response{status,
                    "application/json",
                    "{\"status\":" + std::to_string(status) + ",\"path\":\"" + req.path +
                        "\",\"message\":\"" + message + "\"}",
                    {}};
  });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client client("127.0.0.1", *port);
  auto missing = client.Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, R"({"status":404,"path":"/nope","message":"not found: /nope"})");
  auto wrong = client.Get("/act");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_THAT(wrong->body, HasSubstr(R"("status":405)"));
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
  auto big = client.Post("/act", std::string(HttpServer::Options{}.max_request_bytes + 1, 'x'),
                         "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_THAT(big->body, HasSubstr("request body too large: at most 8192 bytes"));
}

TEST_F(HttpServerTest, RefusesABodyPastTheLimit) {
  const size_t max = HttpServer::Options{}.max_request_bytes;
  auto res = client_->Post("/items/7/touch", std::string(max + 1, 'x'), "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(posts_.load(), 0);
  auto fits = client_->Post("/items/7/touch", std::string(max, 'x'), "text/plain");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 201);
  EXPECT_EQ(posts_.load(), 1);
}

TEST_F(HttpServerTest, StopsAndStopsAgain) {
  ASSERT_TRUE(client_->Get("/metrics"));
  server_.Stop();
  EXPECT_FALSE(client_->Get("/metrics"));  // nobody listens any more
  server_.Stop();                          // idempotent
}

TEST(HttpServer, ABusyPortIsAClearError) {
  HttpServer first;
  auto port = first.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  HttpServer second;
  auto again = second.Start("127.0.0.1", *port);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(), HasSubstr(std::to_string(*port)));
}

// threads = 1 and max_queued = 1: one request runs on the pool's thread,
// one waits in the queue, and the accepting thread serves the next one
// itself, so a fourth is not even accepted until one of them ends. At
// most two handlers ever run at once, and every request is answered.
TEST(HttpServerBounds, ThreadsAndQueueBoundWhatRunsAtOnce) {
  HttpServer::Options opts;
  opts.threads = 1;
  opts.max_queued = 1;
  HttpServer server(opts);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  int most = 0;
  bool release = false;
  std::vector<std::string> started;
  server.Get("/block/{n}", [&](const Request& req) {
    std::unique_lock<std::mutex> lock(mu);
    started.push_back(req.params.at("n"));
    most = std::max(most, ++running);
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    --running;
    return Response{200, "text/plain", "done " + req.params.at("n"), {}};
  });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  std::vector<int> statuses(4, 0);
  std::vector<std::thread> clients;
  auto send = [&](int i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", *port);  // Connection: close
      client.set_read_timeout(30, 0);
      auto res = client.Get("/block/" + std::to_string(i));
      statuses[i] = res ? res->status : -1;
    });
  };
  auto wait_running = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return running >= n; });
  };
  send(0);
  ASSERT_TRUE(wait_running(1));
  send(1);
  send(2);
  ASSERT_TRUE(wait_running(2));  // one of 1 and 2 queued, the other on the accepting thread
  send(3);
  {
    // Nothing can take the fourth: give it a moment to show it would run.
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return running > 2; }));
    EXPECT_EQ(started.size(), 2u);
    release = true;
    cv.notify_all();
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(statuses, std::vector<int>(4, 200));
  EXPECT_EQ(most, 2);
  EXPECT_EQ(started.size(), 4u);
}

// A browser keeps its connections open between polls; httplib would hold
// a thread for each. One request per connection keeps them from starving
// the pool: here a kept-alive client and a long keep-alive timeout would
// hold the only thread for 30 s.
TEST(HttpServerBounds, IdleConnectionsDoNotHoldThreads) {
  HttpServer::Options opts;
  opts.threads = 1;
  opts.max_queued = 4;
  opts.keep_alive_timeout = absl::Seconds(30);
  HttpServer server(opts);
  server.Get("/x", [](const Request&) { return Response{200, "text/plain", "x", {}}; });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client idle("127.0.0.1", *port);
  idle.set_keep_alive(true);
  auto first = idle.Get("/x");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->get_header_value("Connection"), "close");
  httplib::Client other("127.0.0.1", *port);
  other.set_read_timeout(10, 0);
  const auto begin = std::chrono::steady_clock::now();
  auto second = other.Get("/x");
  ASSERT_TRUE(second) << httplib::to_string(second.error());
  EXPECT_EQ(second->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(5));
}

// A client that sends half a request is cut off after the timeouts
// (httplib waits for each line with the keep-alive timeout, then reads it
// with the read timeout) instead of holding a thread.
TEST(HttpServerBounds, ASlowClientTimesOut) {
  HttpServer::Options opts;
  opts.read_timeout = absl::Milliseconds(200);
  opts.keep_alive_timeout = absl::Seconds(1);
  HttpServer server(opts);
  server.Get("/x", [](const Request&) { return Response{}; });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval bound{30, 0};  // only so that a broken server cannot hang the test
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  const std::string half = "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ASSERT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
  const auto begin = std::chrono::steady_clock::now();
  char buf[512];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) {
  }
  EXPECT_EQ(n, 0) << "the server should have closed the connection";
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(4));
  close(fd);
}

TEST(HttpServerBounds, BadTlsFilesAreAClearError) {
  const std::string dir = ::testing::TempDir();
  const std::string not_pem = dir + "/http_server_test_not.pem";
  std::ofstream(not_pem) << "hello\n";
  HttpServer::Options opts;
  opts.tls = {not_pem, not_pem, ""};
  HttpServer server(opts);
  EXPECT_TRUE(server.tls());
  auto port = server.Start("127.0.0.1", 0);
  EXPECT_EQ(port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(port.status().message(), HasSubstr(not_pem));
}

TEST(SplitHostPort, ReadsHostAndPort) {
  EXPECT_EQ(*SplitHostPort("metrics_listen", "127.0.0.1:9090"),
            (std::pair<std::string, int>("127.0.0.1", 9090)));
  EXPECT_EQ(*SplitHostPort("metrics_listen", "[::1]:0"), (std::pair<std::string, int>("::1", 0)));
  EXPECT_EQ(*SplitHostPort("metrics_listen", "localhost:1"),
            (std::pair<std::string, int>("localhost", 1)));
  for (const char* bad : {"127.0.0.1", ":9090", "host:", "host:x", "host:65536", "::1:9090"}) {
    auto r = SplitHostPort("metrics_listen", bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--metrics_listen")) << bad;
  }
}

}  // namespace
}  // namespace taskgrid::http
