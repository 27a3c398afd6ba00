// Pull mode over real gRPC: claimers racing for the same tasks on threads
// of their own, pushed agents sharing the queue, and hostile board calls,
// each refused with a clear status and nothing changed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/proto_time.h"
#include "taskgrid/v1/board_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace taskgrid::testing {
namespace {

using ::testing::HasSubstr;

class BoardIntegrationTest : public ::testing::Test {
 protected:
  BoardIntegrationTest()
      : board_(v1::BoardService::NewStub(
            grpc::CreateChannel(cluster_.addr(), grpc::InsecureChannelCredentials()))) {}

  grpc::Status Claim(const std::string& owner, int max, v1::ClaimResponse* resp,
                     const std::string& queue = "pull") {
    v1::ClaimRequest req;
    req.set_queue(queue);
    req.set_owner(owner);
    req.set_max(max);
    *req.mutable_lease() = ToProto(absl::Seconds(60));
    return board_->Claim(InProcessCluster::Ctx().get(), req, resp);
  }
  grpc::Status Complete(const std::string& id, int attempt, const std::string& owner,
                        v1::CompleteClaimResponse* resp = nullptr) {
    v1::CompleteClaimRequest req;
    req.mutable_claim()->set_task_id(id);
    req.mutable_claim()->set_attempt(attempt);
    req.mutable_claim()->set_owner(owner);
    req.mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
    v1::CompleteClaimResponse ignored;
    return board_->CompleteClaim(InProcessCluster::Ctx().get(), req,
                                 resp != nullptr ? resp : &ignored);
  }
  void SubmitMany(int n, const std::string& queue = "pull") {
    std::vector<v1::TaskSpec> specs;
    for (int i = 0; i < n; ++i) {
      v1::TaskSpec s = BuiltinSpec(absl::StrCat(queue, "-", i), "noop");
      s.set_queue(queue);
      specs.push_back(s);
    }
    ASSERT_TRUE(cluster_.Submit(specs).ok());
  }

  InProcessCluster cluster_;
  std::unique_ptr<v1::BoardService::Stub> board_;
};

TEST_F(BoardIntegrationTest, SixteenClaimersRacingTakeEachTaskExactlyOnce) {
  constexpr int kTasks = 200;
  constexpr int kClaimers = 16;
  SubmitMany(kTasks);
  std::mutex mu;
  std::map<std::string, std::string> taken;  // task -> owner
  std::vector<std::string> doubles;
  std::atomic<int> completed{0};
  std::vector<std::thread> claimers;
  for (int c = 0; c < kClaimers; ++c) {
    claimers.emplace_back([&, c] {
      const std::string owner = absl::StrCat("w", c);
      for (int round = 0; round < 1000 && completed.load() < kTasks; ++round) {
        v1::ClaimResponse resp;
        if (!Claim(owner, 3, &resp).ok()) return;
        for (const v1::ClaimedTask& claim : resp.claims()) {
          const std::string& id = claim.assignment().task_id();
          {
            std::lock_guard<std::mutex> lock(mu);
            if (!taken.emplace(id, owner).second) doubles.push_back(id);
          }
          if (Complete(id, claim.assignment().attempt(), owner).ok()) ++completed;
        }
        if (resp.claims().empty()) std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : claimers) t.join();
  EXPECT_TRUE(doubles.empty()) << "claimed twice: " << doubles.front();
  EXPECT_EQ(taken.size(), static_cast<size_t>(kTasks));
  EXPECT_EQ(completed.load(), kTasks);
  std::set<std::string> owners;
  for (const auto& [id, owner] : taken) owners.insert(owner);
  EXPECT_GT(owners.size(), 1u) << "the claimers did race";
  for (int i = 0; i < kTasks; i += 37) {
    const v1::Task t = cluster_.Get(absl::StrCat("pull-", i));
    EXPECT_EQ(t.state(), v1::TASK_STATE_SUCCEEDED);
    EXPECT_EQ(t.attempt(), 1) << "never handed out twice";
  }
}

TEST_F(BoardIntegrationTest, AnAgentAndAClaimerShareAQueueWithoutDoubleDelivery) {
  cluster_.AddAgent("pusher", 1);
  // Tasks that take a while on the agent, so the queue stays full.
  std::vector<v1::TaskSpec> specs;
  for (int i = 0; i < 6; ++i) {
    v1::TaskSpec s = BuiltinSpec(absl::StrCat("shared-", i), "sleep", {"0.2"});
    s.set_queue("pull");
    specs.push_back(s);
  }
  ASSERT_TRUE(cluster_.Submit(specs).ok());
  std::set<std::string> claimed;
  ASSERT_TRUE(InProcessCluster::Eventually([&] {
    v1::ClaimResponse resp;
    if (!Claim("puller", 1, &resp).ok()) return false;
    for (const v1::ClaimedTask& c : resp.claims()) {
      claimed.insert(c.assignment().task_id());
      EXPECT_TRUE(Complete(c.assignment().task_id(), c.assignment().attempt(), "puller").ok());
    }
    int done = 0;
    for (int i = 0; i < 6; ++i) {
      done += cluster_.Get(absl::StrCat("shared-", i)).state() == v1::TASK_STATE_SUCCEEDED;
    }
    return done == 6;
  }));
  EXPECT_FALSE(claimed.empty()) << "the claimer got some";
  for (int i = 0; i < 6; ++i) {
    const v1::Task t = cluster_.Get(absl::StrCat("shared-", i));
    EXPECT_EQ(t.attempt(), 1) << t.spec().id();
    const std::string holder = t.attempts(0).agent_id();
    EXPECT_EQ(holder, claimed.count(t.spec().id()) ? "puller" : "pusher") << t.spec().id();
  }
}

TEST_F(BoardIntegrationTest, HostileBoardCallsAreRefusedAndChangeNothing) {
  SubmitMany(1);
  v1::ClaimResponse claims;
  ASSERT_TRUE(Claim("good", 1, &claims).ok());
  ASSERT_EQ(claims.claims_size(), 1);
  const std::string id = claims.claims(0).assignment().task_id();
  const v1::Task before = cluster_.Get(id);

  struct Bad {
    std::string what;
    std::function<grpc::Status()> call;
    grpc::StatusCode code;
    std::string says;
  };
  const std::string huge(10'000, 'x');
  const std::vector<Bad> table = {
      {"claim without an owner",
       [&] {
         v1::ClaimResponse r;
         return Claim("", 1, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "owner"},
      {"claim with a huge owner",
       [&] {
         v1::ClaimResponse r;
         return Claim(huge, 1, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "owner"},
      {"claim too many",
       [&] {
         v1::ClaimResponse r;
         return Claim("x", 5000, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "max"},
      {"claim from a bad queue",
       [&] {
         v1::ClaimResponse r;
         return Claim("x", 1, &r, "a b");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "queue"},
      {"claim for an hour and a day",
       [&] {
         v1::ClaimRequest req;
         req.set_owner("x");
         *req.mutable_lease() = ToProto(absl::Hours(25));
         v1::ClaimResponse r;
         return board_->Claim(InProcessCluster::Ctx().get(), req, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "--max_claim_lease"},
      {"complete as another owner", [&] { return Complete(id, 1, "thief"); },
       grpc::StatusCode::ABORTED, "not live"},
      {"complete a later attempt", [&] { return Complete(id, 2, "good"); },
       grpc::StatusCode::ABORTED, "not live"},
      {"complete attempt zero", [&] { return Complete(id, 0, "good"); },
       grpc::StatusCode::INVALID_ARGUMENT, "claim.attempt"},
      {"complete an unknown task", [&] { return Complete("nope", 1, "good"); },
       grpc::StatusCode::NOT_FOUND, "nope"},
      {"extend with a negative lease",
       [&] {
         v1::ExtendClaimRequest req;
         req.mutable_claim()->set_task_id(id);
         req.mutable_claim()->set_attempt(1);
         req.mutable_claim()->set_owner("good");
         req.mutable_lease()->set_seconds(-5);
         v1::ExtendClaimResponse r;
         return board_->ExtendClaim(InProcessCluster::Ctx().get(), req, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "lease"},
      {"restore a task that is not trashed",
       [&] {
         v1::RestoreTaskRequest req;
         req.set_id(id);
         v1::RestoreTaskResponse r;
         return board_->RestoreTask(InProcessCluster::Ctx().get(), req, &r);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "only TRASHED"},
      {"wait with garbage labels",
       [&] {
         v1::WaitForWorkRequest req;
         req.set_queue("pull");
         (*req.mutable_labels())["bad key!"] = "1";
         v1::WaitForWorkResponse r;
         return board_->WaitForWork(InProcessCluster::Ctx().get(), req, &r);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "labels key"},
  };
  for (const Bad& bad : table) {
    SCOPED_TRACE(bad.what);
    const grpc::Status s = bad.call();
    EXPECT_EQ(s.error_code(), bad.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(bad.says));
  }
  const v1::Task after = cluster_.Get(id);
  EXPECT_EQ(after.state(), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(after.agent_id(), "good");
  EXPECT_EQ(after.update_time().seconds(), before.update_time().seconds());
  EXPECT_EQ(after.update_time().nanos(), before.update_time().nanos());
  EXPECT_TRUE(Complete(id, 1, "good").ok()) << "the scheduler still serves the real owner";
}

}  // namespace
}  // namespace taskgrid::testing
