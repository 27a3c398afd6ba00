#include "scheduler/core/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/ids.h"

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;

v1::TaskSpec Good() {
  v1::TaskSpec s;
  s.set_id("job-1.part_2:x");
  s.add_steps()->mutable_exec()->add_argv("/bin/true");
  return s;
}

std::string Error(const v1::TaskSpec& s, SchedulerOptions o = {}) {
  absl::Status st = ValidateSpec(s, o, "tasks[0]");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  return std::string(st.message());
}

TEST(Validate, AcceptsAGoodSpecAndAnEmptyId) {
  EXPECT_TRUE(ValidateSpec(Good(), {}, "t").ok());
  v1::TaskSpec s = Good();
  s.clear_id();
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
}

TEST(Validate, TheWholeSpecIsBoundedApartFromPayloadAndDependencies) {
  SchedulerOptions o;
  o.max_spec_bytes = 1024;
  // Each part that can grow without a limit of its own, past the bound.
  std::vector<std::pair<std::string, std::function<void(v1::TaskSpec&)>>> cases = {
      {"argv",
       [](v1::TaskSpec& s) {
         s.mutable_steps(0)->mutable_exec()->add_argv(std::string(2000, 'a'));
       }},
      {"many argv",
       [](v1::TaskSpec& s) {
         for (int i = 0; i < 600; ++i) s.mutable_steps(0)->mutable_exec()->add_argv("ab");
       }},
      {"env",
       [](v1::TaskSpec& s) {
         (*s.mutable_steps(0)->mutable_exec()->mutable_env())["V"] = std::string(2000, 'v');
       }},
      {"cwd",
       [](v1::TaskSpec& s) {
         s.mutable_steps(0)->mutable_exec()->set_cwd(std::string(2000, 'c'));
       }},
      {"echo args",
       [](v1::TaskSpec& s) {
         s.mutable_steps(0)->mutable_builtin()->set_name("echo");
         s.mutable_steps(0)->mutable_builtin()->add_args(std::string(2000, 'e'));
       }},
      {"labels",
       [](v1::TaskSpec& s) {
         for (int i = 0; i < 200; ++i)
           (*s.mutable_placement()->mutable_required_labels())["k" + std::to_string(i)] = "v";
       }},
      {"agent_ids",
       [](v1::TaskSpec& s) {
         for (int i = 0; i < 200; ++i)
           s.mutable_placement()->add_agent_ids("agent-" + std::to_string(i));
       }},
      {"exit codes",
       [](v1::TaskSpec& s) {
         for (int i = 0; i < 600; ++i) s.mutable_retry()->add_non_retryable_exit_codes(100 + i);
       }},
  };
  for (const auto& [name, grow] : cases) {
    SCOPED_TRACE(name);
    v1::TaskSpec s = Good();
    grow(s);
    const std::string msg = Error(s, o);
    EXPECT_THAT(msg, HasSubstr("tasks[0] is "));
    EXPECT_THAT(msg, HasSubstr("bytes without its payload and depends_on; the limit is 1024 "
                               "(--max_spec_bytes)"));
  }
  // The payload and depends_on are not counted: they have limits of their own.
  v1::TaskSpec s = Good();
  s.set_payload(std::string(4000, 'p'));
  for (int i = 0; i < 100; ++i) s.add_depends_on("upstream-task-number-" + std::to_string(i));
  EXPECT_TRUE(ValidateSpec(s, o, "tasks[0]").ok());
  // The default leaves room for ordinary specs.
  v1::TaskSpec big = Good();
  big.mutable_steps(0)->mutable_exec()->add_argv(std::string(60 << 10, 'a'));
  EXPECT_TRUE(ValidateSpec(big, {}, "tasks[0]").ok());
  big.mutable_steps(0)->mutable_exec()->add_argv(std::string(8 << 10, 'a'));
  EXPECT_THAT(Error(big), HasSubstr("the limit is 65536"));
}

TEST(Validate, NulBytesCannotReachAProcess) {
  using namespace std::string_literals;
  v1::TaskSpec s = Good();
  s.mutable_steps(0)->mutable_exec()->add_argv("a\0b"s);
  EXPECT_EQ(Error(s),
            "tasks[0].steps[0].exec.argv[1] holds a NUL byte, which a process cannot "
            "receive");
  s = Good();
  (*s.mutable_steps(0)->mutable_exec()->mutable_env())["HOME"] = "/x\0y"s;
  EXPECT_EQ(Error(s),
            "tasks[0].steps[0].exec.env[HOME] holds a NUL byte, which a process "
            "cannot receive");
  s = Good();
  (*s.mutable_steps(0)->mutable_exec()->mutable_env())["A\0B"s] = "v";
  EXPECT_THAT(Error(s), HasSubstr("exec.env has an invalid name \"A\\000B\""));
  s = Good();
  s.mutable_steps(0)->mutable_exec()->set_cwd("/tmp\0/x"s);
  EXPECT_EQ(Error(s),
            "tasks[0].steps[0].exec.cwd holds a NUL byte, which a process cannot "
            "receive");
}

TEST(Validate, IdCharsetAndLength) {
  v1::TaskSpec s = Good();
  s.set_id("has space");
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].id"));
  s.set_id("slash/no");
  EXPECT_THAT(Error(s), HasSubstr("outside [A-Za-z0-9._:-]"));
  s.set_id(std::string(kMaxIdLength + 1, 'a'));
  EXPECT_THAT(Error(s), HasSubstr("the limit is 128"));
  s.set_id(std::string(kMaxIdLength, 'a'));
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
  // Dot names stand for directories: an id (or a queue) never may be one.
  for (const char* dots : {".", ".."}) {
    s = Good();
    s.set_id(dots);
    EXPECT_THAT(Error(s), HasSubstr("tasks[0].id \"" + std::string(dots) + "\" is not a name"));
    s = Good();
    s.set_queue(dots);
    EXPECT_THAT(Error(s), HasSubstr("tasks[0].queue"));
  }
  s.set_queue("...");
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
}

TEST(Validate, ScheduleTimeoutIsADurationLikeTheOthers) {
  v1::TaskSpec s = Good();
  s.mutable_schedule_timeout()->set_seconds(-1);
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].schedule_timeout is negative"));
  s.mutable_schedule_timeout()->set_seconds(20LL * 365 * 24 * 3600);
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].schedule_timeout is longer than 10 years"));
  s.mutable_schedule_timeout()->set_seconds(1);
  s.mutable_schedule_timeout()->set_nanos(-5);
  EXPECT_THAT(Error(s), HasSubstr("schedule_timeout is negative"));
  s.mutable_schedule_timeout()->set_nanos(0);
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
}

TEST(Validate, StepsMustBeThereAndWellFormed) {
  v1::TaskSpec s = Good();
  s.clear_steps();
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].steps is empty"));
  s.add_steps();
  EXPECT_EQ(Error(s), "tasks[0].steps[0] has no exec, builtin or http");
  s.mutable_steps(0)->mutable_builtin()->set_name("explode");
  EXPECT_THAT(Error(s), HasSubstr("steps[0].builtin.name"));
  s.mutable_steps(0)->mutable_builtin()->set_name("sleep");
  s.mutable_steps(0)->mutable_builtin()->add_args("soon");
  EXPECT_THAT(Error(s), HasSubstr("args[0]"));
  s.mutable_steps(0)->mutable_builtin()->set_args(0, "0.5");
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
  s.mutable_steps(0)->mutable_timeout()->set_seconds(-1);
  EXPECT_THAT(Error(s), HasSubstr("steps[0].timeout is negative"));
}

v1::TaskSpec GoodHttp() {
  v1::TaskSpec s = Good();
  v1::HttpStep* h = s.add_steps()->mutable_http();
  h->set_url("https://hooks.example.com/v1/done?task=1");
  return s;
}

v1::HttpStep& Http(v1::TaskSpec& s) { return *s.mutable_steps(1)->mutable_http(); }

TEST(Validate, AcceptsAnHttpStep) {
  v1::TaskSpec s = GoodHttp();
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
  for (const char* method : {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", ""}) {
    Http(s).set_method(method);
    EXPECT_TRUE(ValidateSpec(s, {}, "t").ok()) << method;
  }
  Http(s).set_url("http://127.0.0.1:8080/hook");
  (*Http(s).mutable_headers())["Content-Type"] = "application/json; charset=utf-8";
  (*Http(s).mutable_headers())["X-Weird_But.Legal!~"] = "";
  using namespace std::string_literals;
  Http(s).set_body("binary \0 body"s);  // bytes: anything goes
  for (int code : {100, 200, 404, 599}) Http(s).add_success_codes(code);
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
}

TEST(Validate, HttpStepRefusalsNameTheField) {
  using namespace std::string_literals;
  struct Case {
    std::string name;
    std::function<void(v1::HttpStep&)> spoil;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"no url", [](v1::HttpStep& h) { h.clear_url(); },
       "tasks[0].steps[1].http.url is empty: the step needs a URL"},
      {"other scheme", [](v1::HttpStep& h) { h.set_url("ftp://host/file"); },
       "tasks[0].steps[1].http.url \"ftp://host/file\" must start with http:// or https://"},
      {"no scheme", [](v1::HttpStep& h) { h.set_url("host/path"); },
       "tasks[0].steps[1].http.url \"host/path\" must start with http:// or https://"},
      {"no host", [](v1::HttpStep& h) { h.set_url("https:///path"); },
       "tasks[0].steps[1].http.url has no host"},
      {"space", [](v1::HttpStep& h) { h.set_url("http://host/a b"); },
       "tasks[0].steps[1].http.url holds a NUL, CR, LF or space (percent-encode it)"},
      {"CR LF", [](v1::HttpStep& h) { h.set_url("http://host/\r\nX-Evil: 1"); },
       "tasks[0].steps[1].http.url holds a NUL, CR, LF or space (percent-encode it)"},
      {"NUL", [](v1::HttpStep& h) { h.set_url("http://host/\0x"s); },
       "tasks[0].steps[1].http.url holds a NUL, CR, LF or space (percent-encode it)"},
      {"method", [](v1::HttpStep& h) { h.set_method("get"); },
       "tasks[0].steps[1].http.method \"get\" is not one of GET, HEAD, POST, PUT, PATCH, "
       "DELETE (empty means POST)"},
      {"header name", [](v1::HttpStep& h) { (*h.mutable_headers())["Bad Name"] = "v"; },
       "tasks[0].steps[1].http.headers has an invalid name \"Bad Name\" (a header name is "
       "letters, digits and !#$%&'*+-.^_`|~)"},
      {"header name CR LF", [](v1::HttpStep& h) { (*h.mutable_headers())["X\r\nY"] = "v"; },
       "tasks[0].steps[1].http.headers has an invalid name \"X\\r\\nY\" (a header name is "
       "letters, digits and !#$%&'*+-.^_`|~)"},
      {"empty header name", [](v1::HttpStep& h) { (*h.mutable_headers())[""] = "v"; },
       "tasks[0].steps[1].http.headers has an invalid name \"\" (a header name is letters, "
       "digits and !#$%&'*+-.^_`|~)"},
      {"header value LF",
       [](v1::HttpStep& h) { (*h.mutable_headers())["X-Key"] = "a\nX-Injected: 1"; },
       "tasks[0].steps[1].http.headers[X-Key] holds a NUL, CR or LF"},
      {"header value CR", [](v1::HttpStep& h) { (*h.mutable_headers())["X-Key"] = "a\rb"; },
       "tasks[0].steps[1].http.headers[X-Key] holds a NUL, CR or LF"},
      {"header value NUL", [](v1::HttpStep& h) { (*h.mutable_headers())["X-Key"] = "a\0b"s; },
       "tasks[0].steps[1].http.headers[X-Key] holds a NUL, CR or LF"},
      {"65 headers",
       [](v1::HttpStep& h) {
         for (int i = 0; i < 65; ++i) (*h.mutable_headers())["X-" + std::to_string(i)] = "v";
       },
       "tasks[0].steps[1].http.headers has 65 entries; the limit is 64"},
      {"code 99", [](v1::HttpStep& h) { h.add_success_codes(200), h.add_success_codes(99); },
       "tasks[0].steps[1].http.success_codes[1] is 99; a status is in [100, 599]"},
      {"code 600", [](v1::HttpStep& h) { h.add_success_codes(600); },
       "tasks[0].steps[1].http.success_codes[0] is 600; a status is in [100, 599]"},
      {"65 codes",
       [](v1::HttpStep& h) {
         for (int i = 0; i < 65; ++i) h.add_success_codes(200 + i);
       },
       "tasks[0].steps[1].http.success_codes has 65 entries; the limit is 64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::TaskSpec s = GoodHttp();
    c.spoil(Http(s));
    EXPECT_EQ(Error(s), c.error);
  }
  // The limits themselves are allowed.
  v1::TaskSpec s = GoodHttp();
  for (int i = 0; i < 64; ++i) {
    (*Http(s).mutable_headers())["X-" + std::to_string(i)] = "v";
    Http(s).add_success_codes(200 + i);
  }
  EXPECT_TRUE(ValidateSpec(s, {}, "t").ok());
}

TEST(Validate, AnHttpStepCountsTowardsTheSpecBytes) {
  SchedulerOptions o;
  o.max_spec_bytes = 1024;
  v1::TaskSpec s = GoodHttp();
  Http(s).set_body(std::string(2000, 'b'));
  EXPECT_THAT(Error(s, o),
              HasSubstr("bytes without its payload and depends_on; the limit is 1024"));
  s = GoodHttp();
  (*Http(s).mutable_headers())["Authorization"] = std::string(2000, 't');
  EXPECT_THAT(Error(s, o), HasSubstr("the limit is 1024"));
}

TEST(Validate, PayloadLimit) {
  SchedulerOptions o;
  o.max_payload_bytes = 10;
  v1::TaskSpec s = Good();
  s.set_payload(std::string(11, 'x'));
  EXPECT_THAT(Error(s, o), HasSubstr("tasks[0].payload is 11 bytes; the limit is 10"));
  s.set_payload(std::string(10, 'x'));
  EXPECT_TRUE(ValidateSpec(s, o, "t").ok());
}

TEST(Validate, NumbersInRange) {
  v1::TaskSpec s = Good();
  s.set_max_attempts(-1);
  EXPECT_THAT(Error(s), HasSubstr("max_attempts"));
  s = Good();
  s.mutable_retry()->set_multiplier(0.5);
  EXPECT_THAT(Error(s), HasSubstr("retry.multiplier"));
  s = Good();
  s.mutable_placement()->set_slots(-2);
  EXPECT_THAT(Error(s), HasSubstr("placement.slots"));
  s = Good();
  (*s.mutable_placement()->mutable_required_labels())["bad key"] = "1";
  EXPECT_THAT(Error(s), HasSubstr("required_labels"));
  s = Good();
  s.set_queue("no queue");
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].queue"));
}

TEST(Validate, TaskLabelsAreBoundedNamesWithPrintableValues) {
  v1::TaskSpec s = Good();
  for (int i = 0; i < 16; ++i) (*s.mutable_labels())["k" + std::to_string(i)] = "any value, = too";
  EXPECT_TRUE(ValidateSpec(s, {}, "tasks[0]").ok());
  (*s.mutable_labels())["k16"] = "v";
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].labels has 17 entries; the limit is 16"));
  s = Good();
  (*s.mutable_labels())["team=red"] = "v";
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].labels.key"));
  s = Good();
  (*s.mutable_labels())["note"] = std::string(kMaxLabelValueBytes + 1, 'v');
  EXPECT_THAT(Error(s), HasSubstr("tasks[0].labels[note] is 257 bytes; the limit is 256"));
  // A line break would let a value pass for a second label where they are
  // stored; no control character gets in.
  for (const std::string& bad :
       std::vector<std::string>{"a\nb=c", std::string("a\0b", 3), "tab\there", "del\x7f"}) {
    s = Good();
    (*s.mutable_labels())["note"] = bad;
    EXPECT_THAT(Error(s), HasSubstr("tasks[0].labels[note] holds a control character"));
  }
}

}  // namespace
}  // namespace taskgrid::core

namespace taskgrid::core {
namespace {

TEST(Validate, ABatchHoldsPlainAgentMessagesOnly) {
  v1::AgentMessage plain;
  plain.mutable_heartbeat();
  EXPECT_TRUE(ValidateAgentMessage(plain).ok());

  v1::AgentMessage batch;
  batch.mutable_batch()->add_msgs()->mutable_heartbeat();
  batch.mutable_batch()->add_msgs()->mutable_accept()->set_task_id("t");
  EXPECT_TRUE(ValidateAgentMessage(batch).ok());

  v1::AgentMessage with_hello = batch;
  with_hello.mutable_batch()->add_msgs()->mutable_hello()->set_agent_id("a");
  absl::Status s = ValidateAgentMessage(with_hello);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("batch.msgs[2] is a hello"));

  v1::AgentMessage nested = batch;
  nested.mutable_batch()->add_msgs()->mutable_batch();
  s = ValidateAgentMessage(nested);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("batch.msgs[2] is a batch"));
}

}  // namespace
}  // namespace taskgrid::core
