#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/builtins.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/json.h"
#include "common/key_values.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/refusal_log.h"
#include "common/secret_file.h"
#include "common/worker_pool.h"

namespace taskgrid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(SchedulerAddresses, ParsesAListAndRefusesEmptyEntries) {
  auto a = SchedulerAddresses::Parse("a:1, b:2,c:3");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->all(), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  EXPECT_EQ(a->current(), "a:1");
  EXPECT_EQ(a->text(), "a:1,b:2,c:3");
  for (const char* bad : {"", "a:1,", ",a:1", "a:1,,b:2", " "}) {
    auto b = SchedulerAddresses::Parse(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SchedulerAddresses, GoesToTheLeaderAStandbyNamesElseTheNextThatAnswered) {
  SchedulerAddresses a = *SchedulerAddresses::Parse("a:1,b:2,c:3");
  a.Failed("");  // a:1 did not answer
  EXPECT_EQ(a.current(), "b:2");
  a.Failed("c:3");  // b:2 is a standby naming c:3
  EXPECT_EQ(a.current(), "c:3");
  a.Failed("");  // c:3 is gone too: a:1 is silent, b:2 is not
  EXPECT_EQ(a.current(), "b:2");
  a.Failed("d:4");  // a leader not in the list is added
  EXPECT_EQ(a.current(), "d:4");
  EXPECT_EQ(a.size(), 4u);
}

TEST(SchedulerAddresses, ASilentLeaderIsNotGoneBackToAtOnceButIsLater) {
  SchedulerAddresses a = *SchedulerAddresses::Parse("a:1,b:2");
  a.Failed("");  // the leader a:1 was killed
  EXPECT_EQ(a.current(), "b:2");
  a.Failed("a:1");  // the standby still names it: ask the standby again
  EXPECT_EQ(a.current(), "b:2");
  a.Failed("a:1");  // and again: now a:1 is tried once more
  EXPECT_EQ(a.current(), "a:1");
  a.Failed("");
  EXPECT_EQ(a.current(), "b:2");
  a.Answered();  // b:2 leads now
  EXPECT_EQ(a.current(), "b:2");
}

TEST(SchedulerAddresses, WhenAllAreSilentEachIsTriedInTurnAgain) {
  SchedulerAddresses a = *SchedulerAddresses::Parse("a:1,b:2,c:3");
  a.Failed("");
  a.Failed("");
  EXPECT_EQ(a.current(), "c:3");
  a.Failed("");  // all silent: the marks go, the turn goes on
  EXPECT_EQ(a.current(), "a:1");
  a.Failed("");
  EXPECT_EQ(a.current(), "b:2");
  SchedulerAddresses one = *SchedulerAddresses::Parse("a:1");
  one.Failed("");
  EXPECT_EQ(one.current(), "a:1");
}

TEST(Address, AdvertisesTheListenHostOrThisHostsNameForEveryInterface) {
  EXPECT_EQ(AdvertisedAddress("127.0.0.1:0", 4321), "127.0.0.1:4321");
  EXPECT_EQ(AdvertisedAddress("db1.example.com:7070", 7070), "db1.example.com:7070");
  EXPECT_EQ(AdvertisedAddress("[::1]:0", 9), "[::1]:9");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(AdvertisedAddress("0.0.0.0:7070", 7070), absl::StrCat(host, ":7070"));
  EXPECT_EQ(AdvertisedAddress("[::]:0", 12), absl::StrCat(host, ":12"));
  EXPECT_EQ(AdvertisedAddress(":7070", 7070), absl::StrCat(host, ":7070"));
}

TEST(Address, OnlyLoopbackAndUnixSocketsCountAsLocal) {
  for (const char* local : {"127.0.0.1:7070", "127.3.4.5:0", "localhost:7070", "LOCALHOST:1",
                            "[::1]:7070", "unix:/run/taskgrid.sock", "unix-abstract:tg"}) {
    EXPECT_TRUE(IsLoopbackAddress(local)) << local;
  }
  for (const char* open :
       {"0.0.0.0:7070", "[::]:7070", ":7070", "10.0.0.5:7070", "head.example.com:7070",
        "[::ffff:10.0.0.1]:1", "[::1:7070", "128.0.0.1:7070", ""}) {
    EXPECT_FALSE(IsLoopbackAddress(open)) << open;
  }
}

TEST(KeyValues, ParsesListsAndPairs) {
  EXPECT_THAT(ParseList(" a, b,,c "), ElementsAre("a", "b", "c"));
  auto kv = ParseKeyValues("labels", "gpu=1, zone=a,empty=,eq=a=b");
  ASSERT_TRUE(kv.ok());
  EXPECT_THAT(
      *kv, ElementsAre(Pair("empty", ""), Pair("eq", "a=b"), Pair("gpu", "1"), Pair("zone", "a")));
  EXPECT_TRUE(ParseKeyValues("labels", "")->empty());
}

TEST(KeyValues, NamesTheFlagOnBadInput) {
  for (const char* bad : {"novalue", "=v", "a=1,oops"}) {
    auto kv = ParseKeyValues("labels", bad);
    ASSERT_FALSE(kv.ok()) << bad;
    EXPECT_THAT(std::string(kv.status().message()), HasSubstr("--labels"));
  }
}

TEST(Names, CharsetAndLength) {
  EXPECT_TRUE(IsValidName("a-b_c.d:9", 128));
  EXPECT_FALSE(IsValidName("", 128));
  EXPECT_FALSE(IsValidName("a b", 128));
  EXPECT_FALSE(IsValidName("abc", 2));
  EXPECT_THAT(std::string(CheckName("x.id", "bad/id", 128).message()), HasSubstr("x.id"));
}

TEST(ProtoTime, RoundTripsAndKeepsUnsetUnset) {
  const absl::Time t = absl::FromUnixMicros(1'700'000'000'123'456);
  EXPECT_EQ(FromProto(ToProto(t)), t);
  EXPECT_EQ(FromProto(google::protobuf::Timestamp()), absl::InfinitePast());
  EXPECT_EQ(ToProto(absl::InfinitePast()).seconds(), 0);
  EXPECT_EQ(FromUnixMicrosOrZero(ToUnixMicrosOrZero(t)), t);
  EXPECT_EQ(ToUnixMicrosOrZero(absl::InfinitePast()), 0);
  const absl::Duration d = absl::Milliseconds(2500);
  EXPECT_EQ(FromProto(ToProto(d)), d);
  EXPECT_EQ(ToProto(d).seconds(), 2);
  EXPECT_EQ(ToProto(d).nanos(), 500'000'000);
}

// Waits, without sleeping, for a count to reach a value.
class Counter {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
    cv_.notify_all();
  }
  void WaitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return n_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

TEST(WorkerPool, ClosuresRunOneAfterAnotherReuseTheirThread) {
  WorkerPool pool;
  Counter done;
  for (int i = 1; i <= 200; ++i) {
    pool.Run([&] { done.Add(); });
    done.WaitFor(i);
  }
  // A thread per closure would make 200. Usually one does it all; a Run
  // that comes between a closure's end and its thread's return to the pool
  // starts another, so only "far fewer" is certain.
  EXPECT_LE(pool.threads(), 50);
}

TEST(WorkerPool, ClosuresThatRunAtOnceEachGetAThread) {
  std::atomic<int> ran{0};
  Counter started;
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  {
    WorkerPool pool;
    for (int i = 0; i < 8; ++i) {
      pool.Run([&] {
        started.Add();
        std::unique_lock<std::mutex> lock(gate_mu);
        gate_cv.wait(lock, [&] { return open; });
        ++ran;
      });
    }
    started.WaitFor(8);  // all eight are blocked at the gate at once
    EXPECT_EQ(pool.threads(), 8);
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      open = true;
    }
    gate_cv.notify_all();
    // Queued behind the gate, run by the destructor's drain at the latest.
    pool.Run([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 9);
}

TEST(Json, StringsAreAlwaysValidJson) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("a \"q\" \\ /"), "\"a \\\"q\\\" \\\\ /\"");
  EXPECT_EQ(JsonString("l1\nl2\r\t\x01\x1f"), "\"l1\\nl2\\r\\t\\u0001\\u001f\"");
  using namespace std::string_literals;
  EXPECT_EQ(JsonString("nul\0"s), "\"nul\\u0000\"");
  // UTF-8 passes as is; bytes that are not UTF-8 become U+FFFD one by one.
  EXPECT_EQ(JsonString("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
  EXPECT_EQ(JsonString("\xFF\xC3"), "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");
  EXPECT_EQ(JsonString("\xC0\xAF"), "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");  // overlong "/"
  EXPECT_EQ(JsonString("\xED\xA0\x80"),                               // a surrogate
            "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
  for (const std::string& s : {"x"s, "\xFF"s, "\"\\"s, "\0\x7f"s}) {
    EXPECT_TRUE(IsJsonValue(JsonString(s))) << s;
  }
}

TEST(Json, OnlyOneStrictValueIsJson) {
  for (const char* good :
       {"0", "-0", "12.5e-3", "1E+9", "true", "false", "null", "\"\"", "\"\\u00e9\\n\\/\"", "[]",
        "{}", " [1, \"a\", {\"k\": [null]}] \n", "{\"a\":{\"b\":{}}}", "\"caf\xC3\xA9\""}) {
    EXPECT_TRUE(IsJsonValue(good)) << good;
  }
  for (const char* bad : {"",
                          " ",
                          "01",
                          "1.",
                          ".5",
                          "+1",
                          "1e",
                          "-",
                          "NaN",
                          "Infinity",
                          "tru",
                          "True",
                          "nul",
                          "'a'",
                          "{a: 1}",
                          "{\"a\" 1}",
                          "[1,]",
                          "[1 2]",
                          "{\"a\":1,}",
                          "[1]]",
                          "1 2",
                          "\"unterminated",
                          "\"tab\there\"",
                          "\"\\x\"",
                          "\"\\u12\"",
                          "[1] // c",
                          "\"\xFF\"",
                          "hello"}) {
    EXPECT_FALSE(IsJsonValue(bad)) << bad;
  }
  // Nesting is bounded: the check recurses.
  const std::string deep_ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(IsJsonValue(deep_ok));
  const std::string too_deep =
      std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  EXPECT_FALSE(IsJsonValue(too_deep));
  EXPECT_FALSE(IsJsonValue(std::string(100000, '[')));
}

}  // namespace
}  // namespace taskgrid

namespace taskgrid {
namespace {

// Refusals a client can cause at will: each counted, at most one line a
// second logged, and that line says how many were left out.
TEST(RefusalLog, CountsEveryRefusalAndLogsAtMostOneLineASecond) {
  FakeClock clock;
  RefusalLog log(&clock);
  EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused a"), "refused a");
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused b"), "") << i;
  }
  clock.Advance(absl::Milliseconds(999));
  EXPECT_EQ(log.Refused(absl::StatusCode::kPermissionDenied, "refused c"), "");
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(log.Refused(absl::StatusCode::kPermissionDenied, "refused d"),
            "refused d (and 1001 more refusals not logged since the last line)");
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused e"), "refused e");
  EXPECT_EQ(log.Counts(),
            (std::map<std::string, int64_t>{{"PERMISSION_DENIED", 2}, {"UNAUTHENTICATED", 1002}}));
}

// A client retrying the same refused call (an agent with a bad token)
// adds one line a minute, however often it retries; another line still
// gets through at once.
TEST(RefusalLog, TheSameLineIsWrittenOnceAMinute) {
  FakeClock clock;
  RefusalLog log(&clock);
  EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused w1"), "refused w1");
  for (int i = 0; i < 20; ++i) {
    clock.Advance(absl::Seconds(2));
    EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused w1"), "") << i;
  }
  EXPECT_EQ(log.Refused(absl::StatusCode::kPermissionDenied, "refused w2"),
            "refused w2 (and 20 more refusals not logged since the last line)");
  clock.Advance(absl::Seconds(20));
  EXPECT_EQ(log.Refused(absl::StatusCode::kUnauthenticated, "refused w1"), "refused w1");
  EXPECT_EQ(log.Counts(),
            (std::map<std::string, int64_t>{{"PERMISSION_DENIED", 1}, {"UNAUTHENTICATED", 22}}));
}

// Token files: the scheduler's --tokens_file and the clients' --token_file
// get the same warning when other users may read them.
TEST(SecretFile, WarnsWhenOthersMayRead) {
  const std::string path = absl::StrCat(::testing::TempDir(), "taskgrid-secret-", getpid());
  std::ofstream(path) << "secret-0123456789\n";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(OthersMayReadWarning(path, "--token_file"), "");
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  EXPECT_EQ(OthersMayReadWarning(path, "--token_file"),
            "--token_file " + path + " can be read by other users (mode 640): chmod 600 it");
  ASSERT_EQ(chmod(path.c_str(), 0604), 0);
  EXPECT_NE(OthersMayReadWarning(path, "--tokens_file"), "");
  ASSERT_EQ(unlink(path.c_str()), 0);
  EXPECT_EQ(OthersMayReadWarning(path, "--token_file"), "") << "reading it says what is wrong";
}

TEST(Logging, ControlBytesFromTheNetworkAreEscaped) {
  EXPECT_EQ(EscapeControlBytes("plain /path ok"), "plain /path ok");
  EXPECT_EQ(EscapeControlBytes("a\x1b[31mred\nforged line\r\t\x7f"),
            "a\\x1b[31mred\\x0aforged line\\x0d\\x09\\x7f");
  EXPECT_EQ(EscapeControlBytes(std::string("nul\0byte", 8)), "nul\\x00byte");
}

}  // namespace
}  // namespace taskgrid

namespace taskgrid::builtins {
namespace {

TEST(Builtins, NamesAndArgumentRules) {
  EXPECT_TRUE(IsKnown("echo"));
  EXPECT_FALSE(IsKnown("rm"));
  EXPECT_EQ(Names(), "noop, sleep, fail, echo");
  EXPECT_EQ(Usages(), "noop, sleep SECONDS, fail [CODE], echo [WORDS...]");
  struct Case {
    const char* name;
    std::vector<std::string> args;
    int bad_index;  // -2: fine
  };
  const Case cases[] = {
      {"noop", {}, -2},       {"noop", {"x"}, -1},       {"sleep", {}, -2},
      {"sleep", {"0.5"}, -2}, {"sleep", {"604800"}, -2}, {"sleep", {"604801"}, 0},
      {"sleep", {"-1"}, 0},   {"sleep", {"nan"}, 0},     {"sleep", {"1", "2"}, -1},
      {"fail", {}, -2},       {"fail", {"255"}, -2},     {"fail", {"0"}, 0},
      {"fail", {"x"}, 0},     {"fail", {"1", "2"}, -1},  {"echo", {"a", "b", "c"}, -2},
  };
  for (const Case& c : cases) {
    const std::optional<ArgProblem> bad = CheckArgs(c.name, c.args);
    SCOPED_TRACE(std::string(c.name) + " " + (c.args.empty() ? "" : c.args[0]));
    if (c.bad_index == -2) {
      EXPECT_FALSE(bad.has_value()) << bad->rule;
    } else {
      ASSERT_TRUE(bad.has_value());
      EXPECT_EQ(bad->index, c.bad_index);
      EXPECT_FALSE(bad->rule.empty());
    }
  }
}

}  // namespace
}  // namespace taskgrid::builtins
