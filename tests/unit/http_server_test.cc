// The embedded HTTP server on a real loopback socket: routing by pattern
// and method, 404, 405, the request size bound, the request deadline, the
// idle timeout and the connection caps against slow clients, HTTPS with
// and without client certificates, and a clean stop.
#include "scheduler/http/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"

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
  EXPECT_EQ(post->body, R"({"id":"7","query":"b=2;a=1;a=3;","x":"yes","body":"hello"})");
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

// A socket to the server from `from` (any 127.0.0.0/8 address is this
// machine's loopback, so each stands for another client), its reads
// bounded so that a broken server cannot hang the test.
int ConnectFrom(int port, const std::string& from) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, from.c_str(), &local.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval bound{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Loopback(int n) { return "127.0.0." + std::to_string(n); }

// Whether the server ended the connection (EOF or a reset) before the
// read bound.
bool EndedByServer(int fd) {
  char buf[512];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// GET /x from `from` on a connection of its own: the status, or -1.
int GetFrom(int port, const std::string& from) {
  const int fd = ConnectFrom(port, from);
  if (fd < 0) return -1;
  const std::string req = "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::string answer;
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[512];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  int status = -1;
  if (answer.rfind("HTTP/1.1 ", 0) != 0 || !absl::SimpleAtoi(answer.substr(9, 3), &status)) {
    return -1;
  }
  return status;
}

// Sends `bytes` one at a time, 50 ms apart, watching for the server to
// end the connection; returns how many it took before it did (all of
// them: it never did).
size_t Trickle(int fd, const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size(); ++sent) {
    if (send(fd, &bytes[sent], 1, MSG_NOSIGNAL) != 1) return sent;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char b;
      if (recv(fd, &b, 1, 0) <= 0) return sent + 1;
    }
  }
  return bytes.size();
}

// Waits (bounded: 30 s) for the server's count of open connections.
bool WaitForConnections(const HttpServer& server, size_t want) {
  for (int i = 0; i < 3000; ++i) {
    if (server.connections() == want) return true;
    poll(nullptr, 0, 10);
  }
  return false;
}

HttpServer::Options Patient() {
  HttpServer::Options opts;
  opts.request_deadline = absl::Minutes(2);
  opts.idle_timeout = absl::Minutes(2);
  return opts;
}

Response Ok(const Request&) { return Response{200, "text/plain", "x", {}}; }

// The deadline is for the whole request, however the bytes trickle in: a
// client sending one header byte every 50 ms (never idle long enough for
// the idle timeout) is cut off at the deadline, long before the ~32 s its
// head would take.
TEST(HttpServerBounds, ATrickledRequestIsCutOffAtTheDeadline) {
  HttpServer::Options opts = Patient();
  opts.request_deadline = absl::Seconds(1);
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const int fd = ConnectFrom(*port, "127.0.0.1");
  ASSERT_GE(fd, 0);
  const std::string head =
      "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(600, 'a') + "\r\n\r\n";
  EXPECT_LT(Trickle(fd, head), head.size()) << "the server took the whole trickled head";
  close(fd);
  EXPECT_TRUE(WaitForConnections(server, 0));
  EXPECT_EQ(GetFrom(*port, "127.0.0.1"), 200);
}

// A client that sends half a request and then nothing is cut off after
// the idle timeout.
TEST(HttpServerBounds, AnIdleClientIsCutOff) {
  HttpServer::Options opts = Patient();
  opts.idle_timeout = absl::Seconds(1);
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const int fd = ConnectFrom(*port, "127.0.0.1");
  ASSERT_GE(fd, 0);
  const std::string half = "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ASSERT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
  EXPECT_TRUE(EndedByServer(fd));
  close(fd);
}

// Hundreds of connections that sit in the middle of a request, or send
// nothing at all, from many addresses, cost the server no thread: with
// two event loops and all of them open, every other client is answered.
TEST(HttpServerBounds, HundredsOfSlowAndIdleConnectionsDoNotStopOthers) {
  HttpServer::Options opts = Patient();
  opts.threads = 2;
  opts.max_connections_per_address = 8;
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  std::vector<int> fds;
  const std::string half = "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaa";
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectFrom(*port, Loopback(2 + i / 6));
    ASSERT_GE(fd, 0) << i;
    fds.push_back(fd);
    if (i < 200) {
      ASSERT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
    }
  }
  ASSERT_TRUE(WaitForConnections(server, 300)) << server.connections();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(GetFrom(*port, "127.0.0.1"), 200) << i;
  // The slow ones are still open (the last GET's own may take a moment
  // to be counted out).
  EXPECT_TRUE(WaitForConnections(server, 300)) << server.connections();
  for (int fd : fds) close(fd);
  EXPECT_TRUE(WaitForConnections(server, 0));
}

// One address holds at most max_connections_per_address connections: the
// next one is closed at once, other addresses are served, and a place
// freed is taken again. (One event loop, so the connections are taken in
// the order they came.)
TEST(HttpServerBounds, ConnectionsPerAddressAreCapped) {
  HttpServer::Options opts = Patient();
  opts.threads = 1;
  opts.max_connections_per_address = 4;
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(ConnectFrom(*port, "127.0.0.9"));
    ASSERT_GE(held.back(), 0);
  }
  const int fifth = ConnectFrom(*port, "127.0.0.9");
  ASSERT_GE(fifth, 0);
  EXPECT_TRUE(EndedByServer(fifth));
  close(fifth);
  EXPECT_EQ(server.connections(), 4u);
  EXPECT_EQ(GetFrom(*port, "127.0.0.10"), 200);
  EXPECT_EQ(GetFrom(*port, "127.0.0.9"), -1);
  close(held.back());
  held.pop_back();
  ASSERT_TRUE(WaitForConnections(server, 3));
  EXPECT_EQ(GetFrom(*port, "127.0.0.9"), 200);
  for (int fd : held) close(fd);
}

// HTTPS: certificates made by the deployment's own script.
class HttpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/http_server_test_certs_" + std::to_string(getpid());
    const std::string cmd = std::string("bash ") + TASKGRID_SOURCE_DIR + "/deploy/make-certs.sh " +
                            dir_ + " localhost >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  HttpServer::Tls Files(bool client_ca) const {
    return {dir_ + "/head.pem", dir_ + "/head.key", client_ca ? dir_ + "/ca.pem" : ""};
  }

  std::string dir_;
};

// The TLS handshake counts against the deadline too: a ClientHello
// trickled in a byte at a time is cut off.
TEST_F(HttpsTest, ATrickledHandshakeIsCutOffAtTheDeadline) {
  HttpServer::Options opts = Patient();
  opts.request_deadline = absl::Seconds(1);
  opts.tls = Files(false);
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  const int fd = ConnectFrom(*port, "127.0.0.1");
  ASSERT_GE(fd, 0);
  // A handshake record announcing 512 bytes, then the bytes.
  const std::string hello = std::string("\x16\x03\x01\x02\x00", 5) + std::string(512, '\x01');
  EXPECT_LT(Trickle(fd, hello), hello.size()) << "the server took the whole trickled handshake";
  close(fd);
  EXPECT_TRUE(WaitForConnections(server, 0));
}

// With a client CA, a request without a certificate it signed is refused,
// saying why; one with such a certificate is served.
TEST_F(HttpsTest, ClientCertificatesAreRequiredWithAClientCa) {
  HttpServer::Options opts;
  opts.tls = Files(true);
  HttpServer server(opts);
  server.Get("/x", Ok);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::SSLClient anonymous("127.0.0.1", *port);
  anonymous.set_ca_cert_path((dir_ + "/ca.pem").c_str());
  auto refused = anonymous.Get("/x");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 403);
  EXPECT_THAT(refused->body, HasSubstr("no client certificate was presented"));
  httplib::SSLClient client("127.0.0.1", *port, dir_ + "/client.pem", dir_ + "/client.key");
  client.set_ca_cert_path((dir_ + "/ca.pem").c_str());
  auto served = client.Get("/x");
  ASSERT_TRUE(served) << httplib::to_string(served.error());
  EXPECT_EQ(served->status, 200);
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
