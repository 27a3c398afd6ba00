// Compute resources: how amounts are spelled and read, and placement by
// what agents offer and tasks ask for. Every Scheduler step of the fixture
// runs the invariant checker, which holds each agent's held resources to
// the sum of what its attempts asked for (free = offered - held).

#include "common/resources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/unit/scheduler_fixture.h"

namespace taskgrid {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

int64_t Amount(const std::string& name, const std::string& value) {
  absl::StatusOr<int64_t> a = ParseResourceAmount(name, value);
  EXPECT_TRUE(a.ok()) << name << "=" << value << ": " << a.status();
  return a.value_or(-1);
}

std::string Refusal(const std::string& name, const std::string& value) {
  absl::StatusOr<int64_t> a = ParseResourceAmount(name, value);
  EXPECT_FALSE(a.ok()) << name << "=" << value << " read as " << a.value_or(0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(a.status().message());
}

TEST(ResourceAmountTest, CpuIsCoresOrMillicores) {
  EXPECT_EQ(Amount("cpu", "2"), 2000);
  EXPECT_EQ(Amount("cpu", "0.5"), 500);
  EXPECT_EQ(Amount("cpu", "1.25"), 1250);
  EXPECT_EQ(Amount("cpu", "500m"), 500);
  EXPECT_EQ(Amount("cpu", "1m"), 1);
  EXPECT_THAT(Refusal("cpu", "0.0005"), HasSubstr("at most 3 decimals"));
  EXPECT_THAT(Refusal("cpu", "2.5m"), HasSubstr("whole number"));
  EXPECT_THAT(Refusal("cpu", "-1"), HasSubstr("cores"));
  EXPECT_THAT(Refusal("cpu", "0"), HasSubstr("more than zero"));
  EXPECT_THAT(Refusal("cpu", "0m"), HasSubstr("more than zero"));
  EXPECT_THAT(Refusal("cpu", ""), HasSubstr("no amount"));
  EXPECT_THAT(Refusal("cpu", "1."), HasSubstr("cores"));
  EXPECT_THAT(Refusal("cpu", ".5"), HasSubstr("cores"));
  EXPECT_THAT(Refusal("cpu", "two"), HasSubstr("cores"));
}

TEST(ResourceAmountTest, MemoryIsBytesWithAUnit) {
  EXPECT_EQ(Amount("memory", "512"), 512);
  EXPECT_EQ(Amount("memory", "512B"), 512);
  EXPECT_EQ(Amount("memory", "4GiB"), int64_t{4} << 30);
  EXPECT_EQ(Amount("memory", "4Gi"), int64_t{4} << 30);
  EXPECT_EQ(Amount("memory", "1G"), 1'000'000'000);
  EXPECT_EQ(Amount("memory", "1GB"), 1'000'000'000);
  EXPECT_EQ(Amount("memory", "2KB"), 2000);
  EXPECT_EQ(Amount("memory", "1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(Amount("memory", "0.001KiB"), 2);  // a fraction of a byte rounds up
  EXPECT_EQ(Amount("memory", "1024TiB"), int64_t{1} << 50);
  EXPECT_THAT(Refusal("memory", "1025TiB"), HasSubstr("too large"));
  EXPECT_THAT(Refusal("memory", "99999999999999999999"), HasSubstr("memory is bytes"));
  EXPECT_THAT(Refusal("memory", "4XB"), HasSubstr("GiB"));
  EXPECT_THAT(Refusal("memory", "4gib"), HasSubstr("GiB"));
  EXPECT_THAT(Refusal("memory", "GiB"), HasSubstr("GiB"));
  EXPECT_THAT(Refusal("memory", "0GiB"), HasSubstr("more than zero"));
}

TEST(ResourceAmountTest, AnyOtherNameIsAWholeCount) {
  EXPECT_EQ(Amount("gpu", "2"), 2);
  EXPECT_EQ(Amount("license_x", "1"), 1);
  EXPECT_EQ(Amount("A.b-c_9", "7"), 7);
  EXPECT_THAT(Refusal("gpu", "1.5"), HasSubstr("whole count"));
  EXPECT_THAT(Refusal("gpu", "2GiB"), HasSubstr("whole count"));
  EXPECT_THAT(Refusal("gpu", "0"), HasSubstr("more than zero"));
  EXPECT_THAT(Refusal("g pu", "1"), HasSubstr("[A-Za-z0-9._-]"));
  EXPECT_THAT(Refusal("", "1"), HasSubstr("1-64 characters"));
  EXPECT_THAT(Refusal(std::string(65, 'g'), "1"), HasSubstr("1-64 characters"));
  // Control bytes are not echoed raw.
  EXPECT_THAT(Refusal("gpu", "\x1b[31m"), HasSubstr("\\x1b"));
}

TEST(ResourceListTest, ReadsAndPrintsOneSpelling) {
  absl::StatusOr<Resources> r = ParseResourceList(" memory=32768MiB, cpu=8000m ,gpu=2");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FormatResources(*r), "cpu=8,gpu=2,memory=32GiB");
  EXPECT_EQ(FormatResourceAmount("cpu", 1500), "1.5");
  EXPECT_EQ(FormatResourceAmount("cpu", 1), "0.001");
  EXPECT_EQ(FormatResourceAmount("cpu", 1010), "1.01");
  EXPECT_EQ(FormatResourceAmount("memory", 1'000'000'000), "1000000000");
  EXPECT_EQ(FormatResourceAmount("memory", int64_t{3} << 29), "1536MiB");
  // What is printed reads back as the same amount.
  for (const auto& [name, amount] : std::vector<std::pair<std::string, int64_t>>{
           {"cpu", 1}, {"cpu", 1234567}, {"memory", 1}, {"memory", int64_t{5} << 40}, {"gpu", 3}}) {
    EXPECT_EQ(Amount(name, FormatResourceAmount(name, amount)), amount) << name;
  }
  EXPECT_TRUE(ParseResourceList("")->empty());
  EXPECT_THAT(ParseResourceList("cpu=1,cpu=2").status().message(), HasSubstr("given twice"));
  EXPECT_THAT(ParseResourceList("cpu").status().message(), HasSubstr("NAME=AMOUNT"));
  std::string many;
  for (int i = 0; i <= kMaxResourceNames; ++i) absl::StrAppend(&many, "r", i, "=1,");
  EXPECT_THAT(ParseResourceList(many).status().message(), HasSubstr("at most 32"));
}

TEST(ResourceListTest, AddAndSubtractKeepNamesThatStillHoldSomething) {
  Resources a = {{"cpu", 1000}};
  AddResources({{"cpu", 500}, {"gpu", 1}}, &a);
  EXPECT_EQ(FormatResources(a), "cpu=1.5,gpu=1");
  SubtractResources({{"gpu", 1}, {"cpu", 500}}, &a);
  EXPECT_EQ(FormatResources(a), "cpu=1");
  Resources big = {{"n", std::numeric_limits<int64_t>::max() - 1}};
  AddResources({{"n", 5}}, &big);
  EXPECT_EQ(big["n"], std::numeric_limits<int64_t>::max());
}

}  // namespace

namespace core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

class ResourcePlacementTest : public SchedulerTest {
 protected:
  std::string Held(const std::string& id) { return FormatResources(Agent(id).held); }

  void Run(uint64_t conn, const std::string& id, int attempt = 1) { Accept(conn, id, attempt); }
  void Finish(uint64_t conn, const std::string& id, int attempt = 1) {
    Result(conn, id, attempt, v1::OUTCOME_SUCCEEDED);
  }
};

TEST_F(ResourcePlacementTest, ATaskGoesOnlyWhereWhatItAsksForIsFree) {
  const uint64_t a = ConnectOffering("a", 10, "cpu=4,memory=8GiB");
  SubmitOk(Needs("t1", "cpu=2,memory=3GiB"));
  SubmitOk(Needs("t2", "cpu=2,memory=3GiB"));
  SubmitOk(Needs("t3", "cpu=2,memory=3GiB"));
  // Slots are free for all three; cpu for only two.
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("t1", "t2"));
  EXPECT_EQ(Held("a"), "cpu=4,memory=6GiB");
  EXPECT_EQ(Describe("t3").reason(), "waiting: for cpu=2,memory=3GiB to be free on one agent");
  Run(a, "t1");
  Finish(a, "t1");
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("t3"));
  EXPECT_EQ(Held("a"), "cpu=4,memory=6GiB");
  Finish(a, "t2");
  Finish(a, "t3");
  EXPECT_EQ(Held("a"), "");
  EXPECT_EQ(Agent("a").used, 0);
}

TEST_F(ResourcePlacementTest, TasksThatAskForNothingTakeOnlyASlot) {
  const uint64_t a = ConnectOffering("a", 3, "cpu=1");
  SubmitOk(Needs("big", "cpu=1"));
  SubmitOk(Spec("s1"));
  SubmitOk(Spec("s2"));
  SubmitOk(Spec("s3"));
  // cpu is all taken; the plain tasks still get the two slots left.
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("big", "s1", "s2"));
  EXPECT_EQ(Held("a"), "cpu=1");
  EXPECT_EQ(Agent("a").used, 3);
}

TEST_F(ResourcePlacementTest, NothingOfferedSaysWhatIsMissingAndWaitsForAnAgentThatHasIt) {
  const uint64_t small = ConnectOffering("small", 4, "cpu=4,gpu=2");
  SubmitOk(Needs("g4", "gpu=4"));
  SubmitOk(Needs("tpu", "tpu=1"));
  EXPECT_THAT(Assigned(Take(), small), IsEmpty());
  EXPECT_EQ(Describe("g4").reason(), "waiting: needs gpu=4; the largest agent has gpu=2");
  EXPECT_EQ(Describe("tpu").reason(), "waiting: needs tpu=1; no agent offers tpu");
  // Parked: later ticks do not look at them again.
  const uint64_t before = sched_.placement_attempts();
  Advance(absl::Milliseconds(10));
  Advance(absl::Milliseconds(10));
  EXPECT_EQ(sched_.placement_attempts(), before);
  const uint64_t big = ConnectOffering("big", 4, "gpu=8");
  EXPECT_THAT(Assigned(Take(), big), ElementsAre("g4"));
  EXPECT_EQ(Held("big"), "gpu=4");
  EXPECT_EQ(Describe("tpu").reason(), "waiting: needs tpu=1; no agent offers tpu");
}

TEST_F(ResourcePlacementTest, BestFitKeepsRoomWholeForLargeRequests) {
  const uint64_t big = ConnectOffering("big", 8, "cpu=16,memory=64GiB");
  const uint64_t small = ConnectOffering("small", 8, "cpu=4,memory=8GiB");
  // Each small request goes where it leaves the least over: the small
  // agent, until it is full; then the big one.
  for (int i = 0; i < 3; ++i) SubmitOk(Needs("s" + std::to_string(i), "cpu=2,memory=4GiB"));
  Effects fx = Take();
  EXPECT_THAT(Assigned(fx, small), ElementsAre("s0", "s1"));
  EXPECT_THAT(Assigned(fx, big), ElementsAre("s2"));
  Finish(big, "s2");
  // The large request finds the big agent whole.
  SubmitOk(Needs("large", "cpu=16,memory=64GiB"));
  EXPECT_THAT(Assigned(Take(), big), ElementsAre("large"));
  EXPECT_EQ(Held("big"), "cpu=16,memory=64GiB");
  EXPECT_EQ(Held("small"), "cpu=4,memory=8GiB");
}

TEST_F(ResourcePlacementTest, PlainTasksStillSpreadByFreeSlots) {
  const uint64_t a = Connect("a", 4);
  const uint64_t b = Connect("b", 4);
  for (int i = 0; i < 4; ++i) SubmitOk(Spec("p" + std::to_string(i)));
  Effects fx = Take();
  EXPECT_EQ(Assigned(fx, a).size(), 2u);
  EXPECT_EQ(Assigned(fx, b).size(), 2u);
}

TEST_F(ResourcePlacementTest, ALostAgentGivesBackWhatItHeldAndItsTasksMove) {
  const uint64_t a = ConnectOffering("a", 4, "cpu=4");
  SubmitOk(Needs("t", "cpu=3"));
  ASSERT_THAT(Assigned(Take(), a), ElementsAre("t"));
  Run(a, "t");
  EXPECT_EQ(Held("a"), "cpu=3");
  sched_.Disconnect(a);
  Check();
  // Within its grace it keeps what it holds.
  EXPECT_EQ(Held("a"), "cpu=3");
  Advance(absl::Seconds(6));
  EXPECT_EQ(Held("a"), "");
  EXPECT_EQ(State("t"), v1::TASK_STATE_PENDING);
  const uint64_t b = ConnectOffering("b", 4, "cpu=8");
  EXPECT_THAT(Assigned(Take(), b), ElementsAre("t"));
  EXPECT_EQ(Held("b"), "cpu=3");
}

TEST_F(ResourcePlacementTest, AnAgentBackWithLessKeepsWhatItRunsAndTakesNothingUntilItFits) {
  const uint64_t first = ConnectOffering("a", 4, "cpu=4");
  SubmitOk(Needs("t", "cpu=3"));
  ASSERT_THAT(Assigned(Take(), first), ElementsAre("t"));
  Run(first, "t");
  sched_.Disconnect(first);
  // Back, still running t, now offering 2 cores.
  v1::Hello h;
  h.set_agent_id("a");
  h.set_slots(4);
  (*h.mutable_resources())["cpu"] = "2";
  v1::AttemptRef* r = h.add_running();
  r->set_task_id("t");
  r->set_attempt(1);
  const uint64_t again = ConnectHello(h);
  EXPECT_EQ(State("t"), v1::TASK_STATE_RUNNING);
  EXPECT_EQ(Held("a"), "cpu=3");
  SubmitOk(Needs("u", "cpu=1"));
  EXPECT_THAT(Assigned(Take(), again), IsEmpty());
  Finish(again, "t");
  EXPECT_THAT(Assigned(Take(), again), ElementsAre("u"));
  EXPECT_EQ(Held("a"), "cpu=1");
}

TEST_F(ResourcePlacementTest, ADrainingAgentTakesNothingAndGivesBackAsItsTasksEnd) {
  const uint64_t a = ConnectOffering("a", 4, "gpu=2");
  SubmitOk(Needs("t", "gpu=1"));
  ASSERT_THAT(Assigned(Take(), a), ElementsAre("t"));
  Run(a, "t");
  ASSERT_TRUE(sched_.Drain("a").ok());
  SubmitOk(Needs("u", "gpu=1"));
  EXPECT_THAT(Assigned(Take(), a), IsEmpty());
  EXPECT_EQ(Describe("u").reason(), "waiting: every connected agent is draining");
  Finish(a, "t");
  EXPECT_EQ(Held("a"), "");
}

TEST_F(ResourcePlacementTest, ARestartKeepsWhatEachAgentHoldsExact) {
  const uint64_t a = ConnectOffering("a", 8, "cpu=8,memory=16GiB");
  SubmitOk(Needs("t1", "cpu=2,memory=4GiB"));
  SubmitOk(Needs("t2", "cpu=500m"));
  SubmitOk(Spec("plain"));
  ASSERT_THAT(Assigned(Take(), a), UnorderedElementsAre("t1", "t2", "plain"));
  Run(a, "t1");
  std::unique_ptr<Scheduler> s = Restarted();
  const AgentRecord* restored = nullptr;
  for (const AgentRecord* r : s->Agents()) {
    if (r->id == "a") restored = r;
  }
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(FormatResources(restored->held), "cpu=2.5,memory=4GiB");
  // Until it says again what it offers, it offers what it holds: nothing
  // more goes to it.
  EXPECT_EQ(FormatResources(restored->resources), "cpu=2.5,memory=4GiB");
  EXPECT_EQ(restored->used, 3);
  ASSERT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
}

TEST_F(ResourcePlacementTest, BadAmountsAreRefusedAndChangeNothing) {
  v1::TaskSpec bad = Spec("bad");
  (*bad.mutable_placement()->mutable_resources())["cpu"] = "lots";
  absl::Status st = Submit({Spec("fine"), bad}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("tasks[1].placement.resources"));
  EXPECT_THAT(st.message(), HasSubstr("cpu=\"lots\""));
  EXPECT_EQ(sched_.task_count(), 0u);

  v1::Hello h;
  h.set_agent_id("a");
  h.set_slots(1);
  (*h.mutable_resources())["gpu"] = "-1";
  st = sched_.Connect(next_conn_++, h);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("hello.resources"));
  EXPECT_THAT(sched_.Agents(), IsEmpty());
}

TEST_F(ResourcePlacementTest, OneSpellingIsOneClass) {
  const uint64_t a = ConnectOffering("a", 4, "cpu=1");
  v1::TaskSpec x = Spec("x");
  (*x.mutable_placement()->mutable_resources())["cpu"] = "1";
  v1::TaskSpec y = Spec("y");
  (*y.mutable_placement()->mutable_resources())["cpu"] = "1000m";
  SubmitOk(x);
  SubmitOk(y);
  EXPECT_EQ(Task("x").placement_class(), Task("y").placement_class());
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("x"));
}

class QueueQuotaTest : public ResourcePlacementTest {
 protected:
  absl::StatusOr<v1::QueueStats> SetQuota(const std::string& queue, const std::string& quota) {
    v1::SetQueueLimitsRequest req;
    req.set_queue(queue);
    absl::StatusOr<Resources> r = ParseResourceList(quota);
    EXPECT_TRUE(r.ok()) << r.status();
    ToResourceMap(*r, req.mutable_quota());
    absl::StatusOr<v1::QueueStats> st = sched_.SetQueueLimits(req);
    Check();
    return st;
  }
  static v1::TaskSpec In(const std::string& queue, v1::TaskSpec s) {
    s.set_queue(queue);
    return s;
  }
  v1::QueueStats StatsOf(const std::string& queue) { return sched_.Stats(queue).front(); }
};

TEST_F(QueueQuotaTest, AQueueHoldsNoMoreThanItsQuotaAndTheRestWaitsSayingWhy) {
  const uint64_t a = ConnectOffering("a", 10, "cpu=8");
  ASSERT_TRUE(SetQuota("batch", "cpu=2").ok());
  for (int i = 0; i < 3; ++i) SubmitOk(In("batch", Needs("b" + std::to_string(i), "cpu=1")));
  SubmitOk(In("other", Needs("o", "cpu=1")));
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("b0", "b1", "o"));
  EXPECT_EQ(Describe("b2").reason(),
            "waiting: queue batch is at its quota of cpu=2 (2 held; this task needs 1)");
  v1::QueueStats st = StatsOf("batch");
  EXPECT_TRUE(st.held());
  EXPECT_EQ(st.resources_held().at("cpu"), "2");
  EXPECT_EQ(st.settings().quota().at("cpu"), "2");
  EXPECT_EQ(StatsOf("other").resources_held().at("cpu"), "1");
  // The quota's class is not looked at again until the queue gives back.
  const uint64_t before = sched_.placement_attempts();
  Advance(absl::Milliseconds(10));
  EXPECT_EQ(sched_.placement_attempts(), before);
  Finish(a, "b0");
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("b2"));
  EXPECT_FALSE(StatsOf("batch").held());
}

TEST_F(QueueQuotaTest, ANewQuotaIsJudgedAtOnce) {
  const uint64_t a = ConnectOffering("a", 10, "gpu=4");
  ASSERT_TRUE(SetQuota("train", "gpu=1").ok());
  SubmitOk(In("train", Needs("t1", "gpu=1")));
  SubmitOk(In("train", Needs("t2", "gpu=1")));
  SubmitOk(In("train", Needs("big", "gpu=2")));
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("t1"));
  EXPECT_EQ(Describe("big").reason(), "waiting: needs gpu=2; the quota of queue train is gpu=1");
  ASSERT_TRUE(SetQuota("train", "gpu=2").ok());
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("t2"));
  // No quota: everything that fits the agent starts; nothing is stored.
  absl::StatusOr<v1::QueueStats> st = SetQuota("train", "");
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->has_settings());
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("big"));
  EXPECT_EQ(Held("a"), "gpu=4");
}

TEST_F(QueueQuotaTest, NamesTheQuotaDoesNotListAreNotCapped) {
  const uint64_t a = ConnectOffering("a", 10, "cpu=8,gpu=2");
  ASSERT_TRUE(SetQuota("q", "gpu=1").ok());
  for (int i = 0; i < 4; ++i) SubmitOk(In("q", Needs("c" + std::to_string(i), "cpu=1")));
  SubmitOk(In("q", Spec("plain")));
  EXPECT_THAT(Assigned(Take(), a), ElementsAre("c0", "c1", "c2", "c3", "plain"));
}

TEST_F(QueueQuotaTest, ARestartKeepsWhatEachQueueHolds) {
  const uint64_t a = ConnectOffering("a", 10, "cpu=8");
  SubmitOk(In("x", Needs("x1", "cpu=3")));
  SubmitOk(In("y", Needs("y1", "cpu=1500m")));
  ASSERT_THAT(Assigned(Take(), a), ElementsAre("x1", "y1"));
  Run(a, "x1");
  std::unique_ptr<Scheduler> s = Restarted();
  EXPECT_EQ(s->Stats("x").front().resources_held().at("cpu"), "3");
  EXPECT_EQ(s->Stats("y").front().resources_held().at("cpu"), "1.5");
}

TEST_F(QueueQuotaTest, ABadQuotaIsRefusedAndChangesNothing) {
  ASSERT_TRUE(SetQuota("q", "gpu=1").ok());
  v1::SetQueueLimitsRequest req;
  req.set_queue("q");
  (*req.mutable_quota())["gpu"] = "1.5";
  absl::StatusOr<v1::QueueStats> st = sched_.SetQueueLimits(req);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.status().message(), HasSubstr("quota: resource gpu=\"1.5\""));
  EXPECT_EQ(StatsOf("q").settings().quota().at("gpu"), "1");
}

}  // namespace
}  // namespace core
}  // namespace taskgrid
