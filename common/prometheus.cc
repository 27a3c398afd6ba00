#include "common/prometheus.h"

#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace taskgrid::prometheus {

namespace {

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Backslash and newline always; the double quote only in label values.
std::string Escape(absl::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string ExpositionWriter::EscapeLabelValue(absl::string_view v) { return Escape(v, true); }

std::string ExpositionWriter::EscapeHelp(absl::string_view v) { return Escape(v, false); }

std::string ExpositionWriter::FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[400];  // the longest fixed form below 1e15 is well under this
  // Fixed notation where it stays short (1700000000, 0.0001), else the
  // shortest form (1e+21); both read back exactly.
  const double mag = std::fabs(v);
  const auto r = v == 0 || (mag >= 1e-6 && mag < 1e15)
                     ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                     : std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void ExpositionWriter::Family(absl::string_view name, Type type, absl::string_view help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(&out_, "# TYPE ", name, " ", TypeName(type), "\n");
}

void ExpositionWriter::Single(absl::string_view name, Type type, absl::string_view help,
                              double value) {
  Family(name, type, help);
  Sample(name, {}, value);
}

void ExpositionWriter::AppendLabels(const Labels& labels,
                                    const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return;
  out_ += '{';
  bool first = true;
  auto one = [&](const std::pair<std::string, std::string>& l) {
    if (!first) out_ += ',';
    first = false;
    absl::StrAppend(&out_, l.first, "=\"", EscapeLabelValue(l.second), "\"");
  };
  for (const auto& l : labels) one(l);
  if (extra != nullptr) one(*extra);
  out_ += '}';
}

void ExpositionWriter::Sample(absl::string_view name, const Labels& labels, double value) {
  out_.append(name.data(), name.size());
  AppendLabels(labels, nullptr);
  absl::StrAppend(&out_, " ", FormatValue(value), "\n");
}

void ExpositionWriter::HistogramSamples(absl::string_view name, const Labels& labels,
                                        const Histogram& h) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  const std::vector<double>& bounds = h.upper_bounds();
  for (size_t i = 0; i <= bounds.size(); ++i) {
    const std::pair<std::string, std::string> le{
        "le", i < bounds.size() ? FormatValue(bounds[i]) : "+Inf"};
    out_ += bucket;
    AppendLabels(labels, &le);
    absl::StrAppend(&out_, " ", h.CumulativeCount(i), "\n");
  }
  Sample(absl::StrCat(name, "_sum"), labels, h.sum());
  Sample(absl::StrCat(name, "_count"), labels, static_cast<double>(h.count()));
}

absl::StatusOr<ProcessStats> ParseProcStat(absl::string_view line, double ticks_per_second,
                                           double page_bytes) {
  const size_t close = line.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("not a /proc stat line: no ')' after the command name");
  }
  // Field 3 (the state) is the first after the name; utime is field 14.
  const std::vector<absl::string_view> f =
      absl::StrSplit(line.substr(close + 1), ' ', absl::SkipEmpty());
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kVsize = 23 - 3, kRss = 24 - 3;
  double utime = 0, stime = 0, vsize = 0, rss = 0;
  if (f.size() <= kRss || !absl::SimpleAtod(f[kUtime], &utime) ||
      !absl::SimpleAtod(f[kStime], &stime) || !absl::SimpleAtod(f[kVsize], &vsize) ||
      !absl::SimpleAtod(f[kRss], &rss)) {
    return absl::InvalidArgumentError(
        "not a /proc stat line: utime, stime, vsize or rss missing or not a number");
  }
  ProcessStats p;
  p.cpu_seconds = (utime + stime) / ticks_per_second;
  p.virtual_bytes = vsize;
  p.resident_bytes = rss * page_bytes;
  return p;
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return absl::UnavailableError("cannot read /proc/self/stat");
  absl::StatusOr<ProcessStats> p = ParseProcStat(line, static_cast<double>(sysconf(_SC_CLK_TCK)),
                                                 static_cast<double>(sysconf(_SC_PAGESIZE)));
  if (!p.ok()) return p;
  std::error_code ec;
  int64_t fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++fds;
  }
  if (ec) return absl::UnavailableError("cannot list /proc/self/fd");
  p->open_fds = static_cast<double>(fds - 1);  // less the one listing it
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    p->max_fds = r.rlim_cur == RLIM_INFINITY ? INFINITY : static_cast<double>(r.rlim_cur);
  }
  return p;
}

void ProcessSamples(ExpositionWriter& w, const ProcessStats& p, absl::Time start) {
  w.Single("process_cpu_seconds_total", Type::kCounter, "User and system CPU time, in seconds.",
           p.cpu_seconds);
  w.Single("process_resident_memory_bytes", Type::kGauge, "Resident memory size, in bytes.",
           p.resident_bytes);
  w.Single("process_virtual_memory_bytes", Type::kGauge, "Virtual memory size, in bytes.",
           p.virtual_bytes);
  w.Single("process_open_fds", Type::kGauge, "Open file descriptors.", p.open_fds);
  w.Single("process_max_fds", Type::kGauge, "The most file descriptors the process may open.",
           p.max_fds);
  StartTimeSample(w, start);
}

void StartTimeSample(ExpositionWriter& w, absl::Time start) {
  w.Single("process_start_time_seconds", Type::kGauge,
           "When the process started, in seconds since the Unix epoch.",
           absl::ToDoubleSeconds(start - absl::UnixEpoch()));
}

}  // namespace taskgrid::prometheus
