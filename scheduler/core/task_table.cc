#include "scheduler/core/task_table.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler_internal.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::core {

TaskRecord* TaskTable::Find(absl::string_view id) const {
  auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : it->get();
}

bool TaskTable::FileRecord(std::unique_ptr<TaskRecord>& owned) {
  owned->id_hash = HashId(owned->id());
  // insert leaves `owned` alone when the id is taken: the set looks the
  // key up before it moves the element in.
  return tasks_.insert(std::move(owned)).second;
}

TaskRecord& TaskTable::Insert(std::unique_ptr<TaskRecord> owned) {
  TaskRecord& t = *owned;
  t.seq = next_seq_++;
  const bool inserted = FileRecord(owned);
  TASKGRID_CHECK(inserted, absl::StrCat("task ", t.id(), " was created twice"));
  by_seq_[t.seq] = &t;
  return t;
}

absl::StatusOr<TaskRecord*> TaskTable::Adopt(std::unique_ptr<TaskRecord> owned) {
  TaskRecord* t = owned.get();
  if (!FileRecord(owned)) {
    return absl::DataLossError(absl::StrCat("task ", t->id(), " is stored twice"));
  }
  by_seq_.emplace_hint(by_seq_.end(), t->seq, t);
  next_seq_ = std::max(next_seq_, t->seq + 1);
  return t;
}

std::string TaskTable::NewTaskId(absl::Time now) {
  for (;;) {
    std::string id =
        absl::StrFormat("t%014d-%06d", absl::ToUnixMillis(now), ++id_counter_ % 1'000'000);
    if (!Taken(id)) return id;
  }
}

const std::string* TaskTable::Intern(const std::string& queue) {
  // Rows of one queue tend to come in runs: the last name is kept at hand.
  if (last_interned_ != nullptr && *last_interned_ == queue) return last_interned_;
  last_interned_ = &*queue_names_.insert(queue).first;
  return last_interned_;
}

const ColdTask* TaskTable::FindCold(absl::string_view id) const {
  auto it = cold_.find(id);
  return it == cold_.end() ? nullptr : &cold_pool_[*it];
}

TaskTable::ColdRef TaskTable::ColdPool::Add(ColdTask c) {
  ColdRef r;
  if (!free_.empty()) {
    r.slot = free_.back();
    free_.pop_back();
  } else {
    // A slot number is 32 bits: 4 billion tasks on disk, far past what one
    // table holds (it would need ~220 GB for the entries alone).
    TASKGRID_CHECK(used_ < std::numeric_limits<uint32_t>::max(),
                   "the pool of tasks on disk is full");
    if ((used_ & kChunkMask) == 0) chunks_.push_back(std::make_unique<ColdTask[]>(kChunkMask + 1));
    r.slot = used_++;
  }
  (*this)[r] = std::move(c);
  return r;
}

void TaskTable::ColdPool::Free(ColdRef r) {
  (*this)[r] = ColdTask();  // lets go of its id's buffer
  free_.push_back(r.slot);
}

uint32_t TaskTable::InternLabels(absl::string_view labels) {
  if (labels.empty()) return 0;
  const std::string lines = absl::StrCat("\n", labels, "\n");
  auto it = label_index_.find(lines);
  if (it != label_index_.end()) {
    ++label_sets_[it->second].refs;
    return it->second;
  }
  uint32_t index;
  if (label_free_.empty()) {
    index = static_cast<uint32_t>(label_sets_.size());
    label_sets_.emplace_back();
  } else {
    index = label_free_.back();
    label_free_.pop_back();
  }
  label_sets_[index] = LabelSet{lines, 1};
  label_index_.emplace(label_sets_[index].lines, index);
  return index;
}

void TaskTable::ReleaseLabels(uint32_t index) {
  if (index == 0) return;
  LabelSet& set = label_sets_[index];
  if (--set.refs > 0) return;
  label_index_.erase(set.lines);
  set = LabelSet();
  label_free_.push_back(index);
}

std::string TaskTable::CheckLabelSets() const {
  std::vector<int64_t> refs(label_sets_.size());
  for (ColdRef r : cold_by_seq_) {
    const ColdTask& c = cold_pool_[r];
    if (c.labels >= refs.size()) return absl::StrCat("task ", c.id(), " has no label set");
    ++refs[c.labels];
  }
  size_t in_use = 0;
  for (uint32_t i = 1; i < label_sets_.size(); ++i) {
    const LabelSet& set = label_sets_[i];
    if (set.refs != refs[i]) {
      return absl::StrCat("label set ", i, " counts ", set.refs, " tasks, not ", refs[i]);
    }
    if (set.refs == 0) continue;
    ++in_use;
    auto it = label_index_.find(set.lines);
    if (it == label_index_.end() || it->second != i) {
      return absl::StrCat("label set ", i, " is not found by its lines");
    }
  }
  if (in_use != label_index_.size() || in_use + label_free_.size() + 1 != label_sets_.size()) {
    return absl::StrCat(label_index_.size(), " label sets indexed, ", in_use, " in use, ",
                        label_free_.size(), " free, of ", label_sets_.size());
  }
  return "";
}

const ColdTask* TaskTable::FileCold(ColdTask c, absl::string_view labels) {
  c.id_hash = HashId(c.id());
  const ColdRef r = cold_pool_.Add(std::move(c));
  if (!cold_.insert(r).second) {
    cold_pool_.Free(r);
    return nullptr;
  }
  cold_by_seq_.insert(cold_by_seq_.end(), r);
  ColdTask& in = cold_pool_[r];
  in.labels = InternLabels(labels);
  return &in;
}

void TaskTable::UnfileCold(const ColdTask* c) {
  auto it = cold_by_seq_.find(c->seq);
  const ColdRef r = *it;
  ReleaseLabels(c->labels);
  cold_by_seq_.erase(it);
  cold_.erase(r);
  cold_pool_.Free(r);
}

const ColdTask* TaskTable::FindColdBySeq(int64_t seq) const {
  auto it = cold_by_seq_.find(seq);
  return it == cold_by_seq_.end() ? nullptr : &cold_pool_[*it];
}

namespace {

ColdTask ColdOf(const TaskRecord& t) {
  ColdTask c;
  c.set_id(t.id());
  c.seq = t.seq;
  c.job = t.job;
  c.finish = t.update_time;
  c.attempt = t.attempt;
  c.set_state(t.state);
  c.replica = !t.spec.replica_of().empty();
  c.has_replicas = ReplicaCount(t.spec) > 0;
  return c;
}

}  // namespace

void TaskTable::Evict(TaskRecord& t) {
  TASKGRID_CHECK(IsTerminal(t.state) && t.job == nullptr,
                 absl::StrCat("task ", t.id(), " cannot leave memory alone"));
  ColdTask c = ColdOf(t);
  c.queue = Intern(t.queue());
  const std::string labels = EncodeLabels(t.spec.labels());
  by_seq_.erase(t.seq);
  tasks_.erase(t.id());  // frees `t`
  TASKGRID_CHECK(FileCold(std::move(c), labels) != nullptr, "a task went to disk twice");
}

void TaskTable::EvictJob(JobRecord& j) {
  j.cold.reserve(j.cold.size() + j.tasks.size());
  for (TaskRecord* t : j.tasks) {
    TASKGRID_CHECK(IsTerminal(t->state), absl::StrCat("task ", t->id(), " of job ", j.id,
                                                      " cannot leave memory unfinished"));
    ColdTask c = ColdOf(*t);
    c.queue = Intern(t->queue());
    const std::string labels = EncodeLabels(t->spec.labels());
    j.cold.push_back(t->seq);
    by_seq_.erase(t->seq);
    tasks_.erase(t->id());
    TASKGRID_CHECK(FileCold(std::move(c), labels) != nullptr, "a task went to disk twice");
  }
  j.tasks.clear();
  std::sort(j.cold.begin(), j.cold.end());
}

absl::Status TaskTable::AdoptCold(const TaskRow& row) {
  if (!v1::TaskState_IsValid(row.state) || !IsTerminal(static_cast<v1::TaskState>(row.state))) {
    return absl::DataLossError(
        absl::StrCat("task ", row.id, ": stored state ", row.state, " is not a finished one"));
  }
  if (Find(row.id) != nullptr) {
    return absl::DataLossError(absl::StrCat("task ", row.id, " is stored twice"));
  }
  ColdTask c;
  c.set_id(row.id);
  c.seq = row.seq;
  c.queue = Intern(row.queue);
  c.finish = FromUnixMicrosOrZero(row.update_us);
  c.attempt = row.attempt;
  c.set_state(static_cast<v1::TaskState>(row.state));
  c.replica = row.replica;
  c.has_replicas = row.has_replicas;
  if (!row.job_id.empty()) {
    c.job = &FindOrAddJob(row.job_id, row.seq, FromUnixMicrosOrZero(row.create_us));
  }
  const ColdTask* in = FileCold(std::move(c), row.labels);
  if (in == nullptr) return absl::DataLossError(absl::StrCat("task ", row.id, " is stored twice"));
  ++counts_[*in->queue][in->state()];
  if (in->job != nullptr) {
    JobRecord& j = *in->job;
    j.cold.push_back(row.seq);
    ++j.counts[in->state()];
    j.update_time = std::max(j.update_time, in->finish.get());
  }
  next_seq_ = std::max(next_seq_, row.seq + 1);
  return absl::OkStatus();
}

void TaskTable::UnadoptCold(int64_t seq) {
  const ColdTask* c = FindColdBySeq(seq);
  if (c == nullptr) return;
  --counts_[*c->queue][c->state()];
  if (c->job != nullptr) {
    JobRecord& j = *c->job;
    --j.counts[c->state()];
    j.cold.erase(std::remove(j.cold.begin(), j.cold.end(), seq), j.cold.end());
  }
  UnfileCold(c);
}

TaskRecord* TaskTable::Warm(std::unique_ptr<TaskRecord> t) {
  const ColdTask* found = FindColdBySeq(t->seq);
  if (found == nullptr) return nullptr;
  const ColdTask& c = *found;
  if (c.id() != t->id() || c.finish != t->update_time || c.state() != t->state) return nullptr;
  t->job = c.job;
  UnfileCold(&c);
  TaskRecord* out = t.get();
  by_seq_.emplace(out->seq, out);
  FileRecord(t);
  return out;
}

bool TaskTable::WarmJob(JobRecord& j) {
  std::vector<TaskRecord*> back;
  back.reserve(j.cold.size() + j.tasks.size());
  for (int64_t seq : j.cold) {
    auto it = by_seq_.find(seq);
    if (it == by_seq_.end()) return false;
    back.push_back(it->second);
  }
  back.insert(back.end(), j.tasks.begin(), j.tasks.end());
  std::sort(back.begin(), back.end(),
            [](const TaskRecord* a, const TaskRecord* b) { return a->seq < b->seq; });
  j.tasks = std::move(back);
  j.cold.clear();
  return true;
}

void TaskTable::DeleteCold(const ColdTask& c, WriteBatch* batch) {
  TASKGRID_CHECK(c.job == nullptr, absl::StrCat("task ", c.id(), " is deleted with its job"));
  EraseCold(c, batch);
}

void TaskTable::EraseCold(const ColdTask& c, WriteBatch* batch) {
  Counts& counts = counts_[*c.queue];
  --counts[c.state()];
  if (std::all_of(counts.begin(), counts.end(), [](int64_t n) { return n == 0; })) {
    counts_.erase(*c.queue);
  }
  batch->deletes.push_back({c.seq, std::string(c.id())});
  UnfileCold(&c);  // `c` is gone
}

void TaskTable::DeleteColdJob(JobRecord& j, WriteBatch* batch) {
  TASKGRID_CHECK(j.tasks.empty(), absl::StrCat("job ", j.id, " has tasks in memory"));
  for (int64_t seq : j.cold) {
    const ColdTask* c = FindColdBySeq(seq);
    TASKGRID_CHECK(c != nullptr, absl::StrCat("job ", j.id, " lost task seq ", seq));
    EraseCold(*c, batch);
  }
  jobs_by_seq_.erase(j.seq);
  jobs_.erase(j.id);  // frees `j`
}

JobRecord* TaskTable::FindJob(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

JobRecord& TaskTable::FindOrAddJob(const std::string& id, int64_t seq, absl::Time create_time) {
  std::unique_ptr<JobRecord>& j = jobs_[id];
  if (j == nullptr) {
    j = std::make_unique<JobRecord>();
    j->id = id;
    j->seq = seq;
    j->create_time = create_time;
    j->update_time = create_time;
    jobs_by_seq_[seq] = j.get();
  } else if (seq < j->seq) {
    jobs_by_seq_.erase(j->seq);
    j->seq = seq;
    j->create_time = create_time;
    jobs_by_seq_[seq] = j.get();
  }
  return *j;
}

std::string TaskTable::NewJobId(absl::Time now) {
  for (;;) {
    std::string id =
        absl::StrFormat("j%014d-%06d", absl::ToUnixMillis(now), ++id_counter_ % 1'000'000);
    if (!jobs_.contains(id)) return id;
  }
}

v1::TaskState TaskTable::Apply(TaskRecord& t, v1::TaskState to, std::string reason, absl::Time now,
                               const std::string* event_agent, WriteBatch* batch) {
  const v1::TaskState from = t.state;
  TASKGRID_CHECK(IsAllowedTransition(from, to),
                 absl::StrCat("task ", t.id(), ": ", StateName(from), " -> ", StateName(to)));
  if (from != v1::TASK_STATE_UNSPECIFIED) Leave(t);
  t.state = to;
  Enter(t);
  Record(t, from, std::move(reason), now, event_agent, batch);
  return from;
}

void TaskTable::Amend(TaskRecord& t, const std::function<void(TaskRecord&)>& change,
                      std::string reason, absl::Time now, WriteBatch* batch) {
  Leave(t);
  change(t);
  Enter(t);
  Record(t, t.state, std::move(reason), now, nullptr, batch);
}

void TaskTable::Record(TaskRecord& t, v1::TaskState from, std::string reason, absl::Time now,
                       const std::string* event_agent, WriteBatch* batch) {
  t.reason = std::move(reason);
  t.update_time = now;
  if (t.job != nullptr) t.job->update_time = now;
  batch->tasks.push_back(ToRow(t, from == v1::TASK_STATE_UNSPECIFIED));
  EventRow e;
  e.revision = ++last_revision_;
  t.revision = e.revision;
  e.task_id = t.id();
  e.queue = t.queue();
  e.from_state = from;
  e.to_state = t.state;
  e.attempt = t.attempt;
  e.agent_id = event_agent != nullptr ? *event_agent : t.agent_id;
  e.time_us = ToUnixMicrosOrZero(now);
  e.reason = t.reason;
  e.job_id = t.job_id();
  if (revision_marks_.empty() ||
      e.time_us / 1'000'000 != ToUnixMicrosOrZero(revision_marks_.back().second) / 1'000'000) {
    revision_marks_.push_back({e.revision, now});
  } else {
    revision_marks_.back().first = e.revision;
  }
  batch->events.push_back(std::move(e));
}

void TaskTable::Enter(TaskRecord& t) {
  ++counts_[t.queue()][t.state];
  if (t.job != nullptr) ++t.job->counts[t.state];
  if (t.state == v1::TASK_STATE_SCHEDULED) scheduled_.insert({t.next_run_time, t.seq, &t});
  if (t.state == v1::TASK_STATE_PENDING) pending_[t.queue()].insert({t.seq, &t});
}

void TaskTable::Leave(TaskRecord& t) {
  if (t.state == v1::TASK_STATE_SCHEDULED) scheduled_.erase({t.next_run_time, t.seq, &t});
  if (t.state == v1::TASK_STATE_PENDING) {
    auto it = pending_.find(t.queue());
    it->second.erase({t.seq, &t});
    if (it->second.empty()) pending_.erase(it);
  }
  --counts_[t.queue()][t.state];
  if (t.job != nullptr) --t.job->counts[t.state];
}

TaskRecord* TaskTable::NextDue(absl::Time now) const {
  if (scheduled_.empty() || std::get<0>(*scheduled_.begin()) > now) return nullptr;
  return std::get<2>(*scheduled_.begin());
}

const TaskRecord* TaskTable::OldestPending(const std::string& queue) const {
  auto it = pending_.find(queue);
  return it == pending_.end() ? nullptr : it->second.begin()->second;
}

const TaskTable::Counts& TaskTable::CountsOf(const std::string& queue) const {
  static const Counts kNone{};
  auto it = counts_.find(queue);
  return it == counts_.end() ? kNone : it->second;
}

void TaskTable::SetRevisions(int64_t last, int64_t oldest, absl::Time now) {
  last_revision_ = last;
  oldest_revision_ = std::max<int64_t>(oldest, 1);
  if (last > 0) revision_marks_.push_back({last, now});
}

int64_t TaskTable::PruneBefore(absl::Time cutoff) {
  int64_t prune = 0;
  while (!revision_marks_.empty() && revision_marks_.front().second < cutoff) {
    prune = revision_marks_.front().first;
    revision_marks_.pop_front();
  }
  if (prune > 0) oldest_revision_ = prune + 1;
  return prune;
}

}  // namespace taskgrid::core
