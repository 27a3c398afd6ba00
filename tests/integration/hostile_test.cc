// Requests and agent messages nobody on the team would send: each gets a
// clear status naming what is wrong, nothing is stored, and the scheduler
// goes on serving. One table per surface, so a new limit is one more row.

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/message_limits.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "taskgrid/v1/job_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace taskgrid::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::string_literals;

v1::TaskSpec Noop(const std::string& id) { return BuiltinSpec(id, "noop"); }

struct BadSubmit {
  std::string name;
  std::function<void(v1::SubmitTasksRequest&)> make;
  grpc::StatusCode code;
  std::string message;  // a substring of the status message
};

// Tasks listed by the scheduler, over every page.
int CountTasks(InProcessCluster& c) {
  int n = 0;
  v1::ListTasksRequest req;
  req.set_page_size(1000);
  for (int page = 0; page < 100; ++page) {
    v1::ListTasksResponse resp;
    auto ctx = InProcessCluster::Ctx();
    if (!c.tasks().ListTasks(ctx.get(), req, &resp).ok()) return -1;
    n += resp.tasks_size();
    if (resp.next_page_token().empty()) return n;
    req.set_page_token(resp.next_page_token());
  }
  return -1;
}

TEST(Hostile, BadRequestsAreRefusedWithAClearStatusAndStoreNothing) {
  InProcessCluster c;
  auto exec = [](v1::TaskSpec& s) -> v1::ExecStep& {
    s.clear_steps();
    return *s.add_steps()->mutable_exec();
  };
  const std::vector<BadSubmit> table = {
      {"id with a space", [](auto& r) { *r.add_tasks() = Noop("has space"); },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].id"},
      {"id ..", [](auto& r) { *r.add_tasks() = Noop(".."); }, grpc::StatusCode::INVALID_ARGUMENT,
       "tasks[0].id"},
      {"id too long", [](auto& r) { *r.add_tasks() = Noop(std::string(500, 'x')); },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].id"},
      {"no steps",
       [](auto& r) {
         v1::TaskSpec* s = r.add_tasks();
         s->set_id("nosteps");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].steps is empty"},
      {"NUL in argv",
       [&](auto& r) {
         v1::TaskSpec* s = r.add_tasks();
         *s = Noop("nul");
         exec(*s).add_argv("/bin/echo\0x"s);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "exec.argv[0] holds a NUL byte"},
      {"huge spec",
       [&](auto& r) {
         v1::TaskSpec* s = r.add_tasks();
         *s = Noop("huge");
         v1::ExecStep& e = exec(*s);
         e.add_argv("/bin/echo");
         e.add_argv(std::string(70 << 10, 'a'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "(--max_spec_bytes)"},
      {"payload over the limit",
       [](auto& r) {
         *r.add_tasks() = Noop("fat");
         r.mutable_tasks(0)->set_payload(std::string((1 << 20) + 1, 'p'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].payload is 1048577 bytes"},
      {"negative max_attempts",
       [](auto& r) {
         *r.add_tasks() = Noop("neg");
         r.mutable_tasks(0)->set_max_attempts(-1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].max_attempts"},
      {"negative timeout",
       [](auto& r) {
         *r.add_tasks() = Noop("negt");
         r.mutable_tasks(0)->mutable_attempt_timeout()->set_seconds(-5);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].attempt_timeout is negative"},
      {"absurd schedule_timeout",
       [](auto& r) {
         *r.add_tasks() = Noop("abs");
         r.mutable_tasks(0)->mutable_schedule_timeout()->set_seconds(20LL * 365 * 24 * 3600);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].schedule_timeout is longer than 10 years"},
      {"unknown enum",
       [](auto& r) {
         *r.add_tasks() = Noop("enum");
         r.mutable_tasks(0)->set_on_upstream_failure(static_cast<v1::UpstreamFailure>(7));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].on_upstream_failure is 7"},
      {"unknown builtin", [](auto& r) { *r.add_tasks() = BuiltinSpec("bi", "rm-rf"); },
       grpc::StatusCode::INVALID_ARGUMENT, "is not a builtin"},
      {"too many slots",
       [](auto& r) {
         *r.add_tasks() = Noop("slots");
         r.mutable_tasks(0)->mutable_placement()->set_slots(5000);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].placement.slots"},
      {"depends on itself",
       [](auto& r) {
         *r.add_tasks() = Noop("self");
         r.mutable_tasks(0)->add_depends_on("self");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "is the task itself"},
      {"depends on nothing known",
       [](auto& r) {
         *r.add_tasks() = Noop("orphan");
         r.mutable_tasks(0)->add_depends_on("no-such-task");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "no-such-task"},
      {"duplicate ids in one batch, the good one not kept",
       [](auto& r) {
         *r.add_tasks() = Noop("twice");
         *r.add_tasks() = Noop("twice");
         r.mutable_tasks(1)->set_priority(3);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "twice"},
      {"one bad task spoils the batch",
       [](auto& r) {
         *r.add_tasks() = Noop("fine-1");
         *r.add_tasks() = Noop("bad id");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "tasks[1].id"},
  };
  for (const BadSubmit& bad : table) {
    SCOPED_TRACE(bad.name);
    v1::SubmitTasksRequest req;
    bad.make(req);
    v1::SubmitTasksResponse resp;
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = c.tasks().SubmitTasks(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), bad.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(bad.message));
    EXPECT_EQ(CountTasks(c), 0) << "a refused submit stored something";
  }

  // Reads with bad arguments.
  {
    v1::ListTasksRequest req;
    req.set_page_token("not-a-token");
    v1::ListTasksResponse resp;
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = c.tasks().ListTasks(ctx.get(), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  }
  {
    v1::GetTaskRequest req;
    v1::Task resp;
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = c.tasks().GetTask(ctx.get(), req, &resp);
    EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
    EXPECT_NE(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  }

  // Jobs: a cycle and an empty job change nothing either.
  auto jobs =
      v1::JobService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  {
    v1::SubmitJobRequest req;
    req.set_job_id("loop");
    *req.add_tasks() = Noop("ja");
    *req.add_tasks() = Noop("jb");
    req.mutable_tasks(0)->add_depends_on("jb");
    req.mutable_tasks(1)->add_depends_on("ja");
    v1::Job job;
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = jobs->SubmitJob(ctx.get(), req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("cycle"));
  }
  {
    v1::SubmitJobRequest req;
    req.set_job_id("empty");
    v1::Job job;
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = jobs->SubmitJob(ctx.get(), req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  EXPECT_EQ(CountTasks(c), 0);
  {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    auto ctx = InProcessCluster::Ctx();
    ASSERT_TRUE(jobs->ListJobs(ctx.get(), req, &resp).ok());
    EXPECT_EQ(resp.jobs_size(), 0);
  }

  // Still serving: a good submit goes through and runs.
  c.AddAgent("good-agent", 1);
  ASSERT_TRUE(c.Submit({Noop("after-the-table")}).ok());
  c.WaitFor("after-the-table", v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(CountTasks(c), 1);
}

struct BadStream {
  std::string name;
  std::vector<v1::AgentMessage> msgs;  // sent in order; the stream must end with `code`
  grpc::StatusCode code;
  std::string message;
};

v1::AgentMessage HelloFrom(const std::string& id, int slots = 1) {
  v1::AgentMessage m;
  m.mutable_hello()->set_agent_id(id);
  m.mutable_hello()->set_slots(slots);
  m.mutable_hello()->set_batches(true);
  return m;
}

TEST(Hostile, BadAgentMessagesEndTheStreamWithAClearStatus) {
  InProcessCluster c;
  // Pinned to the good agent, so no hostile stream that got as far as a
  // Welcome is handed one (its loss would count against the attempts).
  v1::TaskSpec w1 = Noop("waiting-1");
  w1.mutable_placement()->add_agent_ids("good-agent");
  v1::TaskSpec w2 = Noop("waiting-2");
  w2.mutable_placement()->add_agent_ids("good-agent");
  ASSERT_TRUE(c.Submit({w1, w2}).ok());
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat();
  v1::AgentMessage hello_in_batch;
  *hello_in_batch.mutable_batch()->add_msgs() = heartbeat;
  *hello_in_batch.mutable_batch()->add_msgs() = HelloFrom("hostile-batch-inner");
  v1::AgentMessage nested_batch;
  nested_batch.mutable_batch()->add_msgs()->mutable_batch();
  v1::AgentMessage many_labels = HelloFrom("hostile-labels");
  for (int i = 0; i < 65; ++i) {
    (*many_labels.mutable_hello()->mutable_labels())["k" + std::to_string(i)] = "v";
  }
  v1::AgentMessage huge_label = HelloFrom("hostile-huge-label");
  (*huge_label.mutable_hello()->mutable_labels())["k"] = std::string(300, 'v');

  // Every case its own agent id: a refused stream's id may still be held
  // for a moment while the scheduler notices the stream end.
  const std::vector<BadStream> table = {
      {"no hello first", {heartbeat}, grpc::StatusCode::INVALID_ARGUMENT, "must be hello"},
      {"zero slots",
       {HelloFrom("hostile-zero", 0)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "hello.slots is 0"},
      {"huge slots",
       {HelloFrom("hostile-wide", 100000)},
       grpc::StatusCode::INVALID_ARGUMENT,
       "--max_agent_slots"},
      {"bad id", {HelloFrom("not an id")}, grpc::StatusCode::INVALID_ARGUMENT, "hello.agent_id"},
      {"too many labels", {many_labels}, grpc::StatusCode::INVALID_ARGUMENT, "hello.labels has 65"},
      {"huge label", {huge_label}, grpc::StatusCode::INVALID_ARGUMENT, "the limit is 256"},
      {"a hello inside a batch",
       {HelloFrom("hostile-batch"), hello_in_batch},
       grpc::StatusCode::INVALID_ARGUMENT,
       "batch.msgs[1] is a hello"},
      {"a batch inside a batch",
       {HelloFrom("hostile-nested"), nested_batch},
       grpc::StatusCode::INVALID_ARGUMENT,
       "batch.msgs[0] is a batch"},
      {"a second hello",
       {HelloFrom("hostile-twice"), HelloFrom("hostile-twice-2")},
       grpc::StatusCode::FAILED_PRECONDITION,
       "hello may be sent once"},
  };
  auto agents =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  for (const BadStream& bad : table) {
    SCOPED_TRACE(bad.name);
    auto ctx = InProcessCluster::Ctx(absl::Seconds(30));
    auto stream = agents->Connect(ctx.get());
    for (const v1::AgentMessage& m : bad.msgs) {
      if (!stream->Write(m)) break;  // the scheduler may have ended it already
    }
    stream->WritesDone();
    v1::SchedulerMessage in;
    while (stream->Read(&in)) {
      // Welcome and assignments to the agents that got that far.
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), bad.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(bad.message));
  }

  // Still serving agents: both tasks run on a real one.
  c.AddAgent("good-agent", 2);
  c.WaitFor("waiting-1", v1::TASK_STATE_SUCCEEDED, absl::Seconds(60));
  c.WaitFor("waiting-2", v1::TASK_STATE_SUCCEEDED, absl::Seconds(60));
}

TEST(Hostile, AnAgentThatStopsReadingIsCutOffAndLosesNothing) {
  // It says Hello for 1,000 slots and heartbeats, but never reads: what
  // the scheduler sends it piles up behind a write it never takes. Past
  // the outbox limit the stream is cancelled, and once the reconnect grace
  // is over its tasks run on an agent that reads.
  engine::EngineOptions eo = InProcessCluster::DefaultOptions();
  eo.scheduler.reconnect_grace = absl::Seconds(3);
  service::ServerOptions so;
  so.agent_outbox.max_bytes = 1 << 20;
  so.agent_outbox.stuck_after = absl::Seconds(1);
  InProcessCluster c(eo, so);
  auto agents =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  auto ctx = InProcessCluster::Ctx(absl::Seconds(60));
  auto stream = agents->Connect(ctx.get());
  ASSERT_TRUE(stream->Write(HelloFrom("deaf-agent", 1000)));
  auto cluster = v1::ClusterService::NewStub(
      grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  auto deaf_state = [&] {
    v1::ListAgentsResponse resp;
    if (!cluster->ListAgents(InProcessCluster::Ctx().get(), {}, &resp).ok()) {
      return v1::AGENT_STATE_UNSPECIFIED;
    }
    for (const v1::Agent& a : resp.agents()) {
      if (a.id() == "deaf-agent") return a.state();
    }
    return v1::AGENT_STATE_UNSPECIFIED;
  };
  ASSERT_TRUE(InProcessCluster::Eventually([&] { return deaf_state() == v1::AGENT_STATE_ACTIVE; }));
  // 200 tasks of 512 KiB: about 100 MiB for it to take.
  std::vector<std::string> ids;
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<v1::TaskSpec> specs;
    for (int i = 0; i < 20; ++i) {
      ids.push_back("deaf-" + std::to_string(batch) + "-" + std::to_string(i));
      specs.push_back(Noop(ids.back()));
      specs.back().set_payload(std::string(512 << 10, 'p'));
    }
    grpc::Status st = c.Submit(specs);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  // It keeps heartbeating; the scheduler ends the stream for not reading.
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat();
  bool cut = InProcessCluster::Eventually(
      [&] {
        if (deaf_state() == v1::AGENT_STATE_LOST) return true;
        stream->Write(heartbeat);
        return false;
      },
      absl::Seconds(30));
  EXPECT_TRUE(cut) << "the scheduler kept a stream that read nothing";
  ctx->TryCancel();
  stream->Finish();
  // Nothing lost: every task runs on an agent that reads.
  c.AddAgent("reading-agent", 8);
  for (const std::string& id : ids) {
    c.WaitFor(id, v1::TASK_STATE_SUCCEEDED, absl::Seconds(60));
  }
}

// Reads scheduler messages (unpacking batches) until one matches `want`.
bool ReadUntil(grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>& stream,
               const std::function<bool(const v1::SchedulerMessage&)>& want,
               v1::SchedulerMessage* found) {
  v1::SchedulerMessage in;
  for (int i = 0; i < 1000 && stream.Read(&in); ++i) {
    std::vector<v1::SchedulerMessage> msgs;
    if (in.has_batch()) {
      msgs.assign(in.batch().msgs().begin(), in.batch().msgs().end());
    } else {
      msgs.push_back(in);
    }
    for (const v1::SchedulerMessage& m : msgs) {
      if (want(m)) {
        *found = m;
        return true;
      }
    }
  }
  return false;
}

v1::AgentMessage OutputMsg(const std::string& task, int32_t attempt, int64_t offset,
                           std::string data) {
  v1::AgentMessage m;
  m.mutable_output()->set_task_id(task);
  m.mutable_output()->set_attempt(attempt);
  m.mutable_output()->set_stream(v1::OUTPUT_STREAM_STDOUT);
  m.mutable_output()->set_offset(offset);
  m.mutable_output()->set_data(std::move(data));
  return m;
}

TEST(Hostile, LiveOutputIsFencedByAttemptAndCutToItsBoundWithoutEndingTheStream) {
  InProcessCluster c;
  auto agents =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  auto actx = InProcessCluster::Ctx(absl::Seconds(60));
  auto stream = agents->Connect(actx.get());
  v1::AgentMessage hello = HelloFrom("loud-agent");
  hello.mutable_hello()->set_live_output(true);
  ASSERT_TRUE(stream->Write(hello));
  v1::TaskSpec spec = Noop("loud");
  spec.mutable_placement()->add_agent_ids("loud-agent");
  ASSERT_TRUE(c.Submit({spec, Noop("not-its-own")}).ok());
  v1::SchedulerMessage m;
  ASSERT_TRUE(ReadUntil(
      *stream, [](const auto& x) { return x.has_assign(); }, &m));
  v1::AgentMessage accept;
  accept.mutable_accept()->set_task_id("loud");
  accept.mutable_accept()->set_attempt(1);
  ASSERT_TRUE(stream->Write(accept));
  c.WaitFor("loud", v1::TASK_STATE_RUNNING);

  v1::StreamTaskOutputRequest req;
  req.set_id("loud");
  req.set_follow(true);
  auto fctx = InProcessCluster::Ctx(absl::Seconds(60));
  auto follower = c.tasks().StreamTaskOutput(fctx.get(), req);
  ASSERT_TRUE(ReadUntil(
      *stream, [](const auto& x) { return x.has_watch_output(); }, &m));
  EXPECT_EQ(m.watch_output().task_id(), "loud");
  EXPECT_TRUE(m.watch_output().watch());

  auto stale = [&] {
    v1::ClusterStats stats;
    auto cluster = v1::ClusterService::NewStub(
        grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
    EXPECT_TRUE(cluster->GetClusterStats(InProcessCluster::Ctx().get(), {}, &stats).ok());
    return stats.stale_messages();
  };
  const int64_t stale_before = stale();
  // An attempt it does not hold, and a task that is not its own: dropped.
  ASSERT_TRUE(stream->Write(OutputMsg("loud", 9, 0, "attempt nine\n")));
  ASSERT_TRUE(stream->Write(OutputMsg("not-its-own", 1, 0, "someone else's\n")));
  // 1 MiB in one message: cut to the bound, and the stream goes on.
  ASSERT_TRUE(stream->Write(OutputMsg("loud", 1, 0, std::string(1 << 20, 'x'))));
  ASSERT_TRUE(stream->Write(OutputMsg("loud", 1, 1 << 20, "after\n")));
  v1::AgentMessage result;
  result.mutable_result()->set_task_id("loud");
  result.mutable_result()->set_attempt(1);
  result.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  ASSERT_TRUE(stream->Write(result));
  c.WaitFor("loud", v1::TASK_STATE_SUCCEEDED);  // the stream was not ended: its Result counted
  EXPECT_TRUE(InProcessCluster::Eventually([&] { return stale() >= stale_before + 2; }));

  std::string text;
  size_t largest = 0;
  v1::StreamTaskOutputResponse r;
  std::vector<int64_t> offsets;
  while (follower->Read(&r)) {
    if (r.kind() != v1::StreamTaskOutputResponse::KIND_OUTPUT) continue;
    largest = std::max(largest, r.data().size());
    offsets.push_back(r.offset());
    text += r.data();
  }
  EXPECT_TRUE(follower->Finish().ok());
  EXPECT_EQ(largest, static_cast<size_t>(kMaxOutputChunkBytes));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1 << 20}));
  EXPECT_EQ(text, std::string(kMaxOutputChunkBytes, 'x') + "after\n");
  EXPECT_THAT(text, ::testing::Not(HasSubstr("nine")));
  actx->TryCancel();
  stream->Finish();
}

}  // namespace
}  // namespace taskgrid::testing
