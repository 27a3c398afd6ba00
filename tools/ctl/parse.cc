#include "tools/ctl/parse.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace taskgrid::ctl {

namespace {

// protobuf 3.21's util::Status is its own type, not absl::Status.
std::string JsonError(std::string msg) {
  while (!msg.empty() && absl::ascii_isspace(static_cast<unsigned char>(msg.back()))) {
    msg.pop_back();
  }
  return msg;
}

// protobuf reports a syntax error as "WHAT\nCONTEXT\n   ^", CONTEXT being up
// to 20 bytes of input either side of the error and the caret its column in
// CONTEXT. Returns "line L, column C: WHAT", or just WHAT when the context
// cannot be placed.
std::string SyntaxError(absl::string_view text, const std::string& msg) {
  const size_t first = msg.find('\n');
  const size_t last = msg.rfind('\n');
  if (first == std::string::npos || last == first) return JsonError(msg);
  const std::string what = msg.substr(0, first);
  const std::string context = msg.substr(first + 1, last - first - 1);
  // Nothing left to show: the input ended too early.
  if (context.empty()) return absl::StrCat("at the end of the input: ", what);
  const size_t caret = msg.find('^', last);
  const size_t pos = text.find(context);
  if (caret == std::string::npos || pos == absl::string_view::npos) return what;
  const size_t offset = pos + (caret - last - 1);
  const absl::string_view head = text.substr(0, offset);
  const size_t line = std::count(head.begin(), head.end(), '\n') + 1;
  const size_t line_start = head.rfind('\n');
  const size_t column = offset - (line_start == absl::string_view::npos ? 0 : line_start + 1) + 1;
  return absl::StrCat("line ", line, ", column ", column, ": ", what);
}

absl::Status ParseSpec(const google::protobuf::Value& v, absl::string_view where,
                       v1::TaskSpec* out) {
  if (!v.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a task object"));
  }
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(v, &json); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", JsonError(s.message().ToString())));
  }
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, out, opts); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", JsonError(s.message().ToString())));
  }
  return absl::OkStatus();
}

absl::Status ParseSpecList(const google::protobuf::ListValue& list, absl::string_view where,
                           std::vector<v1::TaskSpec>* out) {
  for (int i = 0; i < list.values_size(); ++i) {
    v1::TaskSpec spec;
    if (absl::Status s = ParseSpec(list.values(i), absl::StrCat(where, ": tasks[", i, "]"), &spec);
        !s.ok()) {
      return s;
    }
    out->push_back(std::move(spec));
  }
  return absl::OkStatus();
}

// `text` as a generic JSON value; a syntax error says where it is.
absl::Status ParseDocument(absl::string_view text, absl::string_view source,
                           google::protobuf::Value* doc) {
  if (auto s = google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(text.data(), text.size()), doc);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", SyntaxError(text, s.message().ToString())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<absl::Time> ParseWhen(absl::string_view text, absl::Time now) {
  const std::string s(absl::StripAsciiWhitespace(text));
  const std::string bad = absl::StrCat(
      "expected an RFC 3339 time like 2026-11-21T20:00:00Z or +DURATION like +30s, got \"", s,
      "\"");
  if (absl::StartsWith(s, "+")) {
    absl::Duration d;
    if (!absl::ParseDuration(s.substr(1), &d) || d < absl::ZeroDuration() ||
        d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(bad);
    }
    return now + d;
  }
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, s, &t, &err)) return t;
  // No offset: the user's local time.
  if (absl::ParseTime("%Y-%m-%d%ET%H:%M:%E*S", s, absl::LocalTimeZone(), &t, &err)) return t;
  return absl::InvalidArgumentError(bad);
}

absl::Status ParseSuccess(absl::string_view text, v1::Replicas* replicas) {
  if (text == "all" || text == "any") {
    replicas->set_success(text == "all" ? v1::SUCCESS_POLICY_ALL : v1::SUCCESS_POLICY_ANY);
    replicas->set_quorum(0);
    return absl::OkStatus();
  }
  if (text == "quorum") {
    return absl::InvalidArgumentError(
        "--success=quorum needs K, how many replicas must succeed: quorum:K");
  }
  absl::string_view k_text = text;
  if (!absl::ConsumePrefix(&k_text, "quorum:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--success must be all, any or quorum:K, not \"", text, "\""));
  }
  int32_t k = 0;
  if (!absl::SimpleAtoi(k_text, &k) || k < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--success=quorum:K needs a whole number K of at least 1, not \"", k_text, "\""));
  }
  replicas->set_success(v1::SUCCESS_POLICY_QUORUM);
  replicas->set_quorum(k);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::TaskSpec>> ParseTaskSpecsJson(absl::string_view text,
                                                             absl::string_view source) {
  // Parsed first as a generic JSON value to tell the three shapes apart and
  // to report a syntax error once, whatever the shape.
  google::protobuf::Value doc;
  if (absl::Status s = ParseDocument(text, source, &doc); !s.ok()) return s;
  std::vector<v1::TaskSpec> specs;
  absl::Status status;
  if (doc.has_list_value()) {
    status = ParseSpecList(doc.list_value(), source, &specs);
  } else if (doc.has_struct_value() && doc.struct_value().fields().contains("tasks")) {
    for (const auto& [key, unused] : doc.struct_value().fields()) {
      if (key != "tasks") {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": unexpected field \"", key,
            "\" next to \"tasks\" (a file holds {\"tasks\": [...]}, [...] or one task)"));
      }
    }
    const google::protobuf::Value& tasks = doc.struct_value().fields().at("tasks");
    if (!tasks.has_list_value()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": \"tasks\" must be an array"));
    }
    status = ParseSpecList(tasks.list_value(), source, &specs);
  } else if (doc.has_struct_value()) {
    specs.emplace_back();
    status = ParseSpec(doc, source, &specs.back());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected {\"tasks\": [...]}, an array of tasks, or one task"));
  }
  if (!status.ok()) return status;
  if (specs.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": holds no tasks"));
  return specs;
}

absl::StatusOr<v1::SubmitJobRequest> ParseSubmitJobJson(absl::string_view text,
                                                        absl::string_view source) {
  const std::string shape = "a job file holds {\"job_id\": \"ID\", \"tasks\": [TASK, ...]}";
  google::protobuf::Value doc;
  if (absl::Status s = ParseDocument(text, source, &doc); !s.ok()) return s;
  if (!doc.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected an object: ", shape));
  }
  v1::SubmitJobRequest req;
  const google::protobuf::Value* tasks = nullptr;
  for (const auto& [key, value] : doc.struct_value().fields()) {
    if (key == "job_id" || key == "jobId") {
      if (!value.has_string_value()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": \"", key, "\" must be a string"));
      }
      req.set_job_id(value.string_value());
    } else if (key == "tasks") {
      tasks = &value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unknown field \"", key, "\" (", shape, ")"));
    }
  }
  if (tasks == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no \"tasks\" (", shape, ")"));
  }
  if (!tasks->has_list_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": \"tasks\" must be an array"));
  }
  std::vector<v1::TaskSpec> specs;
  if (absl::Status s = ParseSpecList(tasks->list_value(), source, &specs); !s.ok()) return s;
  if (specs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": \"tasks\" is empty: a job needs at least one task"));
  }
  for (v1::TaskSpec& spec : specs) *req.add_tasks() = std::move(spec);
  return req;
}

absl::StatusOr<v1::OutputStream> ParseOutputStream(absl::string_view text) {
  if (text.empty()) return v1::OUTPUT_STREAM_UNSPECIFIED;
  if (text == "stdout") return v1::OUTPUT_STREAM_STDOUT;
  if (text == "stderr") return v1::OUTPUT_STREAM_STDERR;
  return absl::InvalidArgumentError(
      absl::StrCat("--stream must be stdout or stderr, not \"", text, "\""));
}

}  // namespace taskgrid::ctl
