// Test-only Store wrapper for fault injection: fails commits on demand, and
// can hold a commit until the test lets it go (to observe what callers see
// while a transaction is in flight), or hold an event read after it read
// (to race commits against a watch's replay).
#pragma once

#include <condition_variable>
#include <mutex>

#include "absl/status/status.h"
#include "scheduler/store/store.h"

namespace taskgrid::testing {

class FaultyStore final : public store::Store {
 public:
  explicit FaultyStore(store::Store* inner) : inner_(inner) {}

  // The next `n` Apply calls fail (and write nothing).
  void FailNext(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_next_ = n;
  }
  // Apply calls wait inside until Release().
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
    cv_.notify_all();
  }
  // Blocks until some Apply is waiting inside a Hold().
  void WaitUntilHolding() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return holding_ > 0; });
  }
  // ReadEvents calls read, then wait until ResumeReads() before returning.
  void PauseReads() {
    std::lock_guard<std::mutex> lock(mu_);
    reads_paused_ = true;
  }
  void ResumeReads() {
    std::lock_guard<std::mutex> lock(mu_);
    reads_paused_ = false;
    cv_.notify_all();
  }
  // Blocks until some ReadEvents is waiting inside a PauseReads().
  void WaitUntilReadPaused() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return reading_ > 0; });
  }
  int applies() {
    std::lock_guard<std::mutex> lock(mu_);
    return applies_;
  }

  absl::Status Apply(const core::WriteBatch& batch) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++applies_;
      ++holding_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return !held_; });
      --holding_;
      if (fail_next_ > 0) {
        --fail_next_;
        return absl::InternalError("injected commit failure");
      }
    }
    return inner_->Apply(batch);
  }
  absl::StatusOr<int64_t> CountTasks() override { return inner_->CountTasks(); }
  absl::Status ScanTasks(const RowSink& sink, bool light_finished = false) override {
    return inner_->ScanTasks(sink, light_finished);
  }
  absl::StatusOr<std::vector<core::AttemptRow>> LoadAttempts() override {
    return inner_->LoadAttempts();
  }
  absl::StatusOr<std::vector<core::MergedRow>> LoadMerged() override {
    return inner_->LoadMerged();
  }
  absl::Status ReadHistory(const std::vector<std::string>& task_ids,
                           std::vector<core::AttemptRow>* attempts,
                           std::vector<core::MergedRow>* merged) override {
    return inner_->ReadHistory(task_ids, attempts, merged);
  }
  absl::StatusOr<std::vector<core::StoredTask>> ReadTasks(
      const std::vector<int64_t>& seqs) override {
    return inner_->ReadTasks(seqs);
  }
  absl::StatusOr<std::vector<core::QueueRow>> LoadQueues() override { return inner_->LoadQueues(); }
  absl::StatusOr<std::vector<core::ScheduleRow>> LoadSchedules() override {
    return inner_->LoadSchedules();
  }
  absl::StatusOr<std::vector<store::StoredEvent>> ReadEvents(int64_t after, int limit) override {
    auto events = inner_->ReadEvents(after, limit);
    std::unique_lock<std::mutex> lock(mu_);
    ++reading_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !reads_paused_; });
    --reading_;
    return events;
  }
  absl::StatusOr<store::EventSpan> GetEventSpan() override { return inner_->GetEventSpan(); }

 private:
  store::Store* const inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int fail_next_ = 0;          // guarded by mu_
  bool held_ = false;          // guarded by mu_
  int holding_ = 0;            // guarded by mu_
  int applies_ = 0;            // guarded by mu_
  bool reads_paused_ = false;  // guarded by mu_
  int reading_ = 0;            // guarded by mu_
};

}  // namespace taskgrid::testing
