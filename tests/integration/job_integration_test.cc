// Jobs end to end: the scheduler and real agents in one process over gRPC on
// 127.0.0.1, steps as real processes. Order is checked on the times the
// scheduler recorded; every wait is bounded.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/proto_time.h"
#include "taskgrid/v1/job_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace taskgrid::testing {
namespace {

using ::testing::HasSubstr;

class JobIntegrationTest : public ::testing::Test {
 protected:
  JobIntegrationTest()
      : jobs_(v1::JobService::NewStub(
            grpc::CreateChannel(c_.addr(), grpc::InsecureChannelCredentials()))) {}

  static v1::TaskSpec Sh(const std::string& id, const std::string& script,
                         const std::vector<std::string>& deps = {}) {
    v1::TaskSpec s = ExecSpec(id, {"/bin/sh", "-c", script});
    for (const std::string& d : deps) s.add_depends_on(d);
    return s;
  }

  grpc::Status SubmitJob(const std::string& id, const std::vector<v1::TaskSpec>& specs,
                         v1::Job* out = nullptr) {
    v1::SubmitJobRequest req;
    req.set_job_id(id);
    for (const v1::TaskSpec& s : specs) *req.add_tasks() = s;
    v1::Job job;
    grpc::Status st = jobs_->SubmitJob(InProcessCluster::Ctx().get(), req, &job);
    if (out != nullptr) *out = job;
    return st;
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_id(id);
    v1::Job job;
    EXPECT_TRUE(jobs_->GetJob(InProcessCluster::Ctx().get(), req, &job).ok());
    return job;
  }

  // Polls until the job is no longer RUNNING.
  v1::Job WaitJob(const std::string& id, absl::Duration timeout = absl::Seconds(30)) {
    v1::Job job;
    EXPECT_TRUE(InProcessCluster::Eventually(
        [&] {
          job = GetJob(id);
          return job.state() != v1::JOB_STATE_RUNNING;
        },
        timeout))
        << "job " << id << " still running: " << job.DebugString();
    return job;
  }

  // Attempts that started on an agent (a chain link that was sent along
  // but never started has an interrupted attempt without a start time).
  static int Started(const v1::Task& t) {
    int n = 0;
    for (const v1::Attempt& a : t.attempts()) n += a.has_start_time();
    return n;
  }

  static absl::Time Start(const v1::Task& t) { return FromProto(t.attempts(0).start_time()); }
  static absl::Time Finish(const v1::Task& t) {
    return FromProto(t.attempts(t.attempts_size() - 1).finish_time());
  }

  InProcessCluster c_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(JobIntegrationTest, ADiamondRunsInDependencyOrder) {
  c_.AddAgent("w1", 4);
  ASSERT_TRUE(SubmitJob("dia", {Sh("a", "sleep 0.2"), Sh("b", "sleep 0.2", {"a"}),
                                Sh("c", "sleep 0.3", {"a"}), Sh("d", "true", {"b", "c"})})
                  .ok());
  EXPECT_EQ(WaitJob("dia").state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Task a = c_.Get("a"), b = c_.Get("b"), cc = c_.Get("c"), d = c_.Get("d");
  for (const v1::Task* t : {&a, &b, &cc, &d}) ASSERT_EQ(t->attempts_size(), 1);
  EXPECT_GE(Start(b), Finish(a));
  EXPECT_GE(Start(cc), Finish(a));
  EXPECT_GE(Start(d), Finish(b));
  EXPECT_GE(Start(d), Finish(cc));
  // b and c ran side by side.
  EXPECT_LT(Start(cc), Finish(b));
}

TEST_F(JobIntegrationTest, AFailedMiddleTaskCancelsItsDescendantsButNotOtherBranches) {
  c_.AddAgent("w1", 4);
  v1::TaskSpec bad = Sh("b", "exit 7", {"a"});
  bad.set_max_attempts(1);
  ASSERT_TRUE(
      SubmitJob("j", {Sh("a", "true"), bad, Sh("b2", "true", {"b"}), Sh("b3", "true", {"b2"}),
                      Sh("c", "sleep 0.2", {"a"}), Sh("c2", "true", {"c"}), Sh("free", "true")})
          .ok());
  const v1::Job job = WaitJob("j");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(c_.Get("b").state(), v1::TASK_STATE_FAILED);
  for (const char* id : {"b2", "b3"}) {
    const v1::Task t = c_.Get(id);
    EXPECT_EQ(t.state(), v1::TASK_STATE_CANCELLED) << id;
    EXPECT_EQ(Started(t), 0) << id;
  }
  EXPECT_EQ(c_.Get("b2").reason(), "upstream task b failed");
  EXPECT_EQ(c_.Get("b3").reason(), "upstream task b2 was cancelled");
  for (const char* id : {"a", "c", "c2", "free"}) {
    EXPECT_EQ(c_.Get(id).state(), v1::TASK_STATE_SUCCEEDED) << id;
  }
  EXPECT_EQ(job.counts().at("SUCCEEDED"), 4);
  EXPECT_EQ(job.counts().at("CANCELLED"), 2);
}

TEST_F(JobIntegrationTest, RunAnywayRunsAfterAFailedDependency) {
  c_.AddAgent("w1", 2);
  v1::TaskSpec bad = Sh("bad", "echo partial; exit 1");
  bad.set_max_attempts(1);
  v1::TaskSpec cleanup = Sh("cleanup", "cat \"$TASKGRID_INPUTS_DIR/bad\"", {"bad"});
  cleanup.set_on_upstream_failure(v1::UPSTREAM_FAILURE_RUN);
  ASSERT_TRUE(SubmitJob("j", {bad, cleanup}).ok());
  EXPECT_EQ(WaitJob("j").state(), v1::JOB_STATE_FAILED);
  const v1::Task t = c_.Get("cleanup");
  EXPECT_EQ(t.state(), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(t.result().stdout_tail(), "partial\n");
}

TEST_F(JobIntegrationTest, CancelJobCascadesToRunningAndWaitingTasks) {
  c_.AddAgent("w1", 2);
  ASSERT_TRUE(
      SubmitJob("j", {Sh("long", "sleep 60"), Sh("after", "true", {"long"}), Sh("done", "true")})
          .ok());
  c_.WaitFor("long", v1::TASK_STATE_RUNNING);
  c_.WaitFor("done", v1::TASK_STATE_SUCCEEDED);
  v1::CancelJobRequest req;
  req.set_id("j");
  v1::Job job;
  ASSERT_TRUE(jobs_->CancelJob(InProcessCluster::Ctx().get(), req, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);  // the agent confirms the running one
  EXPECT_EQ(WaitJob("j", absl::Seconds(15)).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(c_.Get("long").result().outcome(), v1::OUTCOME_CANCELLED);
  EXPECT_EQ(c_.Get("after").state(), v1::TASK_STATE_CANCELLED);
  EXPECT_EQ(c_.Get("done").state(), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(JobIntegrationTest, RetryJobRerunsOnlyWhatNeedsIt) {
  c_.AddAgent("w1", 2);
  TempDir dir;
  const std::string marker = dir.path() + "/fixed";
  v1::TaskSpec flaky = Sh("flaky", "test -e " + marker, {"first"});
  flaky.set_max_attempts(1);
  ASSERT_TRUE(SubmitJob("j", {Sh("first", "echo once"), flaky, Sh("next", "true", {"flaky"}),
                              Sh("side", "true", {"first"})})
                  .ok());
  ASSERT_EQ(WaitJob("j").state(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(c_.Get("next").state(), v1::TASK_STATE_CANCELLED);
  FILE* f = fopen(marker.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  v1::RetryJobRequest req;
  req.set_id("j");
  v1::Job job;
  ASSERT_TRUE(jobs_->RetryJob(InProcessCluster::Ctx().get(), req, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(WaitJob("j").state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Started(c_.Get("first")), 1);
  EXPECT_EQ(Started(c_.Get("side")), 1);
  EXPECT_EQ(Started(c_.Get("flaky")), 2);
  EXPECT_EQ(Started(c_.Get("next")), 1);
  // Nothing left to retry now.
  EXPECT_EQ(jobs_->RetryJob(InProcessCluster::Ctx().get(), req, &job).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(JobIntegrationTest, AChainOfFiveRunsInOrderOnOneAgentFromOneDispatch) {
  c_.AddAgent("w1", 1);
  c_.AddAgent("w2", 1);
  std::vector<v1::TaskSpec> specs = {Sh("c1", "sleep 0.1")};
  for (int i = 2; i <= 5; ++i) {
    specs.push_back(Sh("c" + std::to_string(i), "sleep 0.1", {"c" + std::to_string(i - 1)}));
  }
  ASSERT_TRUE(SubmitJob("chain", specs).ok());
  EXPECT_EQ(WaitJob("chain").state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Task first = c_.Get("c1");
  for (int i = 2; i <= 5; ++i) {
    const v1::Task prev = c_.Get("c" + std::to_string(i - 1));
    const v1::Task t = c_.Get("c" + std::to_string(i));
    ASSERT_EQ(t.attempts_size(), 1);
    // Sent together with c1, to the same agent, started after the one before.
    EXPECT_EQ(t.attempts(0).agent_id(), first.attempts(0).agent_id());
    EXPECT_EQ(FromProto(t.attempts(0).dispatch_time()),
              FromProto(first.attempts(0).dispatch_time()))
        << t.DebugString();
    EXPECT_GE(Start(t), Finish(prev));
  }
}

TEST_F(JobIntegrationTest, OutputsReachDependentsThroughTheInputsDirectory) {
  c_.AddAgent("w1", 2);
  ASSERT_TRUE(
      SubmitJob(
          "j", {Sh("p", "echo log; printf from-p > \"$TASKGRID_OUTPUT\""), Sh("q", "printf from-q"),
                Sh("sink", "cat \"$TASKGRID_INPUTS_DIR/p\" \"$TASKGRID_INPUTS_DIR/q\"", {"p", "q"}),
                // A chain link reads its predecessor's output too.
                Sh("link", "cat \"$TASKGRID_INPUTS_DIR/sink\"", {"sink"})})
          .ok());
  ASSERT_EQ(WaitJob("j").state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(c_.Get("p").result().output(), "from-p");
  EXPECT_EQ(c_.Get("p").result().stdout_tail(), "log\n");
  EXPECT_FALSE(c_.Get("q").result().has_output());
  EXPECT_EQ(c_.Get("sink").result().stdout_tail(), "from-pfrom-q");
  EXPECT_EQ(c_.Get("link").result().stdout_tail(), "from-pfrom-q");
}

TEST_F(JobIntegrationTest, ATenThousandTaskJobIsAcceptedAndItsReadinessComputed) {
  // 100 chains of 100: the shape a sharded pipeline submits. Printed, not
  // asserted: the benchmark tool holds the performance figures.
  std::vector<v1::TaskSpec> specs;
  for (int chain = 0; chain < 100; ++chain) {
    for (int i = 0; i < 100; ++i) {
      v1::TaskSpec s = BuiltinSpec("s" + std::to_string(chain) + "." + std::to_string(i), "noop");
      if (i > 0) s.add_depends_on("s" + std::to_string(chain) + "." + std::to_string(i - 1));
      specs.push_back(std::move(s));
    }
  }
  const absl::Duration start = RealClock::Get()->Monotonic();
  v1::Job job;
  ASSERT_TRUE(SubmitJob("big", specs, &job).ok());
  const absl::Duration took = RealClock::Get()->Monotonic() - start;
  EXPECT_EQ(job.task_count(), 10'000);
  EXPECT_EQ(job.counts().at("PENDING"), 100);
  EXPECT_EQ(job.counts().at("BLOCKED"), 9'900);
  std::printf("SubmitJob of 10,000 tasks (100 chains of 100), durable, readiness computed: %s\n",
              absl::FormatDuration(took).c_str());
}

TEST_F(JobIntegrationTest, BadJobsAreRefusedAndChangeNothing) {
  v1::Job job;
  grpc::Status st = SubmitJob("j", {Sh("x", "true", {"y"}), Sh("y", "true", {"x"})});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("cycle"));
  st = SubmitJob("j", {Sh("x", "true", {"nope"})});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("\"nope\""));
  v1::GetJobRequest get;
  get.set_id("j");
  EXPECT_EQ(jobs_->GetJob(InProcessCluster::Ctx().get(), get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ListJobsRequest list;
  v1::ListJobsResponse resp;
  ASSERT_TRUE(jobs_->ListJobs(InProcessCluster::Ctx().get(), list, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 0);
}

TEST_F(JobIntegrationTest, ListJobsFiltersByStateAndPages) {
  c_.AddAgent("w1", 2);
  for (const char* id : {"j1", "j2", "j3"})
    ASSERT_TRUE(SubmitJob(id, {Sh(std::string(id) + ".t", "true")}).ok());
  v1::TaskSpec never = Sh("never", "true");
  never.mutable_placement()->add_agent_ids("nobody");
  ASSERT_TRUE(SubmitJob("j4", {never}).ok());
  for (const char* id : {"j1", "j2", "j3"}) WaitJob(id);
  v1::ListJobsRequest req;
  req.add_states(v1::JOB_STATE_SUCCEEDED);
  req.set_page_size(2);
  v1::ListJobsResponse page1, page2;
  ASSERT_TRUE(jobs_->ListJobs(InProcessCluster::Ctx().get(), req, &page1).ok());
  ASSERT_EQ(page1.jobs_size(), 2);
  EXPECT_EQ(page1.jobs(0).id(), "j1");
  ASSERT_FALSE(page1.next_page_token().empty());
  req.set_page_token(page1.next_page_token());
  ASSERT_TRUE(jobs_->ListJobs(InProcessCluster::Ctx().get(), req, &page2).ok());
  ASSERT_EQ(page2.jobs_size(), 1);
  EXPECT_EQ(page2.jobs(0).id(), "j3");
  EXPECT_TRUE(page2.next_page_token().empty());
  req.clear_page_token();
  req.set_page_token("garbage");
  EXPECT_EQ(jobs_->ListJobs(InProcessCluster::Ctx().get(), req, &page2).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace taskgrid::testing
