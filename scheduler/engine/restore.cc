// Recovery: the Engine reads the store back into the Scheduler at Start,
// the unfinished tasks whole and the finished ones light, on two threads.

#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "absl/types/span.h"
#include "common/status_macros.h"
#include "scheduler/engine/bounded_queue.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::engine {

namespace {

// Chunks of rows (Store::kScanChunkRows each) read ahead of the parsing in
// recovery: enough to ride out a hiccup on either side, a few MiB at most.
constexpr size_t kRestoreChunksInFlight = 8;

// Rows of one kind (finished attempts, merged payloads) as the store
// returns them, each task's together, found by task id: a span per task
// into the rows, which must outlive the index.
template <typename Row>
class RowIndex {
 public:
  explicit RowIndex(const std::vector<Row>& rows) {
    for (size_t i = 0; i < rows.size();) {
      size_t end = i + 1;
      while (end < rows.size() && rows[end].task_id == rows[i].task_id) ++end;
      runs_.emplace(rows[i].task_id, absl::MakeConstSpan(rows).subspan(i, end - i));
      i = end;
    }
  }
  absl::Span<const Row> Of(const std::string& task_id) const {
    if (runs_.empty()) return {};
    auto it = runs_.find(task_id);
    return it == runs_.end() ? absl::Span<const Row>() : it->second;
  }

 private:
  absl::flat_hash_map<absl::string_view, absl::Span<const Row>> runs_;
};

}  // namespace

absl::Status Engine::Restore() {
  if (started_) return absl::FailedPreconditionError("the engine was started already");
  ASSIGN_OR_RETURN(const std::vector<core::QueueRow> queues, store_->LoadQueues());
  // Revisions go on after the newest ever handed out, even when retention
  // pruned every event.
  ASSIGN_OR_RETURN(const store::EventSpan span, store_->GetEventSpan());
  const int64_t oldest = span.oldest > 0 ? span.oldest : span.newest + 1;
  RETURN_IF_ERROR(sched_.BeginRestore(0, span.newest, oldest));
  RETURN_IF_ERROR(sched_.RestoreQueues(queues));

  // Two threads share the work on a table of unfinished tasks, about half
  // each at 1,000,000 of them: a reader thread steps SQLite, files the
  // finished tasks' light rows at once (they stay on disk) and files
  // finished records into the scheduler's indexes; this thread parses the
  // other rows into records, with the attempts and merged payloads of the
  // few that have any (attempt > 0, a merge key), read by key a chunk at a
  // time (a walk over every task's would read the whole table again). The
  // parsing makes nearly all the allocations, and keeping them on this
  // thread keeps them in malloc's main arena: a second thread's arena grows
  // its heap an mprotect() call per page, which made a reader that parsed a
  // quarter slower. Chunks go round in three queues: rows to parse, records
  // to file, and parsed rows whose string buffers the reader fills again.
  // The reader files every record chunk ready each time it has read one, so
  // records waiting stay within the rows' bound too. An error on either
  // side stops the other; the reader is always joined.
  using Rows = std::vector<core::TaskRow>;
  using Records = std::vector<std::unique_ptr<core::TaskRecord>>;
  BoundedQueue<Rows> to_parse(kRestoreChunksInFlight);
  BoundedQueue<Records> to_file(std::numeric_limits<size_t>::max());
  BoundedQueue<Rows> spare(kRestoreChunksInFlight + 2);
  absl::Status read_status;  // written by the reader, read after the join
  std::thread reader([&] {
    // Only this thread touches sched_ until the join (mu_ is held by the
    // thread that waits for it).
    auto file_ready = [&]() -> absl::Status {
      while (std::optional<Records> records = to_file.TryPop()) {
        RETURN_IF_ERROR(sched_.RestoreTasks(&*records));
      }
      return absl::OkStatus();
    };
    absl::Status s = store_->ScanTasks(
        [&](Rows* rows) -> absl::Status {
          const auto light = std::stable_partition(rows->begin(), rows->end(),
                                                   [](const core::TaskRow& r) { return !r.light; });
          if (light != rows->end()) {
            RETURN_IF_ERROR(sched_.RestoreCold(absl::MakeConstSpan(&*light, rows->end() - light)));
            rows->erase(light, rows->end());
          }
          if (rows->empty()) return file_ready();
          Rows next = spare.TryPop().value_or(Rows());
          std::swap(*rows, next);
          if (!to_parse.Push(std::move(next))) return absl::CancelledError("recovery stopped");
          return file_ready();
        },
        /*light_finished=*/true);
    to_parse.Close();
    while (s.ok()) {
      std::optional<Records> records = to_file.Pop();
      if (!records) break;
      s = sched_.RestoreTasks(&*records);
    }
    if (!s.ok()) {
      to_parse.Cancel();
      to_file.Cancel();
    }
    read_status = s;
  });
  absl::Status parse_status;
  std::vector<std::string> with_history;
  std::vector<core::AttemptRow> attempts;
  std::vector<core::MergedRow> merged;
  while (std::optional<Rows> rows = to_parse.Pop()) {
    with_history.clear();
    attempts.clear();
    merged.clear();
    for (const core::TaskRow& row : *rows) {
      if (row.attempt > 0 || row.merge_fire_us != 0) with_history.push_back(row.id);
    }
    parse_status = store_->ReadHistory(with_history, &attempts, &merged);
    if (!parse_status.ok()) break;
    const RowIndex<core::AttemptRow> index(attempts);
    const RowIndex<core::MergedRow> merged_index(merged);
    Records records;
    records.reserve(rows->size());
    for (core::TaskRow& row : *rows) {
      const absl::Span<const core::AttemptRow> of = index.Of(row.id);
      const absl::Span<const core::MergedRow> gathered = merged_index.Of(row.id);
      absl::StatusOr<std::unique_ptr<core::TaskRecord>> rec =
          core::FromStored(std::move(row), of, gathered);
      if (!rec.ok()) {
        parse_status = rec.status();
        break;
      }
      records.push_back(std::move(*rec));
    }
    if (!parse_status.ok() || !to_file.Push(std::move(records))) break;
    spare.TryPush(std::move(*rows));
  }
  if (parse_status.ok()) {
    to_file.Close();
  } else {
    to_parse.Cancel();
    to_file.Cancel();
  }
  reader.join();
  RETURN_IF_ERROR(parse_status);
  RETURN_IF_ERROR(read_status);
  // Finished tasks the others need in memory (their dependencies, their
  // jobs' tasks, their replicas) are read back whole, and what those need.
  for (std::vector<int64_t> need = sched_.RestoreNeeds(); !need.empty();
       need = sched_.RestoreNeeds()) {
    ASSIGN_OR_RETURN(std::vector<core::StoredTask> stored, store_->ReadTasks(need));
    Records records;
    records.reserve(stored.size());
    for (core::StoredTask& st : stored) {
      ASSIGN_OR_RETURN(std::unique_ptr<core::TaskRecord> rec,
                       core::FromStored(std::move(st.row), st.attempts, st.merged));
      records.push_back(std::move(rec));
    }
    RETURN_IF_ERROR(sched_.RestoreTasks(&records));
  }
  RETURN_IF_ERROR(sched_.FinishRestore());
  ASSIGN_OR_RETURN(std::vector<core::ScheduleRow> schedules, store_->LoadSchedules());
  return sched_.RestoreSchedules(std::move(schedules));
}

}  // namespace taskgrid::engine
