// Validation of client input (invariant 7 in docs/architecture.md): every error is
// INVALID_ARGUMENT naming the field, e.g. "tasks[2].steps[0].exec.argv is
// empty". Pure functions; nothing here changes state.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "scheduler/core/options.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/board_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::core {

// The longest a task stays unique by its key (TaskSpec.unique_ttl).
inline constexpr absl::Duration kMaxUniqueTtl = absl::Hours(24 * 30);

// The path of a field ("tasks[3].steps[0].timeout"), spelled out only when
// an error names it: a valid spec costs no string building (W1 submits
// validate every task on the hot path). Refers to its parent and its name:
// both must outlive it.
class FieldPath {
 public:
  FieldPath(const char* root) : name_(root) {}  // NOLINT: implicit, for "tasks[0]"
  FieldPath(absl::string_view root, int index) : name_(root), index_(index) {}
  FieldPath(const FieldPath& parent, absl::string_view name, int index = -1)
      : parent_(&parent), name_(name), index_(index) {}
  std::string str() const;

 private:
  const FieldPath* parent_ = nullptr;
  absl::string_view name_;
  int index_ = -1;  // >= 0: "name[index]"
};

// A duration from a client: not negative, nanos in range, at most 10
// years; INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckDuration(const google::protobuf::Duration& d, const FieldPath& field);

// Checks an agent's Hello: its id, slots (at most --max_agent_slots),
// labels, version and the attempts it says it holds, each bounded.
absl::Status ValidateHello(const v1::Hello& hello, const SchedulerOptions& opts);

// Checks an agent message after the stream's Hello: a batch holds plain
// messages only (neither a hello nor another batch). A second Hello is the
// stream's business (FAILED_PRECONDITION there).
absl::Status ValidateAgentMessage(const v1::AgentMessage& msg);

// Pull mode: a Claim (queue, owner, lease within --max_claim_lease, max,
// labels as an agent's), the claim a later call names, and WaitForWork.
absl::Status ValidateClaim(const v1::ClaimRequest& req, const SchedulerOptions& opts);
absl::Status ValidateClaimRef(const v1::ClaimRef& ref);
absl::Status ValidateWaitForWork(const v1::WaitForWorkRequest& req);
// Labels a worker or agent carries: at most 64, keys valid names, values
// at most kMaxLabelValueBytes. `field` names them ("hello.labels").
absl::Status CheckLabels(absl::string_view field,
                         const google::protobuf::Map<std::string, std::string>& labels);
// A task's labels (TaskSpec.labels), or the labels a listing asks for:
// at most kMaxTaskLabels, keys valid names, values at most
// kMaxLabelValueBytes without control characters (so "key=value" lines
// hold them whole: EncodeLabels).
absl::Status CheckTaskLabels(const FieldPath& field,
                             const google::protobuf::Map<std::string, std::string>& labels);

// Checks one spec; `field` prefixes the messages (e.g. "tasks[3]").
// An empty id is allowed (the scheduler generates one).
absl::Status ValidateSpec(const v1::TaskSpec& spec, const SchedulerOptions& opts,
                          const FieldPath& field);

}  // namespace taskgrid::core
