// Periodic tasks in the Scheduler: fires at the right times under a
// FakeClock, derived task ids, pause/resume/delete, the misfire policies
// after a restart, duplicate fires, refused fires and the bound per tick.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/proto_time.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/unit/scheduler_fixture.h"

namespace taskgrid::core {
namespace {

using ::testing::HasSubstr;

// FakeClock starts at 1,700,000,000 s: 2023-11-14T22:13:20Z.
const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

class ScheduleTest : public SchedulerTest {
 protected:
  ScheduleTest() : SchedulerTest(Opts()) {}
  static SchedulerOptions Opts() {
    SchedulerOptions o = Options();
    o.max_schedule_fires_per_tick = 3;
    return o;
  }

  static v1::Schedule Every(const std::string& id, absl::Duration interval,
                            const std::string& queue = "") {
    v1::Schedule s;
    s.set_id(id);
    *s.mutable_interval() = ToProto(interval);
    v1::TaskSpec* t = s.mutable_task_template();
    t->set_queue(queue);
    t->add_steps()->mutable_exec()->add_argv("/bin/true");
    return s;
  }
  static v1::Schedule Cron(const std::string& id, const std::string& expr,
                           const std::string& zone = "") {
    v1::Schedule s = Every(id, absl::ZeroDuration());
    s.clear_interval();
    s.set_cron(expr);
    s.set_time_zone(zone);
    return s;
  }

  const ScheduleRecord& Create(v1::Schedule s) {
    absl::StatusOr<const ScheduleRecord*> r = sched_.CreateSchedule(std::move(s));
    Check();
    EXPECT_TRUE(r.ok()) << r.status();
    return **r;
  }
  std::string CreateError(v1::Schedule s) {
    const size_t before = sched_.schedule_count();
    const size_t rows = sched_.pending_effects().batch.schedules.size();
    absl::StatusOr<const ScheduleRecord*> r = sched_.CreateSchedule(std::move(s));
    Check();
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    // Nothing stored.
    EXPECT_EQ(sched_.schedule_count(), before);
    EXPECT_EQ(sched_.pending_effects().batch.schedules.size(), rows);
    return std::string(r.status().message());
  }

  // Every task of the table, by id.
  std::vector<std::string> TaskIds() {
    ListFilter all;
    all.page_size = 100'000;
    std::vector<std::string> ids;
    for (const TaskRecord* t : sched_.List(all).tasks) ids.push_back(t->id());
    return ids;
  }

  // The schedules table as the rows written so far would leave it.
  std::vector<ScheduleRow> StoredSchedules() {
    std::map<std::string, ScheduleRow> table;
    for (const ScheduleRow& r : sched_.pending_effects().batch.schedules) {
      if (r.erase) {
        table.erase(r.id);
      } else {
        table[r.id] = r;
      }
    }
    std::vector<ScheduleRow> out;
    for (auto& [id, r] : table) out.push_back(r);
    return out;
  }

  // A restart `down` later: tasks and schedules read back.
  std::unique_ptr<Scheduler> RestartAfter(absl::Duration down) {
    std::vector<ScheduleRow> rows = StoredSchedules();
    clock_.Advance(down);
    std::unique_ptr<Scheduler> s = Restarted(Opts());
    EXPECT_TRUE(s->RestoreSchedules(std::move(rows)).ok());
    EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
    return s;
  }
};

TEST_F(ScheduleTest, IntervalFiresEachIntervalWithDerivedIds) {
  const ScheduleRecord& s = Create(Every("beat", absl::Seconds(10)));
  EXPECT_EQ(s.next_fire, kT0 + absl::Seconds(10));
  Advance(absl::Seconds(9));
  EXPECT_TRUE(TaskIds().empty());
  Advance(absl::Seconds(1));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("beat:20231114T221330Z"));
  Advance(absl::Seconds(10));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("beat:20231114T221330Z", "beat:20231114T221340Z"));
  const ScheduleRecord& now = *sched_.FindSchedule("beat");
  EXPECT_EQ(now.fire_count, 2);
  EXPECT_EQ(now.last_task_id, "beat:20231114T221340Z");
  EXPECT_EQ(now.last_fire, kT0 + absl::Seconds(20));
  EXPECT_EQ(now.next_fire, kT0 + absl::Seconds(30));
  // The task is the template with the derived id, in the default queue.
  v1::TaskSpec want = Every("beat", absl::Seconds(1)).task_template();
  want.set_id("beat:20231114T221340Z");
  want.set_queue("default");
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(Task("beat:20231114T221340Z").spec, want))
      << Task("beat:20231114T221340Z").spec.DebugString();
  EXPECT_EQ(State("beat:20231114T221340Z"), v1::TASK_STATE_PENDING);
}

TEST_F(ScheduleTest, TheFirstIntervalFireIsAWholeIntervalAfterTheCreation) {
  clock_.Advance(absl::Milliseconds(700));
  const ScheduleRecord& s = Create(Every("late", absl::Seconds(10)));
  // Not kT0 + 10 s, 9.3 s after the creation: the grid starts at the next
  // whole second.
  EXPECT_EQ(s.next_fire, kT0 + absl::Seconds(11));
  EXPECT_EQ(s.next_fire - s.create_time, absl::Milliseconds(10'300));
  Advance(absl::Milliseconds(10'299));
  EXPECT_TRUE(TaskIds().empty());
  Advance(absl::Milliseconds(1));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("late:20231114T221331Z"));
  EXPECT_EQ(sched_.FindSchedule("late")->next_fire, kT0 + absl::Seconds(21));
}

TEST_F(ScheduleTest, AFireStoredOffTheGridIsFollowedAWholeIntervalLater) {
  clock_.Advance(absl::Milliseconds(700));
  Create(Every("old", absl::Seconds(10)));
  // As an older version stored it: its grid counted from kT0, so its next
  // fire is kT0 + 10 s where this version's grid has kT0 + 11 s.
  std::vector<ScheduleRow> rows = StoredSchedules();
  ASSERT_EQ(rows.size(), 1u);
  rows[0].next_fire_us = absl::ToUnixMicros(kT0 + absl::Seconds(10));
  std::unique_ptr<Scheduler> s = Restarted(Opts());
  ASSERT_TRUE(s->RestoreSchedules(std::move(rows)).ok());
  clock_.Advance(absl::Milliseconds(9'300));  // kT0 + 10 s
  s->Tick();
  const ScheduleRecord* r = s->FindSchedule("old");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->fire_count, 1);
  EXPECT_EQ(r->last_fire, kT0 + absl::Seconds(10));
  EXPECT_EQ(r->next_fire, kT0 + absl::Seconds(21)) << "not a second after the last fire";
}

TEST_F(ScheduleTest, FireWritesTheTaskAndTheScheduleInOneBatch) {
  Create(Every("beat", absl::Seconds(10)));
  Take();
  Advance(absl::Seconds(10));
  const Effects fx = Take();
  ASSERT_EQ(fx.batch.tasks.size(), 1u);
  EXPECT_TRUE(fx.batch.tasks[0].insert);
  EXPECT_EQ(fx.batch.tasks[0].id, "beat:20231114T221330Z");
  ASSERT_EQ(fx.batch.schedules.size(), 1u);
  const ScheduleRow& row = fx.batch.schedules[0];
  EXPECT_EQ(row.id, "beat");
  EXPECT_EQ(row.last_task_id, "beat:20231114T221330Z");
  EXPECT_EQ(row.fire_count, 1);
  EXPECT_EQ(row.last_fire_us, absl::ToUnixMicros(kT0 + absl::Seconds(10)));
  EXPECT_EQ(row.next_fire_us, absl::ToUnixMicros(kT0 + absl::Seconds(20)));
  // A tick with nothing due writes nothing.
  Advance(absl::Seconds(1));
  EXPECT_TRUE(Take().batch.schedules.empty());
}

TEST_F(ScheduleTest, CronFiresAtWallTimesOfItsZone) {
  // 09:00 in Berlin (CET, +01:00) is 08:00Z; the clock is at 22:13:20Z.
  const ScheduleRecord& s = Create(Cron("morning", "0 9 * * *", "Europe/Berlin"));
  EXPECT_EQ(s.next_fire,
            absl::FromCivil(absl::CivilSecond(2023, 11, 15, 8, 0, 0), absl::UTCTimeZone()));
  Advance(s.next_fire - kT0 - absl::Seconds(1));
  EXPECT_TRUE(TaskIds().empty());
  Advance(absl::Seconds(1));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("morning:20231115T080000Z"));
  EXPECT_EQ(sched_.FindSchedule("morning")->next_fire,
            absl::FromCivil(absl::CivilSecond(2023, 11, 16, 8, 0, 0), absl::UTCTimeZone()));
  // Macros too; UTC when no zone is given.
  EXPECT_EQ(Create(Cron("hourly", "@hourly")).next_fire,
            absl::FromCivil(absl::CivilSecond(2023, 11, 15, 9, 0, 0), absl::UTCTimeZone()));
}

TEST_F(ScheduleTest, PauseStopsFiresAndResumeSkipsWhatFellMeanwhile) {
  Create(Every("beat", absl::Seconds(10)));
  Advance(absl::Seconds(10));
  ASSERT_EQ(TaskIds().size(), 1u);
  ASSERT_TRUE(sched_.PauseSchedule("beat").ok());
  ASSERT_TRUE(sched_.PauseSchedule("beat").ok());  // idempotent
  Check();
  v1::Schedule view;
  sched_.DescribeSchedule(*sched_.FindSchedule("beat"), &view);
  EXPECT_TRUE(view.paused());
  EXPECT_FALSE(view.has_next_fire_time());
  Advance(absl::Seconds(35));
  EXPECT_EQ(TaskIds().size(), 1u);
  absl::StatusOr<const ScheduleRecord*> r = sched_.ResumeSchedule("beat");
  ASSERT_TRUE(r.ok());
  Check();
  // Now is T0+45: the next fire is T0+50, nothing for the 20, 30, 40 it missed.
  EXPECT_EQ((*r)->next_fire, kT0 + absl::Seconds(50));
  Advance(absl::Seconds(4));
  EXPECT_EQ(TaskIds().size(), 1u);
  Advance(absl::Seconds(1));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("beat:20231114T221330Z", "beat:20231114T221410Z"));
  EXPECT_EQ(sched_.PauseSchedule("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_.ResumeSchedule("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ScheduleTest, DeleteStopsFiresAndKeepsTheTasks) {
  Create(Every("beat", absl::Seconds(10)));
  Advance(absl::Seconds(10));
  Take();
  absl::StatusOr<ScheduleRecord> gone = sched_.DeleteSchedule("beat");
  ASSERT_TRUE(gone.ok());
  Check();
  EXPECT_EQ(gone->fire_count, 1);
  EXPECT_EQ(sched_.FindSchedule("beat"), nullptr);
  const Effects fx = Take();
  ASSERT_EQ(fx.batch.schedules.size(), 1u);
  EXPECT_TRUE(fx.batch.schedules[0].erase);
  Advance(absl::Seconds(60));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("beat:20231114T221330Z"));
  EXPECT_EQ(sched_.DeleteSchedule("beat").status().code(), absl::StatusCode::kNotFound);
  // The id is free again.
  Create(Every("beat", absl::Seconds(5)));
}

TEST_F(ScheduleTest, CreateAgainIsSafeAndAnotherDefinitionIsAlreadyExists) {
  const ScheduleRecord* first = &Create(Every("beat", absl::Seconds(10)));
  Advance(absl::Seconds(3));
  // The same definition (defaults spelled out, paused or not) returns it.
  v1::Schedule same = Every("beat", absl::Seconds(10), "default");
  same.set_time_zone("UTC");
  same.set_misfire_policy(v1::MISFIRE_POLICY_CATCH_UP);
  same.set_paused(true);
  same.set_fire_count(99);  // reported fields are ignored
  absl::StatusOr<const ScheduleRecord*> again = sched_.CreateSchedule(same);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, first);
  EXPECT_FALSE((*again)->paused);
  EXPECT_EQ((*again)->next_fire, kT0 + absl::Seconds(10));
  for (v1::Schedule other : {Every("beat", absl::Seconds(11)), Cron("beat", "* * * * *"),
                             Every("beat", absl::Seconds(10), "mail")}) {
    absl::StatusOr<const ScheduleRecord*> r = sched_.CreateSchedule(other);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << other.DebugString();
    EXPECT_THAT(r.status().message(), HasSubstr("schedule \"beat\" already exists"));
  }
  Check();
}

TEST_F(ScheduleTest, BadSchedulesAreRefusedNamingTheFieldAndNothingIsStored) {
  EXPECT_THAT(CreateError(Every("", absl::Seconds(1))), HasSubstr("schedule.id is empty"));
  EXPECT_THAT(CreateError(Every("a b", absl::Seconds(1))), HasSubstr("schedule.id \"a b\""));
  EXPECT_THAT(CreateError(Every(std::string(kMaxScheduleIdLength + 1, 'x'), absl::Seconds(1))),
              HasSubstr("schedule.id is 112 characters long; the limit is 111"));
  EXPECT_THAT(CreateError(Cron("c", "")), HasSubstr("schedule needs a trigger"));
  v1::Schedule both = Every("c", absl::Seconds(5));
  both.set_cron("* * * * *");
  EXPECT_THAT(CreateError(both), HasSubstr("schedule.cron and schedule.interval are both set"));
  EXPECT_THAT(CreateError(Cron("c", "garbage")),
              HasSubstr("schedule.cron \"garbage\": has 1 fields"));
  EXPECT_THAT(CreateError(Cron("c", "0 0 * * * *")), HasSubstr("has 6 fields; expected 5"));
  EXPECT_THAT(CreateError(Cron("c", "0 24 * * *")),
              HasSubstr("schedule.cron \"0 24 * * *\": hour: 24 is out of range 0-23"));
  EXPECT_THAT(CreateError(Cron("c", "* * * * " + std::string(300, '1'))),
              HasSubstr("schedule.cron is 308 characters long"));
  EXPECT_THAT(CreateError(Cron("c", "@daily", "Mars/Base")),
              HasSubstr("schedule.time_zone \"Mars/Base\" is not a known IANA time zone"));
  EXPECT_THAT(CreateError(Every("c", absl::Milliseconds(500))),
              HasSubstr("schedule.interval is 500ms: give whole seconds"));
  EXPECT_THAT(CreateError(Every("c", absl::Seconds(-1))),
              HasSubstr("schedule.interval is negative"));
  v1::Schedule zero = Every("c", absl::ZeroDuration());
  EXPECT_THAT(CreateError(zero), HasSubstr("schedule.interval is 0s; the least is 1s"));
  v1::Schedule no_template = Every("c", absl::Seconds(5));
  no_template.clear_task_template();
  EXPECT_THAT(CreateError(no_template), HasSubstr("schedule.task_template is unset"));
  v1::Schedule with_id = Every("c", absl::Seconds(5));
  with_id.mutable_task_template()->set_id("t1");
  EXPECT_THAT(CreateError(with_id), HasSubstr("schedule.task_template.id is set"));
  v1::Schedule with_job = Every("c", absl::Seconds(5));
  with_job.mutable_task_template()->set_job_id("j");
  EXPECT_THAT(CreateError(with_job), HasSubstr("schedule.task_template.job_id is set"));
  // The template is checked as a submitted task is.
  v1::Schedule no_steps = Every("c", absl::Seconds(5));
  no_steps.mutable_task_template()->clear_steps();
  EXPECT_THAT(CreateError(no_steps), HasSubstr("schedule.task_template.steps"));
  v1::Schedule big = Every("c", absl::Seconds(5));
  big.mutable_task_template()->set_payload(std::string((1 << 20) + 1, 'p'));
  EXPECT_THAT(CreateError(big), HasSubstr("schedule.task_template.payload"));
  v1::Schedule bad_policy = Every("c", absl::Seconds(5));
  bad_policy.set_misfire_policy(static_cast<v1::MisfirePolicy>(9));
  EXPECT_THAT(CreateError(bad_policy), HasSubstr("schedule.misfire_policy is unknown"));
  EXPECT_EQ(sched_.schedule_count(), 0u);
  // The longest id fits: its tasks' ids are within the task id limit.
  const std::string longest(kMaxScheduleIdLength, 'x');
  Create(Every(longest, absl::Seconds(1)));
  Advance(absl::Seconds(1));
  ASSERT_EQ(TaskIds().size(), 1u);
  EXPECT_EQ(TaskIds()[0].size(), kMaxIdLength);
}

TEST_F(ScheduleTest, MisfireSkipDropsWhatFellWhileDown) {
  v1::Schedule def = Every("beat", absl::Seconds(10));
  def.set_misfire_policy(v1::MISFIRE_POLICY_SKIP);
  Create(def);
  Advance(absl::Seconds(10));
  ASSERT_EQ(TaskIds().size(), 1u);
  // Down from T0+10 to T0+45: the fires at 20, 30 and 40 fell meanwhile.
  std::unique_ptr<Scheduler> s = RestartAfter(absl::Seconds(35));
  s->Tick();
  ASSERT_TRUE(s->CheckInvariants().ok());
  EXPECT_EQ(s->task_count(), 1u);
  const ScheduleRecord& r = *s->FindSchedule("beat");
  EXPECT_EQ(r.next_fire, kT0 + absl::Seconds(50));
  EXPECT_EQ(r.fire_count, 1);
  EXPECT_EQ(r.last_task_id, "beat:20231114T221330Z");
  // Dropped, but not silently: counted, the latest kept, and logged.
  EXPECT_EQ(r.skipped_fires, 3);
  EXPECT_EQ(r.last_skipped, kT0 + absl::Seconds(40));
  EXPECT_EQ(s->Metrics().counters.schedule_fires_skipped, 3);
  const Effects fx = s->TakeEffects();
  ASSERT_EQ(fx.notices.size(), 1u);
  EXPECT_THAT(fx.notices[0], HasSubstr("schedule beat: skipped 3 fire(s) from "
                                       "2023-11-14T22:13:40Z to 2023-11-14T22:14:00Z"));
  v1::Schedule shown;
  s->DescribeSchedule(r, &shown);
  EXPECT_EQ(shown.skipped_fires(), 3);
  EXPECT_EQ(FromProto(shown.last_skipped_time()), kT0 + absl::Seconds(40));
  // Then on as usual.
  clock_.Advance(absl::Seconds(5));
  s->Tick();
  EXPECT_NE(s->Find("beat:20231114T221410Z"), nullptr);
  EXPECT_EQ(s->task_count(), 2u);
}

TEST_F(ScheduleTest, MisfireRunOnceMakesOneTaskForTheLatestMissedFire) {
  v1::Schedule def = Every("beat", absl::Seconds(10));
  def.set_misfire_policy(v1::MISFIRE_POLICY_RUN_ONCE);
  Create(def);
  Advance(absl::Seconds(10));
  std::unique_ptr<Scheduler> s = RestartAfter(absl::Seconds(35));
  s->Tick();
  ASSERT_TRUE(s->CheckInvariants().ok());
  EXPECT_EQ(s->task_count(), 2u);
  EXPECT_NE(s->Find("beat:20231114T221400Z"), nullptr);  // T0+40
  const ScheduleRecord& r = *s->FindSchedule("beat");
  EXPECT_EQ(r.fire_count, 2);
  EXPECT_EQ(r.last_fire, kT0 + absl::Seconds(40));
  EXPECT_EQ(r.next_fire, kT0 + absl::Seconds(50));
  EXPECT_EQ(r.skipped_fires, 2);  // 20 and 30
  EXPECT_EQ(r.last_skipped, kT0 + absl::Seconds(30));
  // Made at T0+45 for T0+40: 5 s late (this process counted no other).
  const TaskCounters c = s->Metrics().counters;
  EXPECT_EQ(c.schedule_fires, 1);
  EXPECT_EQ(c.schedule_fire_lag.count(), 1);
  EXPECT_DOUBLE_EQ(c.schedule_fire_lag.sum(), 5);
  s->Tick();
  EXPECT_EQ(s->task_count(), 2u);
  // A cron schedule down for days: one task, for its latest time.
  v1::Schedule daily = Cron("daily", "30 4 * * *", "America/New_York");
  daily.set_misfire_policy(v1::MISFIRE_POLICY_RUN_ONCE);
  Create(daily);
  std::unique_ptr<Scheduler> later = RestartAfter(absl::Hours(24 * 5));
  later->Tick();
  const ScheduleRecord& d = *later->FindSchedule("daily");
  EXPECT_EQ(d.fire_count, 1);
  // Now: 2023-11-19T22:14:05Z; the latest 04:30 EST was 2023-11-19T09:30Z.
  EXPECT_EQ(d.last_task_id, "daily:20231119T093000Z");
}

TEST_F(ScheduleTest, CatchUpRunsTheLatestMissedFireWithinTheWindowAndSkipsOlderOnes) {
  ASSERT_EQ(Opts().schedule_catch_up, absl::Minutes(1));
  Create(Every("beat", absl::Seconds(10)));  // no policy: CATCH_UP
  EXPECT_EQ(sched_.FindSchedule("beat")->def.misfire_policy(), v1::MISFIRE_POLICY_CATCH_UP);
  Advance(absl::Seconds(10));
  // Down from T0+10 to T0+45: the latest missed fire (T0+40) is 5 s old,
  // within the window: it runs once; 20 and 30 are skipped.
  std::unique_ptr<Scheduler> s = RestartAfter(absl::Seconds(35));
  s->Tick();
  ASSERT_TRUE(s->CheckInvariants().ok());
  EXPECT_EQ(s->task_count(), 2u);
  EXPECT_NE(s->Find("beat:20231114T221400Z"), nullptr);  // T0+40
  const ScheduleRecord& r = *s->FindSchedule("beat");
  EXPECT_EQ(r.fire_count, 2);
  EXPECT_EQ(r.skipped_fires, 2);
  EXPECT_EQ(r.last_skipped, kT0 + absl::Seconds(30));

  // Down again, from T0+45 to T0+45+5min: the latest missed fire (T0+340)
  // is 5 s old again and runs; the 29 before it are skipped, counted on top
  // of the 2 read back.
  std::vector<ScheduleRow> rows;
  for (const ScheduleRow& row : s->pending_effects().batch.schedules) rows.push_back(row);
  ASSERT_FALSE(rows.empty());
  const ScheduleRow stored = rows.back();
  clock_.Advance(absl::Minutes(5));
  std::unique_ptr<Scheduler> again = Restarted(Opts());
  ASSERT_TRUE(again->RestoreSchedules({stored}).ok());
  const ScheduleRecord& back = *again->FindSchedule("beat");
  EXPECT_EQ(back.skipped_fires, 2) << "the count is kept across a restart";
  EXPECT_EQ(back.last_skipped, kT0 + absl::Seconds(30));
  EXPECT_EQ(back.def.skipped_fires(), 0) << "the definition holds no reported field";
  again->Tick();
  EXPECT_EQ(back.fire_count, 3);          // T0+340, 5 s late: caught up
  EXPECT_EQ(back.skipped_fires, 2 + 29);  // T0+50 ... T0+330

  // A daily cron schedule down for three days: its latest fire is hours
  // old, far past the window: nothing runs, all three are skipped.
  Create(Cron("daily", "30 4 * * *", "America/New_York"));
  std::unique_ptr<Scheduler> later = RestartAfter(absl::Hours(24 * 3));
  later->Tick();
  const ScheduleRecord& d = *later->FindSchedule("daily");
  EXPECT_EQ(d.fire_count, 0);
  EXPECT_EQ(d.skipped_fires, 3);
  EXPECT_EQ(d.last_task_id, "");
  ASSERT_TRUE(later->CheckInvariants().ok());
}

TEST_F(ScheduleTest, AStallWhileRunningFiresTheLatestAndCountsTheRestAsSkipped) {
  Create(Every("beat", absl::Seconds(10)));
  // The ticker does not run for 35 s (a stalled process, a clock jump).
  clock_.Advance(absl::Seconds(35));
  sched_.Tick();
  Check();
  const ScheduleRecord& r = *sched_.FindSchedule("beat");
  EXPECT_EQ(r.fire_count, 1);
  EXPECT_EQ(r.last_fire, kT0 + absl::Seconds(30));
  EXPECT_EQ(r.skipped_fires, 2);  // 10 and 20
  EXPECT_EQ(r.last_skipped, kT0 + absl::Seconds(20));
}

TEST_F(ScheduleTest, AFireWhoseTaskExistsReturnsIt) {
  Create(Every("beat", absl::Seconds(10)));
  // The task of the next fire exists already with the same spec (as after
  // a fire made twice).
  v1::TaskSpec spec = Every("beat", absl::Seconds(10)).task_template();
  spec.set_id("beat:20231114T221330Z");
  SubmitOk(spec);
  const int64_t seq = Task("beat:20231114T221330Z").seq;
  Advance(absl::Seconds(10));
  EXPECT_EQ(sched_.task_count(), 1u);
  EXPECT_EQ(Task("beat:20231114T221330Z").seq, seq);
  const ScheduleRecord& r = *sched_.FindSchedule("beat");
  EXPECT_EQ(r.fire_count, 1);
  EXPECT_EQ(r.last_task_id, "beat:20231114T221330Z");
  EXPECT_EQ(r.last_error, "");
}

TEST_F(ScheduleTest, ARefusedFireIsRecordedAndNotRetried) {
  // Queue "small" holds at most 2 unfinished tasks.
  Create(Every("beat", absl::Seconds(10), "small"));
  SubmitOk([] {
    v1::TaskSpec s = Spec("a");
    s.set_queue("small");
    return s;
  }());
  SubmitOk([] {
    v1::TaskSpec s = Spec("b");
    s.set_queue("small");
    return s;
  }());
  Take();
  Advance(absl::Seconds(10));
  const ScheduleRecord& r = *sched_.FindSchedule("beat");
  EXPECT_THAT(r.last_error, HasSubstr("fire at 2023-11-14T22:13:30Z refused: RESOURCE_EXHAUSTED"));
  EXPECT_THAT(r.last_error, HasSubstr("queue \"small\" is full"));
  EXPECT_EQ(r.fire_count, 0);
  EXPECT_EQ(r.next_fire, kT0 + absl::Seconds(20));
  EXPECT_EQ(sched_.Metrics().counters.schedule_fires_refused, 1);
  EXPECT_EQ(sched_.Metrics().counters.schedule_fires, 0);
  Effects fx = Take();
  EXPECT_TRUE(fx.batch.tasks.empty());
  ASSERT_EQ(fx.batch.schedules.size(), 1u);
  EXPECT_EQ(fx.batch.schedules[0].last_error, r.last_error);
  // Not retried: ticks before the next fire write nothing.
  for (int i = 0; i < 5; ++i) Advance(absl::Seconds(1));
  EXPECT_TRUE(Take().batch.schedules.empty());
  // Room again: the next fire goes through and clears the error.
  ASSERT_TRUE(sched_.Cancel("a").ok());
  Advance(absl::Seconds(5));
  EXPECT_EQ(r.fire_count, 1);
  EXPECT_EQ(r.last_error, "");
  EXPECT_NE(sched_.Find("beat:20231114T221340Z"), nullptr);
  EXPECT_EQ(sched_.Metrics().counters.schedule_fires, 1);
  EXPECT_EQ(sched_.Metrics().counters.schedule_fires_refused, 1);
  EXPECT_DOUBLE_EQ(sched_.Metrics().counters.schedule_fire_lag.sum(), 0);  // on its tick
}

TEST_F(ScheduleTest, FiresPerTickAreBounded) {
  // Ten schedules due at the same time; at most 3 fire per tick.
  for (int i = 0; i < 10; ++i) Create(Every("s" + std::to_string(i), absl::Seconds(60)));
  Advance(absl::Seconds(60));
  EXPECT_EQ(sched_.task_count(), 3u);
  sched_.Tick();
  EXPECT_EQ(sched_.task_count(), 6u);
  sched_.Tick();
  sched_.Tick();
  EXPECT_EQ(sched_.task_count(), 10u);
  Check();
  // Each for its own fire time, not a later one.
  EXPECT_NE(sched_.Find("s9:20231114T221420Z"), nullptr);
}

TEST_F(ScheduleTest, BehindWhileRunningFiresOnceForTheLatest) {
  Create(Every("beat", absl::Seconds(10)));
  // A stall (or a clock jump) of 35 s: one task, for T0+30.
  Advance(absl::Seconds(35));
  EXPECT_THAT(TaskIds(), ::testing::ElementsAre("beat:20231114T221350Z"));
  EXPECT_EQ(sched_.FindSchedule("beat")->next_fire, kT0 + absl::Seconds(40));
}

TEST_F(ScheduleTest, RestoreKeepsPausedAndReportedFields) {
  Create(Every("beat", absl::Seconds(10)));
  Advance(absl::Seconds(10));
  v1::Schedule paused = Cron("nightly", "0 3 * * *", "Europe/Berlin");
  paused.set_paused(true);
  Create(paused);
  std::unique_ptr<Scheduler> s = RestartAfter(absl::Seconds(1));
  ASSERT_EQ(s->schedule_count(), 2u);
  v1::Schedule before, after;
  sched_.DescribeSchedule(*sched_.FindSchedule("beat"), &before);
  s->DescribeSchedule(*s->FindSchedule("beat"), &after);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, after))
      << before.DebugString() << after.DebugString();
  EXPECT_TRUE(s->FindSchedule("nightly")->paused);
  std::vector<const ScheduleRecord*> page = s->ListSchedules("", 10);
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0]->id(), "beat");
  EXPECT_EQ(s->ListSchedules("beat", 10).size(), 1u);
}

}  // namespace
}  // namespace taskgrid::core
