// What taskgrid-bench measured: one Figure per number, printed as a table
// and, with --json, as one JSON object per line. gRPC-free; used by the
// workloads (which append figures) and main() (which prints them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace taskgrid::bench {

// One setting a figure was measured with, e.g. {"slots", "100"}.
struct Setting {
  std::string key;
  std::string value;
  bool number = false;  // written unquoted in JSON
};

Setting S(std::string key, std::string value);
Setting I(std::string key, int64_t value);
Setting D(std::string key, absl::Duration value);  // e.g. "5s"

struct Figure {
  std::string workload;  // "W1" .. "W6"
  std::string metric;    // e.g. "submit_batch_100"
  double value = 0;
  std::string unit;  // "tasks/s", "ms", "s", "MiB", "%", "count", "ratio"
  int64_t n = 0;     // samples or tasks behind the value
  std::vector<Setting> settings;
};

// {"workload":"W1","metric":...,"value":...,"unit":...,"n":...,"settings":{...}};
// a value that is not finite is written as null.
std::string FigureJson(const Figure& f);
// A fixed-width table, one row per figure, with the settings in the last
// column as key=value.
std::string FormatTable(const std::vector<Figure>& figures);
// Percentile (0-100) of `samples` by nearest rank; sorts a copy.
double Percentile(std::vector<double> samples, double pct);

}  // namespace taskgrid::bench
