// The scheduler and agents in one process over real gRPC on 127.0.0.1:
// each behaviour of the foundation end to end.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/grpc_status.h"
#include "common/proto_time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "scheduler/service/request_counts.h"
#include "scheduler/service/standby_server.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/testing/await.h"

namespace taskgrid::testing {
namespace {

using ::testing::HasSubstr;

TEST(Scheduler, SubmittedTaskSucceedsWithItsOutput) {
  InProcessCluster c;
  c.AddAgent("a1", 2);
  v1::TaskSpec s = ExecSpec("hello", {"/bin/sh", "-c", "cat; echo \" $TASKGRID_ATTEMPT\""});
  s.set_payload("hi from stdin");
  ASSERT_TRUE(c.Submit({s}).ok());
  v1::Task t = c.WaitFor("hello", v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(t.attempt(), 1);
  EXPECT_EQ(t.result().exit_code(), 0);
  EXPECT_EQ(t.result().stdout_tail(), "hi from stdin 1\n");
  ASSERT_EQ(t.attempts_size(), 1);
  EXPECT_EQ(t.attempts(0).agent_id(), "a1");
}

TEST(Scheduler, FailingStepIsRetriedToMaxAttemptsThenFailed) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  v1::TaskSpec s = ExecSpec("flaky", {"/bin/sh", "-c", "echo oops >&2; exit 3"});
  s.set_max_attempts(3);
  ASSERT_TRUE(c.Submit({s}).ok());
  v1::Task t = c.WaitFor("flaky", v1::TASK_STATE_FAILED);
  EXPECT_EQ(t.attempt(), 3);
  ASSERT_EQ(t.attempts_size(), 3);
  for (const v1::Attempt& a : t.attempts()) {
    EXPECT_EQ(a.result().outcome(), v1::OUTCOME_FAILED);
    EXPECT_EQ(a.result().exit_code(), 3);
  }
  EXPECT_EQ(t.result().stderr_tail(), "oops\n");
  EXPECT_THAT(t.reason(), HasSubstr("all 3 attempts used"));
}

TEST(Scheduler, CancelPendingTaskNeverRuns) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("never", "noop")}).ok());
  v1::CancelTaskRequest req;
  req.set_id("never");
  v1::Task t;
  ASSERT_TRUE(c.tasks().CancelTask(InProcessCluster::Ctx().get(), req, &t).ok());
  EXPECT_EQ(t.state(), v1::TASK_STATE_CANCELLED);
  c.AddAgent("a1", 1);
  ASSERT_TRUE(c.Submit({BuiltinSpec("after", "noop")}).ok());
  c.WaitFor("after", v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(c.Get("never").state(), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(c.Get("never").attempt(), 0);
}

TEST(Scheduler, CancelRunningTaskStopsIt) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  ASSERT_TRUE(c.Submit({BuiltinSpec("long", "sleep", {"600"})}).ok());
  c.WaitFor("long", v1::TASK_STATE_RUNNING);
  v1::CancelTaskRequest req;
  req.set_id("long");
  v1::Task t;
  ASSERT_TRUE(c.tasks().CancelTask(InProcessCluster::Ctx().get(), req, &t).ok());
  EXPECT_EQ(t.state(), v1::TASK_STATE_CANCELLING);
  t = c.WaitFor("long", v1::TASK_STATE_CANCELLED, absl::Seconds(10));
  EXPECT_EQ(t.result().outcome(), v1::OUTCOME_CANCELLED);
}

TEST(Scheduler, PauseAndResume) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("p", "noop")}).ok());
  v1::PauseTaskRequest pause;
  pause.set_id("p");
  v1::Task t;
  ASSERT_TRUE(c.tasks().PauseTask(InProcessCluster::Ctx().get(), pause, &t).ok());
  EXPECT_EQ(t.state(), v1::TASK_STATE_PAUSED);
  c.AddAgent("a1", 1);
  ASSERT_TRUE(c.Submit({BuiltinSpec("other", "noop")}).ok());
  c.WaitFor("other", v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(c.Get("p").state(), v1::TASK_STATE_PAUSED) << "a paused task is not dispatched";
  v1::ResumeTaskRequest resume;
  resume.set_id("p");
  ASSERT_TRUE(c.tasks().ResumeTask(InProcessCluster::Ctx().get(), resume, &t).ok());
  c.WaitFor("p", v1::TASK_STATE_SUCCEEDED);
}

TEST(Scheduler, HigherPriorityIsDispatchedFirst) {
  InProcessCluster c;
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 6; ++i) {
    v1::TaskSpec s = BuiltinSpec("p" + std::to_string(i), "noop");
    s.set_priority(i % 3);  // 0 1 2 0 1 2
    specs.push_back(s);
  }
  ASSERT_TRUE(c.Submit(specs).ok());
  c.AddAgent("a1", 1);  // one slot: strictly one after another
  std::vector<std::pair<absl::Time, std::string>> starts;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "p" + std::to_string(i);
    v1::Task t = c.WaitFor(id, v1::TASK_STATE_SUCCEEDED);
    starts.push_back({FromProto(t.attempts(0).dispatch_time()), id});
  }
  std::sort(starts.begin(), starts.end());
  std::vector<std::string> order;
  for (const auto& [time, id] : starts) order.push_back(id);
  EXPECT_THAT(order, ::testing::ElementsAre("p2", "p5", "p1", "p4", "p0", "p3"));
}

TEST(Scheduler, NotBeforeIsRespected) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  v1::TaskSpec s = BuiltinSpec("later", "noop");
  const absl::Time not_before = absl::Now() + absl::Milliseconds(1500);
  SetTimestamp(not_before, s.mutable_not_before());
  v1::SubmitTasksResponse resp;
  ASSERT_TRUE(c.Submit({s}, &resp).ok());
  EXPECT_EQ(resp.tasks(0).state(), v1::TASK_STATE_SCHEDULED);
  v1::Task t = c.WaitFor("later", v1::TASK_STATE_SUCCEEDED);
  EXPECT_GE(FromProto(t.attempts(0).dispatch_time()), not_before);
}

TEST(Scheduler, IdenticalResubmitReturnsTheExistingTask) {
  InProcessCluster c;
  v1::TaskSpec s = BuiltinSpec("same", "noop");
  v1::SubmitTasksResponse first, second;
  ASSERT_TRUE(c.Submit({s}, &first).ok());
  ASSERT_TRUE(c.Submit({s}, &second).ok());
  EXPECT_EQ(first.tasks(0).create_time().seconds(), second.tasks(0).create_time().seconds());
  EXPECT_EQ(first.tasks(0).create_time().nanos(), second.tasks(0).create_time().nanos());
  EXPECT_EQ(c.store().LoadTasks()->size(), 1u);
}

TEST(Scheduler, ConflictingResubmitIsAlreadyExistsAndChangesNothing) {
  InProcessCluster c;
  ASSERT_TRUE(c.Submit({BuiltinSpec("x", "noop")}).ok());
  v1::TaskSpec changed = BuiltinSpec("x", "sleep", {"1"});
  grpc::Status s = c.Submit({BuiltinSpec("fresh", "noop"), changed});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("\"x\""));
  EXPECT_EQ(c.store().LoadTasks()->size(), 1u);
  EXPECT_EQ(c.Get("x").spec().steps(0).builtin().name(), "noop");
}

TEST(Scheduler, FullQueueIsResourceExhaustedAndStoresNothing) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.scheduler.queue_max_length["tiny"] = 2;
  InProcessCluster c(o);
  auto in_tiny = [](const std::string& id) {
    v1::TaskSpec s = BuiltinSpec(id, "noop");
    s.set_queue("tiny");
    return s;
  };
  ASSERT_TRUE(c.Submit({in_tiny("t1"), in_tiny("t2")}).ok());
  grpc::Status s = c.Submit({in_tiny("t3")});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("queue \"tiny\" is full"));
  EXPECT_EQ(c.store().LoadTasks()->size(), 2u);
  ASSERT_TRUE(c.Submit({BuiltinSpec("elsewhere", "noop")}).ok()) << "other queues are unaffected";
}

TEST(Scheduler, BadInputGetsAClearStatusAndChangesNothing) {
  InProcessCluster c;
  struct Case {
    std::vector<v1::TaskSpec> specs;
    grpc::StatusCode code;
    std::string names;
  };
  v1::TaskSpec huge = BuiltinSpec("huge", "noop");
  huge.set_payload(std::string((1 << 20) + 1, 'x'));
  v1::TaskSpec no_steps;
  no_steps.set_id("empty");
  v1::TaskSpec long_id = BuiltinSpec(std::string(129, 'a'), "noop");
  v1::TaskSpec bad_chars = BuiltinSpec("a/b", "noop");
  const std::vector<Case> cases = {
      {{}, grpc::StatusCode::INVALID_ARGUMENT, "tasks is empty"},
      {{huge}, grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].payload"},
      {{no_steps}, grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].steps"},
      {{long_id}, grpc::StatusCode::INVALID_ARGUMENT, "tasks[0].id"},
      {{BuiltinSpec("ok", "noop"), bad_chars}, grpc::StatusCode::INVALID_ARGUMENT, "tasks[1].id"},
      {{BuiltinSpec("d", "noop"), BuiltinSpec("d", "noop")},
       grpc::StatusCode::INVALID_ARGUMENT,
       "tasks[1].id"},
      {{BuiltinSpec("z", "warp")}, grpc::StatusCode::INVALID_ARGUMENT, "builtin.name"},
  };
  for (const Case& k : cases) {
    grpc::Status s = c.Submit(k.specs);
    EXPECT_EQ(s.error_code(), k.code) << k.names;
    EXPECT_THAT(s.error_message(), HasSubstr(k.names));
  }
  EXPECT_TRUE(c.store().LoadTasks()->empty());

  v1::GetTaskRequest get;
  get.set_id("missing");
  v1::Task t;
  grpc::Status s = c.tasks().GetTask(InProcessCluster::Ctx().get(), get, &t);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("missing"));
  v1::RetryTaskRequest retry;
  s = c.tasks().RetryTask(InProcessCluster::Ctx().get(), retry, &t);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(Scheduler, ListAndStatsOverGrpc) {
  InProcessCluster c;
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 5; ++i) {
    v1::TaskSpec s = BuiltinSpec("l" + std::to_string(i), "noop");
    s.set_queue(i < 3 ? "a" : "b");
    specs.push_back(s);
  }
  ASSERT_TRUE(c.Submit(specs).ok());
  v1::ListTasksRequest req;
  req.set_queue("a");
  req.set_page_size(2);
  v1::ListTasksResponse resp;
  ASSERT_TRUE(c.tasks().ListTasks(InProcessCluster::Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.tasks_size(), 2);
  EXPECT_FALSE(resp.next_page_token().empty());
  req.set_page_token(resp.next_page_token());
  ASSERT_TRUE(c.tasks().ListTasks(InProcessCluster::Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.tasks_size(), 1);
  EXPECT_EQ(resp.tasks(0).spec().id(), "l2");

  v1::GetQueueStatsRequest sreq;
  v1::GetQueueStatsResponse sresp;
  ASSERT_TRUE(c.tasks().GetQueueStats(InProcessCluster::Ctx().get(), sreq, &sresp).ok());
  ASSERT_EQ(sresp.queues_size(), 2);
  EXPECT_EQ(sresp.queues(0).queue(), "a");
  EXPECT_EQ(sresp.queues(0).length(), 3);
  EXPECT_EQ(sresp.queues(0).counts().at("PENDING"), 3);
}

TEST(Scheduler, TasksSpreadOverAgentsAndLabelsAreHonoured) {
  InProcessCluster c;
  c.AddAgent("cpu", 4, {{"kind", "cpu"}});
  c.AddAgent("gpu", 1, {{"kind", "gpu"}});
  v1::TaskSpec g = BuiltinSpec("needs-gpu", "noop");
  (*g.mutable_placement()->mutable_required_labels())["kind"] = "gpu";
  ASSERT_TRUE(c.Submit({g}).ok());
  EXPECT_EQ(c.WaitFor("needs-gpu", v1::TASK_STATE_SUCCEEDED).attempts(0).agent_id(), "gpu");
}

// Bytes that do not parse as the method's request get INVALID_ARGUMENT
// naming the method (gRPC alone answers UNIMPLEMENTED, no message), and
// change nothing; a method that does not exist stays UNIMPLEMENTED.
TEST(Scheduler, ARequestThatDoesNotParseIsInvalidArgument) {
  InProcessCluster c;
  auto channel = grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  auto call = [&](const std::string& method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::unique_ptr<grpc::ClientContext> ctx = InProcessCluster::Ctx();
    std::mutex mu;
    std::condition_variable cv;
    std::optional<grpc::Status> status;
    generic.UnaryCall(ctx.get(), method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return status.has_value(); });
    return *status;
  };
  // Field 1 (tasks), length-delimited, claiming 100 bytes it does not have.
  const std::string garbage("\x0a\x64\xff\xff", 4);
  // The calls each method answered, by code (this process's port, shared
  // by every test in it: differences only).
  auto answered = [](const std::string& method, const std::string& code) -> int64_t {
    const auto all = service::GrpcRequests().Counts();
    auto m = all.find(method);
    if (m == all.end()) return 0;
    auto n = m->second.find(code);
    return n == m->second.end() ? 0 : n->second;
  };
  const int64_t submits_refused =
      answered("/taskgrid.v1.TaskService/SubmitTasks", "INVALID_ARGUMENT");
  const int64_t lists_ok = answered("/taskgrid.v1.TaskService/ListTasks", "OK");
  const int64_t unknown = answered("(unknown)", "UNIMPLEMENTED");
  for (const char* method :
       {"/taskgrid.v1.TaskService/SubmitTasks", "/taskgrid.v1.TaskService/GetTask",
        "/taskgrid.v1.TaskService/WatchTasks", "/taskgrid.v1.JobService/SubmitJob"}) {
    const grpc::Status s = call(method, garbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(s.error_message(),
                HasSubstr(std::string("the request to ") + method + " could not be parsed"));
  }
  EXPECT_EQ(call("/taskgrid.v1.TaskService/NoSuchMethod", garbage).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  v1::ListTasksRequest list;
  v1::ListTasksResponse listed;
  ASSERT_TRUE(c.tasks().ListTasks(InProcessCluster::Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.tasks_size(), 0) << "nothing was submitted";
  // /metrics counts each answer under its method and the code sent (the
  // rewritten one); a method that does not exist counts as "(unknown)",
  // never as a series of its own.
  EXPECT_EQ(answered("/taskgrid.v1.TaskService/SubmitTasks", "INVALID_ARGUMENT"),
            submits_refused + 1);
  EXPECT_EQ(answered("/taskgrid.v1.TaskService/SubmitTasks", "UNIMPLEMENTED"), 0);
  EXPECT_EQ(answered("/taskgrid.v1.TaskService/ListTasks", "OK"), lists_ok + 1);
  EXPECT_EQ(service::GrpcRequests().Counts().count("/taskgrid.v1.TaskService/NoSuchMethod"), 0u);
  EXPECT_EQ(answered("(unknown)", "UNIMPLEMENTED"), unknown + 1);
}

// Bytes on AgentService.Connect that do not parse as an AgentMessage end
// the stream with INVALID_ARGUMENT saying so (gRPC's own parse would end
// it OK, as if the agent had hung up), and no agent joins.
TEST(Scheduler, GarbageOnTheAgentStreamIsInvalidArgument) {
  InProcessCluster c;
  auto channel = grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);

  class Sender final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Sender(const std::string& bytes) {
      grpc::Slice slice(bytes);
      out_ = grpc::ByteBuffer(&slice, 1);
    }
    void Go() {
      StartWrite(&out_);
      StartRead(&in_);
      StartCall();
    }
    void OnDone(const grpc::Status& s) override {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = s;
      cv_.notify_all();
    }
    grpc::Status Wait() {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return status_.has_value(); });
      return *status_;
    }

   private:
    grpc::ByteBuffer out_, in_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<grpc::Status> status_;
  };

  // Field 1 (hello), length-delimited, claiming 100 bytes it does not have.
  Sender sender(std::string("\x0a\x64\xff\xff", 4));
  std::unique_ptr<grpc::ClientContext> ctx = InProcessCluster::Ctx();
  generic.PrepareBidiStreamingCall(ctx.get(), "/taskgrid.v1.AgentService/Connect",
                                   grpc::StubOptions(), &sender);
  sender.Go();
  const grpc::Status s = sender.Wait();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("could not be parsed as taskgrid.v1.AgentMessage"));

  v1::ListAgentsRequest list;
  v1::ListAgentsResponse listed;
  auto cluster = v1::ClusterService::NewStub(channel);
  ASSERT_TRUE(cluster->ListAgents(InProcessCluster::Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.agents_size(), 0) << "no agent joined";
}

TEST(StandbyServer, AnswersEveryCallUnavailableNamingTheLeaderAndIsNotServing) {
  service::ServerOptions opts;
  opts.listen = "127.0.0.1:0";
  auto standby = service::StandbyServer::Start(opts);
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*standby)->port()),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckResponse h;
  ASSERT_TRUE(health->Check(InProcessCluster::Ctx().get(), {}, &h).ok());
  EXPECT_EQ(h.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  auto tasks = v1::TaskService::NewStub(channel);
  v1::GetTaskRequest get;
  get.set_id("t");
  v1::Task task;
  {
    // No leader known (this one is taking over): no address to name.
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = tasks->GetTask(ctx.get(), get, &task);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.error_message(), HasSubstr("taking over"));
    EXPECT_EQ(LeaderNamedBy(*ctx), "");
    EXPECT_TRUE(AnsweredByStandby(*ctx));
  }
  (*standby)->SetLeader("10.1.2.3:7070", 3);
  {
    auto ctx = InProcessCluster::Ctx();
    grpc::Status s = tasks->GetTask(ctx.get(), get, &task);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(s.error_message(),
              "this scheduler is a standby; the leader is at 10.1.2.3:7070 (lease epoch 3)");
    EXPECT_EQ(LeaderNamedBy(*ctx), "10.1.2.3:7070");
    EXPECT_TRUE(AnsweredByStandby(*ctx));
  }
  {
    // A large request is answered the same, not refused for its size.
    v1::SubmitTasksRequest big;
    big.add_tasks()->set_payload(std::string(1 << 20, 'x'));
    v1::SubmitTasksResponse resp;
    auto ctx = InProcessCluster::Ctx();
    EXPECT_EQ(tasks->SubmitTasks(ctx.get(), big, &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(LeaderNamedBy(*ctx), "10.1.2.3:7070");
  }
  {
    // An agent's stream too.
    auto agents = v1::AgentService::NewStub(channel);
    auto ctx = InProcessCluster::Ctx();
    auto stream = agents->Connect(ctx.get());
    v1::AgentMessage hello;
    hello.mutable_hello()->set_agent_id("a1");
    stream->Write(hello);
    v1::SchedulerMessage m;
    EXPECT_FALSE(stream->Read(&m));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(LeaderNamedBy(*ctx), "10.1.2.3:7070");
  }
  (*standby)->Shutdown();
}

TEST(StandbyServer, AnAgentGivenOnlyAStandbyIsSentToTheLeaderAndRunsItsWork) {
  InProcessCluster c;
  service::ServerOptions opts;
  opts.listen = "127.0.0.1:0";
  auto standby = service::StandbyServer::Start(opts);
  ASSERT_TRUE(standby.ok()) << standby.status();
  (*standby)->SetLeader(c.addr(), 1);
  c.AddAgent("a1", 1, {}, "127.0.0.1:" + std::to_string((*standby)->port()));
  ASSERT_TRUE(c.Submit({ExecSpec("t", {"/bin/echo", "led"})}).ok());
  EXPECT_EQ(c.WaitFor("t", v1::TASK_STATE_SUCCEEDED).result().stdout_tail(), "led\n");
}

TEST(Scheduler, HealthAndReflectionAreServed) {
  InProcessCluster c;
  auto channel = grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(InProcessCluster::Ctx().get(), req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  namespace refl = grpc::reflection::v1alpha;
  auto reflection = refl::ServerReflection::NewStub(channel);
  auto ctx = InProcessCluster::Ctx();
  auto stream = reflection->ServerReflectionInfo(ctx.get());
  refl::ServerReflectionRequest list;
  list.set_list_services("*");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse listed;
  ASSERT_TRUE(stream->Read(&listed));
  std::set<std::string> services;
  for (const auto& s : listed.list_services_response().service()) services.insert(s.name());
  for (const char* want : {"taskgrid.v1.TaskService", "taskgrid.v1.AgentService",
                           "taskgrid.v1.JobService", "grpc.health.v1.Health"}) {
    EXPECT_TRUE(services.count(want)) << want;
  }
  // Each listed service can also be described (the health descriptor is
  // linked in, see proto/CMakeLists.txt).
  for (const char* symbol : {"taskgrid.v1.TaskService", "grpc.health.v1.Health"}) {
    refl::ServerReflectionRequest describe;
    describe.set_file_containing_symbol(symbol);
    ASSERT_TRUE(stream->Write(describe));
    refl::ServerReflectionResponse described;
    ASSERT_TRUE(stream->Read(&described));
    EXPECT_FALSE(described.has_error_response())
        << symbol << ": " << described.error_response().error_message();
    EXPECT_GT(described.file_descriptor_response().file_descriptor_proto_size(), 0) << symbol;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(Scheduler, SubmitsInFlightAsTheServerStopsAreEachAnsweredAndNoAcknowledgedOneIsLost) {
  // Callers that submit one at a time, many at once, so that some commit
  // on their handler's thread (CallerCommit) and some queue for the group
  // commit, while the server stops. Every call ends (OK, or refused because
  // the server is going), the stop waits for the answers the Engine still
  // owes, and every task that was acknowledged is in the table.
  InProcessCluster c;
  constexpr int kCallers = 16;
  std::vector<std::vector<std::string>> acknowledged(kCallers);
  std::atomic<int> answered_ok{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int n = 0; !stop && n < 100'000; ++n) {
        const std::string id = "in-flight-" + std::to_string(i) + "-" + std::to_string(n);
        v1::SubmitTasksRequest req;
        *req.add_tasks() = BuiltinSpec(id, "noop");
        v1::SubmitTasksResponse resp;
        const grpc::Status s = c.tasks().SubmitTasks(InProcessCluster::Ctx().get(), req, &resp);
        if (!s.ok()) {
          EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                      s.error_code() == grpc::StatusCode::CANCELLED)
              << s.error_code() << " " << s.error_message();
          return;
        }
        EXPECT_EQ(resp.tasks_size(), 1);
        if (resp.tasks_size() == 1) {
          EXPECT_EQ(resp.tasks(0).spec().id(), id);
        }
        acknowledged[i].push_back(id);
        ++answered_ok;
      }
    });
  }
  ASSERT_TRUE(InProcessCluster::Eventually([&] { return answered_ok >= 300; }));
  c.server().Shutdown(absl::Seconds(5));
  stop = true;
  for (std::thread& t : callers) t.join();
  // The Engine outlives the server: ask it directly.
  int found = 0;
  for (const auto& ids : acknowledged) {
    for (const std::string& id : ids) {
      v1::GetTaskRequest req;
      req.set_id(id);
      const absl::StatusOr<v1::Task> t =
          Await<v1::Task>([&](auto done) { c.engine().GetTask(req, std::move(done)); });
      EXPECT_TRUE(t.ok()) << id << ": " << t.status();
      if (t.ok()) ++found;
    }
  }
  EXPECT_EQ(found, answered_ok.load());
  EXPECT_GE(found, 300);
}

TEST(Scheduler, StreamsThatEndWhileAnswersAreInFlightLetTheServerStop) {
  // Agents that go away while the scheduler is still writing to them
  // (heartbeat acks in flight): every stream must still finish, or the
  // server's shutdown in ~InProcessCluster waits forever (the test times out).
  InProcessCluster c;
  auto stub =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 50; ++i) {
    grpc::ClientContext ctx;
    auto stream = stub->Connect(&ctx);
    v1::AgentMessage m;
    m.mutable_hello()->set_agent_id("gone-" + std::to_string(i));
    m.mutable_hello()->set_slots(1);
    ASSERT_TRUE(stream->Write(m));
    v1::AgentMessage hb;
    hb.mutable_heartbeat();
    for (int k = 0; k < 20; ++k) stream->Write(hb);
    stream->WritesDone();  // ends the server's reads while acks are still on their way
    ctx.TryCancel();
    stream->Finish();
  }
}

TEST(Scheduler, AgentWithBadHelloIsRefused) {
  InProcessCluster c;
  auto stub =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  auto ctx = InProcessCluster::Ctx();
  auto stream = stub->Connect(ctx.get());
  v1::AgentMessage m;
  m.mutable_hello()->set_agent_id("bad id");
  m.mutable_hello()->set_slots(1);
  ASSERT_TRUE(stream->Write(m));
  stream->WritesDone();
  v1::SchedulerMessage in;
  EXPECT_FALSE(stream->Read(&in));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("hello.agent_id"));

  auto ctx2 = InProcessCluster::Ctx();
  auto stream2 = stub->Connect(ctx2.get());
  v1::AgentMessage hb;
  hb.mutable_heartbeat();
  ASSERT_TRUE(stream2->Write(hb));
  EXPECT_FALSE(stream2->Read(&in));
  s = stream2->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("hello"));
}

TEST(Scheduler, ABatchHoldingHelloOrABatchIsRefused) {
  InProcessCluster c;
  auto stub =
      v1::AgentService::NewStub(grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  for (const bool nested : {false, true}) {
    auto ctx = InProcessCluster::Ctx();
    auto stream = stub->Connect(ctx.get());
    v1::AgentMessage hello;
    hello.mutable_hello()->set_agent_id(nested ? "nests" : "repeats");
    hello.mutable_hello()->set_slots(1);
    hello.mutable_hello()->set_batches(true);
    ASSERT_TRUE(stream->Write(hello));
    v1::SchedulerMessage in;
    ASSERT_TRUE(stream->Read(&in));
    ASSERT_TRUE(in.welcome().batches());
    v1::AgentMessage bad;
    bad.mutable_batch()->add_msgs()->mutable_heartbeat();
    if (nested) {
      bad.mutable_batch()->add_msgs()->mutable_batch()->add_msgs()->mutable_heartbeat();
    } else {
      *bad.mutable_batch()->add_msgs() = hello;
    }
    ASSERT_TRUE(stream->Write(bad));
    stream->WritesDone();
    while (stream->Read(&in)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << nested;
    EXPECT_THAT(s.error_message(), HasSubstr("neither hello nor another batch")) << nested;
  }
}

TEST(Scheduler, PausingARunningTaskStopsItAndResumeRunsItAgain) {
  InProcessCluster c;
  c.AddAgent("a1", 1);
  v1::TaskSpec s = BuiltinSpec("long", "sleep", {"600"});
  s.set_max_attempts(1);
  ASSERT_TRUE(c.Submit({s}).ok());
  c.WaitFor("long", v1::TASK_STATE_RUNNING);
  v1::PauseTaskRequest pause;
  pause.set_id("long");
  v1::Task t;
  ASSERT_TRUE(c.tasks().PauseTask(InProcessCluster::Ctx().get(), pause, &t).ok());
  EXPECT_THAT(t.reason(), HasSubstr("pause requested"));
  t = c.WaitFor("long", v1::TASK_STATE_PAUSED, absl::Seconds(10));
  ASSERT_EQ(t.attempts_size(), 1);
  EXPECT_TRUE(t.attempts(0).interrupted());
  v1::ResumeTaskRequest resume;
  resume.set_id("long");
  ASSERT_TRUE(c.tasks().ResumeTask(InProcessCluster::Ctx().get(), resume, &t).ok());
  t = c.WaitFor("long", v1::TASK_STATE_RUNNING);
  EXPECT_EQ(t.attempt(), 2) << "the interrupted attempt did not use up max_attempts=1";
}

TEST(Scheduler, ClusterServiceListsDrainsAndCounts) {
  InProcessCluster c;
  c.AddAgent("a1", 3, {{"zone", "a"}});
  auto cluster = v1::ClusterService::NewStub(
      grpc::CreateChannel(c.addr(), grpc::InsecureChannelCredentials()));
  v1::ListAgentsResponse agents;
  ASSERT_TRUE(InProcessCluster::Eventually([&] {
    agents.Clear();
    return cluster->ListAgents(InProcessCluster::Ctx().get(), {}, &agents).ok() &&
           agents.agents_size() == 1;
  }));
  EXPECT_EQ(agents.agents(0).id(), "a1");
  EXPECT_EQ(agents.agents(0).state(), v1::AGENT_STATE_ACTIVE);
  EXPECT_EQ(agents.agents(0).slots(), 3);
  EXPECT_EQ(agents.agents(0).labels().at("zone"), "a");

  v1::DrainAgentRequest drain;
  drain.set_id("a1");
  v1::Agent drained;
  ASSERT_TRUE(cluster->DrainAgent(InProcessCluster::Ctx().get(), drain, &drained).ok());
  EXPECT_EQ(drained.state(), v1::AGENT_STATE_DRAINING);
  ASSERT_TRUE(c.Submit({BuiltinSpec("waits", "noop")}).ok());
  absl::SleepFor(absl::Milliseconds(300));
  v1::Task t = c.Get("waits");
  EXPECT_EQ(t.state(), v1::TASK_STATE_PENDING) << "a draining agent gets no work";
  EXPECT_THAT(t.reason(), HasSubstr("draining"));

  v1::ClusterStats stats;
  ASSERT_TRUE(cluster->GetClusterStats(InProcessCluster::Ctx().get(), {}, &stats).ok());
  EXPECT_EQ(stats.agents_draining(), 1);
  EXPECT_EQ(stats.slots_total(), 3);
  EXPECT_EQ(stats.tasks().at("PENDING"), 1);

  drain.set_id("ghost");
  grpc::Status s = cluster->DrainAgent(InProcessCluster::Ctx().get(), drain, &drained);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(Scheduler, ScheduleTimeoutExpiresAnUnplaceableTask) {
  InProcessCluster c;
  v1::TaskSpec s = BuiltinSpec("nowhere", "noop");
  (*s.mutable_placement()->mutable_required_labels())["gpu"] = "1";
  s.mutable_schedule_timeout()->set_nanos(300'000'000);
  ASSERT_TRUE(c.Submit({s}).ok());
  v1::Task t = c.WaitFor("nowhere", v1::TASK_STATE_FAILED);
  EXPECT_THAT(t.reason(), HasSubstr("expired before start"));
}

TEST(Scheduler, TheSchedulersOutputCapBoundsWhatAgentsKeep) {
  engine::EngineOptions o = InProcessCluster::DefaultOptions();
  o.scheduler.max_output_bytes = 10;
  InProcessCluster c(o);
  c.AddAgent("a1", 1);  // its own cap is the default 64 KiB
  ASSERT_TRUE(c.Submit({ExecSpec("chatty", {"/bin/sh", "-c", "echo 0123456789abcdefghij"})}).ok());
  v1::Task t = c.WaitFor("chatty", v1::TASK_STATE_SUCCEEDED);
  EXPECT_LE(t.result().stdout_tail().size(), 10u);
  EXPECT_EQ(t.result().stdout_tail(), "bcdefghij\n") << "the last 10 bytes";
  EXPECT_EQ(t.result().stdout_cut_bytes(), 11) << "0123456789a";
}

}  // namespace
}  // namespace taskgrid::testing
