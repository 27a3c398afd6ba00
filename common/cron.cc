#include "common/cron.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace taskgrid::cron {

namespace {

struct FieldRule {
  const char* name;
  int min;
  int max;
  const char* const* names;  // names[i] is value min + i (nullptr: none)
  int names_count;
};

constexpr const char* kMonthNames[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                       "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
constexpr const char* kDayNames[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"};

constexpr FieldRule kFields[5] = {
    {"minute", 0, 59, nullptr, 0},
    {"hour", 0, 23, nullptr, 0},
    {"day-of-month", 1, 31, nullptr, 0},
    {"month", 1, 12, kMonthNames, 12},
    // 7 is Sunday too; folded into 0 once parsed.
    {"day-of-week", 0, 7, kDayNames, 7},
};

absl::Status FieldError(const FieldRule& f, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(f.name, ": ", what));
}

// A number or (for months and weekdays) a name.
absl::StatusOr<int> ParseValue(const FieldRule& f, absl::string_view s) {
  if (s.empty()) return FieldError(f, "a value is missing");
  int v = 0;
  if (absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) {
    if (!absl::SimpleAtoi(s, &v)) {
      return FieldError(f, absl::StrCat("\"", s, "\" is not a number"));
    }
  } else {
    const std::string upper = absl::AsciiStrToUpper(s);
    bool found = false;
    for (int i = 0; i < f.names_count; ++i) {
      if (upper == f.names[i]) {
        v = (f.names == kMonthNames ? 1 : 0) + i;
        found = true;
        break;
      }
    }
    if (!found) {
      return FieldError(f, f.names_count > 0
                               ? absl::StrCat("\"", s, "\" is neither a number nor a name (",
                                              f.names[0], "..", f.names[f.names_count - 1], ")")
                               : absl::StrCat("\"", s, "\" is not a number"));
    }
  }
  if (v < f.min || v > f.max) {
    return FieldError(f, absl::StrCat(v, " is out of range ", f.min, "-", f.max));
  }
  return v;
}

// One field into `bits` (indexed by value). `star`: the field starts with *.
absl::Status ParseField(const FieldRule& f, absl::string_view text, std::bitset<64>* bits,
                        bool* star) {
  *star = !text.empty() && text[0] == '*';
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (item.empty()) return FieldError(f, absl::StrCat("\"", text, "\" has an empty list item"));
    absl::string_view range = item;
    int step = 1;
    if (const size_t slash = item.find('/'); slash != absl::string_view::npos) {
      range = item.substr(0, slash);
      const absl::string_view step_text = item.substr(slash + 1);
      if (!absl::SimpleAtoi(step_text, &step) || step < 1) {
        return FieldError(f, absl::StrCat("step \"", step_text, "\" in \"", item,
                                          "\" is not a whole number of at least 1"));
      }
      if (step > f.max - f.min + 1) {
        return FieldError(f, absl::StrCat("step ", step, " in \"", item, "\" is larger than the ",
                                          f.max - f.min + 1, " values of the field"));
      }
    }
    int lo = f.min;
    int hi = f.max;
    if (range == "*") {
      if (f.names == kDayNames) hi = 6;  // 7 would repeat Sunday
    } else if (const size_t dash = range.find('-'); dash != absl::string_view::npos) {
      absl::StatusOr<int> a = ParseValue(f, range.substr(0, dash));
      if (!a.ok()) return a.status();
      absl::StatusOr<int> b = ParseValue(f, range.substr(dash + 1));
      if (!b.ok()) return b.status();
      lo = *a;
      hi = *b;
      if (lo > hi) {
        return FieldError(f, absl::StrCat("range \"", range, "\" runs backwards (", lo, " > ", hi,
                                          "); ranges do not wrap around"));
      }
    } else {
      absl::StatusOr<int> a = ParseValue(f, range);
      if (!a.ok()) return a.status();
      if (step != 1) {
        return FieldError(f, absl::StrCat("\"", item, "\": a step needs * or a range before it ",
                                          "(*/n or a-b/n)"));
      }
      lo = hi = *a;
    }
    for (int v = lo; v <= hi; v += step) bits->set(static_cast<size_t>(v));
  }
  return absl::OkStatus();
}

constexpr int kDaysInMonth[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

}  // namespace

absl::StatusOr<CronExpr> CronExpr::Parse(absl::string_view text) {
  std::string expanded;
  absl::string_view body = absl::StripAsciiWhitespace(text);
  if (body.empty()) return absl::InvalidArgumentError("is empty");
  if (body[0] == '@') {
    const std::string macro = absl::AsciiStrToLower(body);
    if (macro == "@yearly" || macro == "@annually") {
      expanded = "0 0 1 1 *";
    } else if (macro == "@monthly") {
      expanded = "0 0 1 * *";
    } else if (macro == "@weekly") {
      expanded = "0 0 * * 0";
    } else if (macro == "@daily" || macro == "@midnight") {
      expanded = "0 0 * * *";
    } else if (macro == "@hourly") {
      expanded = "0 * * * *";
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", body,
                       "\" is not a known macro (@yearly, @annually, @monthly, @weekly, @daily, "
                       "@midnight, @hourly)"));
    }
    body = expanded;
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(body, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (fields.size() != 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has ", fields.size(), " fields; expected 5: minute hour day-of-month month day-of-week",
        fields.size() == 6 ? " (a seconds or year field is not supported)" : ""));
  }
  CronExpr e;
  std::bitset<64> bits[5];
  bool stars[5] = {};
  for (int i = 0; i < 5; ++i) {
    if (absl::Status s = ParseField(kFields[i], fields[i], &bits[i], &stars[i]); !s.ok()) return s;
  }
  for (int v = 0; v < 60; ++v) e.minutes_[v] = bits[0][v];
  for (int v = 0; v < 24; ++v) e.hours_[v] = bits[1][v];
  for (int v = 1; v <= 31; ++v) e.days_[v] = bits[2][v];
  for (int v = 1; v <= 12; ++v) e.months_[v] = bits[3][v];
  for (int v = 0; v < 7; ++v) e.weekdays_[v] = bits[4][v];
  if (bits[4][7]) e.weekdays_[0] = true;
  e.days_star_ = stars[2];
  e.weekdays_star_ = stars[4];
  // A day-of-month that no chosen month has never fires (unless the
  // weekdays, restricted too, give other days).
  if (!e.days_star_ && e.weekdays_star_) {
    bool any = false;
    for (int m = 1; m <= 12 && !any; ++m) {
      if (!e.months_[m]) continue;
      for (int d = 1; d <= kDaysInMonth[m] && !any; ++d) any = e.days_[d];
    }
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat("day-of-month: \"", fields[2],
                                                     "\" never falls in month \"", fields[3],
                                                     "\", so the expression never fires"));
    }
  }
  return e;
}

bool CronExpr::DayMatches(const absl::CivilDay& d) const {
  if (!months_[d.month()]) return false;
  const bool dom = days_[d.day()];
  int wd = 0;
  switch (absl::GetWeekday(d)) {
    case absl::Weekday::sunday:
      wd = 0;
      break;
    case absl::Weekday::monday:
      wd = 1;
      break;
    case absl::Weekday::tuesday:
      wd = 2;
      break;
    case absl::Weekday::wednesday:
      wd = 3;
      break;
    case absl::Weekday::thursday:
      wd = 4;
      break;
    case absl::Weekday::friday:
      wd = 5;
      break;
    case absl::Weekday::saturday:
      wd = 6;
      break;
  }
  const bool dow = weekdays_[wd];
  if (!days_star_ && !weekdays_star_) return dom || dow;
  return dom && dow;
}

bool CronExpr::Matches(const absl::CivilMinute& m) const {
  return minutes_[m.minute()] && hours_[m.hour()] && DayMatches(absl::CivilDay(m));
}

absl::Time CronExpr::Next(absl::Time t, const absl::TimeZone& zone) const {
  if (t == absl::InfiniteFuture()) return t;
  // Wall minutes after t's, walked a day, an hour or a minute at a time.
  // Parse refused what never fires; a Feb 29 that must also be a given
  // weekday comes within 28 years, hence the bound.
  absl::CivilMinute m = absl::CivilMinute(zone.At(t).cs) + 1;
  const absl::CivilDay last_day = absl::CivilDay(m) + 366 * 29;
  while (absl::CivilDay(m) <= last_day) {
    const absl::CivilDay day(m);
    if (!DayMatches(day)) {
      m = absl::CivilMinute(day + 1);
      continue;
    }
    if (!hours_[m.hour()]) {
      m = absl::CivilMinute(absl::CivilHour(m) + 1);
      continue;
    }
    if (!minutes_[m.minute()]) {
      m += 1;
      continue;
    }
    const absl::TimeZone::TimeInfo info = zone.At(absl::CivilSecond(m));
    // Skipped by a spring-forward: no fire. Repeated by a fall-back: the
    // first occurrence only (`pre`); in the second, it is not after t.
    if (info.kind != absl::TimeZone::TimeInfo::SKIPPED && info.pre > t) return info.pre;
    m += 1;
  }
  return absl::InfiniteFuture();
}

absl::StatusOr<absl::TimeZone> LoadZone(absl::string_view field, absl::string_view name) {
  if (name.empty() || name == "UTC") return absl::UTCTimeZone();
  if (name.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", name.size(), " characters long; the limit is 64"));
  }
  // A name, never a path: the database lookup joins it to its directory.
  bool ok = name[0] != '/' && name.find("..") == absl::string_view::npos;
  for (char c : name) {
    ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '_' ||
                c == '-' || c == '+');
  }
  absl::TimeZone tz;
  if (!ok || !absl::LoadTimeZone(std::string(name), &tz)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " \"", name,
        "\" is not a known IANA time zone (e.g. UTC, Europe/Berlin, America/New_York; the "
        "scheduler reads them from /usr/share/zoneinfo, Debian's tzdata)"));
  }
  return tz;
}

absl::Time NextInterval(absl::Time anchor, absl::Duration interval, absl::Time t) {
  if (t < anchor) return anchor + interval;
  absl::Duration rest;
  const int64_t k = absl::IDivDuration(t - anchor, interval, &rest) + 1;
  return anchor + k * interval;
}

}  // namespace taskgrid::cron
