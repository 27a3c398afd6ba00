#include "common/prometheus.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

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

}  // namespace taskgrid::prometheus
