#include "scheduler/store/group_commit.h"

#include <utility>
#include <vector>

namespace taskgrid::store {

GroupCommitWriter::GroupCommitWriter(Store* store, Options opts)
    : store_(store), opts_(opts), thread_([this] { Run(); }) {}

GroupCommitWriter::~GroupCommitWriter() { Stop(); }

void GroupCommitWriter::Submit(core::WriteBatch batch, Done done) {
  absl::Status refuse;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      refuse = absl::UnavailableError("the scheduler is shutting down");
    } else if (!broken_.ok()) {
      refuse = broken_;
    } else {
      queue_.push_back({std::move(batch), std::move(done)});
      cv_.notify_one();
      return;
    }
  }
  done(refuse);
}

void GroupCommitWriter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

int64_t GroupCommitWriter::commits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return commits_;
}

void GroupCommitWriter::Run() {
  std::vector<Item> items;
  core::WriteBatch merged;
  for (;;) {
    absl::Status broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything is answered
      size_t rows = 0;
      while (!queue_.empty() &&
             (items.empty() || rows + queue_.front().batch.size() <= opts_.max_rows_per_commit)) {
        rows += queue_.front().batch.size();
        items.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      broken = broken_;
    }
    absl::Status status = broken;
    if (status.ok()) {
      for (Item& it : items) merged.Append(std::move(it.batch));
      if (!merged.empty()) status = store_->Apply(merged);
      merged = core::WriteBatch{};
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok()) {
        broken_ = absl::UnavailableError(
            std::string("the task store failed a commit; the scheduler must restart: ") +
            std::string(status.message()));
        status = broken_;
      } else {
        ++commits_;
      }
    }
    for (Item& it : items) it.done(status);
    items.clear();
  }
}

}  // namespace taskgrid::store
