// The fixture of the Scheduler unit tests: a Scheduler under a FakeClock,
// with helpers that speak for agents. Every helper runs the invariant
// checker after its step.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/resources.h"
#include "scheduler/core/scheduler.h"

namespace taskgrid::core {

class SchedulerTest : public ::testing::Test {
 protected:
  static SchedulerOptions Options() {
    SchedulerOptions o;
    o.queue_max_length["small"] = 2;
    o.default_initial_backoff = absl::Seconds(1);
    o.default_max_backoff = absl::Seconds(8);
    o.default_ack_timeout = absl::Seconds(10);
    o.heartbeat_timeout = absl::Seconds(5);
    o.reconnect_grace = absl::Seconds(5);
    o.random = [] { return 0.0; };  // no jitter unless a test asks for it
    o.max_agent_slots = 10'000;     // one agent stands for a wide fleet
    return o;
  }

  SchedulerTest() : SchedulerTest(Options()) {}
  explicit SchedulerTest(SchedulerOptions o) : sched_(&clock_, std::move(o)) {}

  void Check() { ASSERT_TRUE(sched_.CheckInvariants().ok()) << sched_.CheckInvariants(); }

  static v1::TaskSpec Spec(const std::string& id, int priority = 0) {
    v1::TaskSpec s;
    s.set_id(id);
    s.set_priority(priority);
    v1::ExecStep* e = s.add_steps()->mutable_exec();
    e->add_argv("/bin/echo");
    e->add_argv(id);
    return s;
  }

  // Spec(id) asking for `resources` ("cpu=2,gpu=1").
  static v1::TaskSpec Needs(const std::string& id, const std::string& resources) {
    v1::TaskSpec s = Spec(id);
    absl::StatusOr<Resources> r = ParseResourceList(resources);
    EXPECT_TRUE(r.ok()) << r.status();
    ToResourceMap(*r, s.mutable_placement()->mutable_resources());
    return s;
  }

  absl::StatusOr<std::vector<const TaskRecord*>> Submit(std::vector<v1::TaskSpec> specs) {
    auto r = sched_.Submit(std::move(specs));
    Check();
    return r;
  }

  void SubmitOk(v1::TaskSpec spec) { ASSERT_TRUE(Submit({std::move(spec)}).ok()); }

  Effects Take() {
    Check();
    return sched_.TakeEffects();
  }

  uint64_t Connect(const std::string& agent, int slots,
                   const std::vector<std::pair<std::string, std::string>>& labels = {},
                   const std::vector<std::pair<std::string, int>>& running = {}) {
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(slots);
    for (const auto& [k, v] : labels) (*h.mutable_labels())[k] = v;
    for (const auto& [id, attempt] : running) {
      v1::AttemptRef* r = h.add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
    }
    const uint64_t conn = next_conn_++;
    EXPECT_TRUE(sched_.Connect(conn, h).ok());
    Check();
    return conn;
  }

  // A Hello as given (e.g. with chains or waiting attempts).
  uint64_t ConnectHello(const v1::Hello& h) {
    const uint64_t conn = next_conn_++;
    EXPECT_TRUE(sched_.Connect(conn, h).ok());
    Check();
    return conn;
  }

  // An agent offering `resources` ("cpu=8,gpu=2") beside its slots.
  uint64_t ConnectOffering(const std::string& agent, int slots, const std::string& resources) {
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(slots);
    absl::StatusOr<Resources> r = ParseResourceList(resources);
    EXPECT_TRUE(r.ok()) << r.status();
    ToResourceMap(*r, h.mutable_resources());
    return ConnectHello(h);
  }

  // The agent's record (a test failure when there is none).
  const AgentRecord& Agent(const std::string& id) {
    for (const AgentRecord* a : sched_.Agents()) {
      if (a->id == id) return *a;
    }
    ADD_FAILURE() << "no agent " << id;
    static const AgentRecord kNone;
    return kNone;
  }

  void Accept(uint64_t conn, const std::string& id, int attempt) {
    v1::AgentMessage m;
    m.mutable_accept()->set_task_id(id);
    m.mutable_accept()->set_attempt(attempt);
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  void Result(uint64_t conn, const std::string& id, int attempt, v1::Outcome outcome,
              int exit_code = 0) {
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(outcome);
    m.mutable_result()->mutable_result()->set_exit_code(exit_code);
    m.mutable_result()->mutable_result()->set_stdout_tail(id + "\n");
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  void Heartbeat(uint64_t conn) {
    v1::AgentMessage m;
    m.mutable_heartbeat();
    sched_.OnAgentMessage(conn, m);
    Check();
  }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    sched_.Tick();
    Check();
  }

  // Task ids assigned on `conn` by the effects, in order.
  static std::vector<std::string> Assigned(const Effects& fx, uint64_t conn) {
    std::vector<std::string> ids;
    for (const Outgoing& o : fx.messages) {
      if (o.conn != conn || !o.msg.has_assign()) continue;
      for (const v1::Assignment& a : o.msg.assign().tasks()) ids.push_back(a.task_id());
    }
    return ids;
  }

  static std::vector<v1::ResultAck> Acks(const Effects& fx) {
    std::vector<v1::ResultAck> acks;
    for (const Outgoing& o : fx.messages) {
      if (o.msg.has_result_ack()) acks.push_back(o.msg.result_ack());
    }
    return acks;
  }

  static std::vector<std::string> Cancels(const Effects& fx, uint64_t conn) {
    std::vector<std::string> ids;
    for (const Outgoing& o : fx.messages) {
      if (o.conn == conn && o.msg.has_cancel()) ids.push_back(o.msg.cancel().task_id());
    }
    return ids;
  }

  // A task as the store keeps it: derived fields cleared.
  static TaskRecord Stored(const TaskRecord& t) {
    TaskRecord copy = t;
    copy.deps.clear();
    copy.dependents.clear();
    copy.deps_unsucceeded = copy.deps_unfinished = 0;
    copy.chained_after = copy.chain_next = nullptr;
    copy.job = nullptr;
    copy.class_name = nullptr;
    copy.replicas.clear();
    copy.replica_of = nullptr;
    copy.replica_ended = nullptr;
    return copy;
  }

  // A second scheduler restored from everything sched_ holds, as a restart
  // of the process would read it back (the agents not yet reconnected).
  std::unique_ptr<Scheduler> Restarted(SchedulerOptions o = Options()) {
    ListFilter all;
    all.page_size = static_cast<int>(sched_.task_count()) + 1;
    std::vector<TaskRecord> records;
    for (const TaskRecord* t : sched_.List(all).tasks) records.push_back(Stored(*t));
    auto restored = std::make_unique<Scheduler>(&clock_, std::move(o));
    EXPECT_TRUE(restored->Restore(std::move(records), sched_.last_revision()).ok());
    EXPECT_TRUE(restored->CheckInvariants().ok()) << restored->CheckInvariants();
    return restored;
  }

  v1::TaskState State(const std::string& id) {
    const TaskRecord* t = sched_.Find(id);
    return t == nullptr ? v1::TASK_STATE_UNSPECIFIED : t->state;
  }
  const TaskRecord& Task(const std::string& id) { return *sched_.Find(id); }
  // The API view of a task.
  v1::Task Describe(const std::string& id) {
    v1::Task view;
    sched_.Describe(*sched_.Find(id), &view);
    return view;
  }

  FakeClock clock_;
  Scheduler sched_;
  uint64_t next_conn_ = 1;
};

}  // namespace taskgrid::core
