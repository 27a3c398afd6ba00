// The dashboard's JSON API against an Engine on a MemoryStore with a fake
// clock and a fake agent, through a real HttpServer on a loopback socket:
// the JSON of each endpoint (parsed back into its gRPC message and
// compared with what the Engine answers), paging and filters, every bad
// input (400, 404, 409, and nothing changed), the action header, the Host
// check, roles from MethodRoles() (401, 403, OK), 404 and 405, the static
// files, and 503 from a stopped Engine. No sleeping: each request waits
// for its answer.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "scheduler/engine/engine.h"
#include "scheduler/http/api.h"
#include "scheduler/http/dashboard.h"
#include "scheduler/http/rpc.h"
#include "scheduler/service/tokens.h"
#include "scheduler/store/memory_store.h"
#include "tests/testing/fake_agent_channel.h"

namespace taskgrid::http {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kReader[] = "reader-token-0123456789";
constexpr char kSubmitter[] = "submitter-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789";

// Whether `cond` came true within a minute (real time: it waits for the
// server's threads, not for the fake clock).
template <typename Cond>
bool WaitFor(Cond cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

template <typename T>
T FromJson(const std::string& json) {
  T m;
  auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s << " in " << json;
  return m;
}

// {"code", "message"} of an error body.
struct Error {
  std::string code;
  std::string message;
};
Error ErrorOf(const std::string& json) {
  // The error body is a flat object of two strings: read it as a Struct.
  google::protobuf::Struct st;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &st).ok()) << json;
  EXPECT_EQ(st.fields().size(), 2u) << json;
  return {st.fields().at("code").string_value(), st.fields().at("message").string_value()};
}

class WebApiTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(nullptr); }

  void Start(const service::ReloadableTokens* tokens) {
    engine::EngineOptions opts;
    opts.tick_interval = absl::Hours(1);  // time moves only with the fake clock
    engine_ = std::make_unique<engine::Engine>(&store_, &clock_, opts);
    ASSERT_TRUE(engine_->Start().ok());
    conn_ = engine_->AttachAgent(channel_);
    v1::Hello h;
    h.set_agent_id("a1");
    h.set_slots(1);
    h.set_undrain(true);
    (*h.mutable_labels())["zone"] = "eu";
    ASSERT_TRUE(engine_->AgentHello(conn_, h).ok());
    engine_->Sync();
    server_ = std::make_unique<HttpServer>();
    Api::Options api_opts{tokens, "127.0.0.1", {"head.example"}};
    api_opts.output_wait = absl::Minutes(1);  // the test's fake agent answers
    api_ = std::make_unique<Api>(engine_.get(), api_opts);
    api_->Register(server_.get());
    AddDashboard(server_.get());
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    client_->set_read_timeout(30, 0);
  }

  void TearDown() override {
    if (server_) server_->Stop();
  }

  void Submit(const std::string& queue, const std::vector<std::string>& ids,
              int32_t max_attempts = 1) {
    v1::SubmitTasksRequest req;
    for (const std::string& id : ids) {
      v1::TaskSpec* s = req.add_tasks();
      s->set_id(id);
      s->set_queue(queue);
      s->set_max_attempts(max_attempts);
      s->add_steps()->mutable_builtin()->set_name("noop");
    }
    std::promise<absl::Status> done;
    engine_->SubmitTasks(
        req, [&](absl::StatusOr<v1::SubmitTasksResponse> r) { done.set_value(r.status()); });
    ASSERT_TRUE(done.get_future().get().ok());
  }

  void SubmitJob(const std::string& job, const std::vector<std::pair<std::string, std::string>>&
                                             tasks /* id, the one it depends on or "" */) {
    v1::SubmitJobRequest req;
    req.set_job_id(job);
    for (const auto& [id, dep] : tasks) {
      v1::TaskSpec* s = req.add_tasks();
      s->set_id(id);
      s->set_queue("jobs");
      s->set_max_attempts(1);
      s->add_steps()->mutable_builtin()->set_name("noop");
      if (!dep.empty()) s->add_depends_on(dep);
    }
    std::promise<absl::Status> done;
    engine_->SubmitJob(req, [&](absl::StatusOr<v1::Job> r) { done.set_value(r.status()); });
    ASSERT_TRUE(done.get_future().get().ok());
  }

  // The agent runs the attempt and reports how it ended.
  void Finish(const std::string& id, int32_t attempt, v1::Outcome outcome) {
    v1::AgentMessage accept;
    accept.mutable_accept()->set_task_id(id);
    accept.mutable_accept()->set_attempt(attempt);
    engine_->AgentMessage(conn_, accept);
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(outcome);
    m.mutable_result()->mutable_result()->set_exit_code(outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
    engine_->AgentMessage(conn_, m);
    engine_->Sync();
  }

  template <typename T, typename Call>
  T Direct(Call call) {
    std::promise<absl::StatusOr<T>> p;
    call([&](absl::StatusOr<T> r) { p.set_value(std::move(r)); });
    absl::StatusOr<T> r = p.get_future().get();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : T();
  }

  v1::Task Task(const std::string& id) {
    v1::GetTaskRequest req;
    req.set_id(id);
    return Direct<v1::Task>([&](auto reply) { engine_->GetTask(req, std::move(reply)); });
  }

  httplib::Headers Headers(const std::string& token = "", bool action = false) {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    if (action) h.emplace(kActionHeader, kActionHeaderValue);
    return h;
  }

  httplib::Result Get(const std::string& path, const std::string& token = "") {
    return client_->Get(path, Headers(token));
  }
  // A call of the JSON API as a client sends it: POST, a JSON body.
  httplib::Result Call(const std::string& path, const std::string& body,
                       const std::string& token = "") {
    return client_->Post(path, Headers(token), body, "application/json");
  }

  // GET /api/v1/tasks?query: the page's ids and its total_size ({}, -1
  // when it did not answer 200).
  std::pair<std::vector<std::string>, int64_t> ListIds(const std::string& query) {
    auto res = Get("/api/v1/tasks?" + query);
    EXPECT_TRUE(res);
    if (!res) return {{}, -1};
    EXPECT_EQ(res->status, 200) << res->body;
    const auto page = FromJson<v1::ListTasksResponse>(res->body);
    std::vector<std::string> ids;
    for (const v1::Task& t : page.tasks()) ids.push_back(t.spec().id());
    return {ids, page.total_size()};
  }

  // The OpenAPI document the server serves.
  google::protobuf::Struct Document() {
    auto res = Get("/api/v1/openapi.json");
    EXPECT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    google::protobuf::Struct doc;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(res->body, &doc).ok());
    return doc;
  }

  // An action as the page sends it: POST, the action header, an empty body.
  httplib::Result Act(const std::string& path, const std::string& token = "") {
    return client_->Post(path, Headers(token, /*action=*/true), "", "text/plain");
  }

  FakeClock clock_{absl::FromUnixSeconds(1'800'000'000)};
  store::MemoryStore store_;
  std::shared_ptr<testing::FakeAgentChannel> channel_ =
      std::make_shared<testing::FakeAgentChannel>();
  std::unique_ptr<engine::Engine> engine_;
  uint64_t conn_ = 0;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<Api> api_;
  std::unique_ptr<httplib::Client> client_;
  int port_ = 0;
};

TEST_F(WebApiTest, QueuesAreTheGetQueueStatsMessage) {
  Submit("mail", {"m1", "m2", "m3"});  // one slot: m1 dispatched, m2 and m3 wait
  clock_.Advance(absl::Seconds(42));
  auto res = Get("/api/v1/queues");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(res->get_header_value("Cache-Control"), "no-store");
  // The proto field names, every scalar printed.
  for (const char* field : {"\"queue\":\"mail\"", "\"max_length\"", "\"oldest_pending_time\"",
                            "\"held\":false", "\"PENDING\":\"2\""}) {
    EXPECT_THAT(res->body, HasSubstr(field));
  }
  const auto got = FromJson<v1::GetQueueStatsResponse>(res->body);
  const auto want = Direct<v1::GetQueueStatsResponse>(
      [&](auto reply) { engine_->GetQueueStats({}, std::move(reply)); });
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
      << got.DebugString() << "\nvs\n"
      << want.DebugString();
  ASSERT_EQ(got.queues_size(), 1);
  EXPECT_EQ(got.queues(0).length(), 3);
  // The backlog's age: m2 was submitted at the fake clock's start.
  EXPECT_EQ(got.queues(0).oldest_pending_time().seconds(), 1'800'000'000);

  auto one = Get("/api/v1/queues?queue=mail");
  ASSERT_TRUE(one);
  EXPECT_EQ(FromJson<v1::GetQueueStatsResponse>(one->body).queues_size(), 1);
}

TEST_F(WebApiTest, TasksArePagedAndFiltered) {
  Submit("q1", {"t1", "t2", "t3", "t4", "t5"});
  Submit("q2", {"u1", "u2"});
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto res =
        Get("/api/v1/tasks?queue=q1&page_size=2" + (token.empty() ? "" : "&page_token=" + token));
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const auto page = FromJson<v1::ListTasksResponse>(res->body);
    EXPECT_LE(page.tasks_size(), 2);
    for (const v1::Task& t : page.tasks()) seen.push_back(t.spec().id());
    token = page.next_page_token();
    ASSERT_LT(++pages, 10);
  } while (!token.empty());
  EXPECT_EQ(seen, (std::vector<std::string>{"t1", "t2", "t3", "t4", "t5"}));

  // t1 holds the agent's one slot: the rest are PENDING.
  auto pending = Get("/api/v1/tasks?state=pending,SCHEDULED&state=TASK_STATE_PAUSED");
  ASSERT_TRUE(pending);
  const auto p = FromJson<v1::ListTasksResponse>(pending->body);
  ASSERT_EQ(p.tasks_size(), 6);
  for (const v1::Task& t : p.tasks()) EXPECT_EQ(t.state(), v1::TASK_STATE_PENDING);
  EXPECT_THAT(pending->body, HasSubstr("\"state\":\"TASK_STATE_PENDING\""));

  SubmitJob("j1", {{"j1-a", ""}, {"j1-b", "j1-a"}});
  auto job = Get("/api/v1/tasks?job=j1");
  ASSERT_TRUE(job);
  const auto j = FromJson<v1::ListTasksResponse>(job->body);
  ASSERT_EQ(j.tasks_size(), 2);
  EXPECT_EQ(j.tasks(1).spec().id(), "j1-b");
  EXPECT_EQ(j.tasks(1).spec().depends_on(0), "j1-a");
  EXPECT_EQ(j.tasks(1).state(), v1::TASK_STATE_BLOCKED);
}

TEST_F(WebApiTest, TasksNewestFirstByIdPrefixWithTheirTotal) {
  Submit("q1", {"red-1", "blue-1", "red-2", "blue-2", "red-3"});
  auto list = [&](const std::string& query) { return ListIds(query); };
  using Ids = std::vector<std::string>;
  EXPECT_EQ(list("newest_first=true&page_size=2"),
            std::make_pair(Ids{"red-3", "blue-2"}, int64_t{5}));
  EXPECT_EQ(list("newest_first=true&id_prefix=red-"),
            std::make_pair(Ids{"red-3", "red-2", "red-1"}, int64_t{3}));
  EXPECT_EQ(list("id_prefix=blue&state=PENDING"),
            std::make_pair(Ids{"blue-1", "blue-2"}, int64_t{2}));
  // A job's tasks newest first, counted.
  SubmitJob("j1", {{"j1-a", ""}, {"j1-b", "j1-a"}, {"j1-c", "j1-b"}});
  EXPECT_EQ(list("job=j1&newest_first=1&page_size=2"),
            std::make_pair(Ids{"j1-c", "j1-b"}, int64_t{3}));
  auto bad = Get("/api/v1/tasks?newest_first=yes");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(ErrorOf(bad->body).message, HasSubstr("newest_first must be true or false"));
}

TEST_F(WebApiTest, TasksByLabelAsAClientSubmitsAndSearchesThem) {
  auto submitted = Call("/api/v1/tasks", R"({"tasks":[
      {"id":"l-red","labels":{"team":"red","run":"7"},"steps":[{"builtin":{"name":"noop"}}]},
      {"id":"l-blue","labels":{"team":"blue","note":"a,b c"},"steps":[{"builtin":{"name":"noop"}}]},
      {"id":"l-none","steps":[{"builtin":{"name":"noop"}}]}]})");
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 200) << submitted->body;
  EXPECT_EQ(Task("l-red").spec().labels().at("team"), "red");
  auto list = [&](const std::string& query) { return ListIds(query); };
  using Ids = std::vector<std::string>;
  EXPECT_EQ(list("label=team%3Dred"), std::make_pair(Ids{"l-red"}, int64_t{1}));
  EXPECT_EQ(list("label=team=red&label=run=7"), std::make_pair(Ids{"l-red"}, int64_t{1}));
  EXPECT_EQ(list("label=team=red&label=run=8"), std::make_pair(Ids{}, int64_t{0}));
  // A value is taken whole: commas and spaces are part of it.
  EXPECT_EQ(list("label=note=a,b%20c"), std::make_pair(Ids{"l-blue"}, int64_t{1}));
  EXPECT_EQ(list("label=note=a"), std::make_pair(Ids{}, int64_t{0}));
  for (const auto& [query, says] : std::vector<std::pair<std::string, std::string>>{
           {"label=team", "label \"team\" is not key=value"},
           {"label=team=red&label=team=blue", "label \"team\" is given twice"},
           {"label=bad%20key=1", "labels.key"},
           {"label=note=" + std::string(300, 'v'), "labels[note] is 300 bytes"}}) {
    SCOPED_TRACE(query);
    auto bad = Get("/api/v1/tasks?" + query);
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_THAT(ErrorOf(bad->body).message, HasSubstr(says));
  }
  auto refused = Call("/api/v1/tasks", R"({"tasks":[{"id":"l-bad","labels":{"k":"a\nb"},
      "steps":[{"builtin":{"name":"noop"}}]}]})");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_THAT(ErrorOf(refused->body).message, HasSubstr("labels[k] holds a control character"));
}

TEST_F(WebApiTest, ATasksOutputIsWhatStreamTaskOutputSendsWithoutFollow) {
  Submit("q", {"out", "waits"});
  v1::AgentMessage accept;
  accept.mutable_accept()->set_task_id("out");
  accept.mutable_accept()->set_attempt(1);
  engine_->AgentMessage(conn_, accept);
  engine_->Sync();
  // Running on an agent that sends no live output: the page says so.
  auto running = Get("/api/v1/tasks/out/output");
  ASSERT_TRUE(running);
  ASSERT_EQ(running->status, 200) << running->body;
  auto snap = FromJson<v1::TaskOutputSnapshot>(running->body);
  ASSERT_GE(snap.messages_size(), 1);
  EXPECT_EQ(snap.messages(0).kind(), v1::StreamTaskOutputResponse::KIND_ATTEMPT_STARTED);
  EXPECT_FALSE(snap.messages(0).note().empty());

  v1::AgentMessage m;
  m.mutable_result()->set_task_id("out");
  m.mutable_result()->set_attempt(1);
  m.mutable_result()->mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  m.mutable_result()->mutable_result()->set_stdout_tail("hello from out\n");
  m.mutable_result()->mutable_result()->set_stderr_tail("a warning\n");
  engine_->AgentMessage(conn_, m);
  engine_->Sync();
  // Finished: the tails its result keeps, then the end.
  auto done = Get("/api/v1/tasks/out/output?stream=stdout");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;
  snap = FromJson<v1::TaskOutputSnapshot>(done->body);
  std::string out;
  for (const auto& msg : snap.messages()) {
    if (msg.kind() == v1::StreamTaskOutputResponse::KIND_OUTPUT) out += msg.data();
  }
  EXPECT_EQ(out, "hello from out\n");  // stdout only
  ASSERT_GE(snap.messages_size(), 1);
  EXPECT_EQ(snap.messages(snap.messages_size() - 1).kind(), v1::StreamTaskOutputResponse::KIND_END);

  auto unknown = Get("/api/v1/tasks/nope/output");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  auto bad = Get("/api/v1/tasks/out/output?stream=both");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(ErrorOf(bad->body).message, HasSubstr("stream must be stdout or stderr"));
}

TEST_F(WebApiTest, ARunningTasksOutputIsAskedOfItsAgent) {
  Submit("q", {"busy"});  // a1's one slot
  auto live = std::make_shared<testing::FakeAgentChannel>();
  const uint64_t conn = engine_->AttachAgent(live);
  v1::Hello h;
  h.set_agent_id("a2");
  h.set_slots(1);
  h.set_live_output(true);
  ASSERT_TRUE(engine_->AgentHello(conn, h).ok());
  engine_->Sync();
  Submit("q", {"talks"});
  v1::AgentMessage accept;
  accept.mutable_accept()->set_task_id("talks");
  accept.mutable_accept()->set_attempt(1);
  engine_->AgentMessage(conn, accept);
  engine_->Sync();
  ASSERT_EQ(Task("talks").agent_id(), "a2");
  // The GET waits for the agent's answer to the scheduler's WatchOutput.
  auto got = std::async(std::launch::async, [&] { return Get("/api/v1/tasks/talks/output"); });
  auto asked = [&] {
    for (const v1::SchedulerMessage& m : live->sent()) {
      if (m.has_watch_output() && m.watch_output().watch()) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(asked));
  for (const auto& [stream, offset, data, last] :
       {std::make_tuple(v1::OUTPUT_STREAM_STDOUT, 0, "line 1\n", false),
        std::make_tuple(v1::OUTPUT_STREAM_STDERR, 0, "oops\n", false),
        std::make_tuple(v1::OUTPUT_STREAM_STDOUT, 7, "line 2\n", true)}) {
    v1::AgentMessage m;
    v1::TaskOutput* o = m.mutable_output();
    o->set_task_id("talks");
    o->set_attempt(1);
    o->set_stream(stream);
    o->set_offset(offset);
    o->set_data(data);
    o->set_caught_up(last);
    engine_->AgentMessage(conn, m);
  }
  auto res = got.get();
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto snap = FromJson<v1::TaskOutputSnapshot>(res->body);
  std::string out, err;
  for (const auto& msg : snap.messages()) {
    if (msg.kind() != v1::StreamTaskOutputResponse::KIND_OUTPUT) continue;
    (msg.stream() == v1::OUTPUT_STREAM_STDERR ? err : out) += msg.data();
  }
  EXPECT_EQ(out, "line 1\nline 2\n");
  EXPECT_EQ(err, "oops\n");
  EXPECT_EQ(snap.messages(0).kind(), v1::StreamTaskOutputResponse::KIND_ATTEMPT_STARTED);
  EXPECT_EQ(snap.messages(0).agent_id(), "a2");
  EXPECT_EQ(snap.messages(snap.messages_size() - 1).kind(), v1::StreamTaskOutputResponse::KIND_END);
}

TEST_F(WebApiTest, QueuesCarryTheirLastHourWhenAsked) {
  Submit("hist", {"h1"});
  engine_->TickNow();
  auto plain = Get("/api/v1/queues?queue=hist");
  ASSERT_TRUE(plain);
  EXPECT_EQ(FromJson<v1::GetQueueStatsResponse>(plain->body).queues(0).history_size(), 0);
  Finish("h1", 1, v1::OUTCOME_FAILED);
  auto with = Get("/api/v1/queues?queue=hist&history=true");
  ASSERT_TRUE(with);
  ASSERT_EQ(with->status, 200) << with->body;
  const auto stats = FromJson<v1::GetQueueStatsResponse>(with->body);
  ASSERT_EQ(stats.queues(0).history_size(), 1);
  EXPECT_EQ(stats.queues(0).history(0).failed(), 1);
  auto bad = Get("/api/v1/queues?history=maybe");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST_F(WebApiTest, ATaskIsTheGetTaskMessage) {
  Submit("q", {"t1"});
  auto res = Get("/api/v1/tasks/t1");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(FromJson<v1::Task>(res->body),
                                                                 Task("t1")));
  EXPECT_THAT(res->body, HasSubstr("\"attempts_used\":1"));
  EXPECT_THAT(res->body, HasSubstr("\"agent_id\":\"a1\""));
}

TEST_F(WebApiTest, JobsAgentsAndClusterAreTheirMessages) {
  SubmitJob("j1", {{"j1-a", ""}, {"j1-b", "j1-a"}});
  auto list = Get("/api/v1/jobs?state=running&page_size=10");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200) << list->body;
  const auto jobs = FromJson<v1::ListJobsResponse>(list->body);
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).task_count(), 2);
  SubmitJob("j2", {{"j2-a", ""}});
  SubmitJob("j3", {{"j3-a", ""}});
  std::vector<std::string> ids;
  std::string token;
  for (int pages = 0; pages < 10; ++pages) {
    auto page = Get("/api/v1/jobs?page_size=2" + (token.empty() ? "" : "&page_token=" + token));
    ASSERT_TRUE(page);
    ASSERT_EQ(page->status, 200) << page->body;
    const auto p = FromJson<v1::ListJobsResponse>(page->body);
    EXPECT_LE(p.jobs_size(), 2);
    for (const v1::Job& j : p.jobs()) ids.push_back(j.id());
    token = p.next_page_token();
    if (token.empty()) break;
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"j1", "j2", "j3"}));
  auto job = Get("/api/v1/jobs/j1");
  ASSERT_TRUE(job);
  EXPECT_EQ(FromJson<v1::Job>(job->body).state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(job->body, HasSubstr("\"task_count\":2"));

  auto agents = Get("/api/v1/agents");
  ASSERT_TRUE(agents);
  const auto a = FromJson<v1::ListAgentsResponse>(agents->body);
  ASSERT_EQ(a.agents_size(), 1);
  EXPECT_EQ(a.agents(0).id(), "a1");
  EXPECT_EQ(a.agents(0).slots(), 1);
  EXPECT_EQ(a.agents(0).slots_used(), 1);  // j1-a
  EXPECT_EQ(a.agents(0).labels().at("zone"), "eu");
  EXPECT_THAT(agents->body, HasSubstr("\"slots_used\":1"));

  auto cluster = Get("/api/v1/cluster");
  ASSERT_TRUE(cluster);
  const auto c = FromJson<v1::ClusterStats>(cluster->body);
  EXPECT_EQ(c.agents_active(), 1);
  EXPECT_EQ(c.slots_total(), 1);
  EXPECT_EQ(c.tasks().at("BLOCKED"), 1);
}

TEST_F(WebApiTest, ActionsChangeStateThroughTheEngine) {
  SubmitJob("j1", {{"j1-a", ""}, {"j1-b", "j1-a"}});
  Finish("j1-a", 1, v1::OUTCOME_FAILED);  // j1-b is cancelled with it
  ASSERT_EQ(Task("j1-b").state(), v1::TASK_STATE_CANCELLED);
  auto job_retry = Act("/api/v1/jobs/j1/retry");
  ASSERT_TRUE(job_retry);
  ASSERT_EQ(job_retry->status, 200) << job_retry->body;
  EXPECT_EQ(FromJson<v1::Job>(job_retry->body).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Task("j1-b").state(), v1::TASK_STATE_BLOCKED);
  auto job_cancel = Act("/api/v1/jobs/j1/cancel");
  ASSERT_EQ(job_cancel->status, 200) << job_cancel->body;
  EXPECT_EQ(Task("j1-b").state(), v1::TASK_STATE_CANCELLED);

  Submit("q", {"t1"});  // the slot is j1-a's until its agent confirms the cancel
  auto cancel = Act("/api/v1/tasks/t1/cancel");
  ASSERT_TRUE(cancel);
  ASSERT_EQ(cancel->status, 200) << cancel->body;
  EXPECT_EQ(FromJson<v1::Task>(cancel->body).state(), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_CANCELLED);
  auto retry = Act("/api/v1/tasks/t1/retry");
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->status, 200);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  ASSERT_EQ(Act("/api/v1/tasks/t1/pause")->status, 200);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PAUSED);
  ASSERT_EQ(Act("/api/v1/tasks/t1/resume")->status, 200);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  ASSERT_EQ(Act("/api/v1/tasks/t1/cancel")->status, 200);
  ASSERT_EQ(Act("/api/v1/tasks/t1/reset")->status, 200);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  // Delete: refused while unfinished (409, nothing changed), then done.
  auto refused = Act("/api/v1/tasks/t1/delete");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("cancel it first"));
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  ASSERT_EQ(Act("/api/v1/tasks/t1/cancel")->status, 200);
  auto deleted = Act("/api/v1/tasks/t1/delete");
  ASSERT_TRUE(deleted);
  ASSERT_EQ(deleted->status, 200) << deleted->body;
  EXPECT_THAT(FromJson<v1::DeleteTaskResponse>(deleted->body).ids(), ElementsAre("t1"));
  EXPECT_EQ(Get("/api/v1/tasks/t1")->status, 404);

  auto pause = Act("/api/v1/queues/q/pause");
  ASSERT_TRUE(pause);
  ASSERT_EQ(pause->status, 200) << pause->body;
  EXPECT_TRUE(FromJson<v1::QueueStats>(pause->body).settings().paused());
  auto resume = Act("/api/v1/queues/q/resume");
  ASSERT_EQ(resume->status, 200) << resume->body;
  EXPECT_FALSE(FromJson<v1::QueueStats>(resume->body).settings().paused());

  auto drain = Act("/api/v1/agents/a1/drain");
  ASSERT_EQ(drain->status, 200) << drain->body;
  EXPECT_EQ(FromJson<v1::Agent>(drain->body).state(), v1::AGENT_STATE_DRAINING);
  auto undrain = Act("/api/v1/agents/a1/undrain");
  ASSERT_EQ(undrain->status, 200) << undrain->body;
  EXPECT_EQ(FromJson<v1::Agent>(undrain->body).state(), v1::AGENT_STATE_ACTIVE);
}

// Each bad request: its status, the code, what the message names, and
// that no task changed.
TEST_F(WebApiTest, BadInputIsAClearErrorAndChangesNothing) {
  Submit("q", {"busy", "t1"});
  struct Case {
    const char* method;
    std::string path;
    int status;
    const char* code;
    const char* names;
  };
  const std::vector<Case> cases = {
      {"GET", "/api/v1/tasks?state=bogus", 400, "INVALID_ARGUMENT", "state \"bogus\""},
      {"GET", "/api/v1/tasks?page_size=0", 400, "INVALID_ARGUMENT", "page_size"},
      {"GET", "/api/v1/tasks?page_size=1001", 400, "INVALID_ARGUMENT", "page_size"},
      {"GET", "/api/v1/tasks?page_size=ten", 400, "INVALID_ARGUMENT", "page_size"},
      {"GET", "/api/v1/tasks?page_token=xyz", 400, "INVALID_ARGUMENT", "page_token"},
      {"GET", "/api/v1/tasks?queue=no%20spaces", 400, "INVALID_ARGUMENT", "queue"},
      {"GET", "/api/v1/tasks?job=a/b", 400, "INVALID_ARGUMENT", "job"},
      {"GET", "/api/v1/tasks?sate=PENDING", 400, "INVALID_ARGUMENT", "\"sate\""},
      {"GET", "/api/v1/queues?queue=x%2Fy", 400, "INVALID_ARGUMENT", "queue"},
      {"GET", "/api/v1/jobs?state=PENDING", 400, "INVALID_ARGUMENT", "not a job state"},
      {"GET", "/api/v1/jobs?page_size=-1", 400, "INVALID_ARGUMENT", "page_size"},
      {"GET", "/api/v1/tasks/nope", 404, "NOT_FOUND", "nope"},
      {"GET", "/api/v1/jobs/nope", 404, "NOT_FOUND", "nope"},
      {"GET", "/api/v1/agents?x=1", 400, "INVALID_ARGUMENT", "\"x\""},
      {"POST", "/api/v1/tasks/nope/cancel", 404, "NOT_FOUND", "nope"},
      {"POST", "/api/v1/tasks/t1/retry", 409, "FAILED_PRECONDITION", "t1"},
      {"POST", "/api/v1/tasks/t1/resume", 409, "FAILED_PRECONDITION", "t1"},
      {"POST", "/api/v1/tasks/t1/cancel?now=1", 400, "INVALID_ARGUMENT", "takes none"},
      {"POST", "/api/v1/jobs/nope/retry", 404, "NOT_FOUND", "nope"},
      {"POST", "/api/v1/agents/nope/drain", 404, "NOT_FOUND", "nope"},
      {"POST", "/api/v1/queues/no%20space/pause", 400, "INVALID_ARGUMENT", "queue"},
  };
  const v1::Task before = Task("t1");
  for (const Case& c : cases) {
    auto res = std::string(c.method) == "GET" ? Get(c.path) : Act(c.path);
    ASSERT_TRUE(res) << c.path;
    EXPECT_EQ(res->status, c.status) << c.method << " " << c.path << ": " << res->body;
    const Error e = ErrorOf(res->body);
    EXPECT_EQ(e.code, c.code) << c.path;
    EXPECT_THAT(e.message, HasSubstr(c.names)) << c.path;
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json") << c.path;
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, Task("t1")));
  auto queues = Get("/api/v1/queues");
  EXPECT_FALSE(FromJson<v1::GetQueueStatsResponse>(queues->body).queues(0).settings().paused());
}

TEST_F(WebApiTest, AnActionNeedsItsHeader) {
  Submit("q", {"busy", "t1"});
  for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{kActionHeader, "0"}}}) {
    auto res = client_->Post("/api/v1/tasks/t1/cancel", h, "", "application/x-www-form-urlencoded");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 403);
    const Error e = ErrorOf(res->body);
    EXPECT_EQ(e.code, "PERMISSION_DENIED");
    EXPECT_THAT(e.message, HasSubstr("X-Taskgrid-Request: 1"));
    EXPECT_THAT(e.message, HasSubstr("Content-Type: application/json"));
  }
  // Nor a text body of the kind a form or a simple cross-site request sends.
  for (const char* type : {"text/plain", "multipart/form-data; boundary=x", "application/jsonx"}) {
    auto res = client_->Post("/api/v1/TaskService/CancelTask", R"({"id":"t1"})", type);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 403) << type;
  }
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  // A GET of an action's path is no way around it.
  auto get = Get("/api/v1/tasks/t1/cancel");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
}

TEST_F(WebApiTest, TheHostMustNameThisScheduler) {
  Submit("q", {"busy", "t1"});
  for (const char* host : {"evil.example", "evil.example:8080", "127.0.0.1.evil.example",
                           "localhost.evil.example", "unix:80", "::1", "[::1", ""}) {
    httplib::Headers h = Headers("", true);
    h.emplace("Host", host);
    auto get = client_->Get("/api/v1/queues", h);
    ASSERT_TRUE(get) << host;
    EXPECT_EQ(get->status, 403) << host;
    EXPECT_THAT(ErrorOf(get->body).message, HasSubstr("is not a name of this scheduler")) << host;
    auto post = client_->Post("/api/v1/tasks/t1/cancel", h, "", "text/plain");
    ASSERT_TRUE(post) << host;
    EXPECT_EQ(post->status, 403) << host;
  }
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  for (const char* host : {"127.0.0.1", "127.0.0.1:9", "localhost:9", "LOCALHOST", "[::1]:9",
                           "127.1.2.3:9", "head.example", "Head.Example:443"}) {
    httplib::Headers h;
    h.emplace("Host", host);
    auto res = client_->Get("/api/v1/queues", h);
    ASSERT_TRUE(res) << host;
    EXPECT_EQ(res->status, 200) << host << ": " << res->body;
  }
}

TEST_F(WebApiTest, UnknownPathsAndMethodsAreJsonErrors) {
  auto missing = Get("/api/v1/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(ErrorOf(missing->body).code, "NOT_FOUND");
  auto post_list = Act("/api/v1/cluster");
  ASSERT_TRUE(post_list);
  EXPECT_EQ(post_list->status, 405);
  EXPECT_EQ(post_list->get_header_value("Allow"), "GET, HEAD");
  EXPECT_THAT(ErrorOf(post_list->body).message, HasSubstr("takes GET, HEAD, not POST"));
  auto del = client_->Delete("/api/v1/tasks/t1");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto page = Get("/nope.js");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 404);
  EXPECT_THAT(page->body, StartsWith("not found"));
}

// Every unary call of the five client services is a route, documented as
// the gRPC method it stands for.
TEST_F(WebApiTest, EveryCallOfTheClientServicesIsARoute) {
  const google::protobuf::Struct doc = Document();
  const auto& paths = doc.fields().at("paths").struct_value().fields();
  int methods = 0;
  for (const std::string& name : RpcServiceNames()) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const auto* m = service->method(i);
      if (m->server_streaming()) continue;  // WatchTasks, StreamTaskOutput: gRPC only
      ++methods;
      const std::string path = "/api/v1/" + service->name() + "/" + m->name();
      ASSERT_TRUE(paths.count(path)) << path;
      const auto& op = paths.at(path).struct_value().fields().at("post").struct_value().fields();
      EXPECT_EQ(op.at("x-grpc-method").string_value(),
                "/" + service->full_name() + "/" + m->name());
      EXPECT_EQ(op.at("requestBody")
                    .struct_value()
                    .fields()
                    .at("content")
                    .struct_value()
                    .fields()
                    .at("application/json")
                    .struct_value()
                    .fields()
                    .at("schema")
                    .struct_value()
                    .fields()
                    .at("$ref")
                    .string_value(),
                "#/components/schemas/" + m->input_type()->full_name());
    }
  }
  EXPECT_GE(methods, 40);
  // A schema is the proto3 JSON of its message: field names, enums, int64
  // as strings, durations as strings.
  const auto& spec = doc.fields()
                         .at("components")
                         .struct_value()
                         .fields()
                         .at("schemas")
                         .struct_value()
                         .fields()
                         .at("taskgrid.v1.TaskSpec")
                         .struct_value()
                         .fields()
                         .at("properties")
                         .struct_value()
                         .fields();
  EXPECT_EQ(spec.at("id").struct_value().fields().at("type").string_value(), "string");
  EXPECT_EQ(spec.at("steps").struct_value().fields().at("type").string_value(), "array");
  EXPECT_EQ(spec.at("priority").struct_value().fields().at("type").string_value(), "integer");
}

// The document and the routes are the same set, and every documented
// route answers (its own answer, never the router's 404 or 405).
TEST_F(WebApiTest, TheDocumentNamesEveryRouteAndEveryDocumentedRouteAnswers) {
  Submit("q", {"busy"});
  Submit("wq", {"ready1"});  // waits: the one slot is busy's
  const google::protobuf::Struct doc = Document();
  std::set<std::string> documented;
  for (const auto& [path, item] : doc.fields().at("paths").struct_value().fields()) {
    for (const auto& [method, op] : item.struct_value().fields()) {
      documented.insert(absl::AsciiStrToUpper(method) + " " + path);
    }
  }
  std::set<std::string> served;
  for (const std::string& r : server_->Routes()) {
    if (absl::StrContains(r, " /api/")) served.insert(r);
  }
  EXPECT_EQ(documented, served);

  for (const std::string& route : documented) {
    const std::string method = route.substr(0, route.find(' '));
    std::string path = route.substr(route.find(' ') + 1);
    for (const char* param : {"{id}", "{queue}"}) {
      absl::StrReplaceAll({{param, "nothing-here"}}, &path);
    }
    // A long poll that answers at once: the queue has work.
    const std::string body = absl::EndsWith(path, "/WaitForWork") ? R"({"queue":"wq"})" : "{}";
    auto res = method == "GET" ? Get(path) : Call(path, body);
    ASSERT_TRUE(res) << route;
    EXPECT_NE(res->status, 405) << route << ": " << res->body;
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json") << route;
    if (res->status == 404) {
      EXPECT_THAT(ErrorOf(res->body).message, ::testing::Not(StartsWith("not found: /api")))
          << route;
    }
  }
}

// POST /api/v1/tasks submits from JSON; the same task again is the same
// task (idempotent by id); another spec under its id is refused.
TEST_F(WebApiTest, SubmitOverHttpIsIdempotentById) {
  const std::string body =
      R"({"tasks":[{"id":"h1","queue":"hq","steps":[{"exec":{"argv":["echo","hi"]}}],)"
      R"("max_attempts":2}]})";
  auto first = Call("/api/v1/tasks", body);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const auto resp = FromJson<v1::SubmitTasksResponse>(first->body);
  ASSERT_EQ(resp.tasks_size(), 1);
  EXPECT_EQ(resp.tasks(0).spec().id(), "h1");
  EXPECT_EQ(Task("h1").spec().queue(), "hq");
  EXPECT_EQ(Task("h1").spec().steps(0).exec().argv(1), "hi");

  auto again = Call("/api/v1/TaskService/SubmitTasks", body);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200) << again->body;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      FromJson<v1::SubmitTasksResponse>(again->body).tasks(0).create_time(),
      resp.tasks(0).create_time()));

  auto other = Call("/api/v1/tasks",
                    R"({"tasks":[{"id":"h1","queue":"hq","steps":[{"exec":{"argv":["rm"]}}]}]})");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 409) << other->body;
  EXPECT_EQ(ErrorOf(other->body).code, "ALREADY_EXISTS");
  EXPECT_EQ(Task("h1").spec().steps(0).exec().argv(0), "echo");

  auto job = Call("/api/v1/jobs",
                  R"({"job_id":"hj","tasks":[{"id":"hj-a","steps":[{"builtin":{"name":"noop"}}]},)"
                  R"({"id":"hj-b","depends_on":["hj-a"],"steps":[{"builtin":{"name":"noop"}}]}]})");
  ASSERT_TRUE(job);
  ASSERT_EQ(job->status, 200) << job->body;
  EXPECT_EQ(FromJson<v1::Job>(job->body).id(), "hj");
  EXPECT_EQ(Task("hj-b").state(), v1::TASK_STATE_BLOCKED);
}

// Bodies that are not the method's request: 400 naming the message, 413
// past the size cap, and nothing changed.
TEST_F(WebApiTest, ABadBodyIsAClearErrorAndChangesNothing) {
  Submit("q", {"busy", "t1"});
  struct Case {
    std::string path;
    std::string body;
    int status;
    const char* names;
  };
  const std::vector<Case> cases = {
      {"/api/v1/tasks", "{", 400, "not a SubmitTasksRequest in JSON"},
      {"/api/v1/tasks", "[]", 400, "SubmitTasksRequest"},
      {"/api/v1/tasks", "null", 400, "SubmitTasksRequest"},
      {"/api/v1/tasks", R"({"tasks":[{"idd":"x"}]})", 400, "idd"},
      {"/api/v1/tasks", R"({"tasks":[{"id":"x","priority":"high"}]})", 400, "priority"},
      {"/api/v1/tasks", R"({"tasks":[]})", 400, "task"},
      {"/api/v1/tasks", R"({"tasks":[{"id":"x"}]})", 400, "steps"},
      {"/api/v1/tasks", std::string(20000, ' ') + "{}", 413, "too large"},
      {"/api/v1/TaskService/CancelTask", R"({"id":"t1","now":true})", 400, "now"},
      {"/api/v1/TaskService/CancelTask?id=t1", "{}", 400, "takes none"},
      {"/api/v1/TaskService/GetTask", R"({"id":"nope"})", 404, "nope"},
      {"/api/v1/JobService/SubmitJob",
       R"({"job_id":"a b","tasks":[{"id":"y","steps":[{"builtin":{"name":"noop"}}]}]})", 400,
       "job"},
      {"/api/v1/TaskService/WaitTask", R"({"id":"t1","timeout":"soon"})", 400, "timeout"},
      {"/api/v1/tasks/t1/wait?timeout=soon", "", 400, "timeout"},
      {"/api/v1/tasks/t1/wait?timeout=-1s", "", 400, "timeout"},
      {"/api/v1/tasks/t1/wait?until=done", "", 400, "until"},
  };
  const v1::Task before = Task("t1");
  for (const Case& c : cases) {
    auto res = absl::StrContains(c.path, "/wait?") ? Get(c.path) : Call(c.path, c.body);
    ASSERT_TRUE(res) << c.path;
    EXPECT_EQ(res->status, c.status) << c.path << " " << c.body.substr(0, 80) << ": " << res->body;
    EXPECT_THAT(ErrorOf(res->body).message, HasSubstr(c.names)) << c.path;
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, Task("t1")));
  auto list = Get("/api/v1/tasks");
  EXPECT_EQ(FromJson<v1::ListTasksResponse>(list->body).tasks_size(), 2);
}

// A long poll holds its connection, not a thread: other requests are
// answered meanwhile, and it is answered when its task ends.
TEST_F(WebApiTest, WaitIsALongPollAnsweredWhenTheTaskEnds) {
  Submit("q", {"busy"});
  std::vector<std::future<httplib::Result>> waits;
  const int port = port_;
  for (int i = 0; i < 4; ++i) {  // more than the server's event loops
    waits.push_back(std::async(std::launch::async, [port, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(60, 0);
      return i % 2 == 0 ? c.Get("/api/v1/tasks/busy/wait?timeout=60s")
                        : c.Post("/api/v1/TaskService/WaitTask", R"({"id":"busy","timeout":"60s"})",
                                 "application/json");
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return engine_->waiting() == 4; })) << engine_->waiting();
  auto cluster = Get("/api/v1/cluster");
  ASSERT_TRUE(cluster);
  EXPECT_EQ(cluster->status, 200);
  for (auto& w : waits) {
    EXPECT_EQ(w.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  }
  Finish("busy", 1, v1::OUTCOME_SUCCEEDED);
  for (auto& w : waits) {
    httplib::Result res = w.get();
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const auto resp = FromJson<v1::WaitTaskResponse>(res->body);
    EXPECT_TRUE(resp.done());
    EXPECT_EQ(resp.task().state(), v1::TASK_STATE_SUCCEEDED);
  }
  // An ended task is answered at once.
  auto done = Get("/api/v1/tasks/busy/wait");
  ASSERT_TRUE(done);
  EXPECT_TRUE(FromJson<v1::WaitTaskResponse>(done->body).done());
}

// Stopping the server answers a waiting long poll 503, in JSON.
TEST_F(WebApiTest, StoppingAnswersAWaitingLongPoll) {
  Submit("q", {"busy"});
  const int port = port_;
  auto wait = std::async(std::launch::async, [port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c.Get("/api/v1/tasks/busy/wait?timeout=60s");
  });
  ASSERT_TRUE(WaitFor([&] { return engine_->waiting() == 1; })) << engine_->waiting();
  server_->Stop();
  httplib::Result res = wait.get();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(ErrorOf(res->body).code, "UNAVAILABLE");
}

TEST_F(WebApiTest, ServesThePagesFromTheBinary) {
  auto index = Get("/");
  ASSERT_TRUE(index);
  EXPECT_EQ(index->status, 200);
  EXPECT_EQ(index->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_THAT(index->body, HasSubstr("<script src=\"app.js\""));
  EXPECT_THAT(index->get_header_value("Content-Security-Policy"),
              HasSubstr("frame-ancestors 'none'"));
  EXPECT_EQ(index->get_header_value("X-Frame-Options"), "DENY");
  EXPECT_EQ(Get("/index.html")->body, index->body);
  for (const auto& [path, type, text] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"/app.js", "text/javascript; charset=utf-8", "X-Taskgrid-Request"},
           {"/dag.js", "text/javascript; charset=utf-8", "TaskgridDag"},
           {"/style.css", "text/css; charset=utf-8", ".badge"}}) {
    auto res = Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_EQ(res->get_header_value("Content-Type"), type) << path;
    EXPECT_THAT(res->body, HasSubstr(text)) << path;
  }
}

TEST_F(WebApiTest, AStoppedEngineIsUnavailable) {
  engine_->Stop();
  auto res = Get("/api/v1/queues");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(ErrorOf(res->body).code, "UNAVAILABLE");
}

TEST(WebApiStatus, GrpcCodesMapToHttp) {
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kOutOfRange), 400);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kFailedPrecondition), 409);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kAborted), 409);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(Api::HttpStatus(absl::StatusCode::kInternal), 500);
  const Response r = Api::ErrorResponse(absl::UnauthenticatedError("who \"are\" you"));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body, R"({"code":"UNAUTHENTICATED","message":"who \"are\" you"})");
}

class WebApiRolesTest : public WebApiTest {
 protected:
  void SetUp() override {
    auto tokens =
        service::TokenTable::Parse(std::string("ann reader ") + kReader + "\nsam submitter " +
                                       kSubmitter + "\nroot admin " + kAdmin + "\n",
                                   "tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    tokens_ = std::make_unique<service::ReloadableTokens>("tokens", std::move(*tokens));
    Start(tokens_.get());
  }
  std::unique_ptr<service::ReloadableTokens> tokens_;
};

TEST_F(WebApiRolesTest, EveryCallNeedsAKnownToken) {
  for (const std::string& token : {std::string(), std::string("not-a-token-0123456789")}) {
    auto res = Get("/api/v1/queues", token);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    EXPECT_EQ(ErrorOf(res->body).code, "UNAUTHENTICATED");
    EXPECT_EQ(res->get_header_value("WWW-Authenticate"), "Bearer realm=\"taskgrid\"");
  }
  auto basic = client_->Get("/api/v1/queues", {{"Authorization", "Basic YWxhZGRpbjpvcGVu"}});
  ASSERT_TRUE(basic);
  EXPECT_EQ(basic->status, 401);
  // The pages themselves hold no data, and load without a token.
  EXPECT_EQ(Get("/")->status, 200);
}

// The API checks each request with the tokens' current table, so a
// reloaded file applies to the next request, on the same connection too.
TEST_F(WebApiRolesTest, AReloadedTableAppliesToTheNextRequest) {
  const std::string fresh = "fresh-token-0123456789";
  EXPECT_EQ(Get("/api/v1/queues", fresh)->status, 401);
  EXPECT_EQ(Get("/api/v1/queues", kReader)->status, 200);
  auto table = service::TokenTable::Parse("nia reader " + fresh + "\n", "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  tokens_->Replace(std::move(*table));
  EXPECT_EQ(Get("/api/v1/queues", fresh)->status, 200);
  auto removed = Get("/api/v1/queues", kReader);
  EXPECT_EQ(removed->status, 401);
  EXPECT_EQ(ErrorOf(removed->body).code, "UNAUTHENTICATED");
}

// Every endpoint needs the role of its gRPC method in MethodRoles(): the
// reader may call exactly those that need reader, the submitter those
// that need reader or submitter, the admin all of them.
TEST_F(WebApiRolesTest, EachEndpointNeedsTheRoleOfItsMethod) {
  Submit("q", {"busy", "t1"});
  SubmitJob("j1", {{"j1-a", ""}});
  struct Endpoint {
    bool post;
    std::string path;
    std::string method;
  };
  const std::vector<Endpoint> endpoints = {
      {false, "/api/v1/queues", "TaskService/GetQueueStats"},
      {false, "/api/v1/tasks", "TaskService/ListTasks"},
      {false, "/api/v1/tasks/t1", "TaskService/GetTask"},
      {false, "/api/v1/tasks/t1/output", "TaskService/StreamTaskOutput"},
      {false, "/api/v1/jobs", "JobService/ListJobs"},
      {false, "/api/v1/jobs/j1", "JobService/GetJob"},
      {false, "/api/v1/agents", "ClusterService/ListAgents"},
      {false, "/api/v1/cluster", "ClusterService/GetClusterStats"},
      {true, "/api/v1/tasks/t1/pause", "TaskService/PauseTask"},
      {true, "/api/v1/tasks/t1/resume", "TaskService/ResumeTask"},
      {true, "/api/v1/tasks/t1/cancel", "TaskService/CancelTask"},
      {true, "/api/v1/tasks/t1/retry", "TaskService/RetryTask"},
      {true, "/api/v1/tasks/t1/reset", "TaskService/ResetTask"},
      {true, "/api/v1/tasks/t1/delete", "TaskService/DeleteTask"},
      {true, "/api/v1/jobs/j1/cancel", "JobService/CancelJob"},
      {true, "/api/v1/jobs/j1/retry", "JobService/RetryJob"},
      {true, "/api/v1/queues/q/pause", "TaskService/PauseQueue"},
      {true, "/api/v1/queues/q/resume", "TaskService/ResumeQueue"},
      {true, "/api/v1/agents/a1/drain", "ClusterService/DrainAgent"},
      {true, "/api/v1/agents/a1/undrain", "ClusterService/UndrainAgent"},
  };
  const std::vector<std::tuple<std::string, std::string, service::Role>> principals = {
      {"ann", kReader, service::Role::kReader},
      {"sam", kSubmitter, service::Role::kSubmitter},
      {"root", kAdmin, service::Role::kAdmin}};
  for (const auto& [name, token, role] : principals) {
    for (const Endpoint& e : endpoints) {
      const std::string full = "/taskgrid.v1." + e.method;
      ASSERT_TRUE(service::MethodRoles().count(full)) << full;
      const service::Role needed = service::MethodRoles().at(full);
      auto res = e.post ? Act(e.path, token) : Get(e.path, token);
      ASSERT_TRUE(res);
      if (service::Grants(role, needed)) {
        // Allowed: whatever the state makes of it, never a refusal for the role.
        EXPECT_NE(res->status, 403) << name << " " << e.path << ": " << res->body;
        EXPECT_NE(res->status, 401) << name << " " << e.path;
      } else {
        EXPECT_EQ(res->status, 403) << name << " " << e.path << ": " << res->body;
        const Error err = ErrorOf(res->body);
        EXPECT_EQ(err.code, "PERMISSION_DENIED");
        EXPECT_THAT(err.message, HasSubstr(name)) << e.path;
        EXPECT_THAT(err.message, HasSubstr("needs role " + service::RoleName(needed))) << e.path;
      }
    }
  }
}

// Every documented route needs the role of its gRPC method, and a board
// call acts only as the owner its token may act as.
TEST_F(WebApiRolesTest, EveryDocumentedRouteNeedsTheRoleOfItsMethod) {
  Submit("q", {"busy"});
  Submit("wq", {"ready1"});
  const google::protobuf::Struct doc = Document();
  const std::vector<std::tuple<std::string, std::string, service::Role>> principals = {
      {"ann", kReader, service::Role::kReader},
      {"sam", kSubmitter, service::Role::kSubmitter},
      {"root", kAdmin, service::Role::kAdmin}};
  int checked = 0;
  for (const auto& [path_pattern, item] : doc.fields().at("paths").struct_value().fields()) {
    for (const auto& [method, op] : item.struct_value().fields()) {
      const std::string grpc_method = op.struct_value().fields().at("x-grpc-method").string_value();
      if (grpc_method.empty()) continue;  // the document itself
      ASSERT_TRUE(service::MethodRoles().count(grpc_method)) << grpc_method;
      const service::Role needed = service::MethodRoles().at(grpc_method);
      std::string path = absl::StrReplaceAll(path_pattern, {{"{id}", "x"}, {"{queue}", "x"}});
      for (const auto& [name, token, role] : principals) {
        std::string body = "{}";
        if (absl::StrContains(path, "/BoardService/")) {
          body = absl::StrContains(path, "Claim") && !absl::EndsWith(path, "/Claim")
                     ? R"({"claim":{"owner":")" + name + R"("}})"
                     : R"({"owner":")" + name + R"(","queue":"no-work"})";
          if (absl::EndsWith(path, "/WaitForWork")) body = R"({"queue":"wq"})";
          if (absl::EndsWith(path, "/RestoreTask")) body = "{}";
        }
        auto res = method == "get" ? Get(path, token) : Call(path, body, token);
        ASSERT_TRUE(res);
        ++checked;
        if (service::Grants(role, needed)) {
          EXPECT_NE(res->status, 403) << name << " " << path << ": " << res->body;
          EXPECT_NE(res->status, 401) << name << " " << path;
        } else {
          EXPECT_EQ(res->status, 403) << name << " " << path << ": " << res->body;
          EXPECT_THAT(ErrorOf(res->body).message,
                      HasSubstr("needs role " + service::RoleName(needed)))
              << path;
        }
      }
    }
  }
  EXPECT_GT(checked, 150);
  // A board call as another owner is refused, before the Engine hears of it.
  auto other = Call("/api/v1/BoardService/Claim", R"({"owner":"ann","queue":"wq"})", kAdmin);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403) << other->body;
  EXPECT_THAT(ErrorOf(other->body).message, HasSubstr("owner ann"));
  EXPECT_EQ(Task("ready1").state(), v1::TASK_STATE_PENDING);
}

TEST_F(WebApiRolesTest, AReaderCannotActAndNothingChanges) {
  Submit("q", {"busy", "t1"});
  auto res = Act("/api/v1/tasks/t1/cancel", kReader);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 403);
  EXPECT_THAT(ErrorOf(res->body).message, HasSubstr("ann (reader) may not call "
                                                    "/taskgrid.v1.TaskService/CancelTask"));
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_PENDING);
  auto ok = Act("/api/v1/tasks/t1/cancel", kSubmitter);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(Task("t1").state(), v1::TASK_STATE_CANCELLED);
}

}  // namespace
}  // namespace taskgrid::http
