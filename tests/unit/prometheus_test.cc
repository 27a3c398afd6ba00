#include "common/prometheus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>

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

namespace taskgrid::prometheus {
namespace {

TEST(ProcessStats, ParsesAProcStatLineWhoseNameHasSpacesAndParentheses) {
  // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
  // majflt cmajflt utime stime cutime cstime priority nice threads
  // itrealvalue starttime vsize rss ...
  const std::string line =
      "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 12345 "
      "104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  absl::StatusOr<ProcessStats> p = ParseProcStat(line, 100, 4096);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->cpu_seconds, 3);  // (250 + 50) ticks at 100 a second
  EXPECT_DOUBLE_EQ(p->virtual_bytes, 104857600);
  EXPECT_DOUBLE_EQ(p->resident_bytes, 2560.0 * 4096);
}

TEST(ProcessStats, RefusesWhatIsNotAProcStatLine) {
  EXPECT_EQ(ParseProcStat("", 100, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStat("1 (x) S 1 2 3", 100, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 5 0 0 20 0 1 0 1 100 10", 100, 4096)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessStats, ReadsThisProcessAndSeesAFileItOpens) {
  absl::StatusOr<ProcessStats> before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->resident_bytes, 0);
  EXPECT_GT(before->virtual_bytes, before->resident_bytes);
  EXPECT_GE(before->open_fds, 3);  // stdin, stdout, stderr
  EXPECT_GE(before->max_fds, before->open_fds);
  FILE* f = std::fopen("/proc/self/stat", "r");
  ASSERT_NE(f, nullptr);
  absl::StatusOr<ProcessStats> after = ReadProcessStats();
  std::fclose(f);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_GE(after->cpu_seconds, before->cpu_seconds);
}

TEST(ProcessStats, WritesTheStandardFamilies) {
  ExpositionWriter w;
  ProcessSamples(w, ProcessStats{2, 1000, 5000, 7, 1024}, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("# TYPE process_cpu_seconds_total counter\n"
                                             "process_cpu_seconds_total 2\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("\nprocess_resident_memory_bytes 1000\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("\nprocess_virtual_memory_bytes 5000\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("\nprocess_open_fds 7\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("\nprocess_max_fds 1024\n"));
  EXPECT_THAT(w.text(), ::testing::HasSubstr("\nprocess_start_time_seconds 1700000000\n"));
}

}  // namespace
}  // namespace taskgrid::prometheus
