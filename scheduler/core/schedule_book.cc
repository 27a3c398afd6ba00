#include "scheduler/core/schedule_book.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cron.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/core/validate.h"

namespace taskgrid::core {

namespace {

constexpr size_t kMaxCronLength = 256;
constexpr absl::Duration kMaxInterval = absl::Hours(24 * 366);

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// The definition's fields only, with the defaults filled in (what a
// repeated create is compared by); `paused` is taken out of it.
v1::Schedule Definition(v1::Schedule s, bool* paused) {
  *paused = s.paused();
  s.clear_paused();
  s.clear_next_fire_time();
  s.clear_last_fire_time();
  s.clear_last_task_id();
  s.clear_fire_count();
  s.clear_last_error();
  s.clear_create_time();
  s.clear_update_time();
  s.clear_skipped_fires();
  s.clear_last_skipped_time();
  if (s.time_zone().empty()) s.set_time_zone("UTC");
  if (s.misfire_policy() == v1::MISFIRE_POLICY_UNSPECIFIED) {
    s.set_misfire_policy(v1::MISFIRE_POLICY_CATCH_UP);
  }
  if (s.has_task_template() && s.task_template().queue().empty()) {
    s.mutable_task_template()->set_queue(kDefaultQueue);
  }
  return s;
}

// Checks a definition and compiles it into `r` (def, cron, zone,
// interval). `field` prefixes the messages ("schedule").
absl::Status Compile(const v1::Schedule& def, const SchedulerOptions& opts, absl::string_view field,
                     ScheduleRecord* r) {
  RETURN_IF_ERROR(CheckName(absl::StrCat(field, ".id"), def.id(), kMaxScheduleIdLength));
  const std::string cron_field = absl::StrCat(field, ".cron");
  const std::string interval_field = absl::StrCat(field, ".interval");
  const bool has_interval = def.has_interval();
  if (!def.cron().empty() && has_interval) {
    return Invalid(cron_field, absl::StrCat("and ", interval_field, " are both set: give one"));
  }
  if (def.cron().empty() && !has_interval) {
    return absl::InvalidArgumentError(absl::StrCat(field, " needs a trigger: set ", cron_field,
                                                   " (e.g. \"0 3 * * *\") or ", interval_field,
                                                   " (e.g. 60s)"));
  }
  if (!def.cron().empty()) {
    if (def.cron().size() > kMaxCronLength) {
      return Invalid(cron_field, absl::StrCat("is ", def.cron().size(),
                                              " characters long; the limit is ", kMaxCronLength));
    }
    absl::StatusOr<cron::CronExpr> expr = cron::CronExpr::Parse(def.cron());
    if (!expr.ok()) {
      return Invalid(absl::StrCat(cron_field, " \"", def.cron(), "\":"), expr.status().message());
    }
    r->cron = *expr;
  } else {
    const google::protobuf::Duration& d = def.interval();
    if (d.seconds() < 0 || d.nanos() < 0) return Invalid(interval_field, "is negative");
    if (d.nanos() != 0) {
      return Invalid(interval_field, absl::StrCat("is ", absl::FormatDuration(FromProto(d)),
                                                  ": give whole seconds"));
    }
    if (d.seconds() < 1) return Invalid(interval_field, "is 0s; the least is 1s");
    if (FromProto(d) > kMaxInterval) {
      return Invalid(interval_field,
                     absl::StrCat("is longer than ", absl::FormatDuration(kMaxInterval),
                                  "; use a cron expression"));
    }
    r->interval = FromProto(d);
  }
  ASSIGN_OR_RETURN(r->zone, cron::LoadZone(absl::StrCat(field, ".time_zone"), def.time_zone()));
  if (!v1::MisfirePolicy_IsValid(def.misfire_policy())) {
    return Invalid(absl::StrCat(field, ".misfire_policy"),
                   absl::StrCat("is unknown (", def.misfire_policy(), ")"));
  }
  const std::string tf = absl::StrCat(field, ".task_template");
  if (!def.has_task_template()) {
    return Invalid(tf, "is unset: give the task each fire creates");
  }
  if (!def.task_template().id().empty()) {
    return Invalid(absl::StrCat(tf, ".id"),
                   absl::StrCat("is set: each fire names its task \"", def.id(),
                                ":<fire time>\"; leave it empty"));
  }
  if (!def.task_template().job_id().empty()) {
    return Invalid(absl::StrCat(tf, ".job_id"), "is set: a schedule's tasks belong to no job");
  }
  // Checked as the fires' tasks will be, with an id as long as theirs.
  v1::TaskSpec probe = def.task_template();
  probe.set_id(ScheduleBook::FireTaskId(def.id(), absl::UnixEpoch()));
  RETURN_IF_ERROR(ValidateSpec(probe, opts, FieldPath(tf.c_str())));
  r->def = def;
  return absl::OkStatus();
}

}  // namespace

std::string ScheduleBook::FireTaskId(const std::string& schedule_id, absl::Time fire) {
  return absl::StrCat(schedule_id, ":",
                      absl::FormatTime("%Y%m%dT%H%M%SZ", fire, absl::UTCTimeZone()));
}

absl::Time ScheduleBook::NextFire(const ScheduleRecord& s, absl::Time t) {
  if (s.interval > absl::ZeroDuration()) return cron::NextInterval(s.anchor(), s.interval, t);
  return s.cron.Next(t, s.zone);
}

absl::Time ScheduleBook::LatestFire(const ScheduleRecord& s, absl::Time due, absl::Time now) {
  if (s.interval > absl::ZeroDuration()) {
    return std::max(due, cron::NextInterval(s.anchor(), s.interval, now) - s.interval);
  }
  // Walk the fires of a recent window only, widened until it holds one:
  // a minutely schedule down for a year is not walked minute by minute.
  for (const absl::Duration back : {absl::Hours(2), absl::Hours(50), absl::Hours(24 * 33),
                                    absl::Hours(24 * 367), absl::InfiniteDuration()}) {
    const absl::Time from = back == absl::InfiniteDuration() ? due : std::max(due, now - back);
    absl::Time latest = from == due ? due : absl::InfinitePast();
    for (absl::Time t = NextFire(s, from); t <= now; t = NextFire(s, t)) latest = t;
    if (latest != absl::InfinitePast()) return latest;
  }
  return due;
}

int64_t ScheduleBook::CountFires(const ScheduleRecord& s, absl::Time from, absl::Time to) {
  if (to < from) return 0;
  if (s.interval > absl::ZeroDuration()) {
    absl::Duration rest;
    return std::min<int64_t>(absl::IDivDuration(to - from, s.interval, &rest) + 1,
                             kMaxSkippedFiresCounted);
  }
  int64_t n = 1;
  for (absl::Time t = NextFire(s, from); t <= to && n < kMaxSkippedFiresCounted;
       t = NextFire(s, t)) {
    ++n;
  }
  return n;
}

void ScheduleBook::SkipFires(ScheduleRecord& s, absl::Time from, absl::Time to, absl::Time now,
                             Effects* out) {
  const int64_t n = CountFires(s, from, to);
  if (n == 0) return;
  s.skipped_fires += n;
  s.last_skipped = std::max(s.last_skipped, to);
  counters_->schedule_fires_skipped += n;
  out->notices.push_back(
      absl::StrCat("schedule ", s.id(), ": skipped ", n, " fire(s) from ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", from, absl::UTCTimeZone()), " to ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", to, absl::UTCTimeZone()), " (the last ",
                   absl::FormatDuration(absl::Trunc(now - to, absl::Seconds(1))),
                   " late; misfire policy ", v1::MisfirePolicy_Name(s.def.misfire_policy()), ")"));
}

void ScheduleBook::SkipFiresBefore(ScheduleRecord& s, absl::Time from, absl::Time fired,
                                   absl::Time now, Effects* out) {
  if (fired > from) {
    SkipFires(s, from, LatestFire(s, from, fired - absl::Nanoseconds(1)), now, out);
  }
}

void ScheduleBook::Persist(const ScheduleRecord& s, Effects* out) {
  ScheduleRow r;
  r.id = s.id();
  if (s.skipped_fires == 0) {
    s.def.SerializeToString(&r.definition);
  } else {
    v1::Schedule stored = s.def;
    stored.set_skipped_fires(s.skipped_fires);
    SetTimestamp(s.last_skipped, stored.mutable_last_skipped_time());
    stored.SerializeToString(&r.definition);
  }
  r.paused = s.paused;
  r.next_fire_us = ToUnixMicrosOrZero(s.next_fire == absl::InfiniteFuture() ? absl::InfinitePast()
                                                                            : s.next_fire);
  r.last_fire_us = ToUnixMicrosOrZero(s.last_fire);
  r.last_task_id = s.last_task_id;
  r.fire_count = s.fire_count;
  r.last_error = s.last_error;
  r.create_us = ToUnixMicrosOrZero(s.create_time);
  r.update_us = ToUnixMicrosOrZero(s.update_time);
  out->batch.schedules.push_back(std::move(r));
}

absl::StatusOr<ScheduleRecord*> ScheduleBook::Lookup(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is empty");
  auto it = schedules_.find(id);
  if (it == schedules_.end()) {
    return absl::NotFoundError(absl::StrCat("schedule \"", id, "\" does not exist"));
  }
  return it->second.get();
}

const ScheduleRecord* ScheduleBook::Find(const std::string& id) const {
  auto it = schedules_.find(id);
  return it == schedules_.end() ? nullptr : it->second.get();
}

absl::StatusOr<const ScheduleRecord*> ScheduleBook::Create(v1::Schedule given, absl::Time now,
                                                           Effects* out) {
  bool paused = false;
  v1::Schedule def = Definition(std::move(given), &paused);
  auto owned = std::make_unique<ScheduleRecord>();
  RETURN_IF_ERROR(Compile(def, *opts_, "schedule", owned.get()));
  if (const ScheduleRecord* existing = Find(def.id())) {
    if (!google::protobuf::util::MessageDifferencer::Equals(existing->def, def)) {
      return absl::AlreadyExistsError(
          absl::StrCat("schedule \"", def.id(), "\" already exists with another definition"));
    }
    return existing;  // the same create again
  }
  ScheduleRecord& s = *owned;
  s.paused = paused;
  s.create_time = now;
  s.update_time = now;
  s.next_fire = NextFire(s, now);
  if (!s.paused) timer_.emplace(s.next_fire, s.id());
  Persist(s, out);
  return schedules_.emplace(s.id(), std::move(owned)).first->second.get();
}

absl::StatusOr<const ScheduleRecord*> ScheduleBook::Pause(const std::string& id, absl::Time now,
                                                          Effects* out) {
  ASSIGN_OR_RETURN(ScheduleRecord * s, Lookup(id));
  if (s->paused) return s;
  timer_.erase({s->next_fire, s->id()});
  s->paused = true;
  s->update_time = now;
  Persist(*s, out);
  return s;
}

absl::StatusOr<const ScheduleRecord*> ScheduleBook::Resume(const std::string& id, absl::Time now,
                                                           Effects* out) {
  ASSIGN_OR_RETURN(ScheduleRecord * s, Lookup(id));
  if (!s->paused) return s;
  s->paused = false;
  s->missed = false;
  s->next_fire = NextFire(*s, now);  // what fell while paused is not made up
  s->update_time = now;
  timer_.emplace(s->next_fire, s->id());
  Persist(*s, out);
  return s;
}

absl::StatusOr<ScheduleRecord> ScheduleBook::Delete(const std::string& id, Effects* out) {
  ASSIGN_OR_RETURN(ScheduleRecord * s, Lookup(id));
  if (!s->paused) timer_.erase({s->next_fire, s->id()});
  ScheduleRecord gone = std::move(*s);
  schedules_.erase(id);
  ScheduleRow r;
  r.erase = true;
  r.id = id;
  out->batch.schedules.push_back(std::move(r));
  return gone;
}

std::vector<const ScheduleRecord*> ScheduleBook::List(const std::string& after_id,
                                                      int limit) const {
  std::vector<const ScheduleRecord*> out;
  for (auto it = schedules_.upper_bound(after_id);
       it != schedules_.end() && static_cast<int>(out.size()) < limit; ++it) {
    out.push_back(it->second.get());
  }
  return out;
}

void ScheduleBook::Describe(const ScheduleRecord& s, v1::Schedule* out) {
  *out = s.def;
  out->set_paused(s.paused);
  if (!s.paused) SetTimestamp(s.next_fire, out->mutable_next_fire_time());
  if (s.last_fire != absl::InfinitePast()) SetTimestamp(s.last_fire, out->mutable_last_fire_time());
  out->set_last_task_id(s.last_task_id);
  out->set_fire_count(s.fire_count);
  out->set_last_error(s.last_error);
  out->set_skipped_fires(s.skipped_fires);
  if (s.last_skipped != absl::InfinitePast()) {
    SetTimestamp(s.last_skipped, out->mutable_last_skipped_time());
  }
  SetTimestamp(s.create_time, out->mutable_create_time());
  SetTimestamp(s.update_time, out->mutable_update_time());
}

bool ScheduleBook::Fire(ScheduleRecord& s, absl::Time fire, absl::Time now, Submit submit) {
  v1::TaskSpec spec = s.def.task_template();
  spec.set_id(FireTaskId(s.id(), fire));
  Fired made = submit(std::move(spec));
  switch (made.kind) {
    case Fired::Kind::kWait:
      return false;
    case Fired::Kind::kExisted:
      // This fire's task exists and finished (a fire repeated after a
      // clock went back): it fired.
      s.last_fire = fire;
      s.last_task_id = std::move(made.task_id);
      s.last_error.clear();
      return true;
    case Fired::Kind::kRefused:
      // Recorded, and the schedule goes on to its next fire: a refusal (a
      // full queue) is never retried in a loop.
      ++counters_->schedule_fires_refused;
      s.last_error = absl::StrCat("fire at ",
                                  absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", fire, absl::UTCTimeZone()),
                                  " refused: ", absl::StatusCodeToString(made.refused.code()), ": ",
                                  made.refused.message());
      return true;
    case Fired::Kind::kMade:
      break;
  }
  s.last_fire = fire;
  s.last_task_id = std::move(made.task_id);
  ++s.fire_count;
  ++counters_->schedule_fires;
  counters_->schedule_fire_lag.Observe(std::max(0.0, absl::ToDoubleSeconds(now - fire)));
  s.last_error.clear();
  return true;
}

void ScheduleBook::FireDue(absl::Time now, Submit submit, Effects* out) {
  std::vector<std::string> later;  // waiting for tasks read back from disk
  for (int budget = opts_->max_schedule_fires_per_tick;
       budget > 0 && !timer_.empty() && timer_.begin()->first <= now; --budget) {
    const std::string id = timer_.begin()->second;
    timer_.erase(timer_.begin());
    ScheduleRecord& s = *schedules_.at(id);
    const absl::Time due = s.next_fire;
    // An interval schedule's next fire is a whole interval on even when
    // `due` is off its grid: one stored by a version that counted from the
    // second below the creation would otherwise fire again a second later.
    absl::Time next = s.interval > absl::ZeroDuration()
                          ? NextFire(s, due + s.interval - absl::Nanoseconds(1))
                          : NextFire(s, due);
    bool fired = true;
    if (s.missed) {
      // Fires fell while the scheduler was down: the policy decides which
      // runs (the latest, or none); the others are skipped, and counted.
      const absl::Time latest = LatestFire(s, due, now);
      const v1::MisfirePolicy policy = s.def.misfire_policy();
      const bool run =
          policy == v1::MISFIRE_POLICY_RUN_ONCE ||
          (policy == v1::MISFIRE_POLICY_CATCH_UP && now - latest <= opts_->schedule_catch_up);
      if (run) fired = Fire(s, latest, now, submit);
      if (fired) {
        if (!run) {
          SkipFires(s, due, latest, now, out);
        } else {
          SkipFiresBefore(s, due, latest, now, out);
        }
      }
      next = NextFire(s, now);
    } else if (next <= now) {
      // Behind by more than one fire while running (a stall, a clock
      // jump): one task, for the latest; the ones before it are skipped.
      const absl::Time latest = LatestFire(s, due, now);
      fired = Fire(s, latest, now, submit);
      if (fired) SkipFiresBefore(s, due, latest, now, out);
      next = NextFire(s, now);
    } else {
      fired = Fire(s, due, now, submit);
    }
    if (!fired) {
      later.push_back(id);
      continue;
    }
    s.missed = false;
    s.next_fire = next;
    s.update_time = now;
    timer_.emplace(s.next_fire, s.id());
    Persist(s, out);
  }
  for (const std::string& id : later) timer_.emplace(schedules_.at(id)->next_fire, id);
}

absl::Status ScheduleBook::Restore(std::vector<ScheduleRow> rows, absl::Time now) {
  for (ScheduleRow& row : rows) {
    v1::Schedule def;
    if (!def.ParseFromString(row.definition)) {
      return absl::DataLossError(
          absl::StrCat("schedule ", row.id, ": its definition does not parse"));
    }
    // The skip counts ride in the blob (ScheduleRow::definition).
    const int64_t skipped = def.skipped_fires();
    const absl::Time last_skipped =
        def.has_last_skipped_time() ? FromProto(def.last_skipped_time()) : absl::InfinitePast();
    def.clear_skipped_fires();
    def.clear_last_skipped_time();
    auto owned = std::make_unique<ScheduleRecord>();
    if (absl::Status s =
            Compile(def, *opts_, absl::StrCat("stored schedule ", row.id), owned.get());
        !s.ok()) {
      // E.g. a time zone the zone database no longer has.
      return absl::FailedPreconditionError(s.message());
    }
    ScheduleRecord& s = *owned;
    s.paused = row.paused;
    s.next_fire = row.next_fire_us == 0 ? NextFire(s, now) : FromUnixMicrosOrZero(row.next_fire_us);
    s.last_fire = FromUnixMicrosOrZero(row.last_fire_us);
    s.last_task_id = std::move(row.last_task_id);
    s.fire_count = row.fire_count;
    s.last_error = std::move(row.last_error);
    s.skipped_fires = skipped;
    s.last_skipped = last_skipped;
    s.create_time = FromUnixMicrosOrZero(row.create_us);
    s.update_time = FromUnixMicrosOrZero(row.update_us);
    s.missed = !s.paused && s.next_fire <= now;
    if (!s.paused) timer_.emplace(s.next_fire, s.id());
    if (!schedules_.emplace(s.id(), std::move(owned)).second) {
      return absl::DataLossError(absl::StrCat("schedule ", row.id, " is stored twice"));
    }
  }
  return absl::OkStatus();
}

std::string ScheduleBook::CheckInvariants() const {
  size_t armed = 0;
  for (const auto& [id, sp] : schedules_) {
    if (sp->id() != id) return absl::StrCat("schedule ", sp->id(), " is listed under ", id);
    if (sp->paused) continue;
    ++armed;
    if (!timer_.contains({sp->next_fire, id})) {
      return absl::StrCat("schedule ", id, " is not in the timer at its next fire");
    }
  }
  if (armed != timer_.size()) {
    return absl::StrCat("the schedule timer holds ", timer_.size(), " entries for ", armed,
                        " unpaused schedules");
  }
  return "";
}

}  // namespace taskgrid::core
