// What taskgridctl prints: padded tables, local times, and the detail view of
// one task. Pure formatting over proto values (no gRPC), so every function
// returns text and the caller decides where it goes.
#pragma once

#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "taskgrid/v1/task.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::ctl {

// Columns padded to their widest cell (counted in UTF-8 code points), two
// spaces apart, header as given (callers pass capitals). Newlines and tabs in
// cells become spaces so one row stays one line.
class Table {
 public:
  explicit Table(std::vector<std::string> header);

  void AddRow(std::vector<std::string> row);
  bool empty() const { return rows_.empty(); }
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// proto3 JSON, snake_case names, every field printed (zeros too), ending in a
// newline.
std::string ToJson(const google::protobuf::Message& m);

// Local time in RFC 3339 without fractional seconds; "-" when unset.
std::string FormatTime(const google::protobuf::Timestamp& ts);

// "SUCCEEDED" for OUTCOME_SUCCEEDED; "-" for OUTCOME_UNSPECIFIED.
std::string OutcomeName(v1::Outcome o);

// "2" or "2/5" (attempt / max_attempts when the spec sets it).
std::string AttemptText(const v1::Task& t);

// `s` cut to at most `max` code points, ending in "..." when cut.
std::string Shorten(const std::string& s, size_t max);

// The table of `submit`: ID, QUEUE, STATE.
std::string FormatSubmitted(const v1::SubmitTasksResponse& resp);

// The table of `list`.
std::string FormatTaskList(const std::vector<v1::Task>& tasks);

// The table of `stats`.
std::string FormatStats(const v1::GetQueueStatsResponse& resp);

// The detail view of `get`: fields, result with output tails, attempts table.
std::string FormatTaskDetail(const v1::Task& t);

}  // namespace taskgrid::ctl
