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

#include "absl/strings/string_view.h"
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

}  // namespace taskgrid::prometheus
