#include "common/cron.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/civil_time.h"
#include "absl/time/time.h"

namespace taskgrid::cron {
namespace {

using ::testing::HasSubstr;

absl::TimeZone Zone(const std::string& name) {
  absl::StatusOr<absl::TimeZone> tz = LoadZone("time_zone", name);
  EXPECT_TRUE(tz.ok()) << tz.status();
  return tz.ok() ? *tz : absl::UTCTimeZone();
}

CronExpr MustParse(const std::string& text) {
  absl::StatusOr<CronExpr> e = CronExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  return e.ok() ? *e : CronExpr();
}

// The next `n` fire times after the wall time `from` in `zone`, as wall
// times there with their offset ("2026-03-08T03:00:00-04:00").
std::vector<std::string> Fires(const std::string& expr, const std::string& zone,
                               absl::CivilSecond from, int n) {
  const absl::TimeZone tz = Zone(zone);
  const CronExpr e = MustParse(expr);
  absl::Time t = tz.At(from).pre;
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    t = e.Next(t, tz);
    out.push_back(absl::FormatTime("%Y-%m-%dT%H:%M:%S%Ez", t, tz));
  }
  return out;
}

std::string ParseError(const std::string& text) {
  absl::StatusOr<CronExpr> e = CronExpr::Parse(text);
  EXPECT_FALSE(e.ok()) << text;
  if (e.ok()) return "";
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(e.status().message());
}

const absl::CivilSecond kMon = absl::CivilSecond(2026, 11, 23, 10, 7, 30);  // a Monday

TEST(Cron, StarFiresEveryMinuteStrictlyAfter) {
  EXPECT_THAT(Fires("* * * * *", "UTC", kMon, 3),
              ::testing::ElementsAre("2026-11-23T10:08:00+00:00", "2026-11-23T10:09:00+00:00",
                                     "2026-11-23T10:10:00+00:00"));
  // Exactly on a fire time: the next one, never the same.
  EXPECT_THAT(Fires("* * * * *", "UTC", absl::CivilSecond(2026, 11, 23, 10, 8, 0), 1),
              ::testing::ElementsAre("2026-11-23T10:09:00+00:00"));
}

TEST(Cron, ValuesListsRangesAndSteps) {
  EXPECT_THAT(Fires("5 * * * *", "UTC", kMon, 2),
              ::testing::ElementsAre("2026-11-23T11:05:00+00:00", "2026-11-23T12:05:00+00:00"));
  EXPECT_THAT(Fires("0,30 9 * * *", "UTC", kMon, 3),
              ::testing::ElementsAre("2026-11-24T09:00:00+00:00", "2026-11-24T09:30:00+00:00",
                                     "2026-11-25T09:00:00+00:00"));
  EXPECT_THAT(Fires("0 22-23 * * *", "UTC", kMon, 3),
              ::testing::ElementsAre("2026-11-23T22:00:00+00:00", "2026-11-23T23:00:00+00:00",
                                     "2026-11-24T22:00:00+00:00"));
  EXPECT_THAT(Fires("*/15 * * * *", "UTC", kMon, 3),
              ::testing::ElementsAre("2026-11-23T10:15:00+00:00", "2026-11-23T10:30:00+00:00",
                                     "2026-11-23T10:45:00+00:00"));
  EXPECT_THAT(Fires("10-30/10 * * * *", "UTC", kMon, 4),
              ::testing::ElementsAre("2026-11-23T10:10:00+00:00", "2026-11-23T10:20:00+00:00",
                                     "2026-11-23T10:30:00+00:00", "2026-11-23T11:10:00+00:00"));
  // A list mixing the forms.
  EXPECT_THAT(Fires("0 1,5-6,*/12 * * *", "UTC", kMon, 5),
              ::testing::ElementsAre("2026-11-23T12:00:00+00:00", "2026-11-24T00:00:00+00:00",
                                     "2026-11-24T01:00:00+00:00", "2026-11-24T05:00:00+00:00",
                                     "2026-11-24T06:00:00+00:00"));
  // Whitespace: tabs and repeated spaces separate fields too.
  EXPECT_THAT(Fires("  0\t3   * * *  ", "UTC", kMon, 1),
              ::testing::ElementsAre("2026-11-24T03:00:00+00:00"));
}

TEST(Cron, MonthAndWeekdayNames) {
  EXPECT_THAT(Fires("0 0 1 jan,Jul *", "UTC", kMon, 2),
              ::testing::ElementsAre("2027-01-01T00:00:00+00:00", "2027-07-01T00:00:00+00:00"));
  EXPECT_THAT(Fires("0 9 * * MON-FRI", "UTC", absl::CivilSecond(2026, 11, 27, 12, 0, 0), 2),
              ::testing::ElementsAre("2026-11-30T09:00:00+00:00", "2026-12-01T09:00:00+00:00"));
  EXPECT_THAT(Fires("0 0 * FEB-MAR/1 sat", "UTC", kMon, 1),
              ::testing::ElementsAre("2027-02-06T00:00:00+00:00"));
}

TEST(Cron, SundayIsZeroAndSeven) {
  const auto zero = Fires("0 12 * * 0", "UTC", kMon, 2);
  EXPECT_EQ(zero, Fires("0 12 * * 7", "UTC", kMon, 2));
  EXPECT_EQ(zero, Fires("0 12 * * SUN", "UTC", kMon, 2));
  EXPECT_THAT(zero,
              ::testing::ElementsAre("2026-11-29T12:00:00+00:00", "2026-12-06T12:00:00+00:00"));
  // 5-7: Friday, Saturday, Sunday.
  EXPECT_THAT(Fires("0 12 * * 5-7", "UTC", kMon, 4),
              ::testing::ElementsAre("2026-11-27T12:00:00+00:00", "2026-11-28T12:00:00+00:00",
                                     "2026-11-29T12:00:00+00:00", "2026-12-04T12:00:00+00:00"));
}

TEST(Cron, DayOfMonthOrDayOfWeekWhenBothRestricted) {
  // The 1st of the month, or any Friday.
  EXPECT_THAT(Fires("0 0 1 * FRI", "UTC", kMon, 4),
              ::testing::ElementsAre("2026-11-27T00:00:00+00:00", "2026-12-01T00:00:00+00:00",
                                     "2026-12-04T00:00:00+00:00", "2026-12-11T00:00:00+00:00"));
  // One of them unrestricted (*): both must match.
  EXPECT_THAT(Fires("0 0 * * FRI", "UTC", kMon, 2),
              ::testing::ElementsAre("2026-11-27T00:00:00+00:00", "2026-12-04T00:00:00+00:00"));
  EXPECT_THAT(Fires("0 0 13 * *", "UTC", kMon, 1),
              ::testing::ElementsAre("2026-12-13T00:00:00+00:00"));
  // A field starting with * counts as unrestricted: Fridays that are odd days.
  EXPECT_THAT(Fires("0 0 */2 * FRI", "UTC", kMon, 2),
              ::testing::ElementsAre("2026-11-27T00:00:00+00:00", "2026-12-11T00:00:00+00:00"));
}

TEST(Cron, MonthEndsAndLeapDays) {
  // The 31st only in months that have one.
  EXPECT_THAT(Fires("0 0 31 * *", "UTC", kMon, 3),
              ::testing::ElementsAre("2026-12-31T00:00:00+00:00", "2027-01-31T00:00:00+00:00",
                                     "2027-03-31T00:00:00+00:00"));
  // Feb 29 waits for a leap year.
  EXPECT_THAT(Fires("0 0 29 2 *", "UTC", kMon, 2),
              ::testing::ElementsAre("2028-02-29T00:00:00+00:00", "2032-02-29T00:00:00+00:00"));
  // 2100 is not a leap year: from 2097 the next Feb 29 is in 2104.
  EXPECT_THAT(Fires("0 0 29 2 *", "UTC", absl::CivilSecond(2097, 1, 1, 0, 0, 0), 1),
              ::testing::ElementsAre("2104-02-29T00:00:00+00:00"));
  EXPECT_THAT(Fires("30 23 28-29 FEB *", "UTC", absl::CivilSecond(2027, 2, 28, 23, 31, 0), 1),
              ::testing::ElementsAre("2028-02-28T23:30:00+00:00"));
}

TEST(Cron, Macros) {
  EXPECT_THAT(Fires("@hourly", "UTC", kMon, 1),
              ::testing::ElementsAre("2026-11-23T11:00:00+00:00"));
  EXPECT_THAT(Fires("@daily", "UTC", kMon, 1), ::testing::ElementsAre("2026-11-24T00:00:00+00:00"));
  EXPECT_EQ(Fires("@midnight", "UTC", kMon, 2), Fires("@daily", "UTC", kMon, 2));
  EXPECT_THAT(Fires("@weekly", "UTC", kMon, 1),
              ::testing::ElementsAre("2026-11-29T00:00:00+00:00"));
  EXPECT_THAT(Fires("@monthly", "UTC", kMon, 1),
              ::testing::ElementsAre("2026-12-01T00:00:00+00:00"));
  EXPECT_THAT(Fires("@yearly", "UTC", kMon, 1),
              ::testing::ElementsAre("2027-01-01T00:00:00+00:00"));
  EXPECT_EQ(Fires("@ANNUALLY", "UTC", kMon, 2), Fires("@yearly", "UTC", kMon, 2));
}

TEST(Cron, WallTimeOfTheZone) {
  EXPECT_THAT(Fires("0 9 * * *", "Europe/Berlin", kMon, 1),
              ::testing::ElementsAre("2026-11-24T09:00:00+01:00"));
  EXPECT_THAT(Fires("0 9 * * *", "Asia/Kolkata", kMon, 1),
              ::testing::ElementsAre("2026-11-24T09:00:00+05:30"));
}

TEST(Cron, SpringForwardSkipsTheMissingWallTime) {
  // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT. 02:30 does not
  // exist that day and does not fire; the day before and after it does.
  EXPECT_THAT(Fires("30 2 * * *", "America/New_York", absl::CivilSecond(2026, 3, 6, 12, 0, 0), 3),
              ::testing::ElementsAre("2026-03-07T02:30:00-05:00", "2026-03-09T02:30:00-04:00",
                                     "2026-03-10T02:30:00-04:00"));
  // Hourly: 01:00 EST, then 03:00 EDT (no 02:00).
  EXPECT_THAT(Fires("0 * * * *", "America/New_York", absl::CivilSecond(2026, 3, 8, 0, 30, 0), 3),
              ::testing::ElementsAre("2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00",
                                     "2026-03-08T04:00:00-04:00"));
  // Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST.
  EXPECT_THAT(Fires("15 2 * * *", "Europe/Berlin", absl::CivilSecond(2026, 3, 28, 12, 0, 0), 2),
              ::testing::ElementsAre("2026-03-30T02:15:00+02:00", "2026-03-31T02:15:00+02:00"));
}

TEST(Cron, FallBackFiresARepeatedWallTimeOnce) {
  // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens
  // twice and fires at the first.
  EXPECT_THAT(Fires("30 1 * * *", "America/New_York", absl::CivilSecond(2026, 10, 31, 12, 0, 0), 2),
              ::testing::ElementsAre("2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"));
  // Every 20 minutes through the repeated hour: each wall time once.
  EXPECT_THAT(
      Fires("*/20 1-2 * * *", "America/New_York", absl::CivilSecond(2026, 11, 1, 0, 50, 0), 7),
      ::testing::ElementsAre("2026-11-01T01:00:00-04:00", "2026-11-01T01:20:00-04:00",
                             "2026-11-01T01:40:00-04:00", "2026-11-01T02:00:00-05:00",
                             "2026-11-01T02:20:00-05:00", "2026-11-01T02:40:00-05:00",
                             "2026-11-02T01:00:00-05:00"));
  // Asked from inside the second pass (01:10 EST): 01:20 fired in the
  // first pass already, so the next is 02:00.
  const absl::TimeZone ny = Zone("America/New_York");
  const absl::Time second_pass = ny.At(absl::CivilSecond(2026, 11, 1, 1, 10, 0)).post;
  EXPECT_EQ(absl::FormatTime("%H:%M%Ez", MustParse("*/20 1-2 * * *").Next(second_pass, ny), ny),
            "02:00-05:00");
  // Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET.
  EXPECT_THAT(Fires("30 2 * * *", "Europe/Berlin", absl::CivilSecond(2026, 10, 24, 12, 0, 0), 2),
              ::testing::ElementsAre("2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"));
}

TEST(Cron, InvalidExpressionsNameTheField) {
  EXPECT_THAT(ParseError(""), HasSubstr("is empty"));
  EXPECT_THAT(ParseError("   "), HasSubstr("is empty"));
  EXPECT_THAT(ParseError("hello"), HasSubstr("has 1 fields; expected 5"));
  EXPECT_THAT(ParseError("0 0 * * * *"), HasSubstr("has 6 fields; expected 5"));
  EXPECT_THAT(ParseError("0 0 * * * *"), HasSubstr("seconds"));
  EXPECT_THAT(ParseError("* * * *"), HasSubstr("has 4 fields"));
  EXPECT_EQ(ParseError("60 * * * *"), "minute: 60 is out of range 0-59");
  EXPECT_EQ(ParseError("0 24 * * *"), "hour: 24 is out of range 0-23");
  EXPECT_EQ(ParseError("0 0 0 * *"), "day-of-month: 0 is out of range 1-31");
  EXPECT_EQ(ParseError("0 0 32 * *"), "day-of-month: 32 is out of range 1-31");
  EXPECT_EQ(ParseError("0 0 * 13 *"), "month: 13 is out of range 1-12");
  EXPECT_EQ(ParseError("0 0 * * 8"), "day-of-week: 8 is out of range 0-7");
  EXPECT_THAT(ParseError("0 0 * FOO *"),
              HasSubstr("month: \"FOO\" is neither a number nor a name"));
  EXPECT_THAT(ParseError("0 0 * * MONDAY"), HasSubstr("day-of-week: \"MONDAY\""));
  EXPECT_THAT(ParseError("x * * * *"), HasSubstr("minute: \"x\" is not a number"));
  EXPECT_THAT(ParseError("0 JAN * * *"), HasSubstr("hour: \"JAN\" is not a number"));
  EXPECT_THAT(ParseError("*/0 * * * *"), HasSubstr("minute: step \"0\""));
  EXPECT_THAT(ParseError("*/x * * * *"), HasSubstr("minute: step \"x\""));
  EXPECT_THAT(ParseError("0 */25 * * *"), HasSubstr("hour: step 25"));
  EXPECT_THAT(ParseError("0 5/2 * * *"), HasSubstr("hour: \"5/2\": a step needs"));
  EXPECT_THAT(ParseError("30-10 * * * *"), HasSubstr("minute: range \"30-10\" runs backwards"));
  EXPECT_THAT(ParseError("0 0 1,,2 * *"), HasSubstr("day-of-month: \"1,,2\" has an empty"));
  EXPECT_THAT(ParseError("0 0 1- * *"), HasSubstr("day-of-month: a value is missing"));
  EXPECT_THAT(ParseError("-1 * * * *"), HasSubstr("minute"));
  EXPECT_THAT(ParseError("@every_minute"), HasSubstr("is not a known macro"));
  EXPECT_THAT(ParseError("@reboot"), HasSubstr("is not a known macro"));
  // Never fires.
  EXPECT_THAT(ParseError("0 0 30 2 *"), HasSubstr("day-of-month: \"30\" never falls in month"));
  EXPECT_THAT(ParseError("0 0 31 APR,JUN *"), HasSubstr("never fires"));
  // ... unless the weekday field, restricted too, gives other days.
  EXPECT_TRUE(CronExpr::Parse("0 0 30 2 MON").ok());
}

TEST(Cron, ZonesLoadByIanaName) {
  EXPECT_TRUE(LoadZone("time_zone", "").ok());
  EXPECT_TRUE(LoadZone("time_zone", "UTC").ok());
  EXPECT_TRUE(LoadZone("time_zone", "Etc/GMT+5").ok());
  for (const char* bad : {"Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime", "Europe/",
                          "Europe/Berlin\n", "utc x"}) {
    absl::StatusOr<absl::TimeZone> tz = LoadZone("schedule.time_zone", bad);
    ASSERT_FALSE(tz.ok()) << bad;
    EXPECT_EQ(tz.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tz.status().message(), HasSubstr("schedule.time_zone"));
    EXPECT_THAT(tz.status().message(), HasSubstr("not a known IANA time zone"));
  }
  EXPECT_THAT(LoadZone("tz", std::string(65, 'a')).status().message(), HasSubstr("limit is 64"));
}

TEST(Cron, IntervalsCountFromTheAnchor) {
  const absl::Time a = absl::FromUnixSeconds(1'000'000);
  EXPECT_EQ(NextInterval(a, absl::Seconds(10), a), a + absl::Seconds(10));
  EXPECT_EQ(NextInterval(a, absl::Seconds(10), a - absl::Hours(1)), a + absl::Seconds(10));
  EXPECT_EQ(NextInterval(a, absl::Seconds(10), a + absl::Seconds(9)), a + absl::Seconds(10));
  EXPECT_EQ(NextInterval(a, absl::Seconds(10), a + absl::Seconds(10)), a + absl::Seconds(20));
  EXPECT_EQ(NextInterval(a, absl::Seconds(10), a + absl::Seconds(1234.5)), a + absl::Seconds(1240));
}

}  // namespace
}  // namespace taskgrid::cron
