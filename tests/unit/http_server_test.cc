// The embedded HTTP server on a real loopback socket: routing by exact
// path, 404, 405, the request size bound, and a clean stop.
#include "scheduler/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <string>

namespace taskgrid::http {
namespace {

using ::testing::HasSubstr;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Get("/metrics", [this](const Request& req) {
      ++calls_;
      return Response{200, "text/plain; version=0.0.4", "up 1\n# path " + req.path + "\n"};
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

TEST_F(HttpServerTest, OnlyGetAndHeadAreAllowed) {
  auto post = client_->Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");
  auto del = client_->Delete("/metrics");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto head = client_->Head("/metrics");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
}

TEST_F(HttpServerTest, RefusesABodyPastTheLimit) {
  auto res = client_->Post(
      "/metrics", std::string(HttpServer::Options{}.max_request_bytes + 1, 'x'), "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
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
