#include "scheduler/store/group_commit.h"

#include <utility>
#include <vector>

namespace taskgrid::store {

GroupCommitWriter::GroupCommitWriter(Store* store, Options opts)
    : store_(store), opts_(opts), deliverer_([this] { Deliver(); }), thread_([this] { Run(); }) {}

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
      // A busy writer takes the queue when its commit ends: no wakeup.
      if (writer_idle_) cv_.notify_one();
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
  {
    std::lock_guard<std::mutex> lock(deliver_mu_);
    deliver_stop_ = true;
    deliver_cv_.notify_one();
  }
  if (deliverer_.joinable()) deliverer_.join();
}

int64_t GroupCommitWriter::commits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.commits;
}

GroupCommitWriter::Stats GroupCommitWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GroupCommitWriter::Run() {
  std::vector<Item> items;
  core::WriteBatch merged;
  for (;;) {
    absl::Status broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      writer_idle_ = true;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      writer_idle_ = false;
      if (queue_.empty()) return;  // stopping, and everything is handed over
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
      const absl::Duration begin = opts_.clock->Monotonic();
      if (!merged.empty()) status = store_->Apply(merged);
      const absl::Duration took = opts_.clock->Monotonic() - begin;
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok()) {
        broken_ = absl::UnavailableError(
            std::string("the task store failed a commit; the scheduler must restart: ") +
            std::string(status.message()));
        status = broken_;
      } else {
        ++stats_.commits;
        if (!merged.empty()) {  // barriers alone make no transaction
          stats_.commit_seconds.Observe(absl::ToDoubleSeconds(took));
          stats_.commit_rows.Observe(static_cast<double>(merged.size()));
        }
      }
    }
    bool more_queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      more_queued = !queue_.empty();
    }
    bool inline_done = false;
    {
      std::lock_guard<std::mutex> lock(deliver_mu_);
      // With nothing left to commit and nothing waiting to be delivered, a
      // hand-off would only add a thread wakeup to the caller's latency
      // (one submit at a time, W1 and W3): answer here, still in order.
      inline_done = !more_queued && deliverer_idle_ && committed_.empty();
      if (!inline_done) {
        Committed c;
        c.done.reserve(items.size());
        for (Item& it : items) c.done.push_back(std::move(it.done));
        c.status = status;
        committed_.push_back(std::move(c));
        if (deliverer_idle_) deliver_cv_.notify_one();
      }
    }
    if (inline_done) {
      for (Item& it : items) it.done(status);
    }
    items.clear();
    // Freed here, not on the delivery thread, and while no commit waits.
    merged = core::WriteBatch{};
  }
}

void GroupCommitWriter::Deliver() {
  std::deque<Committed> ready;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(deliver_mu_);
      deliverer_idle_ = true;
      deliver_cv_.wait(lock, [this] { return deliver_stop_ || !committed_.empty(); });
      deliverer_idle_ = false;
      if (committed_.empty()) return;  // stopped after the writer: nothing left
      ready.swap(committed_);
    }
    for (Committed& c : ready) {
      for (Done& done : c.done) done(c.status);
    }
    ready.clear();
  }
}

}  // namespace taskgrid::store
