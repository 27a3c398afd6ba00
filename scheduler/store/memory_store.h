// MemoryStore: a Store in plain maps, for tests. Not durable. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/store/store.h"

namespace taskgrid::store {

class MemoryStore : public Store {
 public:
  absl::Status Apply(const core::WriteBatch& batch) override;
  absl::StatusOr<int64_t> CountTasks() override;
  absl::Status ScanTasks(const RowSink& sink, bool light_finished = false) override;
  absl::StatusOr<std::vector<core::AttemptRow>> LoadAttempts() override;
  absl::StatusOr<std::vector<core::MergedRow>> LoadMerged() override;
  absl::Status ReadHistory(const std::vector<std::string>& task_ids,
                           std::vector<core::AttemptRow>* attempts,
                           std::vector<core::MergedRow>* merged) override;
  absl::StatusOr<std::vector<core::StoredTask>> ReadTasks(
      const std::vector<int64_t>& seqs) override;
  absl::StatusOr<std::vector<core::QueueRow>> LoadQueues() override;
  absl::StatusOr<std::vector<core::ScheduleRow>> LoadSchedules() override;
  absl::StatusOr<std::vector<StoredEvent>> ReadEvents(int64_t after, int limit) override;
  absl::StatusOr<EventSpan> GetEventSpan() override;

 private:
  std::mutex mu_;
  std::map<std::string, core::TaskRow> tasks_;                            // guarded by mu_
  std::map<std::pair<std::string, int32_t>, core::AttemptRow> attempts_;  // guarded by mu_
  std::map<std::pair<std::string, int32_t>, core::MergedRow> merged_;     // guarded by mu_
  std::map<std::string, std::string> queues_;                             // guarded by mu_
  std::map<std::string, core::ScheduleRow> schedules_;                    // guarded by mu_
  std::vector<StoredEvent> events_;                                       // guarded by mu_
  int64_t newest_pruned_ = 0;                                             // guarded by mu_
};

}  // namespace taskgrid::store
