// Views: lookups, the API views of tasks, jobs and agents, lists and stats.

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

const JobRecord* Scheduler::FindJob(const std::string& id) const { return table_.FindJob(id); }

void Scheduler::DescribeJob(const JobRecord& j, v1::Job* out) const {
  out->set_id(j.id);
  out->set_state(JobStateOf(j));
  out->set_task_count(static_cast<int32_t>(j.size()));
  for (int s = 1; s < kNumStates; ++s) {
    if (j.counts[s] != 0) {
      (*out->mutable_counts())[StateName(static_cast<v1::TaskState>(s))] = j.counts[s];
    }
  }
  SetTimestamp(j.create_time, out->mutable_create_time());
  SetTimestamp(j.update_time, out->mutable_update_time());
}

JobListPage Scheduler::ListJobs(const JobListFilter& filter) const {
  JobListPage page;
  const absl::flat_hash_set<int> states(filter.states.begin(), filter.states.end());
  const auto& jobs = table_.jobs_by_seq();
  for (auto it = jobs.upper_bound(filter.after_seq); it != jobs.end(); ++it) {
    const JobRecord* j = it->second;
    if (!states.empty() && !states.contains(JobStateOf(*j))) continue;
    if (static_cast<int>(page.jobs.size()) == filter.page_size) {
      page.next_after_seq = page.jobs.back()->seq;
      break;
    }
    page.jobs.push_back(j);
  }
  return page;
}

const TaskRecord* Scheduler::Find(const std::string& id) const { return table_.Find(id); }

void Scheduler::Describe(const TaskRecord& t, v1::Task* out,
                         const std::vector<const AgentRecord*>* agents) const {
  ToTaskProto(t, out);
  out->set_max_attempts(MaxAttempts(t));
  out->set_attempts_used(AttemptsUsed(t));
  out->set_pause_requested(t.pause_requested);
  if (t.state == v1::TASK_STATE_PENDING) {
    // Placeable tasks keep their stored reason (e.g. why the last attempt
    // failed); the others say what no agent offers.
    const std::vector<const AgentRecord*> all = agents != nullptr ? *agents : Agents();
    const std::string why = WhyUnplaceable(t.spec.placement(), all);
    const Resources need = NeedOf(t.spec.placement());
    if (!why.empty()) {
      out->set_reason("waiting: " + why);
    } else if (const std::string over = ready_.QuotaReason(t.queue(), need); !over.empty()) {
      out->set_reason("waiting: " + over);
    } else if (const std::string gang = IsGangMember(t) ? gangs_.Reason(*t.replica_of, Mono()) : "";
               !gang.empty()) {
      out->set_reason("waiting: " + gang);
    } else if (!need.empty() && std::none_of(all.begin(), all.end(), [&](const AgentRecord* a) {
                 return a->takes_work() && a->HasFree(need) &&
                        Matches(t.spec.placement(), need, *a);
               })) {
      out->set_reason(
          absl::StrCat("waiting: for ", FormatResources(need), " to be free on one agent"));
    } else if (t.replica_of != nullptr && !IsGangMember(t)) {
      const absl::flat_hash_set<std::string> taken = ReplicaAgents(*t.replica_of);
      if (!ready_.AnyAgentCouldTake(t.spec.placement(), &taken)) {
        out->set_reason(
            absl::StrCat("waiting: every agent that could take it holds another "
                         "replica of ",
                         t.replica_of->id(), " or ran one that succeeded"));
      }
    }
  } else if (t.state == v1::TASK_STATE_BLOCKED && !t.replicas.empty()) {
    int succeeded = 0, ended = 0;
    for (const TaskRecord* r : t.replicas) {
      succeeded += r->state == v1::TASK_STATE_SUCCEEDED ? 1 : 0;
      ended += IsTerminal(r->state) ? 1 : 0;
    }
    out->set_reason(absl::StrCat(ReplicasReason(t), ": ", succeeded, " succeeded, ",
                                 ended - succeeded, " did not"));
    // A gang's waiting replicas say why the gang has not started.
    if (const std::string gang = t.spec.replicas().gang() ? gangs_.Reason(t, Mono()) : "";
        !gang.empty()) {
      for (v1::ReplicaStatus& rs : *out->mutable_replicas()) {
        if (rs.state() == v1::TASK_STATE_PENDING) rs.set_reason("waiting: " + gang);
      }
    }
  } else if (t.state == v1::TASK_STATE_BLOCKED) {
    out->set_reason(BlockedReason(t));
  }
}

std::vector<const AgentRecord*> Scheduler::Agents() const {
  std::vector<const AgentRecord*> out;
  out.reserve(agents_.size());
  for (const auto& [id, a] : agents_.all()) out.push_back(a.get());
  std::sort(out.begin(), out.end(),
            [](const AgentRecord* x, const AgentRecord* y) { return x->id < y->id; });
  return out;
}

void Scheduler::DescribeAgent(const AgentRecord& a, v1::Agent* out) const {
  out->set_id(a.id);
  for (const auto& [k, v] : a.labels) (*out->mutable_labels())[k] = v;
  out->set_slots(a.slots);
  out->set_slots_used(a.used);
  std::vector<std::string> running(a.tasks.begin(), a.tasks.end());
  std::sort(running.begin(), running.end());
  for (std::string& id : running) out->add_running(std::move(id));
  out->set_state(!a.connected() ? v1::AGENT_STATE_LOST
                 : a.draining   ? v1::AGENT_STATE_DRAINING
                                : v1::AGENT_STATE_ACTIVE);
  if (a.lost) {
    out->set_note("not back within its grace: its tasks moved to other agents");
  } else if (!a.connected()) {
    out->set_note(a.restarting ? "restarting, its steps running on"
                  : a.restored ? "not back since the scheduler restarted"
                               : "disconnected");
    // The grace's end on the wall clock, for people (the registry counts
    // on the monotonic one).
    const absl::Duration left = agents_.deadline(a.id) - Mono();
    if (!a.tasks.empty() && left < absl::InfiniteDuration()) {
      SetTimestamp(Now() + std::max(left, absl::ZeroDuration()), out->mutable_grace_end_time());
    }
  } else if (a.restart_hold > absl::ZeroDuration()) {
    out->set_note("restarting, keeping its steps: held for it once its stream ends");
  } else if (a.exiting) {
    out->set_note("draining to exit");
  }
  SetTimestamp(a.last_seen_time, out->mutable_last_heartbeat_time());
  SetTimestamp(a.connect_time, out->mutable_connect_time());
  out->set_version(a.version);
  ToResourceMap(a.resources, out->mutable_resources());
  ToResourceMap(a.held, out->mutable_resources_used());
}

v1::ClusterStats Scheduler::ClusterStats() const {
  v1::ClusterStats st;
  Resources total, held;
  for (const auto& [id, a] : agents_.all()) {
    if (!a->connected()) {
      st.set_agents_lost(st.agents_lost() + 1);
      continue;
    }
    if (a->draining) {
      st.set_agents_draining(st.agents_draining() + 1);
    } else {
      st.set_agents_active(st.agents_active() + 1);
    }
    st.set_slots_total(st.slots_total() + a->slots);
    st.set_slots_used(st.slots_used() + a->used);
    AddResources(a->resources, &total);
    AddResources(a->held, &held);
  }
  ToResourceMap(total, st.mutable_resources_total());
  ToResourceMap(held, st.mutable_resources_used());
  st.set_stale_messages(stale_messages_);
  *st.mutable_heartbeat_interval() = ToProto(heartbeat_interval());
  for (const auto& [queue, counts] : table_.counts()) {
    for (int s = 1; s < kNumStates; ++s) {
      if (counts[s] != 0) {
        (*st.mutable_tasks())[StateName(static_cast<v1::TaskState>(s))] += counts[s];
      }
    }
  }
  return st;
}

SchedulerMetrics Scheduler::Metrics() const {
  SchedulerMetrics m;
  m.queues = Stats("");
  const absl::Time now = Now();
  m.oldest_pending_seconds.reserve(m.queues.size());
  for (const v1::QueueStats& q : m.queues) {
    m.oldest_pending_seconds.push_back(
        q.has_oldest_pending_time()
            ? std::max(0.0, absl::ToDoubleSeconds(now - FromProto(q.oldest_pending_time())))
            : 0);
  }
  m.cluster = ClusterStats();
  m.counters = counters_;
  m.tasks_in_memory = static_cast<int64_t>(table_.size());
  m.tasks_on_disk = static_cast<int64_t>(table_.cold_size());
  m.tasks_deleted = cold_.tasks_deleted();
  return m;
}

void Scheduler::AddHistory(v1::QueueStats* qs) const {
  history_.Describe(qs->queue(), counters_, Now(), qs->mutable_history());
}

ListPage Scheduler::List(const ListFilter& filter) const {
  ListPage page;
  const absl::flat_hash_set<int> states(filter.states.begin(), filter.states.end());
  // Tasks on disk are finished: a filter of unfinished states skips them.
  const bool with_cold = states.empty() || std::any_of(states.begin(), states.end(), [](int s) {
                           return IsTerminal(static_cast<v1::TaskState>(s));
                         });
  auto matches = [&](absl::string_view id, const std::string& queue, v1::TaskState state) {
    return (filter.queue.empty() || queue == filter.queue) &&
           (states.empty() || states.contains(state)) && absl::StartsWith(id, filter.id_prefix);
  };
  // A task on disk carries a label when its lines hold "\nkey=value\n".
  std::vector<std::string> label_lines;
  for (const auto& [k, v] : filter.labels)
    label_lines.push_back(absl::StrCat("\n", k, "=", v, "\n"));
  auto matches_hot = [&](const TaskRecord& t) {
    return matches(t.id(), t.queue(), t.state) && HasLabels(t.spec, filter.labels);
  };
  auto matches_cold = [&](const ColdTask& c) {
    if (!matches(c.id(), *c.queue, c.state())) return false;
    const absl::string_view lines = table_.LabelsOf(c);
    return std::all_of(label_lines.begin(), label_lines.end(),
                       [&](const std::string& l) { return absl::StrContains(lines, l); });
  };
  // Returns false when the page is full: there is one more.
  auto offer = [&](bool match, const TaskRecord* t, int64_t seq) {
    if (!match) return true;
    if (static_cast<int>(page.tasks.size()) >= filter.page_size) {
      page.next_after_seq = page.seqs.back();
      return false;
    }
    page.tasks.push_back(t);
    page.seqs.push_back(seq);
    return true;
  };
  auto take = [&](const TaskRecord* t) { return offer(matches_hot(*t), t, t->seq); };
  auto take_cold = [&](const ColdTask& c) { return offer(matches_cold(c), nullptr, c.seq); };
  // Newest first: the page starts before the token's seq (none: the end).
  const int64_t before =
      filter.after_seq == 0 ? std::numeric_limits<int64_t>::max() : filter.after_seq;
  // Walks `list` (in submit order; `seq_of` an entry's seq) from the page
  // token on, in the listing's order, offering each entry to `take_one`;
  // false once the page is full.
  auto walk = [&](const auto& list, auto seq_of, auto take_one) {
    if (filter.newest_first) {
      auto it = std::make_reverse_iterator(
          std::lower_bound(list.begin(), list.end(), before,
                           [&](const auto& entry, int64_t seq) { return seq_of(entry) < seq; }));
      for (; it != list.rend(); ++it) {
        if (!take_one(*it)) return false;
      }
    } else {
      auto it =
          std::upper_bound(list.begin(), list.end(), filter.after_seq,
                           [&](int64_t seq, const auto& entry) { return seq < seq_of(entry); });
      for (; it != list.end(); ++it) {
        if (!take_one(*it)) return false;
      }
    }
    return true;
  };
  const JobRecord* j = filter.job_id.empty() ? nullptr : FindJob(filter.job_id);
  if (!filter.job_id.empty()) {
    if (j == nullptr) return page;
    // A job's tasks are all in memory, or all on disk.
    auto hot_seq = [](const TaskRecord* t) { return t->seq; };
    auto cold_seq = [](int64_t seq) { return seq; };
    auto cold = [&](int64_t seq) { return take_cold(*table_.FindColdBySeq(seq)); };
    if (walk(j->tasks, hot_seq, take) && with_cold) walk(j->cold, cold_seq, cold);
  } else if (filter.newest_first) {
    // Reverse submit order across both: whichever of the two comes next.
    const auto& hot = table_.by_seq();
    const auto& cold = table_.cold_by_seq();
    auto h = std::make_reverse_iterator(hot.lower_bound(before));
    auto c = with_cold ? std::make_reverse_iterator(cold.lower_bound(before)) : cold.rend();
    while (h != hot.rend() || c != cold.rend()) {
      const bool from_hot = c == cold.rend() || (h != hot.rend() && h->first > table_.cold(*c).seq);
      if (from_hot ? !take((h++)->second) : !take_cold(table_.cold(*c++))) break;
    }
  } else {
    // Submit order across both: whichever of the two comes next.
    const auto& hot = table_.by_seq();
    const auto& cold = table_.cold_by_seq();
    auto h = hot.upper_bound(filter.after_seq);
    auto c = with_cold ? cold.upper_bound(filter.after_seq) : cold.end();
    while (h != hot.end() || c != cold.end()) {
      const bool from_hot = c == cold.end() || (h != hot.end() && h->first < table_.cold(*c).seq);
      if (from_hot ? !take((h++)->second) : !take_cold(table_.cold(*c++))) break;
    }
  }
  // The total: from the counts by queue and state, unless the filter asks
  // what they do not know (a job, an id prefix, labels); then by counting.
  auto count_hot = [&](const TaskRecord* t) { page.total += matches_hot(*t); };
  auto count_cold = [&](const ColdTask& c) { page.total += matches_cold(c); };
  if (j != nullptr) {
    for (const TaskRecord* t : j->tasks) count_hot(t);
    if (with_cold) {
      for (int64_t seq : j->cold) count_cold(*table_.FindColdBySeq(seq));
    }
  } else if (!filter.id_prefix.empty() || !filter.labels.empty()) {
    for (const auto& [seq, t] : table_.by_seq()) count_hot(t);
    if (with_cold) {
      for (TaskTable::ColdRef r : table_.cold_by_seq()) count_cold(table_.cold(r));
    }
  } else {
    auto add = [&](const TaskTable::Counts& counts) {
      for (int s = 1; s < kNumStates; ++s) {
        if (states.empty() || states.contains(s)) page.total += counts[s];
      }
    };
    if (!filter.queue.empty()) {
      add(table_.CountsOf(filter.queue));
    } else {
      for (const auto& [queue, counts] : table_.counts()) add(counts);
    }
  }
  return page;
}

std::vector<v1::QueueStats> Scheduler::Stats(const std::string& queue) const {
  std::map<std::string, v1::QueueStats> by_name;
  // While queues share by weight: what each holds, and what its weight
  // gives it among the queues with work (pending, or on agents).
  const bool fair = queue_controls_.weighted();
  const ReadyQueues::Capacity cap = fair ? ready_.CapacityNow() : ReadyQueues::Capacity();
  auto has_work = [&](const std::string& name) {
    const TaskTable::Counts& c = table_.CountsOf(name);
    return c[v1::TASK_STATE_PENDING] > 0 || ready_.HoldsSlots(name);
  };
  int64_t weights = 0;
  if (fair) {
    for (const auto& [name, unused] : table_.counts()) {
      if (has_work(name)) weights += queue_controls_.WeightOf(name);
    }
  }
  auto add = [&](const std::string& name) {
    v1::QueueStats& qs = by_name[name];
    qs.set_queue(name);
    qs.set_max_length(opts_.QueueMaxLength(name));
    qs.set_length(QueueLength(name));
    const TaskTable::Counts& counts = table_.CountsOf(name);
    for (int s = 1; s < kNumStates; ++s) {
      if (counts[s] != 0) {
        (*qs.mutable_counts())[StateName(static_cast<v1::TaskState>(s))] = counts[s];
      }
    }
    qs.set_claimed(board_.ClaimedIn(name));
    if (const v1::QueueSettings* s = queue_controls_.Find(name)) *qs.mutable_settings() = *s;
    qs.set_held(ready_.QueueHeld(name));
    if (const Resources* held = ready_.HeldBy(name))
      ToResourceMap(*held, qs.mutable_resources_held());
    if (fair) {
      qs.set_share(ready_.DominantShare(name, cap));
      if (weights > 0 && has_work(name)) {
        qs.set_fair_share(static_cast<double>(queue_controls_.WeightOf(name)) /
                          static_cast<double>(weights));
      }
    }
    if (const TaskRecord* oldest = table_.OldestPending(name)) {
      SetTimestamp(oldest->create_time, qs.mutable_oldest_pending_time());
    }
  };
  if (!queue.empty()) {
    add(queue);
  } else {
    for (const auto& [name, unused] : table_.counts()) add(name);
    for (const auto& [name, unused] : opts_.queue_max_length) add(name);
    queue_controls_.ForEach([&](const std::string& name, const v1::QueueSettings&) { add(name); });
  }
  std::vector<v1::QueueStats> out;
  for (auto& [name, qs] : by_name) out.push_back(std::move(qs));
  return out;
}

const AgentRecord* Scheduler::FindAgent(const std::string& id) const { return agents_.Find(id); }

}  // namespace taskgrid::core
