// A Hello is the first thing an agent says, and the scheduler trusts none
// of it: every count and size is bounded, and a refused Hello leaves no
// agent behind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;

class HelloTest : public SchedulerTest {
 protected:
  static SchedulerOptions Capped() {
    SchedulerOptions o = Options();
    o.max_agent_slots = 64;
    return o;
  }
  HelloTest() : SchedulerTest(Capped()) {}

  static v1::Hello Good() {
    v1::Hello h;
    h.set_agent_id("a1");
    h.set_slots(4);
    return h;
  }
  // The Hello is refused with INVALID_ARGUMENT naming `what`, and nothing
  // of the agent is kept.
  void Refused(const v1::Hello& h, const std::string& what) {
    const absl::Status s = sched_.Connect(77, h);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(what));
    EXPECT_EQ(sched_.FindAgent(h.agent_id()), nullptr) << what;
    Check();
  }
};

TEST_F(HelloTest, SlotsOverTheCapAreRefused) {
  v1::Hello h = Good();
  h.set_slots(65);
  Refused(h, "hello.slots is 65; it must be in [1, 64]");
  h.set_slots(0);
  Refused(h, "hello.slots is 0");
  h.set_slots(64);
  EXPECT_TRUE(sched_.Connect(1, h).ok());
}

TEST_F(HelloTest, LabelsAreBoundedInNumberAndSize) {
  v1::Hello h = Good();
  (*h.mutable_labels())["zone"] = std::string(257, 'z');
  Refused(h, "hello.labels[zone] is 257 bytes");
  h = Good();
  for (int i = 0; i < 65; ++i) (*h.mutable_labels())["k" + std::to_string(i)] = "v";
  Refused(h, "hello.labels has 65 entries");
}

TEST_F(HelloTest, VersionAndRunningListAreBounded) {
  v1::Hello h = Good();
  h.set_version(std::string(200, 'v'));
  Refused(h, "hello.version");
  h = Good();
  // At most what an agent can hold: every slot with a full chain.
  for (int i = 0; i < 64 * 100 + 1; ++i) {
    v1::AttemptRef* r = h.add_running();
    r->set_task_id("t" + std::to_string(i));
    r->set_attempt(1);
  }
  Refused(h, "hello.running");
  h = Good();
  h.add_running()->set_task_id("bad id");
  Refused(h, "hello.running[0].task_id");
}

}  // namespace
}  // namespace taskgrid::core
