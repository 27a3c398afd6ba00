#include "scheduler/core/validate.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/builtins.h"
#include "common/http_rules.h"
#include "common/ids.h"
#include "common/proto_time.h"
#include "common/resources.h"
#include "common/status_macros.h"
#include "scheduler/core/model.h"

namespace taskgrid::core {

namespace {

// What one agent's Hello may announce.
constexpr int kMaxAgentLabels = 64;

constexpr absl::string_view kNulMessage = "holds a NUL byte, which a process cannot receive";

bool HasNul(absl::string_view s) { return s.find('\0') != absl::string_view::npos; }

// The spec's encoded size less its payload and depends_on values.
int64_t SpecBytes(const v1::TaskSpec& spec) {
  int64_t size = static_cast<int64_t>(spec.ByteSizeLong());
  size -= static_cast<int64_t>(spec.payload().size());
  for (const std::string& dep : spec.depends_on()) size -= static_cast<int64_t>(dep.size());
  return size;
}

absl::Status Invalid(const FieldPath& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field.str(), " ", what));
}

absl::Status CheckNameAt(const FieldPath& field, absl::string_view name, size_t max_len) {
  if (IsValidName(name, max_len)) return absl::OkStatus();
  return CheckName(field.str(), name, max_len);
}

}  // namespace

absl::Status CheckDuration(const google::protobuf::Duration& d, const FieldPath& field) {
  if (d.seconds() < 0 || d.nanos() < 0) return Invalid(field, "is negative");
  if (d.nanos() >= 1'000'000'000) return Invalid(field, "has nanos out of range");
  if (d.seconds() > 10LL * 365 * 24 * 3600) return Invalid(field, "is longer than 10 years");
  return absl::OkStatus();
}

namespace {

absl::Status CheckBuiltin(const v1::BuiltinStep& b, const FieldPath& field) {
  if (!builtins::IsKnown(b.name())) {
    return Invalid(FieldPath(field, "name"),
                   absl::StrCat("\"", b.name(), "\" is not a builtin (", builtins::Names(), ")"));
  }
  const std::vector<std::string> args(b.args().begin(), b.args().end());
  const std::optional<builtins::ArgProblem> bad = builtins::CheckArgs(b.name(), args);
  if (!bad.has_value()) return absl::OkStatus();
  return Invalid(bad->index < 0 ? FieldPath(field, "args") : FieldPath(field, "args", bad->index),
                 bad->rule);
}

absl::Status CheckHttp(const v1::HttpStep& h, const FieldPath& field) {
  const std::optional<http::Problem> bad =
      http::CheckStep(h.method(), h.url(), h.headers(), absl::MakeConstSpan(h.success_codes()));
  if (!bad.has_value()) return absl::OkStatus();
  return Invalid(FieldPath(field, bad->field), bad->rule);
}

absl::Status CheckReplicas(const v1::TaskSpec& spec, const FieldPath& f) {
  const v1::Replicas& r = spec.replicas();
  const FieldPath rf(f, "replicas");
  if (r.count() < 0 || r.count() > kMaxReplicas) {
    return Invalid(FieldPath(rf, "count"),
                   absl::StrCat("is ", r.count(), "; it must be in [1, ", kMaxReplicas, "]"));
  }
  if (r.agent_ids_size() > kMaxReplicas) {
    return Invalid(
        FieldPath(rf, "agent_ids"),
        absl::StrCat("has ", r.agent_ids_size(), " entries; the limit is ", kMaxReplicas));
  }
  if (r.agent_ids_size() > 0 && r.count() != 0 && r.count() != r.agent_ids_size()) {
    return Invalid(FieldPath(rf, "count"),
                   absl::StrCat("is ", r.count(), " but agent_ids names ", r.agent_ids_size(),
                                " agents (leave count 0, or make them equal)"));
  }
  const int32_t n = ReplicaCount(spec);
  if (n == 0) return Invalid(FieldPath(rf, "count"), "is 0: ask for at least one replica");
  absl::flat_hash_map<absl::string_view, int> ids;
  for (int i = 0; i < r.agent_ids_size(); ++i) {
    const FieldPath af(rf, "agent_ids", i);
    RETURN_IF_ERROR(CheckNameAt(af, r.agent_ids(i), kMaxIdLength));
    auto [it, inserted] = ids.emplace(r.agent_ids(i), i);
    if (!inserted) {
      return Invalid(af, absl::StrCat("\"", r.agent_ids(i), "\" repeats agent_ids[", it->second,
                                      "]: each replica runs on an agent of its own"));
    }
  }
  if (r.agent_ids_size() > 0 && spec.placement().agent_ids_size() > 0) {
    return Invalid(FieldPath(rf, "agent_ids"),
                   "cannot go with placement.agent_ids: name the agents in one of them");
  }
  if (!v1::SuccessPolicy_IsValid(r.success())) {
    return Invalid(FieldPath(rf, "success"), absl::StrCat("is unknown (", r.success(), ")"));
  }
  if (r.success() == v1::SUCCESS_POLICY_QUORUM) {
    if (r.quorum() < 1 || r.quorum() > n) {
      return Invalid(FieldPath(rf, "quorum"), absl::StrCat("is ", r.quorum(), "; with ", n,
                                                           " replicas it must be in [1, ", n, "]"));
    }
  } else if (r.quorum() != 0) {
    return Invalid(FieldPath(rf, "quorum"), "needs success SUCCESS_POLICY_QUORUM");
  }
  if (!spec.merge_key().empty()) {
    return Invalid(FieldPath(rf, "count"), "cannot go with merge_key");
  }
  RETURN_IF_ERROR(CheckDuration(r.gang_wait(), FieldPath(rf, "gang_wait")));
  if (r.has_gang_wait() && !r.gang()) {
    return Invalid(FieldPath(rf, "gang_wait"), "needs gang: it bounds a gang's reservation");
  }
  if (FromProto(r.gang_wait()) > kMaxGangWait) {
    return Invalid(FieldPath(rf, "gang_wait"),
                   absl::StrCat("is ", absl::FormatDuration(FromProto(r.gang_wait())),
                                "; the limit is ", absl::FormatDuration(kMaxGangWait)));
  }
  // Room for ":r<n>" after the id.
  const size_t longest = kMaxIdLength - 2 - absl::StrCat(n).size();
  if (spec.id().size() > longest) {
    return Invalid(FieldPath(f, "id"),
                   absl::StrCat("is ", spec.id().size(), " characters long; with ", n,
                                " replicas the limit is ", longest,
                                " (each replica's id is the task's with \":r<n>\" after it)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FieldPath::str() const {
  std::string out = parent_ == nullptr ? std::string() : parent_->str() + ".";
  absl::StrAppend(&out, name_);
  if (index_ >= 0) absl::StrAppend(&out, "[", index_, "]");
  return out;
}

absl::Status ValidateAgentMessage(const v1::AgentMessage& msg) {
  if (!msg.has_batch()) return absl::OkStatus();
  for (int i = 0; i < msg.batch().msgs_size(); ++i) {
    const v1::AgentMessage& m = msg.batch().msgs(i);
    if (m.has_hello() || m.has_batch()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch.msgs[", i, "] is a ", m.has_hello() ? "hello" : "batch",
                       "; a batch may hold neither hello nor another batch"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLabels(absl::string_view field,
                         const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > kMaxAgentLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", labels.size(), " entries; the limit is ", kMaxAgentLabels));
  }
  for (const auto& [k, v] : labels) {
    if (absl::Status s = CheckName(absl::StrCat(field, " key"), k, kMaxIdLength); !s.ok()) return s;
    if (v.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", k, "] is ", v.size(),
                                                     " bytes; the limit is ", kMaxLabelValueBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTaskLabels(const FieldPath& field,
                             const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > kMaxTaskLabels) {
    return Invalid(field,
                   absl::StrCat("has ", labels.size(), " entries; the limit is ", kMaxTaskLabels));
  }
  for (const auto& [k, v] : labels) {
    if (absl::Status s = CheckNameAt(FieldPath(field, "key"), k, kMaxIdLength); !s.ok()) return s;
    if (v.size() > kMaxLabelValueBytes) {
      const std::string name = absl::StrCat(field.str(), "[", k, "]");
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is ", v.size(), " bytes; the limit is ", kMaxLabelValueBytes));
    }
    if (std::any_of(v.begin(), v.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      const std::string name = absl::StrCat(field.str(), "[", k, "]");
      return absl::InvalidArgumentError(absl::StrCat(name, " holds a control character"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateClaim(const v1::ClaimRequest& req, const SchedulerOptions& opts) {
  if (!req.queue().empty()) {
    RETURN_IF_ERROR(CheckName("queue", req.queue(), kMaxQueueNameLength));
  }
  RETURN_IF_ERROR(CheckName("owner", req.owner(), kMaxIdLength));
  RETURN_IF_ERROR(CheckDuration(req.lease(), "lease"));
  if (FromProto(req.lease()) > opts.max_claim_lease) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease is ", absl::FormatDuration(FromProto(req.lease())), "; the limit is ",
                     absl::FormatDuration(opts.max_claim_lease), " (--max_claim_lease)"));
  }
  if (req.max() < 0 || req.max() > opts.max_claims_per_call) {
    return absl::InvalidArgumentError(
        absl::StrCat("max is ", req.max(), "; it must be in [0, ", opts.max_claims_per_call, "]"));
  }
  if (!req.task_id().empty()) {
    RETURN_IF_ERROR(CheckName("task_id", req.task_id(), kMaxIdLength));
    if (req.max() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max is ", req.max(), "; a claim of one task_id takes at most 1"));
    }
  }
  return CheckLabels("labels", req.labels());
}

absl::Status ValidateClaimRef(const v1::ClaimRef& ref) {
  RETURN_IF_ERROR(CheckName("claim.task_id", ref.task_id(), kMaxIdLength));
  RETURN_IF_ERROR(CheckName("claim.owner", ref.owner(), kMaxIdLength));
  if (ref.attempt() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "claim.attempt is ", ref.attempt(), "; it is the claimed attempt's number (from 1)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWaitForWork(const v1::WaitForWorkRequest& req) {
  if (!req.queue().empty()) {
    RETURN_IF_ERROR(CheckName("queue", req.queue(), kMaxQueueNameLength));
  }
  RETURN_IF_ERROR(CheckDuration(req.timeout(), "timeout"));
  return CheckLabels("labels", req.labels());
}

absl::Status ValidateHello(const v1::Hello& hello, const SchedulerOptions& opts) {
  if (absl::Status s = CheckName("hello.agent_id", hello.agent_id(), kMaxIdLength); !s.ok()) {
    return s;
  }
  if (hello.slots() < 1 || hello.slots() > opts.max_agent_slots) {
    return absl::InvalidArgumentError(absl::StrCat("hello.slots is ", hello.slots(),
                                                   "; it must be in [1, ", opts.max_agent_slots,
                                                   "] (--max_agent_slots)"));
  }
  RETURN_IF_ERROR(CheckLabels("hello.labels", hello.labels()));
  if (absl::StatusOr<Resources> offer = ParseResourceMap(hello.resources()); !offer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("hello.resources: ", offer.status().message()));
  }
  if (hello.version().size() > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("hello.version is ", hello.version().size(),
                                                   " bytes; the limit is ", kMaxIdLength));
  }
  // An agent holds at most a full chain per slot.
  const int64_t max_running = int64_t{opts.max_agent_slots} * opts.max_chain_length;
  if (hello.running_size() > max_running) {
    return absl::InvalidArgumentError(absl::StrCat("hello.running has ", hello.running_size(),
                                                   " entries; the limit is ", max_running));
  }
  for (int i = 0; i < hello.running_size(); ++i) {
    if (absl::Status s = CheckName(absl::StrCat("hello.running[", i, "].task_id"),
                                   hello.running(i).task_id(), kMaxIdLength);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSpec(const v1::TaskSpec& spec, const SchedulerOptions& opts,
                          const FieldPath& f) {
  if (!spec.id().empty()) {
    if (absl::Status s = CheckNameAt(FieldPath(f, "id"), spec.id(), kMaxIdLength); !s.ok())
      return s;
  }
  if (!spec.queue().empty()) {
    if (absl::Status s = CheckNameAt(FieldPath(f, "queue"), spec.queue(), kMaxQueueNameLength);
        !s.ok()) {
      return s;
    }
  }
  if (const int64_t size = SpecBytes(spec); size > opts.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.str(), " is ", size, " bytes without its payload and depends_on; the limit is ",
        opts.max_spec_bytes, " (--max_spec_bytes)"));
  }
  if (spec.steps().empty())
    return Invalid(FieldPath(f, "steps"), "is empty: a task needs at least one step");
  if (spec.steps_size() > opts.max_steps) {
    return Invalid(FieldPath(f, "steps"), absl::StrCat("has ", spec.steps_size(),
                                                       " steps; the limit is ", opts.max_steps));
  }
  for (int i = 0; i < spec.steps_size(); ++i) {
    const v1::Step& step = spec.steps(i);
    const FieldPath sf(f, "steps", i);
    switch (step.kind_case()) {
      case v1::Step::kExec: {
        const v1::ExecStep& e = step.exec();
        if (e.argv().empty()) return Invalid(FieldPath(sf, "exec.argv"), "is empty");
        if (e.argv(0).empty()) return Invalid(FieldPath(sf, "exec.argv[0]"), "is empty");
        // A process receives C strings: a NUL would silently cut them.
        for (int j = 0; j < e.argv_size(); ++j) {
          if (HasNul(e.argv(j))) return Invalid(FieldPath(sf, "exec.argv", j), kNulMessage);
        }
        for (const auto& [k, v] : e.env()) {
          if (k.empty() || k.find('=') != std::string::npos || HasNul(k)) {
            return Invalid(FieldPath(sf, "exec.env"),
                           absl::StrCat("has an invalid name \"", absl::CEscape(k), "\""));
          }
          if (HasNul(v)) {
            return Invalid(FieldPath(sf, absl::StrCat("exec.env[", k, "]")), kNulMessage);
          }
        }
        if (HasNul(e.cwd())) return Invalid(FieldPath(sf, "exec.cwd"), kNulMessage);
        break;
      }
      case v1::Step::kBuiltin:
        if (absl::Status s = CheckBuiltin(step.builtin(), FieldPath(sf, "builtin")); !s.ok())
          return s;
        break;
      case v1::Step::kHttp:
        if (absl::Status s = CheckHttp(step.http(), FieldPath(sf, "http")); !s.ok()) return s;
        break;
      default:
        return Invalid(sf, "has no exec, builtin or http");
    }
    if (absl::Status s = CheckDuration(step.timeout(), FieldPath(sf, "timeout")); !s.ok()) return s;
  }
  if (static_cast<int64_t>(spec.payload().size()) > opts.max_payload_bytes) {
    return Invalid(FieldPath(f, "payload"),
                   absl::StrCat("is ", spec.payload().size(), " bytes; the limit is ",
                                opts.max_payload_bytes));
  }
  if (spec.max_attempts() < 0 || spec.max_attempts() > opts.max_attempts_limit) {
    return Invalid(FieldPath(f, "max_attempts"),
                   absl::StrCat("is ", spec.max_attempts(), "; it must be in [0, ",
                                opts.max_attempts_limit, "] (0 means the default)"));
  }
  if (spec.not_before().nanos() < 0 || spec.not_before().nanos() >= 1'000'000'000 ||
      spec.not_before().seconds() < 0 || spec.not_before().seconds() > 253402300799) {
    return Invalid(FieldPath(f, "not_before"), "is not a valid timestamp");
  }
  const v1::RetryPolicy& r = spec.retry();
  if (absl::Status s = CheckDuration(r.initial_backoff(), FieldPath(f, "retry.initial_backoff"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDuration(r.max_backoff(), FieldPath(f, "retry.max_backoff")); !s.ok())
    return s;
  if (r.multiplier() != 0 &&
      (!std::isfinite(r.multiplier()) || r.multiplier() < 1 || r.multiplier() > 100)) {
    return Invalid(FieldPath(f, "retry.multiplier"), "must be in [1, 100] (0 means the default)");
  }
  if (absl::Status s = CheckDuration(spec.ack_timeout(), FieldPath(f, "ack_timeout")); !s.ok())
    return s;
  if (absl::Status s = CheckDuration(spec.attempt_timeout(), FieldPath(f, "attempt_timeout"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDuration(spec.schedule_timeout(), FieldPath(f, "schedule_timeout"));
      !s.ok()) {
    return s;
  }
  const v1::Placement& p = spec.placement();
  if (p.slots() < 0 || p.slots() > 1024) {
    return Invalid(FieldPath(f, "placement.slots"), "must be in [0, 1024] (0 means 1)");
  }
  for (const auto& [k, v] : p.required_labels()) {
    if (absl::Status s =
            CheckNameAt(FieldPath(f, "placement.required_labels key"), k, kMaxIdLength);
        !s.ok()) {
      return s;
    }
    if (v.size() > kMaxLabelValueBytes) {
      const std::string name = absl::StrCat("placement.required_labels[", k, "]");
      return Invalid(FieldPath(f, name), "is too long");
    }
  }
  if (absl::Status s = CheckTaskLabels(FieldPath(f, "labels"), spec.labels()); !s.ok()) return s;
  for (int i = 0; i < p.agent_ids_size(); ++i) {
    if (absl::Status s =
            CheckNameAt(FieldPath(f, "placement.agent_ids", i), p.agent_ids(i), kMaxIdLength);
        !s.ok()) {
      return s;
    }
  }
  if (!p.resources().empty()) {
    if (absl::StatusOr<Resources> need = ParseResourceMap(p.resources()); !need.ok()) {
      return Invalid(FieldPath(f, "placement.resources"), need.status().message());
    }
  }
  if (!spec.job_id().empty()) {
    if (absl::Status s = CheckNameAt(FieldPath(f, "job_id"), spec.job_id(), kMaxIdLength); !s.ok())
      return s;
  }
  if (!spec.merge_key().empty()) {
    RETURN_IF_ERROR(CheckNameAt(FieldPath(f, "merge_key"), spec.merge_key(), kMaxIdLength));
    if (spec.depends_on_size() > 0) {
      return Invalid(
          FieldPath(f, "merge_key"),
          "cannot go with depends_on: a task delivered by merge key has no dependencies");
    }
  }
  if (!v1::MergeUpdate_IsValid(spec.merge_update())) {
    return Invalid(FieldPath(f, "merge_update"),
                   absl::StrCat("is unknown (", spec.merge_update(), ")"));
  }
  if (spec.merge_update() != v1::MERGE_UPDATE_UNSPECIFIED && spec.merge_key().empty()) {
    return Invalid(FieldPath(f, "merge_update"), "needs merge_key");
  }
  RETURN_IF_ERROR(CheckDuration(spec.unique_ttl(), FieldPath(f, "unique_ttl")));
  if (!spec.unique_key().empty()) {
    RETURN_IF_ERROR(CheckNameAt(FieldPath(f, "unique_key"), spec.unique_key(), kMaxIdLength));
    if (!spec.merge_key().empty()) {
      return Invalid(FieldPath(f, "unique_key"),
                     "cannot go with merge_key: a merge key already makes one task of many");
    }
    const absl::Duration ttl = FromProto(spec.unique_ttl());
    if (ttl < absl::Seconds(1) || ttl > kMaxUniqueTtl) {
      return Invalid(FieldPath(f, "unique_ttl"), absl::StrCat("is ", absl::FormatDuration(ttl),
                                                              "; with unique_key it must be 1s to ",
                                                              absl::FormatDuration(kMaxUniqueTtl)));
    }
  } else if (spec.has_unique_ttl()) {
    return Invalid(FieldPath(f, "unique_ttl"), "needs unique_key");
  }
  if (!v1::UniqueRelease_IsValid(spec.unique_release())) {
    return Invalid(FieldPath(f, "unique_release"),
                   absl::StrCat("is unknown (", spec.unique_release(), ")"));
  }
  if (spec.unique_key().empty() &&
      (spec.unique_release() != v1::UNIQUE_RELEASE_UNSPECIFIED || spec.unique_refuse())) {
    return Invalid(FieldPath(f, spec.unique_refuse() ? "unique_refuse" : "unique_release"),
                   "needs unique_key");
  }
  if (!spec.replica_of().empty()) {
    return Invalid(FieldPath(f, "replica_of"),
                   "is set by the scheduler on the replicas it makes; ask for replicas instead");
  }
  if (spec.has_replicas()) RETURN_IF_ERROR(CheckReplicas(spec, f));
  if (spec.depends_on_size() > opts.max_job_tasks) {
    return Invalid(FieldPath(f, "depends_on"),
                   absl::StrCat("has ", spec.depends_on_size(), " entries; the limit is ",
                                opts.max_job_tasks));
  }
  absl::flat_hash_map<absl::string_view, int> deps;
  for (int i = 0; i < spec.depends_on_size(); ++i) {
    const FieldPath df(f, "depends_on", i);
    const std::string& dep = spec.depends_on(i);
    if (absl::Status s = CheckNameAt(df, dep, kMaxIdLength); !s.ok()) return s;
    if (dep == spec.id()) return Invalid(df, absl::StrCat("\"", dep, "\" is the task itself"));
    auto [it, inserted] = deps.emplace(dep, i);
    if (!inserted) {
      return Invalid(df, absl::StrCat("\"", dep, "\" repeats depends_on[", it->second, "]"));
    }
  }
  if (!v1::UpstreamFailure_IsValid(spec.on_upstream_failure())) {
    return Invalid(FieldPath(f, "on_upstream_failure"),
                   absl::StrCat("is ", spec.on_upstream_failure(), "; it must be CANCEL or RUN"));
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::core
