#include "scheduler/core/model.h"

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

namespace {
template <typename T>
void MoveAppend(std::vector<T>& to, std::vector<T>& from) {
  if (to.empty()) {
    to = std::move(from);
  } else {
    to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  }
  from.clear();
}
}  // namespace

void WriteBatch::Append(WriteBatch&& other) {
  // A store clears history before it writes attempts, so a reset in `other`
  // must also drop the attempts this batch wrote for the same task.
  if (!other.clear_attempts.empty() && !attempts.empty()) {
    const absl::flat_hash_set<std::string> cleared(other.clear_attempts.begin(),
                                                   other.clear_attempts.end());
    attempts.erase(std::remove_if(attempts.begin(), attempts.end(),
                                  [&](const AttemptRow& a) { return cleared.contains(a.task_id); }),
                   attempts.end());
  }
  // A task `other` deletes was changed in this batch before it was
  // deleted: those rows are moot (the store deletes first, so it would find
  // no row to update). Its events stay: they happened.
  if (!other.deletes.empty()) {
    absl::flat_hash_set<int64_t> seqs;
    absl::flat_hash_set<std::string> ids;
    for (const TaskDelete& d : other.deletes) {
      seqs.insert(d.seq);
      ids.insert(d.id);
    }
    auto drop = [](auto& rows, auto gone) {
      rows.erase(std::remove_if(rows.begin(), rows.end(), gone), rows.end());
    };
    // A task inserted in this batch too never reaches the table at all.
    absl::flat_hash_set<int64_t> never_stored;
    drop(tasks, [&](const TaskRow& r) {
      if (!seqs.contains(r.seq)) return false;
      if (r.insert) never_stored.insert(r.seq);
      return true;
    });
    drop(other.deletes, [&](const TaskDelete& d) { return never_stored.contains(d.seq); });
    drop(attempts, [&](const AttemptRow& a) { return ids.contains(a.task_id); });
    drop(clear_attempts, [&](const std::string& id) { return ids.contains(id); });
    drop(trim_attempts, [&](const auto& t) { return ids.contains(t.first); });
    drop(merged, [&](const MergedRow& m) { return ids.contains(m.task_id); });
  }
  MoveAppend(tasks, other.tasks);
  MoveAppend(attempts, other.attempts);
  MoveAppend(clear_attempts, other.clear_attempts);
  MoveAppend(trim_attempts, other.trim_attempts);
  MoveAppend(merged, other.merged);
  MoveAppend(queues, other.queues);
  MoveAppend(events, other.events);
  MoveAppend(schedules, other.schedules);
  MoveAppend(deletes, other.deletes);
  prune_events_through = std::max(prune_events_through, other.prune_events_through);
}

absl::Time UniqueUntil(const TaskRecord& t) {
  if (t.spec.unique_key().empty() || t.unique_released) return absl::InfinitePast();
  absl::Time from = t.create_time;
  if (t.spec.has_not_before()) from = std::max(from, FromProto(t.spec.not_before()));
  return from + FromProto(t.spec.unique_ttl());
}

TaskRow ToRow(const TaskRecord& t, bool insert) {
  TaskRow r;
  r.insert = insert;
  r.id = t.id();
  r.seq = t.seq;
  r.queue = t.queue();
  r.state = t.state;
  r.attempt = t.attempt;
  r.agent_id = t.agent_id;
  r.create_us = ToUnixMicrosOrZero(t.create_time);
  r.update_us = ToUnixMicrosOrZero(t.update_time);
  r.next_run_us = ToUnixMicrosOrZero(t.next_run_time);
  r.dispatch_us = ToUnixMicrosOrZero(t.dispatch_time);
  r.start_us = ToUnixMicrosOrZero(t.start_time);
  r.reason = t.reason;
  r.pause_requested = t.pause_requested;
  if (t.result().outcome() != v1::OUTCOME_UNSPECIFIED) t.result().SerializeToString(&r.result);
  r.attempt_base = t.attempt_base;
  r.attempts_dropped = t.attempts_dropped;
  r.interrupted_dropped = t.interrupted_dropped;
  r.claim_until_us = ToUnixMicrosOrZero(t.claim_until);
  if (t.merge) r.merge_fire_us = ToUnixMicrosOrZero(FromProto(t.merge->merged.fire_time()));
  r.unique_until_us = ToUnixMicrosOrZero(UniqueUntil(t));
  if (insert) {
    t.spec.SerializeToString(&r.spec);
    r.job_id = t.job_id();
    r.replica = !t.spec.replica_of().empty();
    r.has_replicas = ReplicaCount(t.spec) > 0;
    r.unique_key = t.spec.unique_key();
    r.labels = EncodeLabels(t.spec.labels());
  }
  return r;
}

AttemptRow ToAttemptRow(const std::string& task_id, const v1::Attempt& a) {
  AttemptRow r;
  r.task_id = task_id;
  r.attempt = a.attempt();
  a.SerializeToString(&r.data);
  return r;
}

absl::StatusOr<std::unique_ptr<TaskRecord>> FromStored(TaskRow&& r,
                                                       absl::Span<const AttemptRow> attempts,
                                                       absl::Span<const MergedRow> merged) {
  auto owned = std::make_unique<TaskRecord>();
  TaskRecord& t = *owned;
  if (!t.spec.ParseFromString(r.spec)) {
    return absl::DataLossError(absl::StrCat("task ", r.id, ": stored spec does not parse"));
  }
  if (!v1::TaskState_IsValid(r.state)) {
    return absl::DataLossError(absl::StrCat("task ", r.id, ": unknown stored state ", r.state));
  }
  t.seq = r.seq;
  t.state = static_cast<v1::TaskState>(r.state);
  t.attempt = r.attempt;
  t.agent_id = std::move(r.agent_id);
  t.create_time = FromUnixMicrosOrZero(r.create_us);
  t.update_time = FromUnixMicrosOrZero(r.update_us);
  t.next_run_time = FromUnixMicrosOrZero(r.next_run_us);
  t.dispatch_time = FromUnixMicrosOrZero(r.dispatch_us);
  t.start_time = FromUnixMicrosOrZero(r.start_us);
  t.reason = std::move(r.reason);
  t.pause_requested = r.pause_requested;
  t.attempt_base = r.attempt_base;
  t.attempts_dropped = r.attempts_dropped;
  t.interrupted_dropped = r.interrupted_dropped;
  t.claim_until = FromUnixMicrosOrZero(r.claim_until_us);
  t.unique_released = !t.spec.unique_key().empty() && r.unique_until_us == 0;
  if (!t.spec.merge_key().empty()) {
    MergeState& m = t.merge.emplace();
    SetTimestamp(FromUnixMicrosOrZero(r.merge_fire_us), m.merged.mutable_fire_time());
    for (const MergedRow& p : merged) {
      if (p.n != m.merged.payloads_size()) {
        return absl::DataLossError(absl::StrCat("task ", r.id, ": merged payload ",
                                                m.merged.payloads_size(), " is missing"));
      }
      m.merged.add_payloads(p.payload);
      m.bytes += static_cast<int64_t>(p.payload.size());
    }
    if (m.merged.payloads_size() == 0) {
      return absl::DataLossError(absl::StrCat("task ", r.id, ": its merged payloads are missing"));
    }
  }
  if (!r.result.empty() && !t.mutable_result().ParseFromString(r.result)) {
    return absl::DataLossError(absl::StrCat("task ", r.id, ": stored result does not parse"));
  }
  t.attempts.reserve(attempts.size());
  for (const AttemptRow& a : attempts) {
    if (!t.attempts.emplace_back().ParseFromString(a.data)) {
      return absl::DataLossError(
          absl::StrCat("task ", r.id, ": stored attempt ", a.attempt, " does not parse"));
    }
  }
  return owned;
}

void ToTaskProto(const TaskRecord& t, v1::Task* out) {
  *out->mutable_spec() = t.spec;
  out->set_state(t.state);
  out->set_attempt(t.attempt);
  out->set_agent_id(t.agent_id);
  SetTimestamp(t.create_time, out->mutable_create_time());
  SetTimestamp(t.update_time, out->mutable_update_time());
  if (t.state == v1::TASK_STATE_SCHEDULED) {
    SetTimestamp(t.next_run_time, out->mutable_next_run_time());
  }
  out->set_reason(t.reason);
  if (t.result().outcome() != v1::OUTCOME_UNSPECIFIED) *out->mutable_result() = t.result();
  for (const v1::Attempt& a : t.attempts) *out->add_attempts() = a;
  out->set_attempts_dropped(t.attempts_dropped);
  if (t.claimed()) SetTimestamp(t.claim_until, out->mutable_claim_expire_time());
  if (t.merge) *out->mutable_merged() = t.merge->merged;
  for (const TaskRecord* r : t.replicas) {
    v1::ReplicaStatus* rs = out->add_replicas();
    rs->set_task_id(r->id());
    rs->set_state(r->state);
    rs->set_attempt(r->attempt);
    if (!r->agent_id.empty()) {
      rs->set_agent_id(r->agent_id);
    } else if (!r->attempts.empty()) {
      rs->set_agent_id(r->attempts.back().agent_id());
    }
    rs->set_outcome(r->result().outcome());
    rs->set_reason(r->reason);
  }
}

std::string ReplicaId(const std::string& task_id, int32_t n) {
  return absl::StrCat(task_id, ":r", n);
}

std::string EncodeLabels(const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.empty()) return "";
  std::vector<std::pair<absl::string_view, absl::string_view>> sorted(labels.begin(), labels.end());
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (const auto& [k, v] : sorted) {
    absl::StrAppend(&out, out.empty() ? "" : "\n", k, "=", v);
  }
  return out;
}

bool HasLabels(const v1::TaskSpec& spec,
               const std::vector<std::pair<std::string, std::string>>& want) {
  for (const auto& [k, v] : want) {
    auto it = spec.labels().find(k);
    if (it == spec.labels().end() || it->second != v) return false;
  }
  return true;
}

v1::JobState JobStateOf(const JobRecord& j) {
  for (int s = 1; s < kNumTaskStates; ++s) {
    if (j.counts[s] > 0 && !IsTerminal(static_cast<v1::TaskState>(s))) {
      return v1::JOB_STATE_RUNNING;
    }
  }
  // A task put aside by its pull worker failed as far as its job goes.
  if (j.counts[v1::TASK_STATE_FAILED] > 0 || j.counts[v1::TASK_STATE_TRASHED] > 0) {
    return v1::JOB_STATE_FAILED;
  }
  if (j.counts[v1::TASK_STATE_CANCELLED] > 0) return v1::JOB_STATE_CANCELLED;
  return v1::JOB_STATE_SUCCEEDED;
}

}  // namespace taskgrid::core
