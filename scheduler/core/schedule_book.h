// ScheduleBook: periodic tasks. Every schedule (by id) and the timer of
// the unpaused ones, their fires, skips and misfire policy.
//
// A fire is an ordinary submit of the schedule's template under an id
// derived from (schedule id, fire time) (FireTaskId), so a fire made twice
// (a restart, a RUN_ONCE of a time that already fired) returns the
// existing task. The book does not make tasks: FireDue hands each fire's
// spec to the Scheduler's submit and records what came of it. The task's
// rows and the schedule's row go into the same Effects, one transaction:
// a crash either keeps both or neither.
//
// Owns: the schedule records, the timer. Invariant (CheckInvariants): the
// timer holds exactly the unpaused schedules, each once, at its next fire.
// Writes: schedule rows and notices (skipped fires) into the Effects it is
// given, and the fire counters of TaskCounters it is given at
// construction. Reaches no task.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/core/effects.h"
#include "scheduler/core/metrics.h"
#include "scheduler/core/model.h"
#include "scheduler/core/options.h"
#include "taskgrid/v1/schedule_service.pb.h"

namespace taskgrid::core {

class ScheduleBook {
 public:
  // What the submit of one fire's task came to.
  struct Fired {
    enum class Kind {
      kMade,     // the task is made (or existed in memory): `task_id`
      kExisted,  // the fire's task exists and finished (it fired before): `task_id`
      kWait,     // it needs tasks read back from disk first: fire on a later tick
      kRefused,  // the submit was refused (`refused`): recorded, not retried
    };
    Kind kind = Kind::kMade;
    std::string task_id;
    absl::Status refused;
  };
  using Submit = absl::FunctionRef<Fired(v1::TaskSpec spec)>;

  // `opts` (the template's validation, fires per tick, catch-up) and
  // `counters` (the fire counters) must outlive the book.
  ScheduleBook(const SchedulerOptions* opts, TaskCounters* counters)
      : opts_(opts), counters_(counters) {}
  ScheduleBook(const ScheduleBook&) = delete;
  ScheduleBook& operator=(const ScheduleBook&) = delete;

  // "<schedule id>:<fire time in UTC as YYYYMMDDTHHMMSSZ>".
  static std::string FireTaskId(const std::string& schedule_id, absl::Time fire);

  // INVALID_ARGUMENT naming the field; the existing schedule for the same
  // definition again; ALREADY_EXISTS for another one under its id.
  absl::StatusOr<const ScheduleRecord*> Create(v1::Schedule def, absl::Time now, Effects* out);
  // nullptr when unknown.
  const ScheduleRecord* Find(const std::string& id) const;
  absl::StatusOr<const ScheduleRecord*> Pause(const std::string& id, absl::Time now, Effects* out);
  // Fires again from the next fire time after now.
  absl::StatusOr<const ScheduleRecord*> Resume(const std::string& id, absl::Time now, Effects* out);
  // Returns the schedule as it was.
  absl::StatusOr<ScheduleRecord> Delete(const std::string& id, Effects* out);
  // Up to `limit` schedules with ids after `after_id`, in id order.
  std::vector<const ScheduleRecord*> List(const std::string& after_id, int limit) const;
  static void Describe(const ScheduleRecord& s, v1::Schedule* out);
  size_t size() const { return schedules_.size(); }

  // Fires the due schedules, at most opts.max_schedule_fires_per_tick,
  // each through `submit`.
  void FireDue(absl::Time now, Submit submit, Effects* out);

  // Start-up: the stored schedules. One whose fire time passed while the
  // scheduler was down is left to its misfire policy at the next FireDue.
  absl::Status Restore(std::vector<ScheduleRow> rows, absl::Time now);

  // "" when the invariant holds; else what is wrong.
  std::string CheckInvariants() const;

 private:
  // Skipped fires of one outage are counted up to this many (a minutely
  // cron schedule down for 70 days is not walked minute by minute).
  static constexpr int64_t kMaxSkippedFiresCounted = 100'000;

  // One fire: a task for `fire` through `submit`, recorded on `s`. False
  // when it must wait for tasks on disk to be read back.
  bool Fire(ScheduleRecord& s, absl::Time fire, absl::Time now, Submit submit);
  // The first fire time of `s` strictly after `t`.
  static absl::Time NextFire(const ScheduleRecord& s, absl::Time t);
  // The latest fire time of `s` at or before `now`, `due` (one) at least.
  static absl::Time LatestFire(const ScheduleRecord& s, absl::Time due, absl::Time now);
  // The fires of `s` from `from` to `to` (both fire times), counted up to
  // kMaxSkippedFiresCounted.
  static int64_t CountFires(const ScheduleRecord& s, absl::Time from, absl::Time to);
  // The fires from `from` to `to` did not run: counted on `s` and in the
  // counters, and logged.
  void SkipFires(ScheduleRecord& s, absl::Time from, absl::Time to, absl::Time now, Effects* out);
  // The fires from `from` up to the one before `fired` (which ran) did not.
  void SkipFiresBefore(ScheduleRecord& s, absl::Time from, absl::Time fired, absl::Time now,
                       Effects* out);
  static void Persist(const ScheduleRecord& s, Effects* out);
  absl::StatusOr<ScheduleRecord*> Lookup(const std::string& id);

  const SchedulerOptions* opts_;
  TaskCounters* counters_;
  // Schedules by id, and the unpaused ones by (next fire, id).
  absl::btree_map<std::string, std::unique_ptr<ScheduleRecord>> schedules_;
  absl::btree_set<std::pair<absl::Time, std::string>> timer_;
};

}  // namespace taskgrid::core
