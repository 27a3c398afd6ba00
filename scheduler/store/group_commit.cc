#include "scheduler/store/group_commit.h"

#include <utility>
#include <vector>

namespace taskgrid::store {

namespace {
// The writer of the innermost CallerCommit on this thread, if any.
thread_local GroupCommitWriter* tl_scope = nullptr;
// Set when a Submit on this thread made it the committer of that writer.
thread_local GroupCommitWriter* tl_committer = nullptr;
}  // namespace

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
      if (caller_commits_) return;  // that caller's commit takes it, or hands it on
      if (opts_.caller_commits && writer_idle_ && tl_scope == this && queue_.size() == 1) {
        // Nothing else to commit: this thread commits it at its scope's end.
        caller_commits_ = true;
        tl_committer = this;
        return;
      }
      // A busy writer takes the queue when its commit ends: no wakeup.
      if (writer_idle_) cv_.notify_one();
      return;
    }
  }
  done(refuse);
}

GroupCommitWriter::CallerCommit::CallerCommit(GroupCommitWriter* writer)
    : writer_(writer), outer_(tl_scope) {
  tl_scope = writer;
}

GroupCommitWriter::CallerCommit::~CallerCommit() {
  tl_scope = outer_;
  if (tl_committer == writer_) {
    tl_committer = nullptr;
    writer_->CommitAsCaller();
  }
}

void GroupCommitWriter::CommitAsCaller() {
  std::vector<Item> items;
  absl::Status broken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TakeLocked(&items);
    broken = broken_;
  }
  CommitAndAnswer(&items, std::move(broken));
  std::lock_guard<std::mutex> lock(mu_);
  caller_commits_ = false;
  // What other callers queued meanwhile (or a Stop) is the writer's again.
  if (writer_idle_ && (stopping_ || !queue_.empty())) cv_.notify_one();
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

bool GroupCommitWriter::idle() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!writer_idle_ || !queue_.empty() || caller_commits_) return false;
  }
  std::lock_guard<std::mutex> lock(deliver_mu_);
  return deliverer_idle_ && committed_.empty();
}

int64_t GroupCommitWriter::commits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.commits;
}

GroupCommitWriter::Stats GroupCommitWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GroupCommitWriter::TakeLocked(std::vector<Item>* items) {
  size_t rows = 0;
  while (!queue_.empty() &&
         (items->empty() || rows + queue_.front().batch.size() <= opts_.max_rows_per_commit)) {
    rows += queue_.front().batch.size();
    items->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

void GroupCommitWriter::Run() {
  std::vector<Item> items;
  for (;;) {
    absl::Status broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      writer_idle_ = true;
      cv_.wait(lock, [this] { return !caller_commits_ && (stopping_ || !queue_.empty()); });
      writer_idle_ = false;
      if (queue_.empty()) return;  // stopping, and everything is handed over
      TakeLocked(&items);
      broken = broken_;
    }
    CommitAndAnswer(&items, std::move(broken));
  }
}

void GroupCommitWriter::CommitAndAnswer(std::vector<Item>* items, absl::Status broken) {
  absl::Status status = std::move(broken);
  // Freed when this returns: after the callers are answered, not on the
  // delivery thread.
  core::WriteBatch merged;
  if (status.ok()) {
    for (Item& it : *items) merged.Append(std::move(it.batch));
    const absl::Duration begin = opts_.clock->Monotonic();
    if (!merged.empty()) status = store_->Apply(merged);
    const absl::Duration took = opts_.clock->Monotonic() - begin;
    {
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
      c.done.reserve(items->size());
      for (Item& it : *items) c.done.push_back(std::move(it.done));
      c.status = status;
      committed_.push_back(std::move(c));
      if (deliverer_idle_) deliver_cv_.notify_one();
    }
  }
  if (inline_done) {
    for (Item& it : *items) it.done(status);
  }
  items->clear();
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
