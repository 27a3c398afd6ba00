#include "scheduler/store/memory_store.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::store {

absl::Status MemoryStore::Apply(const core::WriteBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  // Check first so a bad batch changes nothing, as a transaction would.
  for (const core::TaskDelete& d : batch.deletes) {
    auto it = tasks_.find(d.id);
    if (it == tasks_.end() || it->second.seq != d.seq) {
      return absl::NotFoundError(absl::StrCat("deleting task ", d.id, ": no such row"));
    }
  }
  std::map<std::string, bool> exists;
  for (const core::TaskDelete& d : batch.deletes) exists[d.id] = false;
  for (const core::TaskRow& r : batch.tasks) {
    auto it = exists.find(r.id);
    const bool present = it != exists.end() ? it->second : tasks_.count(r.id) > 0;
    if (r.insert && present) return absl::AlreadyExistsError(absl::StrCat("task ", r.id));
    if (!r.insert && !present) return absl::NotFoundError(absl::StrCat("task ", r.id));
    exists[r.id] = true;
  }
  for (const core::TaskDelete& d : batch.deletes) {
    tasks_.erase(d.id);
    attempts_.erase(attempts_.lower_bound({d.id, INT32_MIN}),
                    attempts_.upper_bound({d.id, INT32_MAX}));
    merged_.erase(merged_.lower_bound({d.id, INT32_MIN}), merged_.upper_bound({d.id, INT32_MAX}));
  }
  for (const core::TaskRow& r : batch.tasks) {
    if (r.insert) {
      tasks_[r.id] = r;
    } else {
      // The columns only an insert writes stay as they are.
      core::TaskRow& row = tasks_[r.id];
      core::TaskRow kept = std::move(row);
      row = r;
      row.spec = std::move(kept.spec);
      row.job_id = std::move(kept.job_id);
      row.unique_key = std::move(kept.unique_key);
      row.labels = std::move(kept.labels);
      row.replica = kept.replica;
      row.has_replicas = kept.has_replicas;
      row.create_us = kept.create_us;
    }
  }
  for (const std::string& id : batch.clear_attempts) {
    attempts_.erase(attempts_.lower_bound({id, INT32_MIN}), attempts_.upper_bound({id, INT32_MAX}));
  }
  for (const core::AttemptRow& a : batch.attempts) attempts_[{a.task_id, a.attempt}] = a;
  for (const core::MergedRow& m : batch.merged) merged_[{m.task_id, m.n}] = m;
  for (const core::QueueRow& q : batch.queues) {
    if (q.settings.empty()) {
      queues_.erase(q.queue);
    } else {
      queues_[q.queue] = q.settings;
    }
  }
  for (const auto& [id, below] : batch.trim_attempts) {
    attempts_.erase(attempts_.lower_bound({id, INT32_MIN}), attempts_.lower_bound({id, below}));
  }
  for (const core::EventRow& e : batch.events) events_.push_back({e.revision, e});
  for (const core::ScheduleRow& r : batch.schedules) {
    if (r.erase) {
      schedules_.erase(r.id);
    } else {
      schedules_[r.id] = r;
    }
  }
  if (batch.prune_events_through > 0) {
    auto keep = std::find_if(events_.begin(), events_.end(), [&](const StoredEvent& e) {
      return e.revision > batch.prune_events_through;
    });
    events_.erase(events_.begin(), keep);
    newest_pruned_ = std::max(newest_pruned_, batch.prune_events_through);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryStore::CountTasks() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(tasks_.size());
}

absl::Status MemoryStore::ScanTasks(const RowSink& sink, bool light_finished) {
  std::vector<core::TaskRow> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, row] : tasks_) {
      if (!light_finished || !core::IsTerminal(static_cast<v1::TaskState>(row.state))) {
        all.push_back(row);
        continue;
      }
      // The columns SqliteStore reads for a light row, and no others.
      core::TaskRow& r = all.emplace_back();
      r.light = true;
      r.id = row.id;
      r.seq = row.seq;
      r.queue = row.queue;
      r.state = row.state;
      r.attempt = row.attempt;
      r.create_us = row.create_us;
      r.update_us = row.update_us;
      r.job_id = row.job_id;
      r.unique_key = row.unique_key;
      r.unique_until_us = row.unique_until_us;
      r.labels = row.labels;
      r.replica = row.replica;
      r.has_replicas = row.has_replicas;
    }
  }
  std::sort(all.begin(), all.end(),
            [](const core::TaskRow& a, const core::TaskRow& b) { return a.seq < b.seq; });
  // In chunks, as SqliteStore hands them over.
  std::vector<core::TaskRow> chunk;
  for (size_t i = 0; i < all.size(); i += kScanChunkRows) {
    const size_t end = std::min(all.size(), i + kScanChunkRows);
    chunk.assign(std::make_move_iterator(all.begin() + i),
                 std::make_move_iterator(all.begin() + end));
    for (core::TaskRow& r : chunk) r.insert = false;
    if (absl::Status s = sink(&chunk); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::MergedRow>> MemoryStore::LoadMerged() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<core::MergedRow> out;
  for (const auto& [key, m] : merged_) out.push_back(m);
  return out;
}

absl::Status MemoryStore::ReadHistory(const std::vector<std::string>& task_ids,
                                      std::vector<core::AttemptRow>* attempts,
                                      std::vector<core::MergedRow>* merged) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : task_ids) {
    for (auto a = attempts_.lower_bound({id, INT32_MIN});
         a != attempts_.end() && a->first.first == id; ++a) {
      attempts->push_back(a->second);
    }
    for (auto m = merged_.lower_bound({id, INT32_MIN}); m != merged_.end() && m->first.first == id;
         ++m) {
      merged->push_back(m->second);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::StoredTask>> MemoryStore::ReadTasks(
    const std::vector<int64_t>& seqs) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<core::StoredTask> out;
  for (int64_t seq : seqs) {
    auto it = std::find_if(tasks_.begin(), tasks_.end(),
                           [seq](const auto& entry) { return entry.second.seq == seq; });
    if (it == tasks_.end()) continue;
    core::StoredTask& st = out.emplace_back();
    st.row = it->second;
    st.row.insert = false;
  }
  lock.unlock();
  for (core::StoredTask& st : out) {
    if (absl::Status s = ReadHistory({st.row.id}, &st.attempts, &st.merged); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<std::vector<core::QueueRow>> MemoryStore::LoadQueues() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<core::QueueRow> out;
  for (const auto& [name, settings] : queues_) out.push_back({name, settings});
  return out;
}

absl::StatusOr<std::vector<core::ScheduleRow>> MemoryStore::LoadSchedules() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<core::ScheduleRow> out;
  for (const auto& [id, r] : schedules_) out.push_back(r);
  return out;
}

absl::StatusOr<std::vector<core::AttemptRow>> MemoryStore::LoadAttempts() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<core::AttemptRow> out;
  for (const auto& [key, a] : attempts_) out.push_back(a);
  return out;
}

absl::StatusOr<std::vector<StoredEvent>> MemoryStore::ReadEvents(int64_t after, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StoredEvent> out;
  for (const StoredEvent& e : events_) {
    if (static_cast<int>(out.size()) == limit) break;
    if (e.revision > after) out.push_back(e);
  }
  return out;
}

absl::StatusOr<EventSpan> MemoryStore::GetEventSpan() {
  std::lock_guard<std::mutex> lock(mu_);
  EventSpan span;
  span.newest_pruned = newest_pruned_;
  span.newest = newest_pruned_;
  if (!events_.empty()) {
    span.oldest = events_.front().revision;
    span.newest = std::max(span.newest, events_.back().revision);
  }
  return span;
}

}  // namespace taskgrid::store
