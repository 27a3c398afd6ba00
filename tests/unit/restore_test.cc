// Recovery end to end: a scheduler's state is committed to a store (SQLite
// and the in-memory one), read back by an Engine (in chunks, on two threads)
// and compared with the state before, derived indexes included. The table
// spans several scan chunks so records cross chunk boundaries.
#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/engine/engine.h"
#include "scheduler/store/memory_store.h"
#include "scheduler/store/sqlite_store.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

enum class Backend { kMemory, kSqlite };

// Reads another store, breaking its scan after `chunks` chunks: either the
// scan fails there (as a SQLite error would), or that chunk carries a copy
// of the first task's row (a task stored twice).
class BrokenScanStore final : public store::Store {
 public:
  enum class Fault { kScanError, kDuplicateRow };
  BrokenScanStore(store::Store* inner, int chunks, Fault fault)
      : inner_(inner), chunks_(chunks), fault_(fault) {}

  absl::Status Apply(const WriteBatch& batch) override { return inner_->Apply(batch); }
  absl::StatusOr<int64_t> CountTasks() override { return inner_->CountTasks(); }
  absl::Status ScanTasks(const RowSink& sink, bool light_finished = false) override {
    int n = 0;
    std::optional<TaskRow> first;
    return inner_->ScanTasks(
        [&](std::vector<TaskRow>* rows) {
          if (!first) first = rows->front();
          if (++n == chunks_) {
            if (fault_ == Fault::kScanError) return absl::InternalError("injected scan error");
            rows->push_back(*first);
          }
          return sink(rows);
        },
        light_finished);
  }
  absl::StatusOr<std::vector<AttemptRow>> LoadAttempts() override { return inner_->LoadAttempts(); }
  absl::StatusOr<std::vector<MergedRow>> LoadMerged() override { return inner_->LoadMerged(); }
  absl::Status ReadHistory(const std::vector<std::string>& task_ids,
                           std::vector<core::AttemptRow>* attempts,
                           std::vector<core::MergedRow>* merged) override {
    return inner_->ReadHistory(task_ids, attempts, merged);
  }
  absl::StatusOr<std::vector<StoredTask>> ReadTasks(const std::vector<int64_t>& seqs) override {
    return inner_->ReadTasks(seqs);
  }
  absl::StatusOr<std::vector<QueueRow>> LoadQueues() override { return inner_->LoadQueues(); }
  absl::StatusOr<std::vector<ScheduleRow>> LoadSchedules() override {
    return inner_->LoadSchedules();
  }
  absl::StatusOr<std::vector<store::StoredEvent>> ReadEvents(int64_t after, int limit) override {
    return inner_->ReadEvents(after, limit);
  }
  absl::StatusOr<store::EventSpan> GetEventSpan() override { return inner_->GetEventSpan(); }

 private:
  store::Store* const inner_;
  const int chunks_;
  const Fault fault_;
};

class RestoreTest : public SchedulerTest, public ::testing::WithParamInterface<Backend> {
 protected:
  RestoreTest() {
    if (GetParam() == Backend::kSqlite) {
      auto s = store::SqliteStore::Open({dir_.path(), store::Durability::kNormal});
      EXPECT_TRUE(s.ok()) << s.status();
      sqlite_ = std::move(*s);
      store_ = sqlite_.get();
    } else {
      store_ = &memory_;
    }
  }

  // Commits what the scheduler did since the last call, as the Engine's
  // writer would.
  void Persist() {
    Check();
    Effects fx = sched_.TakeEffects();
    ASSERT_TRUE(store_->Apply(fx.batch).ok());
  }

  static v1::TaskSpec Dep(const std::string& id, const std::vector<std::string>& deps) {
    v1::TaskSpec s = Spec(id);
    for (const std::string& d : deps) s.add_depends_on(d);
    return s;
  }

  // Runs the live attempt of `id` (held by `conn`) to `outcome`.
  void Finish(uint64_t conn, const std::string& id, v1::Outcome outcome) {
    const int attempt = Task(id).attempt;
    Accept(conn, id, attempt);
    Result(conn, id, attempt, outcome, outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
  }

  // A table of every kind of task: several thousand plain ones (priorities,
  // labels, not_before, schedule_timeout), jobs whose dependencies point to
  // tasks stored before and after them, chains sent to an agent, attempts
  // that succeeded, failed and are waiting for their retry, tasks in flight
  // (dispatched and running), cancelled and paused ones.
  void BuildTable() {
    const int plain = 3 * static_cast<int>(store::Store::kScanChunkRows) + 100;
    for (int b = 0; b < plain; b += 100) {
      std::vector<v1::TaskSpec> specs;
      for (int i = b; i < b + 100 && i < plain; ++i) {
        v1::TaskSpec s = Spec("p" + std::to_string(i), i % 5);
        if (i % 7 == 0) (*s.mutable_placement()->mutable_required_labels())["gpu"] = "1";
        if (i % 11 == 0) s.mutable_placement()->set_slots(2);
        if (i % 13 == 0) SetTimestamp(clock_.Now() + absl::Hours(1), s.mutable_not_before());
        if (i % 17 == 0) s.mutable_schedule_timeout()->set_seconds(3600);
        if (i % 19 == 0) s.set_payload(std::string(200, 'x'));
        specs.push_back(std::move(s));
      }
      ASSERT_TRUE(sched_.Submit(std::move(specs)).ok());
      Persist();
    }
    // Jobs: a diamond listed bottom-up (dependencies stored after their
    // dependents), a chain, and a task depending on a plain task.
    ASSERT_TRUE(sched_
                    .SubmitJob("dia", {Dep("d", {"b", "c"}), Dep("b", {"a"}), Dep("c", {"a"}),
                                       Spec("a", 9), Dep("e", {"p3"})})
                    .ok());
    std::vector<v1::TaskSpec> chain = {Spec("c1", 9)};
    for (int i = 2; i <= 5; ++i) {
      chain.push_back(Dep("c" + std::to_string(i), {"c" + std::to_string(i - 1)}));
    }
    ASSERT_TRUE(sched_.SubmitJob("chain", std::move(chain)).ok());
    Persist();
    // Priority 9 puts the jobs' heads first: a chains agent takes them, the
    // chain going along as one Assign.
    v1::Hello h;
    h.set_agent_id("w1");
    h.set_slots(4);
    h.set_chains(true);
    const uint64_t w1 = ConnectHello(h);
    Persist();
    ASSERT_EQ(Task("c1").agent_id, "w1");
    ASSERT_EQ(Task("c2").chained_after, &Task("c1"));
    Finish(w1, "a", v1::OUTCOME_SUCCEEDED);  // b and c become ready
    Accept(w1, "c1", Task("c1").attempt);    // c2.. still wait behind it
    Persist();
    // A second agent runs plain tasks: some succeed, some fail (and wait
    // for their retry), some stay dispatched or running.
    const uint64_t w2 = Connect("w2", 8, {{"gpu", "1"}});
    Persist();
    std::vector<std::string> held;
    for (const TaskRecord* t : All(sched_)) {
      if (t->agent_id == "w2" && t->state == v1::TASK_STATE_DISPATCHED) held.push_back(t->id());
    }
    ASSERT_GE(held.size(), 6u);
    Finish(w2, held[0], v1::OUTCOME_SUCCEEDED);
    Finish(w2, held[1], v1::OUTCOME_FAILED);  // retried later: SCHEDULED
    Finish(w2, held[2], v1::OUTCOME_SUCCEEDED);
    Accept(w2, held[3], Task(held[3]).attempt);  // RUNNING
    Persist();
    ASSERT_TRUE(sched_.Cancel("p20").ok());
    ASSERT_TRUE(sched_.Pause("p21").ok());
    ASSERT_TRUE(sched_.Pause(held[3]).ok());  // pause_requested while RUNNING
    Persist();
  }

  // `from`: the store to read (the test's store by default).
  std::unique_ptr<engine::Engine> StartEngine(store::Store* from = nullptr) {
    engine::EngineOptions opts;
    opts.scheduler = Options();
    opts.tick_interval = absl::Hours(1);  // time is driven by the test
    auto e = std::make_unique<engine::Engine>(from ? from : store_, &clock_, opts);
    start_status_ = e->Start();
    return e;
  }

  // Every task, in submit order.
  static std::vector<const TaskRecord*> All(const Scheduler& s) {
    ListFilter f;
    f.page_size = static_cast<int>(s.task_count()) + 1;
    return s.List(f).tasks;
  }

  static std::vector<std::string> Ids(const std::vector<TaskRecord*>& tasks) {
    std::vector<std::string> ids;
    for (const TaskRecord* t : tasks) ids.push_back(t ? t->id() : "(null)");
    return ids;
  }

  // Every task, job and agent of `got` is what sched_ holds. Finished
  // tasks nothing unfinished needs stay on disk: their stored rows are
  // what sched_ holds.
  void ExpectSameAsBefore(const Scheduler& got) {
    ASSERT_TRUE(got.CheckInvariants().ok()) << got.CheckInvariants();
    ASSERT_EQ(got.task_count() + got.cold_task_count(), sched_.task_count());
    EXPECT_GT(got.cold_task_count(), 0u);
    EXPECT_EQ(got.last_revision(), sched_.last_revision());
    const std::vector<const TaskRecord*> all = All(sched_);
    ListFilter every;
    every.page_size = static_cast<int>(sched_.task_count()) + 1;
    const ListPage got_all = got.List(every);
    ASSERT_EQ(got_all.tasks.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      const TaskRecord& want = *all[i];
      SCOPED_TRACE(want.id());
      ASSERT_EQ(got_all.seqs[i], want.seq);  // submit order
      if (got_all.tasks[i] == nullptr) {
        // On disk: finished, needed by nothing unfinished.
        EXPECT_TRUE(IsTerminal(want.state));
        for (const TaskRecord* d : want.dependents) EXPECT_TRUE(IsTerminal(d->state)) << d->id();
        ASSERT_NE(got.FindCold(want.id()), nullptr);
        auto stored = store_->ReadTasks({want.seq});
        ASSERT_TRUE(stored.ok()) << stored.status();
        ASSERT_EQ(stored->size(), 1u);
        auto rec =
            FromStored(std::move((*stored)[0].row), (*stored)[0].attempts, (*stored)[0].merged);
        ASSERT_TRUE(rec.ok()) << rec.status();
        v1::Task want_proto, got_proto;
        ToTaskProto(want, &want_proto);
        ToTaskProto(**rec, &got_proto);
        want_proto.clear_replicas();  // derived: links to records in memory
        EXPECT_TRUE(MessageDifferencer::Equals(got_proto, want_proto))
            << got_proto.DebugString() << "\nwant\n"
            << want_proto.DebugString();
        continue;
      }
      const TaskRecord& t = *got_all.tasks[i];
      ASSERT_EQ(t.id(), want.id());
      v1::Task want_proto, got_proto;
      ToTaskProto(want, &want_proto);
      ToTaskProto(t, &got_proto);
      EXPECT_TRUE(MessageDifferencer::Equals(got_proto, want_proto))
          << got_proto.DebugString() << "\nwant\n"
          << want_proto.DebugString();
      EXPECT_EQ(t.seq, want.seq);
      EXPECT_EQ(t.dispatch_time, want.dispatch_time);
      EXPECT_EQ(t.start_time, want.start_time);
      EXPECT_EQ(t.pause_requested, want.pause_requested);
      EXPECT_EQ(t.attempt_base, want.attempt_base);
      EXPECT_EQ(t.placement_class(), want.placement_class());
      EXPECT_EQ(Ids(t.deps), Ids(want.deps));
      // Dependents on disk are not linked.
      std::vector<TaskRecord*> want_dependents;
      for (TaskRecord* d : want.dependents) {
        if (got.Find(d->id()) != nullptr) want_dependents.push_back(d);
      }
      EXPECT_EQ(Ids(t.dependents), Ids(want_dependents));
      EXPECT_EQ(t.deps_unsucceeded, want.deps_unsucceeded);
      EXPECT_EQ(t.deps_unfinished, want.deps_unfinished);
      EXPECT_EQ(Ids({t.chained_after}), Ids({want.chained_after}));
      EXPECT_EQ(Ids({t.chain_next}), Ids({want.chain_next}));
      EXPECT_EQ(t.job == nullptr, want.job == nullptr);
    }
    for (const char* id : {"dia", "chain"}) {
      SCOPED_TRACE(id);
      const JobRecord* want = sched_.FindJob(id);
      const JobRecord* j = got.FindJob(id);
      ASSERT_NE(j, nullptr);
      EXPECT_EQ(j->seq, want->seq);
      EXPECT_EQ(j->counts, want->counts);
      EXPECT_EQ(j->update_time, want->update_time);
      std::vector<int64_t> want_seqs;
      for (const TaskRecord* t : want->tasks) want_seqs.push_back(t->seq);
      ListFilter of_job;
      of_job.job_id = id;
      of_job.page_size = 1000;
      EXPECT_EQ(got.List(of_job).seqs, want_seqs);
      // A job goes to disk whole, once it has finished.
      EXPECT_EQ(j->tasks.empty(), Scheduler::JobStateOf(*want) != v1::JOB_STATE_RUNNING);
    }
    for (const v1::QueueStats& q : sched_.Stats("")) {
      auto stats = got.Stats(q.queue());
      ASSERT_EQ(stats.size(), 1u);
      EXPECT_TRUE(MessageDifferencer::Equals(stats[0], q)) << stats[0].DebugString();
    }
    // In-flight tasks are back with their agents (disconnected, within a
    // fresh grace), holding the same slots; waiting chain links hold none.
    for (const char* id : {"w1", "w2"}) {
      SCOPED_TRACE(id);
      const AgentRecord* want = sched_.FindAgent(id);
      const AgentRecord* a = got.FindAgent(id);
      ASSERT_NE(a, nullptr);
      EXPECT_FALSE(a->connected());
      EXPECT_EQ(a->used, want->used);
      EXPECT_EQ(a->tasks, want->tasks);
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<store::SqliteStore> sqlite_;
  store::MemoryStore memory_;
  store::Store* store_ = nullptr;
  absl::Status start_status_;
};

INSTANTIATE_TEST_SUITE_P(Stores, RestoreTest, ::testing::Values(Backend::kMemory, Backend::kSqlite),
                         [](const auto& info) {
                           return info.param == Backend::kSqlite ? "Sqlite" : "Memory";
                         });

TEST_P(RestoreTest, ALargeTableComesBackAsItWas) {
  BuildTable();
  auto e = StartEngine();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  e->Inspect([&](const Scheduler& got) { ExpectSameAsBefore(got); });
}

TEST_P(RestoreTest, RestoredAttemptsWaitOutTheRestartGraceThenAreRequeuedUncounted) {
  BuildTable();
  // Before the restart: tasks dispatched but never accepted, and tasks
  // running on an agent with no attempt timeout.
  std::vector<std::string> dispatched, running;
  for (const TaskRecord* t : All(sched_)) {
    if (t->state == v1::TASK_STATE_DISPATCHED && t->chained_after == nullptr) {
      dispatched.push_back(t->id());
    }
    if (t->state == v1::TASK_STATE_RUNNING && !t->claimed() && !t->spec.has_attempt_timeout()) {
      running.push_back(t->id());
    }
  }
  ASSERT_FALSE(dispatched.empty());
  ASSERT_FALSE(running.empty());
  auto e = StartEngine();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  // Within the reconnect grace nothing moves.
  clock_.Advance(Options().reconnect_grace - absl::Seconds(1));
  e->TickNow();
  e->Inspect([&](const Scheduler& got) {
    for (const std::string& id : dispatched) {
      EXPECT_EQ(got.Find(id)->state, v1::TASK_STATE_DISPATCHED) << id;
    }
    EXPECT_TRUE(got.FindAgent("w1")->restored);
  });
  // An attempt's own limits (an ack timeout, here) pass while the agent is
  // away: it may have started the attempt before the restart (its Accept
  // lost) and run it still, as it keeps running its tasks while a
  // restarting scheduler refuses it, for the restart grace. So nothing is
  // freed before that grace ends.
  ASSERT_GT(Options().restart_grace, Options().reconnect_grace + absl::Minutes(1));
  clock_.Advance(Options().restart_grace - Options().reconnect_grace);
  e->TickNow();
  e->Inspect([&](const Scheduler& got) {
    ASSERT_TRUE(got.CheckInvariants().ok()) << got.CheckInvariants();
    for (const std::string& id : dispatched) {
      EXPECT_EQ(got.Find(id)->state, v1::TASK_STATE_DISPATCHED) << id;
      EXPECT_EQ(got.Find(id)->stop_request, StopRequest::kNotAccepted) << id;
    }
    for (const std::string& id : running) {
      EXPECT_EQ(got.Find(id)->state, v1::TASK_STATE_RUNNING) << id;
    }
  });
  // Past it, every attempt the agents still held is lost and re-queued,
  // not counted: the scheduler's outage ended it, not the task.
  clock_.Advance(absl::Seconds(2));
  e->TickNow();
  e->Inspect([&](const Scheduler& got) {
    ASSERT_TRUE(got.CheckInvariants().ok()) << got.CheckInvariants();
    std::vector<std::string> held = running;
    held.insert(held.end(), dispatched.begin(), dispatched.end());
    for (const std::string& id : held) {
      const TaskRecord* t = got.Find(id);
      EXPECT_FALSE(IsInFlight(t->state)) << id << " " << v1::TaskState_Name(t->state);
      ASSERT_FALSE(t->attempts.empty()) << id;
      EXPECT_EQ(t->attempts.back().attempt(), Task(id).attempt);
      EXPECT_TRUE(t->attempts.back().interrupted()) << id;
      EXPECT_EQ(t->attempts.back().result().outcome(), v1::OUTCOME_LOST) << id;
      EXPECT_THAT(t->attempts.back().result().error(),
                  HasSubstr("the scheduler restarted and agent"))
          << id;
    }
  });
}

TEST_P(RestoreTest, AFailingScanFailsTheStart) {
  BuildTable();
  BrokenScanStore broken(store_, 3, BrokenScanStore::Fault::kScanError);
  auto e = StartEngine(&broken);
  EXPECT_EQ(start_status_, absl::InternalError("injected scan error"));
}

TEST_P(RestoreTest, ATaskStoredTwiceFailsTheStart) {
  BuildTable();
  BrokenScanStore broken(store_, 3, BrokenScanStore::Fault::kDuplicateRow);
  auto e = StartEngine(&broken);
  EXPECT_EQ(start_status_.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(start_status_.message()), HasSubstr("p0 is stored twice"));
}

TEST_P(RestoreTest, ARowThatDoesNotParseFailsTheStartNamingTheTask) {
  BuildTable();
  core::WriteBatch b;
  core::TaskRow bad = ToRow(Task("p1"), /*insert=*/true);
  bad.id = "broken";
  bad.seq = 1'000'000;
  bad.spec = "\xff\xff\xff";
  b.tasks.push_back(bad);
  ASSERT_TRUE(store_->Apply(b).ok());
  auto e = StartEngine();
  EXPECT_EQ(start_status_.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(start_status_.message()), HasSubstr("broken"));
}

TEST_P(RestoreTest, AMissingDependencyFailsTheStart) {
  ASSERT_TRUE(sched_.Submit({Spec("a")}).ok());
  ASSERT_TRUE(sched_.Submit({Dep("b", {"a"})}).ok());
  Effects fx = sched_.TakeEffects();
  // Lose a's row.
  auto& rows = fx.batch.tasks;
  rows.erase(std::remove_if(rows.begin(), rows.end(), [](const TaskRow& r) { return r.id == "a"; }),
             rows.end());
  ASSERT_TRUE(store_->Apply(fx.batch).ok());
  auto e = StartEngine();
  EXPECT_EQ(start_status_.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(start_status_.message()), HasSubstr("depends on a"));
}

TEST_P(RestoreTest, SchedulesComeBackAndTheirMissedFiresFollowThePolicy) {
  // FakeClock starts at 2023-11-14T22:13:20Z.
  v1::Schedule beat;
  beat.set_id("beat");
  beat.mutable_interval()->set_seconds(10);
  beat.set_misfire_policy(v1::MISFIRE_POLICY_RUN_ONCE);
  beat.mutable_task_template()->add_steps()->mutable_builtin()->set_name("noop");
  ASSERT_TRUE(sched_.CreateSchedule(beat).ok());
  v1::Schedule quiet = beat;
  quiet.set_id("quiet");
  quiet.set_misfire_policy(v1::MISFIRE_POLICY_SKIP);
  ASSERT_TRUE(sched_.CreateSchedule(quiet).ok());
  v1::Schedule held = beat;
  held.set_id("held");
  held.set_paused(true);
  ASSERT_TRUE(sched_.CreateSchedule(held).ok());
  Persist();
  clock_.Advance(absl::Seconds(10));
  sched_.Tick();
  Persist();
  // Down for 25 s: beat (RUN_ONCE) and quiet (SKIP) miss T0+20 and T0+30.
  clock_.Advance(absl::Seconds(25));
  auto e = StartEngine();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  e->TickNow();
  e->Sync();
  e->Inspect([&](const Scheduler& got) {
    ASSERT_EQ(got.schedule_count(), 3u);
    EXPECT_NE(got.Find("beat:20231114T221330Z"), nullptr);
    EXPECT_NE(got.Find("beat:20231114T221350Z"), nullptr);  // the latest missed, once
    EXPECT_EQ(got.Find("beat:20231114T221340Z"), nullptr);
    EXPECT_NE(got.Find("quiet:20231114T221330Z"), nullptr);
    EXPECT_EQ(got.Find("quiet:20231114T221350Z"), nullptr);
    EXPECT_EQ(got.task_count(), 3u);
    EXPECT_TRUE(got.FindSchedule("held")->paused);
    EXPECT_EQ(got.FindSchedule("quiet")->next_fire, clock_.Now() + absl::Seconds(5));
  });
  // The fires' rows committed: the store holds both the task and the
  // schedule that made it.
  auto rows = store_->LoadSchedules();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].id, "beat");
  EXPECT_EQ((*rows)[0].fire_count, 2);
  EXPECT_EQ((*rows)[0].last_task_id, "beat:20231114T221350Z");
  auto tasks = store_->LoadTasks();
  ASSERT_TRUE(tasks.ok());
  EXPECT_EQ(tasks->size(), 3u);
}

TEST_P(RestoreTest, AScheduleWhoseZoneIsGoneFailsTheStartNamingIt) {
  v1::Schedule def;
  def.set_id("lost");
  def.set_cron("@daily");
  def.set_time_zone("Atlantis/Capital");
  def.mutable_task_template()->add_steps()->mutable_builtin()->set_name("noop");
  core::WriteBatch b;
  core::ScheduleRow row;
  row.id = "lost";
  def.SerializeToString(&row.definition);
  b.schedules.push_back(row);
  ASSERT_TRUE(store_->Apply(b).ok());
  auto e = StartEngine();
  EXPECT_EQ(start_status_.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(start_status_.message()), HasSubstr("stored schedule lost.time_zone"));
}

}  // namespace
}  // namespace taskgrid::core
