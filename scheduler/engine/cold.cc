// The Engine's side of finished tasks on disk: reading them back for an
// operation that needs them (WithWarm) or for a read (DescribeStored),
// moving finished tasks out of memory on the ticker, and the retention
// calls (DeleteTask, DeleteTasks, DeleteJob, SetQueueRetention).
//
// Store reads happen without mu_ held, so a read from disk never holds up
// the scheduler; what they read is checked against the Scheduler's index
// when it is taken in (Scheduler::Warm), so a task that changed meanwhile
// is read again rather than brought back stale.

#include <map>
#include <optional>
#include <utility>

#ifdef __GLIBC__     // defined by the headers above
#include <malloc.h>  // malloc_trim
#endif

#include "absl/strings/str_cat.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/engine/engine.h"
#include "spdlog/spdlog.h"

namespace taskgrid::engine {

namespace {

// Rounds of reading back before an operation runs anyway: each round
// reads what the last one's tasks need (their dependencies, jobs,
// replicas), and a race with eviction costs one more.
constexpr int kMaxWarmRounds = 8;

// Records of stored tasks, keyed by seq.
absl::Status ParseStored(std::vector<core::StoredTask> stored,
                         std::map<int64_t, std::unique_ptr<core::TaskRecord>>* out) {
  for (core::StoredTask& st : stored) {
    const int64_t seq = st.row.seq;
    absl::StatusOr<std::unique_ptr<core::TaskRecord>> rec =
        core::FromStored(std::move(st.row), st.attempts, st.merged);
    if (!rec.ok()) return rec.status();
    (*out)[seq] = std::move(*rec);
  }
  return absl::OkStatus();
}

}  // namespace

void Engine::WithWarm(const std::function<std::vector<int64_t>()>& needs,
                      const std::function<void()>& op) {
  std::vector<int64_t> want;
  {
    std::lock_guard<std::mutex> lock(mu_);
    want = stopped_ ? std::vector<int64_t>() : needs();
    if (want.empty()) return op();
  }
  std::map<int64_t, std::unique_ptr<core::TaskRecord>> loaded;
  for (int round = 0; round < kMaxWarmRounds; ++round) {
    for (int64_t seq : want) loaded.erase(seq);  // read again
    absl::StatusOr<std::vector<core::StoredTask>> stored = store_->ReadTasks(want);
    absl::Status s = stored.ok() ? ParseStored(std::move(*stored), &loaded) : stored.status();
    if (!s.ok()) {
      spdlog::error("reading finished tasks back from the store: {}", s.ToString());
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return op();
    std::vector<std::unique_ptr<core::TaskRecord>> records;
    records.reserve(loaded.size());
    for (auto& [seq, rec] : loaded) records.push_back(std::move(rec));
    loaded.clear();
    want = sched_.Warm(&records);
    if (want.empty()) {
      // In memory now, under the same hold of mu_ as the operation: the
      // ticker cannot move them out in between.
      want = needs();
      if (want.empty()) return op();
      continue;
    }
    for (auto& rec : records) {  // not taken: kept for the next round
      const int64_t seq = rec->seq;
      loaded[seq] = std::move(rec);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  op();
}

absl::StatusOr<std::vector<std::optional<v1::Task>>> Engine::DescribeStored(
    const std::vector<int64_t>& seqs) {
  std::map<int64_t, std::unique_ptr<core::TaskRecord>> loaded;
  {
    absl::StatusOr<std::vector<core::StoredTask>> stored = store_->ReadTasks(seqs);
    if (!stored.ok()) return stored.status();
    if (absl::Status s = ParseStored(std::move(*stored), &loaded); !s.ok()) return s;
  }
  // A task with replicas lists them: read them too (they went to disk
  // with it).
  std::vector<std::string> replica_ids;
  for (const auto& [seq, t] : loaded) {
    for (int32_t n = 1; n <= core::ReplicaCount(t->spec); ++n) {
      replica_ids.push_back(core::ReplicaId(t->id(), n));
    }
  }
  std::map<int64_t, std::unique_ptr<core::TaskRecord>> replicas;
  if (!replica_ids.empty()) {
    std::vector<int64_t> replica_seqs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      replica_seqs = sched_.ColdSeqsOfIds(replica_ids);
    }
    absl::StatusOr<std::vector<core::StoredTask>> stored = store_->ReadTasks(replica_seqs);
    if (!stored.ok()) return stored.status();
    if (absl::Status s = ParseStored(std::move(*stored), &replicas); !s.ok()) return s;
    for (auto& [seq, r] : replicas) {
      for (auto& [tseq, t] : loaded) {
        if (r->spec.replica_of() == t->id()) t->replicas.push_back(r.get());
      }
    }
  }
  std::vector<std::optional<v1::Task>> out(seqs.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto it = loaded.find(seqs[i]);
    if (it == loaded.end()) continue;  // deleted meanwhile
    sched_.Describe(*it->second, &out[i].emplace());
  }
  return out;
}

std::vector<int64_t> Engine::ColdWorkLocked() {
  evicted_since_trim_ += sched_.Evict(published_revision_.load());
  return sched_.TakeWarmWanted();
}

bool Engine::TrimDueLocked() {
  if (evicted_since_trim_ < kTrimAfterEvictions) return false;
  evicted_since_trim_ = 0;
  return true;
}

void Engine::TrimMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// ---------------------------------------------------------------------------
// Retention calls.

void Engine::DeleteTask(const std::string& id, Reply<v1::DeleteTaskResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<std::vector<std::string>> ids = sched_.DeleteTask(id);
  absl::StatusOr<v1::DeleteTaskResponse> result;
  if (!ids.ok()) {
    result = ids.status();
  } else {
    v1::DeleteTaskResponse resp;
    for (std::string& deleted : *ids) resp.add_ids(std::move(deleted));
    result = std::move(resp);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::DeleteTasks(const v1::BulkTasksRequest& req, Reply<v1::BulkTasksResponse> done) {
  BulkOp(&core::Scheduler::DeleteTasks, req, std::move(done));
}

void Engine::DeleteJob(const std::string& id, Reply<v1::DeleteJobResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<int64_t> n = sched_.DeleteJob(id);
  absl::StatusOr<v1::DeleteJobResponse> result;
  if (!n.ok()) {
    result = n.status();
  } else {
    v1::DeleteJobResponse resp;
    resp.set_id(id);
    resp.set_tasks_deleted(*n);
    result = std::move(resp);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::SetQueueRetention(const v1::SetQueueRetentionRequest& req,
                               Reply<v1::QueueStats> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  Answer(sched_.SetQueueRetention(req), std::move(done));
}

}  // namespace taskgrid::engine
