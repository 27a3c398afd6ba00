// Cron expressions and fire times: when a schedule fires next.
//
// Standard 5 fields, minute hour day-of-month month day-of-week:
//   *            every value
//   a, a-b       one value, a range (inclusive; no wrap-around)
//   */n, a-b/n   every n-th value of the whole range, or of a-b
//   x,y,...      a list of any of these
// Months may be named JAN..DEC and weekdays SUN..SAT (any case); weekday 0
// and 7 are both Sunday. When both day-of-month and day-of-week are
// restricted (neither starts with `*`), a day matching either fires (the
// classic cron rule); otherwise both must match. The macros @yearly
// (@annually), @monthly, @weekly, @daily (@midnight) and @hourly stand for
// their usual expressions.
//
// Fire times are wall times in a time zone. A wall time that a
// spring-forward skips does not fire that day; a wall time that a
// fall-back repeats fires once, at its first occurrence.
//
// Pure functions over values; thread-compatible. Zones come from
// absl::LoadTimeZone (the IANA database in /usr/share/zoneinfo).
#pragma once

#include <bitset>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace taskgrid::cron {

class CronExpr {
 public:
  // INVALID_ARGUMENT naming the bad field ("hour: 25 is out of range
  // 0-23"); also for an expression that can never fire ("0 0 30 2 *").
  static absl::StatusOr<CronExpr> Parse(absl::string_view text);

  // The first fire time strictly after `t`, in `zone`.
  absl::Time Next(absl::Time t, const absl::TimeZone& zone) const;

  // Whether the wall-clock minute matches the fields.
  bool Matches(const absl::CivilMinute& m) const;

 private:
  bool DayMatches(const absl::CivilDay& d) const;

  std::bitset<60> minutes_;
  std::bitset<24> hours_;
  std::bitset<32> days_;     // 1-31
  std::bitset<13> months_;   // 1-12
  std::bitset<7> weekdays_;  // 0 = Sunday
  bool days_star_ = false;
  bool weekdays_star_ = false;
};

// Loads an IANA zone name ("" is UTC). INVALID_ARGUMENT naming `field`
// when the name is malformed or not in the zone database.
absl::StatusOr<absl::TimeZone> LoadZone(absl::string_view field, absl::string_view name);

// The first time strictly after `t` of the form anchor + k * interval,
// k >= 1. `interval` must be positive.
absl::Time NextInterval(absl::Time anchor, absl::Duration interval, absl::Time t);

}  // namespace taskgrid::cron
