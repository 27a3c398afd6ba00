// Writes the Prometheus text exposition format, version 0.0.4: a family's
// `# HELP` and `# TYPE` lines, then its samples, one a line. Written by
// hand (no client library): the scheduler's /metrics page is its one user.
//
// Names and label names are constants in the code and are not checked;
// label values (queue names, ...) are escaped. Not thread-safe: one writer
// per page.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/histogram.h"

namespace taskgrid::prometheus {

// What a /metrics answer says its body is.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

using Labels = std::vector<std::pair<std::string, std::string>>;

enum class Type { kCounter, kGauge, kHistogram };

class ExpositionWriter {
 public:
  // Starts a family: its HELP and TYPE lines. Its samples follow.
  void Family(absl::string_view name, Type type, absl::string_view help);
  // A family of one sample without labels.
  void Single(absl::string_view name, Type type, absl::string_view help, double value);
  // One sample line: name{labels} value.
  void Sample(absl::string_view name, const Labels& labels, double value);
  // The _bucket (cumulative, with le), _sum and _count lines of `h`.
  void HistogramSamples(absl::string_view name, const Labels& labels, const Histogram& h);

  const std::string& text() const { return out_; }

  // A label value as it goes between the quotes: backslash, double quote
  // and newline escaped.
  static std::string EscapeLabelValue(absl::string_view v);
  // HELP text: backslash and newline escaped.
  static std::string EscapeHelp(absl::string_view v);
  // Shortest text that reads back as `v`; +Inf, -Inf and NaN as
  // Prometheus spells them.
  static std::string FormatValue(double v);

 private:
  void AppendLabels(const Labels& labels, const std::pair<std::string, std::string>* extra);
  std::string out_;
};

// What the standard process_* families say about this process (the names
// every Prometheus client library exports, so stock dashboards and alerts
// work on them).
struct ProcessStats {
  double cpu_seconds = 0;     // user + system
  double resident_bytes = 0;  // resident set
  double virtual_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;  // the soft RLIMIT_NOFILE
};

// The fields of a /proc/<pid>/stat line: utime and stime (in clock ticks
// of `ticks_per_second`), vsize (bytes) and rss (pages of `page_bytes`).
// The command name may hold spaces and parentheses: the fields are the
// ones after its last ')'. INVALID_ARGUMENT when the line is not one.
absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view line, double ticks_per_second,
                                           double page_bytes);

// This process's, from /proc/self (Linux). An error when /proc cannot be
// read: the page then leaves the process families out.
absl::StatusOr<ProcessStats> ReadProcessStats();

// The families process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds and
// process_start_time_seconds (`start`).
void ProcessSamples(ExpositionWriter& w, const ProcessStats& p, absl::Time start);
// process_start_time_seconds alone (when the others cannot be read).
void StartTimeSample(ExpositionWriter& w, absl::Time start);

}  // namespace taskgrid::prometheus
