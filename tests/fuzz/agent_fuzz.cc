// Fuzz target: an agent's stream as the scheduler sees it. The input is a
// sequence of AgentMessages; the first is the Hello when it holds one
// (else a well-formed Hello is used, so the fuzzer spends its time on what
// follows). Four tasks wait (two of them a chain), so Accepts, Results,
// Rejects, Releases and live output for real attempts are one mutation
// away. Each
// message goes through the same checks as on the wire, then to the core;
// after every message and every tick, every invariant must hold. The
// stream then ends and the agent's grace runs out: nothing may stay held.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/message_limits.h"
#include "scheduler/core/validate.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace taskgrid::fuzz {

const google::protobuf::Message* InputPrototype() {
  static const v1::AgentBatch kPrototype;
  return &kPrototype;
}

namespace {

v1::TaskSpec Noop(const std::string& id) {
  v1::TaskSpec spec;
  spec.set_id(id);
  spec.add_steps()->mutable_builtin()->set_name("noop");
  spec.set_max_attempts(2);
  return spec;
}

v1::Hello DefaultHello() {
  v1::Hello h;
  h.set_agent_id("a1");
  h.set_slots(4);
  h.set_chains(true);
  h.set_batches(true);
  h.set_adaptive_heartbeat(true);
  h.set_live_output(true);
  return h;
}

void Run(const v1::AgentBatch& input) {
  FakeClock clock;
  core::Scheduler s(&clock, core::SchedulerOptions{});
  std::vector<v1::TaskSpec> specs = {Noop("t0"), Noop("t1"), Noop("t2"), Noop("t3")};
  specs[1].add_depends_on("t0");
  if (!s.SubmitJob("j", specs).ok()) Die("the fixed job was refused");
  (void)s.TakeEffects();

  int next = 0;
  v1::Hello hello = DefaultHello();
  if (input.msgs_size() > 0 && input.msgs(0).has_hello()) hello = input.msgs(next++).hello();
  const uint64_t conn = 1;
  if (!s.Connect(conn, hello).ok()) {
    if (!s.Agents().empty() || !s.TakeEffects().batch.empty()) {
      Die("a refused hello changed something");
    }
    return;
  }
  CheckOrDie(s, "after hello");
  (void)s.TakeEffects();

  for (; next < input.msgs_size(); ++next) {
    const v1::AgentMessage& msg = input.msgs(next);
    // What the stream does: a second Hello or a malformed batch ends it.
    if (msg.has_hello() || !core::ValidateAgentMessage(msg).ok()) break;
    std::vector<v1::TaskOutput> output;
    s.OnAgentMessage(conn, msg, &output);
    CheckOrDie(s, "after an agent message");
    // Live output passes only for an attempt that was live, and bounded.
    for (const v1::TaskOutput& o : output) {
      const core::TaskRecord* t = s.Find(o.task_id());
      if (t == nullptr || o.attempt() < 1 || o.attempt() > t->attempt) {
        Die("live output of an attempt that was never live passed");
      }
      if (o.data().size() > static_cast<size_t>(kMaxOutputChunkBytes)) {
        Die("live output passed its size bound");
      }
    }
    (void)s.TakeEffects();
    clock.Advance(absl::Milliseconds(300));
    s.Tick();
    CheckOrDie(s, "after a tick");
    (void)s.TakeEffects();
  }

  s.Disconnect(conn);
  CheckOrDie(s, "after the stream ended");
  for (int i = 0; i < 4; ++i) {
    clock.Advance(absl::Minutes(5));
    s.Tick();
    CheckOrDie(s, "after the grace");
    (void)s.TakeEffects();
  }
  core::ListFilter filter;
  for (const core::TaskRecord* t : s.List(filter).tasks) {
    if (t->state == v1::TASK_STATE_DISPATCHED || t->state == v1::TASK_STATE_RUNNING) {
      Die("a task is still held by an agent long gone");
    }
  }
}

}  // namespace
}  // namespace taskgrid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  taskgrid::v1::AgentBatch input;
  if (size > (1 << 20) || !input.ParseFromArray(data, static_cast<int>(size))) return -1;
  taskgrid::fuzz::Run(input);
  return 0;
}
