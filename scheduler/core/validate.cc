#include "scheduler/core/validate.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/proto_time.h"

namespace taskgrid::core {

namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::Status CheckDuration(const google::protobuf::Duration& d, absl::string_view field) {
  if (d.seconds() < 0 || d.nanos() < 0) return Invalid(field, "is negative");
  if (d.nanos() >= 1'000'000'000) return Invalid(field, "has nanos out of range");
  if (d.seconds() > 10LL * 365 * 24 * 3600) return Invalid(field, "is longer than 10 years");
  return absl::OkStatus();
}

absl::Status CheckBuiltin(const v1::BuiltinStep& b, absl::string_view field) {
  if (!IsKnownBuiltin(b.name())) {
    return Invalid(absl::StrCat(field, ".name"),
                   absl::StrCat("\"", b.name(), "\" is not a builtin (noop, sleep, fail, echo)"));
  }
  if (b.name() == "sleep") {
    if (b.args_size() > 1)
      return Invalid(absl::StrCat(field, ".args"), "takes one number of seconds");
    double secs = 0;
    if (b.args_size() == 1 &&
        (!absl::SimpleAtod(b.args(0), &secs) || !(secs >= 0) || secs > 7 * 24 * 3600)) {
      return Invalid(absl::StrCat(field, ".args[0]"), "is not a number of seconds in [0, 604800]");
    }
  } else if (b.name() == "fail") {
    int code = 0;
    if (b.args_size() > 1) return Invalid(absl::StrCat(field, ".args"), "takes one exit code");
    if (b.args_size() == 1 && (!absl::SimpleAtoi(b.args(0), &code) || code < 1 || code > 255)) {
      return Invalid(absl::StrCat(field, ".args[0]"), "is not an exit code in [1, 255]");
    }
  } else if (b.name() == "noop" && b.args_size() > 0) {
    return Invalid(absl::StrCat(field, ".args"), "must be empty for noop");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsKnownBuiltin(absl::string_view name) {
  return name == "noop" || name == "sleep" || name == "fail" || name == "echo";
}

absl::Status ValidateSpec(const v1::TaskSpec& spec, const SchedulerOptions& opts,
                          absl::string_view field) {
  const std::string f(field);
  if (!spec.id().empty()) {
    if (absl::Status s = CheckName(f + ".id", spec.id(), kMaxIdLength); !s.ok()) return s;
  }
  if (!spec.queue().empty()) {
    if (absl::Status s = CheckName(f + ".queue", spec.queue(), kMaxQueueNameLength); !s.ok()) {
      return s;
    }
  }
  if (spec.steps().empty())
    return Invalid(f + ".steps", "is empty: a task needs at least one step");
  if (spec.steps_size() > opts.max_steps) {
    return Invalid(f + ".steps", absl::StrCat("has ", spec.steps_size(), " steps; the limit is ",
                                              opts.max_steps));
  }
  for (int i = 0; i < spec.steps_size(); ++i) {
    const v1::Step& step = spec.steps(i);
    const std::string sf = absl::StrCat(f, ".steps[", i, "]");
    switch (step.kind_case()) {
      case v1::Step::kExec: {
        const v1::ExecStep& e = step.exec();
        if (e.argv().empty()) return Invalid(sf + ".exec.argv", "is empty");
        if (e.argv(0).empty()) return Invalid(sf + ".exec.argv[0]", "is empty");
        for (const auto& [k, v] : e.env()) {
          if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
            return Invalid(sf + ".exec.env", absl::StrCat("has an invalid name \"", k, "\""));
          }
        }
        break;
      }
      case v1::Step::kBuiltin:
        if (absl::Status s = CheckBuiltin(step.builtin(), sf + ".builtin"); !s.ok()) return s;
        break;
      default:
        return Invalid(sf, "has neither exec nor builtin");
    }
    if (absl::Status s = CheckDuration(step.timeout(), sf + ".timeout"); !s.ok()) return s;
  }
  if (static_cast<int64_t>(spec.payload().size()) > opts.max_payload_bytes) {
    return Invalid(f + ".payload", absl::StrCat("is ", spec.payload().size(),
                                                " bytes; the limit is ", opts.max_payload_bytes));
  }
  if (spec.max_attempts() < 0 || spec.max_attempts() > opts.max_attempts_limit) {
    return Invalid(f + ".max_attempts",
                   absl::StrCat("is ", spec.max_attempts(), "; it must be in [0, ",
                                opts.max_attempts_limit, "] (0 means the default)"));
  }
  if (spec.not_before().nanos() < 0 || spec.not_before().nanos() >= 1'000'000'000 ||
      spec.not_before().seconds() < 0 || spec.not_before().seconds() > 253402300799) {
    return Invalid(f + ".not_before", "is not a valid timestamp");
  }
  const v1::RetryPolicy& r = spec.retry();
  if (absl::Status s = CheckDuration(r.initial_backoff(), f + ".retry.initial_backoff"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDuration(r.max_backoff(), f + ".retry.max_backoff"); !s.ok()) return s;
  if (r.multiplier() != 0 &&
      (!std::isfinite(r.multiplier()) || r.multiplier() < 1 || r.multiplier() > 100)) {
    return Invalid(f + ".retry.multiplier", "must be in [1, 100] (0 means the default)");
  }
  if (absl::Status s = CheckDuration(spec.ack_timeout(), f + ".ack_timeout"); !s.ok()) return s;
  if (absl::Status s = CheckDuration(spec.attempt_timeout(), f + ".attempt_timeout"); !s.ok()) {
    return s;
  }
  const v1::Placement& p = spec.placement();
  if (p.slots() < 0 || p.slots() > 1024) {
    return Invalid(f + ".placement.slots", "must be in [0, 1024] (0 means 1)");
  }
  for (const auto& [k, v] : p.required_labels()) {
    if (absl::Status s = CheckName(f + ".placement.required_labels key", k, kMaxIdLength);
        !s.ok()) {
      return s;
    }
    if (v.size() > 256) return Invalid(f + ".placement.required_labels[" + k + "]", "is too long");
  }
  for (int i = 0; i < p.agent_ids_size(); ++i) {
    if (absl::Status s = CheckName(absl::StrCat(f, ".placement.agent_ids[", i, "]"), p.agent_ids(i),
                                   kMaxIdLength);
        !s.ok()) {
      return s;
    }
  }
  if (!spec.job_id().empty()) {
    if (absl::Status s = CheckName(f + ".job_id", spec.job_id(), kMaxIdLength); !s.ok()) return s;
  }
  if (spec.depends_on_size() > opts.max_job_tasks) {
    return Invalid(f + ".depends_on", absl::StrCat("has ", spec.depends_on_size(),
                                                   " entries; the limit is ", opts.max_job_tasks));
  }
  absl::flat_hash_map<absl::string_view, int> deps;
  for (int i = 0; i < spec.depends_on_size(); ++i) {
    const std::string df = absl::StrCat(f, ".depends_on[", i, "]");
    const std::string& dep = spec.depends_on(i);
    if (absl::Status s = CheckName(df, dep, kMaxIdLength); !s.ok()) return s;
    if (dep == spec.id()) return Invalid(df, absl::StrCat("\"", dep, "\" is the task itself"));
    auto [it, inserted] = deps.emplace(dep, i);
    if (!inserted) {
      return Invalid(df, absl::StrCat("\"", dep, "\" repeats depends_on[", it->second, "]"));
    }
  }
  if (!v1::UpstreamFailure_IsValid(spec.on_upstream_failure())) {
    return Invalid(f + ".on_upstream_failure",
                   absl::StrCat("is ", spec.on_upstream_failure(), "; it must be CANCEL or RUN"));
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::core
