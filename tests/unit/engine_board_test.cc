// Pull mode through the Engine, with an in-memory store and a fake clock:
// claims are durable before they are answered and survive a restart, and
// WaitForWork is answered by the commit that makes work ready, by its
// deadline, or by its caller going away.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "common/proto_time.h"
#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"

namespace taskgrid::engine {
namespace {

using ::testing::HasSubstr;

// Generous: only a deadlock or a lost reply ever reaches it.
constexpr auto kBound = std::chrono::seconds(30);

template <typename T>
struct Pending {
  std::promise<absl::StatusOr<T>> p;
  std::future<absl::StatusOr<T>> f = p.get_future();
  Engine::Reply<T> reply() {
    return [this](absl::StatusOr<T> r) { p.set_value(std::move(r)); };
  }
  bool answered() { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  absl::StatusOr<T> get() {
    EXPECT_EQ(f.wait_for(kBound), std::future_status::ready);
    return f.get();
  }
};

class EngineBoardTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> NewEngine(EngineOptions opts = {}) {
    opts.tick_interval = absl::Hours(1);  // the test drives time with TickNow()
    auto e = std::make_unique<Engine>(&mem_, &clock_, opts);
    EXPECT_TRUE(e->Start().ok());
    return e;
  }

  void Submit(Engine& e, const std::string& id, const std::string& queue = "q",
              const std::string& gpu = "") {
    v1::SubmitTasksRequest req;
    v1::TaskSpec* s = req.add_tasks();
    s->set_id(id);
    s->set_queue(queue);
    s->add_steps()->mutable_builtin()->set_name("noop");
    if (!gpu.empty()) (*s->mutable_placement()->mutable_required_labels())["gpu"] = gpu;
    Pending<v1::SubmitTasksResponse> r;
    e.SubmitTasks(req, r.reply());
    ASSERT_TRUE(r.get().ok());
  }

  absl::StatusOr<v1::ClaimResponse> Claim(Engine& e, const std::string& owner) {
    v1::ClaimRequest req;
    req.set_queue("q");
    req.set_owner(owner);
    *req.mutable_lease() = ToProto(absl::Seconds(30));
    Pending<v1::ClaimResponse> r;
    e.Claim(req, r.reply());
    return r.get();
  }

  static v1::WaitForWorkRequest Work(const std::string& gpu = "") {
    v1::WaitForWorkRequest req;
    req.set_queue("q");
    if (!gpu.empty()) (*req.mutable_labels())["gpu"] = gpu;
    return req;
  }

  FakeClock clock_;
  store::MemoryStore mem_;
};

TEST_F(EngineBoardTest, AClaimIsDurableBeforeItIsAnsweredAndSurvivesARestart) {
  v1::ClaimRef ref;
  {
    auto e = NewEngine();
    Submit(*e, "t");
    auto claims = Claim(*e, "w1");
    ASSERT_TRUE(claims.ok()) << claims.status();
    ASSERT_EQ(claims->claims_size(), 1);
    ref.set_task_id("t");
    ref.set_attempt(claims->claims(0).assignment().attempt());
    ref.set_owner("w1");
    // Answered after the commit: the store has the claim.
    auto stored = mem_.LoadTasks();
    ASSERT_TRUE(stored.ok());
    ASSERT_EQ(stored->size(), 1u);
    EXPECT_EQ((*stored)[0].row.state, v1::TASK_STATE_RUNNING);
    EXPECT_EQ((*stored)[0].row.agent_id, "w1");
    EXPECT_GT((*stored)[0].row.claim_until_us, 0);
  }
  auto e = NewEngine();  // a restart: the claim is still the worker's
  v1::CompleteClaimRequest done;
  *done.mutable_claim() = ref;
  done.mutable_result()->set_outcome(v1::OUTCOME_SUCCEEDED);
  Pending<v1::CompleteClaimResponse> r;
  e->CompleteClaim(done, r.reply());
  auto resp = r.get();
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->task().state(), v1::TASK_STATE_SUCCEEDED);
}

TEST_F(EngineBoardTest, AWaitIsAnsweredByTheCommitThatMakesWorkItCanClaim) {
  Pending<v1::WaitForWorkResponse> plain, gpu;
  auto e = NewEngine();
  const uint64_t plain_id = e->WaitForWork(Work(), absl::Hours(1), plain.reply());
  ASSERT_NE(e->WaitForWork(Work("1"), absl::Hours(1), gpu.reply()), 0u);
  ASSERT_NE(plain_id, 0u);
  EXPECT_EQ(e->waiting_for_work(), 2u);
  Submit(*e, "elsewhere", "other");
  Submit(*e, "needs-gpu-2", "q", "2");
  e->Sync();
  EXPECT_FALSE(plain.answered()) << "nothing it could claim";
  EXPECT_FALSE(gpu.answered());
  Submit(*e, "needs-gpu-1", "q", "1");
  auto got = gpu.get();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->ready(), 1);
  EXPECT_FALSE(plain.answered()) << "a task needing a label it lacks is not for it";
  Submit(*e, "plain", "q");
  ASSERT_TRUE(plain.get().ok());
  EXPECT_EQ(e->waiting_for_work(), 0u);
  // Work already there: answered at once, no waiter.
  Pending<v1::WaitForWorkResponse> now;
  EXPECT_EQ(e->WaitForWork(Work(), absl::Hours(1), now.reply()), 0u);
  EXPECT_EQ(now.get()->ready(), 1);
}

TEST_F(EngineBoardTest, AWaitOnAControlledQueueIsAnsweredOnceItMayStartATask) {
  auto e = NewEngine();
  Pending<v1::QueueStats> paused;
  e->PauseQueue("q", true, paused.reply());
  ASSERT_TRUE(paused.get().ok());
  Submit(*e, "t1");
  Pending<v1::WaitForWorkResponse> w;
  ASSERT_NE(e->WaitForWork(Work(), absl::Hours(1), w.reply()), 0u) << "nothing to claim: waits";
  e->TickNow();
  EXPECT_FALSE(w.answered()) << "still paused";
  Pending<v1::QueueStats> resumed;
  e->PauseQueue("q", false, resumed.reply());
  ASSERT_TRUE(resumed.get().ok());
  e->TickNow();
  auto r = w.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ready(), 1);

  // A rate limit: the next token wakes the waiter.
  v1::SetQueueLimitsRequest limits;
  limits.set_queue("q");
  limits.set_rate_per_second(1);
  Pending<v1::QueueStats> set;
  e->SetQueueLimits(limits, set.reply());
  ASSERT_TRUE(set.get().ok());
  ASSERT_TRUE(Claim(*e, "w")->claims_size() == 1) << "the bucket's one token";
  Submit(*e, "t2");
  Pending<v1::WaitForWorkResponse> w2;
  ASSERT_NE(e->WaitForWork(Work(), absl::Hours(1), w2.reply()), 0u) << "no token: waits";
  clock_.Advance(absl::Milliseconds(500));
  e->TickNow();
  EXPECT_FALSE(w2.answered());
  clock_.Advance(absl::Milliseconds(500));
  e->TickNow();
  ASSERT_TRUE(w2.get().ok());
}

TEST_F(EngineBoardTest, AWaitRunsOutOnTheFakeClockOrGoesWithItsCaller) {
  Pending<v1::WaitForWorkResponse> soon, gone;
  auto e = NewEngine();
  e->WaitForWork(Work(), absl::Seconds(5), soon.reply());
  const uint64_t id = e->WaitForWork(Work(), absl::Hours(1), gone.reply());
  clock_.Advance(absl::Seconds(5));
  e->TickNow();
  e->Sync();
  auto ran_out = soon.get();
  ASSERT_TRUE(ran_out.ok());
  EXPECT_EQ(ran_out->ready(), 0);
  EXPECT_FALSE(gone.answered());
  e->CancelWorkWait(id);
  EXPECT_EQ(gone.get().status().code(), absl::StatusCode::kCancelled);
  e->CancelWorkWait(id);  // again: nothing answered twice
  EXPECT_EQ(e->waiting_for_work(), 0u);
}

TEST_F(EngineBoardTest, WaitsAreBoundedAndCheckedNamingWhatIsWrong) {
  EngineOptions o;
  o.max_waits = 1;
  Pending<v1::WaitForWorkResponse> first, second, bad;
  auto e = NewEngine(o);
  ASSERT_NE(e->WaitForWork(Work(), absl::Hours(1), first.reply()), 0u);
  EXPECT_EQ(e->WaitForWork(Work(), absl::Hours(1), second.reply()), 0u);
  auto refused = second.get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("WaitForWork calls"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--max_waits=1"));
  v1::WaitForWorkRequest bad_queue = Work();
  bad_queue.set_queue("no spaces");
  e->WaitForWork(bad_queue, absl::Hours(1), bad.reply());
  auto invalid = bad.get();
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(invalid.status().message()), HasSubstr("queue"));
}

}  // namespace
}  // namespace taskgrid::engine
