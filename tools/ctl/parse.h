// What taskgridctl parses from its user: flag values and task files. Pure
// functions (no gRPC, no I/O); errors are InvalidArgument with a message fit
// to print after "error: ".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/key_values.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::ctl {

// ParseList and ParseKeyValues live in common/key_values.h.
using ::taskgrid::ParseKeyValues;
using ::taskgrid::ParseList;

// An RFC 3339 time ("2026-11-21T20:00:00Z", or without an offset: local
// time), or "+DURATION" ("+30s", "+1h30m") counted from `now`.
absl::StatusOr<absl::Time> ParseWhen(absl::string_view text, absl::Time now);

// The success policy of `submit --success`: "all", "any" or "quorum:K" (K a
// whole number from 1), set in `replicas` (success, and quorum for quorum:K).
// Whether K is at most the number of replicas is the scheduler's to check.
absl::Status ParseSuccess(absl::string_view text, v1::Replicas* replicas);

// `logs --stream`: "stdout", "stderr", or "" for both (UNSPECIFIED).
absl::StatusOr<v1::OutputStream> ParseOutputStream(absl::string_view text);

// The tasks of a JSON document in any of three shapes: a SubmitTasksRequest
// ({"tasks": [...]}), an array of TaskSpec objects, or one TaskSpec object.
// Field names may be snake_case or lowerCamelCase; unknown fields are errors.
// `source` (a file name, or "<stdin>") starts every error message.
absl::StatusOr<std::vector<v1::TaskSpec>> ParseTaskSpecsJson(absl::string_view text,
                                                             absl::string_view source);

// A job file: a SubmitJobRequest in proto3 JSON, {"job_id": "etl-1",
// "tasks": [TASK, ...]} (job_id may be left out). Each TASK is parsed as in
// ParseTaskSpecsJson, so an error names the task (tasks[2]) and the field.
// `source` starts every error message.
absl::StatusOr<v1::SubmitJobRequest> ParseSubmitJobJson(absl::string_view text,
                                                        absl::string_view source);

}  // namespace taskgrid::ctl
