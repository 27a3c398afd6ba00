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
  EXPECT_THAT(Error(s), HasSubstr("neither exec nor builtin"));
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
