#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json.h"

namespace taskgrid::bench {

namespace {

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.6g", v);
}

std::string FormatValue(double v) {
  if (!std::isfinite(v)) return "n/a";
  if (v == std::floor(v) && std::fabs(v) < 1e12) return absl::StrFormat("%.0f", v);
  if (std::fabs(v) >= 100) return absl::StrFormat("%.0f", v);
  if (std::fabs(v) >= 10) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.3f", v);
}

}  // namespace

Setting S(std::string key, std::string value) {
  return Setting{std::move(key), std::move(value), false};
}

Setting I(std::string key, int64_t value) {
  return Setting{std::move(key), absl::StrCat(value), true};
}

Setting D(std::string key, absl::Duration value) {
  return Setting{std::move(key), absl::FormatDuration(value), false};
}

std::string FigureJson(const Figure& f) {
  std::vector<std::string> settings;
  for (const Setting& s : f.settings) {
    settings.push_back(
        absl::StrCat(JsonString(s.key), ":", s.number ? s.value : JsonString(s.value)));
  }
  return absl::StrCat("{\"workload\":", JsonString(f.workload),
                      ",\"metric\":", JsonString(f.metric), ",\"value\":", JsonNumber(f.value),
                      ",\"unit\":", JsonString(f.unit), ",\"n\":", f.n, ",\"settings\":{",
                      absl::StrJoin(settings, ","), "}}");
}

std::string FormatTable(const std::vector<Figure>& figures) {
  size_t metric_w = 6;
  for (const Figure& f : figures) metric_w = std::max(metric_w, f.metric.size());
  std::string out = absl::StrFormat("%-4s %-*s %14s %-8s %9s  %s\n", "WL", metric_w, "METRIC",
                                    "VALUE", "UNIT", "N", "SETTINGS");
  for (const Figure& f : figures) {
    std::vector<std::string> settings;
    for (const Setting& s : f.settings) settings.push_back(absl::StrCat(s.key, "=", s.value));
    absl::StrAppendFormat(&out, "%-4s %-*s %14s %-8s %9d  %s\n", f.workload, metric_w, f.metric,
                          FormatValue(f.value), f.unit, f.n, absl::StrJoin(settings, " "));
  }
  return out;
}

double Percentile(std::vector<double> samples, double pct) {
  if (samples.empty()) return std::nan("");
  std::sort(samples.begin(), samples.end());
  // Nearest rank: the smallest value with at least pct% of samples <= it.
  const double rank = std::ceil(pct / 100.0 * static_cast<double>(samples.size()));
  const size_t idx = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return samples[std::min(idx, samples.size() - 1)];
}

}  // namespace taskgrid::bench
