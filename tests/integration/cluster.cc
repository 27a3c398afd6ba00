#include "tests/integration/cluster.h"

#include <gtest/gtest.h>

#include "common/message_limits.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::testing {

engine::EngineOptions InProcessCluster::DefaultOptions() {
  engine::EngineOptions o;
  o.tick_interval = absl::Milliseconds(5);
  o.scheduler.default_initial_backoff = absl::Milliseconds(50);
  o.scheduler.default_max_backoff = absl::Milliseconds(200);
  return o;
}

InProcessCluster::InProcessCluster(engine::EngineOptions opts, service::ServerOptions so) {
  auto s = store::SqliteStore::Open({dir_.path(), store::Durability::kFull});
  EXPECT_TRUE(s.ok()) << s.status();
  store_ = std::move(*s);
  engine_ = std::make_unique<engine::Engine>(store_.get(), RealClock::Get(), opts);
  EXPECT_TRUE(engine_->Start().ok());
  so.listen = "127.0.0.1:0";
  auto srv = service::SchedulerServer::Start(engine_.get(), so);
  EXPECT_TRUE(srv.ok()) << srv.status();
  server_ = std::move(*srv);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReplyBytes);
  stub_ = v1::TaskService::NewStub(
      grpc::CreateCustomChannel(addr(), grpc::InsecureChannelCredentials(), args));
}

InProcessCluster::~InProcessCluster() {
  for (auto& [id, ra] : agents_) ra.agent->Stop();
  for (auto& [id, ra] : agents_) ra.thread.join();
  server_->Shutdown(absl::Seconds(1));
  engine_->Stop();
}

agent::Agent* InProcessCluster::AddAgent(const std::string& id, int slots,
                                         std::map<std::string, std::string> labels,
                                         const std::string& scheduler) {
  agent::AgentOptions o;
  o.scheduler = scheduler.empty() ? addr() : scheduler;
  o.id = id;
  o.slots = slots;
  o.labels = std::move(labels);
  o.exec.kill_grace = absl::Milliseconds(500);
  // Its own, in the cluster's directory: an agent added again with this
  // id finds what the one before kept (as after a restart), no other test
  // does.
  o.exec.work_dir = dir_.path() + "/agent-" + id;
  o.stop_flush = absl::Milliseconds(500);
  RunningAgent& ra = agents_[id];
  ra.agent = std::make_unique<agent::Agent>(o);
  agent::Agent* a = ra.agent.get();
  ra.thread = std::thread([a] { a->Run(); });
  return a;
}

void InProcessCluster::StopAgent(const std::string& id) {
  auto it = agents_.find(id);
  if (it == agents_.end()) return;
  it->second.agent->Stop();
  it->second.thread.join();
  agents_.erase(it);
}

std::unique_ptr<grpc::ClientContext> InProcessCluster::Ctx(absl::Duration d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(d));
  return ctx;
}

grpc::Status InProcessCluster::Submit(const std::vector<v1::TaskSpec>& specs,
                                      v1::SubmitTasksResponse* resp) {
  v1::SubmitTasksRequest req;
  for (const v1::TaskSpec& s : specs) *req.add_tasks() = s;
  v1::SubmitTasksResponse ignored;
  return stub_->SubmitTasks(Ctx().get(), req, resp ? resp : &ignored);
}

v1::Task InProcessCluster::Get(const std::string& id) {
  v1::GetTaskRequest req;
  req.set_id(id);
  v1::Task t;
  grpc::Status s = stub_->GetTask(Ctx().get(), req, &t);
  EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
  return t;
}

v1::Task InProcessCluster::WaitFor(const std::string& id, v1::TaskState state,
                                   absl::Duration timeout) {
  v1::Task last;
  const bool ok = Eventually(
      [&] {
        last = Get(id);
        return last.state() == state;
      },
      timeout);
  EXPECT_TRUE(ok) << "task " << id << " did not reach " << core::StateName(state) << "; it is "
                  << core::StateName(last.state()) << ": " << last.reason();
  return last;
}

bool InProcessCluster::Eventually(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

v1::TaskSpec ExecSpec(const std::string& id, std::vector<std::string> argv) {
  v1::TaskSpec s;
  s.set_id(id);
  v1::ExecStep* e = s.add_steps()->mutable_exec();
  for (std::string& a : argv) e->add_argv(std::move(a));
  return s;
}

v1::TaskSpec BuiltinSpec(const std::string& id, const std::string& name,
                         std::vector<std::string> args) {
  v1::TaskSpec s;
  s.set_id(id);
  v1::BuiltinStep* b = s.add_steps()->mutable_builtin();
  b->set_name(name);
  for (std::string& a : args) b->add_args(std::move(a));
  return s;
}

}  // namespace taskgrid::testing
