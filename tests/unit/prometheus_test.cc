#include "common/prometheus.h"

#include <gtest/gtest.h>

#include <limits>

namespace taskgrid::prometheus {
namespace {

TEST(ExpositionWriter, WritesHelpTypeAndSamples) {
  ExpositionWriter w;
  w.Family("taskgrid_tasks", Type::kGauge, "Tasks by queue and state.");
  w.Sample("taskgrid_tasks", {{"queue", "q1"}, {"state", "PENDING"}}, 3);
  w.Single("taskgrid_up", Type::kCounter, "No labels.", 1.5);
  EXPECT_EQ(w.text(),
            "# HELP taskgrid_tasks Tasks by queue and state.\n"
            "# TYPE taskgrid_tasks gauge\n"
            "taskgrid_tasks{queue=\"q1\",state=\"PENDING\"} 3\n"
            "# HELP taskgrid_up No labels.\n"
            "# TYPE taskgrid_up counter\n"
            "taskgrid_up 1.5\n");
}

TEST(ExpositionWriter, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(ExpositionWriter::EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(ExpositionWriter::EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
  ExpositionWriter w;
  w.Family("m", Type::kGauge, "line one\nline two");
  w.Sample("m", {{"queue", "we\"ird\\q\n"}}, 1);
  EXPECT_EQ(w.text(),
            "# HELP m line one\\nline two\n"
            "# TYPE m gauge\n"
            "m{queue=\"we\\\"ird\\\\q\\n\"} 1\n");
}

TEST(ExpositionWriter, FormatsValuesAsPrometheusReadsThem) {
  EXPECT_EQ(ExpositionWriter::FormatValue(0), "0");
  EXPECT_EQ(ExpositionWriter::FormatValue(42), "42");
  EXPECT_EQ(ExpositionWriter::FormatValue(-3), "-3");
  EXPECT_EQ(ExpositionWriter::FormatValue(0.1), "0.1");
  EXPECT_EQ(ExpositionWriter::FormatValue(0.0001), "0.0001");
  EXPECT_EQ(ExpositionWriter::FormatValue(1700000000), "1700000000");
  EXPECT_EQ(ExpositionWriter::FormatValue(1700000000.25), "1700000000.25");
  EXPECT_EQ(ExpositionWriter::FormatValue(1e21), "1e+21");
  EXPECT_EQ(ExpositionWriter::FormatValue(1e-9), "1e-09");
  EXPECT_EQ(ExpositionWriter::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(ExpositionWriter::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(ExpositionWriter::FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(ExpositionWriter, WritesHistogramsCumulativeWithInfSumAndCount) {
  Histogram h({0.5, 2});
  h.Observe(0.25);
  h.Observe(1);
  h.Observe(3);
  ExpositionWriter w;
  w.Family("lat_seconds", Type::kHistogram, "Latency.");
  w.HistogramSamples("lat_seconds", {{"queue", "q"}}, h);
  EXPECT_EQ(w.text(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{queue=\"q\",le=\"0.5\"} 1\n"
            "lat_seconds_bucket{queue=\"q\",le=\"2\"} 2\n"
            "lat_seconds_bucket{queue=\"q\",le=\"+Inf\"} 3\n"
            "lat_seconds_sum{queue=\"q\"} 4.25\n"
            "lat_seconds_count{queue=\"q\"} 3\n");
}

}  // namespace
}  // namespace taskgrid::prometheus
