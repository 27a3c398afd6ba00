// TaskRun's http steps against a real HTTP/1.1 server: a tiny one on a
// thread of this test, on 127.0.0.1 with an ephemeral port, that answers
// each request with what the test chose and records what it got. Every wait
// is bounded: a Run() that does not return in time is cancelled and fails
// the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/executor.h"
#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/assignment.h"

// A namespace of its own: some of its file-local names are also another test
// file's, and the files of a test binary compile together (cmake/TaskgridTest.cmake).
namespace taskgrid::agent::http_step_test {
namespace {

using ::taskgrid::testing::Assignment;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// libcurl honours http_proxy: requests to this test's server must not
// leave for a proxy the machine may have set. Before main(), so before any
// thread reads the environment.
const bool kNoProxy = setenv("no_proxy", "127.0.0.1,localhost", 1) == 0;

// --- The server ---

struct Received {
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

struct Reply {
  int status = 200;
  std::string body;
  // Never answer: hold the connection until the client drops it.
  bool hang = false;
};

class TinyHttpServer {
 public:
  // Answers every request with `reply`, in order; the last one repeats.
  explicit TinyHttpServer(std::vector<Reply> replies) : replies_(std::move(replies)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    port_ = ntohs(addr.sin_port);
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    thread_ = std::thread([this] { Serve(); });
  }

  ~TinyHttpServer() {
    const uint64_t one = 1;
    if (stop_fd_ >= 0) (void)!write(stop_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    if (stop_fd_ >= 0) close(stop_fd_);
    if (listen_fd_ >= 0) close(listen_fd_);
  }

  int port() const { return port_; }
  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  std::vector<Received> received() const {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  // Waits (bounded) until `fd` is readable; false when stopped or past
  // the bound.
  bool WaitReadable(int fd) const {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int n = poll(fds, 2, 10'000);
    return n > 0 && fds[1].revents == 0 && fds[0].revents != 0;
  }

  void Serve() {
    while (WaitReadable(listen_fd_)) {
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      Handle(conn);
      close(conn);
    }
  }

  void Handle(int conn) {
    std::string data;
    char buf[16 << 10];
    size_t head_end = std::string::npos;
    size_t body_len = 0;
    Received r;
    // The head, then Content-Length bytes of body.
    while (head_end == std::string::npos || data.size() < head_end + 4 + body_len) {
      if (!WaitReadable(conn)) return;
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) return;
      data.append(buf, static_cast<size_t>(n));
      if (head_end == std::string::npos &&
          (head_end = data.find("\r\n\r\n")) != std::string::npos) {
        std::vector<std::string> lines = absl::StrSplit(data.substr(0, head_end), "\r\n");
        std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
        if (first.size() != 3) return;
        r.method = first[0];
        r.target = first[1];
        for (size_t i = 1; i < lines.size(); ++i) {
          const size_t colon = lines[i].find(':');
          if (colon == std::string::npos) continue;
          r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
              std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
        }
        if (auto it = r.headers.find("content-length"); it != r.headers.end()) {
          if (!absl::SimpleAtoi(it->second, &body_len)) return;
        }
      }
    }
    r.body = data.substr(head_end + 4, body_len);
    Reply reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(r);
      reply = replies_[std::min(received_.size(), replies_.size()) - 1];
    }
    if (reply.hang) {
      // Until the client gives up (EOF) or the server stops.
      while (WaitReadable(conn) && read(conn, buf, sizeof(buf)) > 0) {
      }
      return;
    }
    std::string out =
        absl::StrCat("HTTP/1.1 ", reply.status, " Chosen\r\nContent-Length: ", reply.body.size(),
                     "\r\nConnection: close\r\n\r\n");
    if (r.method != "HEAD") out += reply.body;
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = send(conn, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

  const std::vector<Reply> replies_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Received> received_;  // guarded by mu_
};

Reply Hang() {
  Reply r;
  r.hang = true;
  return r;
}

// A port on 127.0.0.1 where a connection is refused: bound, never listening.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot bind 127.0.0.1";
    }
    port_ = ntohs(addr.sin_port);
  }
  ~RefusingPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// --- Running steps ---

v1::Step Http(const std::string& url, const std::string& method = "") {
  v1::Step step;
  step.mutable_http()->set_url(url);
  step.mutable_http()->set_method(method);
  return step;
}

struct Ran {
  v1::TaskResult result;
  absl::Duration elapsed;  // from Run() to its return
};

// Runs `run` on a thread of its own and `during` on this one meanwhile;
// past `limit` the run is cancelled and the test fails.
Ran RunBounded(TaskRun& run, const std::function<void()>& during = nullptr,
               absl::Duration limit = absl::Seconds(10)) {
  Ran ran;
  std::atomic<bool> done{false};
  const absl::Time start = absl::Now();
  std::thread runner([&] {
    ran.result = run.Run();
    ran.elapsed = absl::Now() - start;
    done = true;
  });
  if (during) during();
  while (!done && absl::Now() - start < limit) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_TRUE(done) << "Run() did not return within " << limit << "; cancelling it";
  run.Cancel();
  runner.join();
  return ran;
}

v1::TaskResult RunTask(v1::Assignment a, ExecutorOptions opts = {}) {
  TaskRun run(std::move(a), std::move(opts));
  EXPECT_FALSE(run.instant()) << "an http step waits: it must not run on the reader";
  return RunBounded(run).result;
}

// Polls `pred` every 2 ms for at most 5 s.
bool WaitFor(const std::function<bool()>& pred) {
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!pred()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// --- Answers ---

TEST(HttpStep, SuccessKeepsTheStatusAndTheBody) {
  TinyHttpServer server({{200, "all good\n"}});
  const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/hook"))}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.exit_code(), 200);
  EXPECT_EQ(r.stdout_tail(), "all good\n");
  EXPECT_EQ(r.stdout_cut_bytes(), 0);
  EXPECT_THAT(r.error(), IsEmpty());
  EXPECT_FALSE(r.permanent());
}

TEST(HttpStep, SendsTheMethodHeadersAndBodyAsked) {
  TinyHttpServer server({{201, ""}});
  v1::Step step = Http(server.Url("/items/7?mode=full"), "PUT");
  (*step.mutable_http()->mutable_headers())["X-Token"] = "abc 123";
  (*step.mutable_http()->mutable_headers())["Content-Type"] = "text/plain";
  (*step.mutable_http()->mutable_headers())["X-Empty"] = "";
  step.mutable_http()->set_body("the body");
  const v1::TaskResult r = RunTask(Assignment({step}, "not the payload"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.exit_code(), 201);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "PUT");
  EXPECT_EQ(got[0].target, "/items/7?mode=full");
  EXPECT_EQ(got[0].headers.at("x-token"), "abc 123");
  EXPECT_EQ(got[0].headers.at("content-type"), "text/plain");
  EXPECT_EQ(got[0].headers.at("x-empty"), "");
  EXPECT_EQ(got[0].headers.count("expect"), 0u);
  EXPECT_EQ(got[0].body, "the body");
}

TEST(HttpStep, DefaultIsAPostOfThePayloadWithNoContentTypeGuessed) {
  TinyHttpServer server({{200, "ok"}});
  const std::string big(100 << 10, 'p');  // large enough for libcurl to think of Expect
  const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/hook"))}, big));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].body, big);
  EXPECT_EQ(got[0].headers.count("content-type"), 0u);
  EXPECT_EQ(got[0].headers.count("expect"), 0u);
  EXPECT_EQ(got[0].headers.at("user-agent"), "taskgrid-agent");
}

TEST(HttpStep, GetAndHeadSendNoBody) {
  TinyHttpServer server({{200, "page"}});
  v1::TaskResult r = RunTask(Assignment({Http(server.Url("/a"), "GET")}, "payload"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "page");
  r = RunTask(Assignment({Http(server.Url("/b"), "HEAD")}, "payload"));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), "");
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].method, "GET");
  EXPECT_EQ(got[1].method, "HEAD");
  for (const Received& g : got) {
    EXPECT_EQ(g.body, "");
    EXPECT_EQ(g.headers.count("content-length"), 0u) << g.method;
  }
}

TEST(HttpStep, A5xxOrA429FailsTheAttemptForARetry) {
  for (int status : {503, 500, 429}) {
    SCOPED_TRACE(status);
    TinyHttpServer server({{status, "busy, come back"}});
    const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/hook"))}));
    EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
    EXPECT_EQ(r.exit_code(), status);
    EXPECT_FALSE(r.permanent());
    EXPECT_EQ(r.error(), absl::StrCat("HTTP ", status, " from POST ", server.Url("/hook")));
    EXPECT_EQ(r.stdout_tail(), "busy, come back");
  }
}

TEST(HttpStep, A404FailsForGood) {
  TinyHttpServer server({{404, "no such hook"}});
  const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/nope"), "DELETE")}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 404);
  EXPECT_TRUE(r.permanent());
  EXPECT_EQ(r.error(), absl::StrCat("HTTP 404 from DELETE ", server.Url("/nope")));
  ASSERT_EQ(server.received().size(), 1u);
  EXPECT_EQ(server.received()[0].method, "DELETE");
}

TEST(HttpStep, ARedirectIsNotFollowed) {
  TinyHttpServer server({{302, ""}});
  const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/moved"))}));
  EXPECT_EQ(r.exit_code(), 302);
  EXPECT_TRUE(r.permanent());
  EXPECT_EQ(server.received().size(), 1u);
}

TEST(HttpStep, SuccessCodesReplaceThe2xxRange) {
  TinyHttpServer server({{404, ""}, {200, ""}});
  v1::Step step = Http(server.Url("/gone"));
  step.mutable_http()->add_success_codes(404);
  step.mutable_http()->add_success_codes(410);
  v1::TaskResult r = RunTask(Assignment({step}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.exit_code(), 404);
  r = RunTask(Assignment({step}));  // now a 200, which the list leaves out
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), 200);
  EXPECT_TRUE(r.permanent());
}

TEST(HttpStep, AStepAfterOthersReportsItsIndexAndTheOutputAddsUp) {
  TinyHttpServer server({{500, "server says no"}});
  v1::Step echo;
  echo.mutable_builtin()->set_name("echo");
  echo.mutable_builtin()->add_args("before");
  const v1::TaskResult r = RunTask(Assignment({echo, Http(server.Url("/hook"))}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.exit_code(), 500);
  EXPECT_EQ(r.stdout_tail(), "before\nserver says no");
}

// --- No answer ---

TEST(HttpStep, ARefusedConnectionIsAFailureWithoutStatus) {
  RefusingPort port;
  const std::string url = absl::StrCat("http://127.0.0.1:", port.port(), "/hook");
  const v1::TaskResult r = RunTask(Assignment({Http(url)}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_FALSE(r.permanent());
  EXPECT_THAT(r.error(), HasSubstr("POST " + url + ": "));
  EXPECT_THAT(r.error(), HasSubstr("onnect"));  // libcurl's "Couldn't connect to server"
}

TEST(HttpStep, AServerThatNeverAnswersTimesOutAtTheStepTimeout) {
  TinyHttpServer server(std::vector<Reply>{Hang()});
  v1::Step step = Http(server.Url("/slow"));
  *step.mutable_timeout() = ToProto(absl::Milliseconds(300));
  TaskRun run(Assignment({step}), {});
  const Ran ran = RunBounded(run);
  EXPECT_EQ(ran.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_EQ(ran.result.exit_code(), -1);
  EXPECT_FALSE(ran.result.permanent());
  EXPECT_EQ(ran.result.error(), "step 0 timed out after 300ms (step timeout)");
  EXPECT_GE(ran.elapsed, absl::Milliseconds(300));
  EXPECT_LT(ran.elapsed, absl::Seconds(2));
  EXPECT_EQ(server.received().size(), 1u);
}

TEST(HttpStep, TheAttemptTimeoutBoundsTheRequestToo) {
  TinyHttpServer server(std::vector<Reply>{Hang()});
  v1::Assignment a = Assignment({Http(server.Url("/slow"))});
  *a.mutable_attempt_timeout() = ToProto(absl::Milliseconds(300));
  TaskRun run(std::move(a), {});
  const Ran ran = RunBounded(run);
  EXPECT_EQ(ran.result.outcome(), v1::OUTCOME_TIMED_OUT);
  EXPECT_THAT(ran.result.error(), HasSubstr("(attempt timeout)"));
  EXPECT_LT(ran.elapsed, absl::Seconds(2));
}

TEST(HttpStep, CancelStopsAHangingRequestAtOnce) {
  TinyHttpServer server(std::vector<Reply>{Hang()});
  TaskRun run(Assignment({Http(server.Url("/slow"))}), {});
  absl::Time cancelled_at;
  const Ran ran = RunBounded(run, [&] {
    ASSERT_TRUE(WaitFor([&] { return server.received().size() == 1; }));
    cancelled_at = absl::Now();
    run.Cancel();
  });
  const absl::Duration after_cancel = (absl::Now() - cancelled_at);
  EXPECT_EQ(ran.result.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_EQ(ran.result.exit_code(), -1);
  EXPECT_EQ(ran.result.error(), "cancelled");
  // The eventfd wakes the request's wait: nothing polls on a period.
  EXPECT_LT(after_cancel, absl::Milliseconds(100)) << after_cancel;
}

TEST(HttpStep, CancelBeforeRunSendsNothing) {
  TinyHttpServer server({{200, ""}});
  TaskRun run(Assignment({Http(server.Url("/hook"))}), {});
  run.Cancel();
  const Ran ran = RunBounded(run);
  EXPECT_EQ(ran.result.outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_THAT(server.received(), IsEmpty());
}

// --- Bodies and bounds ---

TEST(HttpStep, MergedPayloadsAreSentAsAJsonArray) {
  TinyHttpServer server({{200, ""}});
  v1::Assignment a = Assignment({Http(server.Url("/batch"))}, "{\"id\": 1}");
  a.add_merged_payloads("{\"id\": 1}");
  a.add_merged_payloads("plain \"text\"\n");
  a.add_merged_payloads("[2, 3]");
  a.add_merged_payloads("{'not': json}");
  const v1::TaskResult r = RunTask(std::move(a));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body, "[{\"id\": 1},\"plain \\\"text\\\"\\n\",[2, 3],\"{'not': json}\"]");
  EXPECT_EQ(got[0].headers.at("content-type"), "application/json");
}

TEST(HttpStep, AStepBodyWinsOverMergedPayloads) {
  TinyHttpServer server({{200, ""}});
  v1::Step step = Http(server.Url("/batch"));
  step.mutable_http()->set_body("");  // set, though empty
  v1::Assignment a = Assignment({step}, "p1");
  a.add_merged_payloads("p1");
  a.add_merged_payloads("p2");
  EXPECT_EQ(RunTask(std::move(a)).outcome(), v1::OUTCOME_SUCCEEDED);
  ASSERT_EQ(server.received().size(), 1u);
  EXPECT_EQ(server.received()[0].body, "");
  EXPECT_EQ(server.received()[0].headers.at("content-length"), "0");
}

TEST(HttpStep, ALargeResponseKeepsItsTailAndCountsWhatWasCut) {
  std::string body;
  for (int i = 0; body.size() < 300'000; ++i) absl::StrAppend(&body, i, ",");
  TinyHttpServer server({{200, body}});
  ExecutorOptions opts;
  opts.max_output_bytes = 1000;
  const v1::TaskResult r = RunTask(Assignment({Http(server.Url("/big"), "GET")}), opts);
  EXPECT_EQ(r.outcome(), v1::OUTCOME_SUCCEEDED) << r.error();
  EXPECT_EQ(r.stdout_tail(), body.substr(body.size() - 1000));
  EXPECT_EQ(r.stdout_cut_bytes(), static_cast<int64_t>(body.size()) - 1000);
}

// --- Steps the scheduler should have refused ---

TEST(HttpStep, AMalformedStepFailsForGoodWithoutARequest) {
  TinyHttpServer server({{200, ""}});
  v1::Step step = Http(server.Url("/hook"));
  (*step.mutable_http()->mutable_headers())["X-Evil"] = "a\r\nX-Injected: 1";
  v1::TaskResult r = RunTask(Assignment({step}));
  EXPECT_EQ(r.outcome(), v1::OUTCOME_FAILED);
  EXPECT_EQ(r.exit_code(), -1);
  EXPECT_TRUE(r.permanent());
  EXPECT_EQ(r.error(), "step 0: http.headers[X-Evil] holds a NUL, CR or LF");

  r = RunTask(Assignment({Http("ftp://127.0.0.1/file")}));
  EXPECT_TRUE(r.permanent());
  EXPECT_THAT(r.error(), HasSubstr("step 0: http.url"));
  r = RunTask(Assignment({Http(server.Url("/hook"), "TRACE")}));
  EXPECT_TRUE(r.permanent());
  EXPECT_THAT(r.error(), HasSubstr("step 0: http.method \"TRACE\" is not one of"));
  EXPECT_THAT(server.received(), IsEmpty());
}

}  // namespace
}  // namespace taskgrid::agent::http_step_test
