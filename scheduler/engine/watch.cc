#include "scheduler/engine/watch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/proto_time.h"

namespace taskgrid::engine {

namespace {
constexpr char kResumeAfterPayload[] = "taskgrid.dev/resume-after";
}  // namespace

absl::Status WithResumeAfter(absl::Status status, int64_t after_revision) {
  status.SetPayload(kResumeAfterPayload, absl::Cord(absl::StrCat(after_revision)));
  return status;
}

std::optional<int64_t> ResumeAfterOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kResumeAfterPayload);  // absl::optional
  int64_t revision = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &revision)) {
    return std::nullopt;
  }
  return revision;
}

namespace {
constexpr int kReplayChunk = 512;
}  // namespace

Watch::Watch(const v1::WatchTasksRequest& filter, int64_t after_revision, store::Store* store,
             size_t max_queue, std::function<void()> wake, int64_t must_replay_through)
    : queue_(filter.queue()),
      job_id_(filter.job_id()),
      task_ids_(filter.task_ids().begin(), filter.task_ids().end()),
      states_(filter.states().begin(), filter.states().end()),
      store_(store),
      max_queue_(max_queue),
      wake_(std::move(wake)),
      starts_after_(after_revision),
      cursor_(after_revision),
      offered_(must_replay_through),
      sent_(after_revision) {}

bool Watch::Matches(const v1::TaskEvent& e) const {
  return (queue_.empty() || e.queue() == queue_) && (job_id_.empty() || e.job_id() == job_id_) &&
         (task_ids_.empty() || task_ids_.contains(e.task_id())) &&
         (states_.empty() || states_.contains(e.to_state()));
}

v1::TaskEvent Watch::ToEvent(const store::StoredEvent& se) {
  v1::TaskEvent e;
  e.set_revision(se.revision);
  e.set_task_id(se.event.task_id);
  e.set_queue(se.event.queue);
  e.set_from_state(static_cast<v1::TaskState>(se.event.from_state));
  e.set_to_state(static_cast<v1::TaskState>(se.event.to_state));
  e.set_attempt(se.event.attempt);
  e.set_agent_id(se.event.agent_id);
  SetTimestamp(FromUnixMicrosOrZero(se.event.time_us), e.mutable_time());
  e.set_reason(se.event.reason);
  e.set_job_id(se.event.job_id);
  return e;
}

void Watch::Offer(const std::vector<v1::TaskEvent>& events, int64_t through) {
  if (through <= 0) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !failed_.ok()) return;
    ++offers_;
    offered_ = std::max(offered_, through);
    if (replaying_) {
      // Already in the store: the replay reads them. Wake a replay that
      // waits for a commit to land.
      if (idle_) {
        idle_ = false;
        wake = true;
      }
    } else {
      for (const v1::TaskEvent& e : events) {
        if (e.revision() <= cursor_) continue;
        cursor_ = e.revision();
        if (!Matches(e)) continue;
        if (queue_events_.size() >= max_queue_) {
          failed_ = WithResumeAfter(absl::ResourceExhaustedError(absl::StrCat(
                                        "this watcher fell more than ", max_queue_,
                                        " events behind; resume with after_revision=", sent_)),
                                    sent_);
          queue_events_.clear();
          break;
        }
        queue_events_.push_back(e);
      }
    }
    if (idle_ && (!queue_events_.empty() || !failed_.ok())) {
      idle_ = false;
      wake = true;
    }
  }
  if (wake) wake_();
}

absl::StatusOr<std::vector<v1::TaskEvent>> Watch::Next(size_t max) {
  std::vector<v1::TaskEvent> out;
  for (;;) {
    int64_t from;
    uint64_t offers_before;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      if (!replaying_) {
        while (!queue_events_.empty() && out.size() < max) {
          out.push_back(std::move(queue_events_.front()));
          queue_events_.pop_front();
        }
        idle_ = out.empty();
        return out;
      }
      from = cursor_;
      offers_before = offers_;
    }
    // Replay: everything committed is in the store (Offer comes after the
    // commit), so read on from the cursor. No lock is held: offers that
    // come meanwhile only raise offered_, and the loop reads on to it.
    auto chunk = store_->ReadEvents(from, kReplayChunk);
    if (!chunk.ok()) return chunk.status();
    // Revisions are dense (one event each), so a gap means pruned history.
    // From 0 (all the kept history) the first read may start anywhere.
    int64_t oldest_kept = 0;
    if (!chunk->empty()) {
      if (from > 0 && chunk->front().revision != from + 1) oldest_kept = chunk->front().revision;
    } else {
      auto span = store_->GetEventSpan();
      if (!span.ok()) return span.status();
      if (span->newest_pruned > from) {
        if (from == 0) {
          // Nothing kept yet: all the history kept is what comes next.
          std::lock_guard<std::mutex> lock(mu_);
          cursor_ = std::max(cursor_, span->newest_pruned);
          continue;
        }
        oldest_kept = span->oldest > 0 ? span->oldest : span->newest + 1;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (oldest_kept > 0) {
      failed_ = WithResumeAfter(
          absl::OutOfRangeError(absl::StrCat(
              "the history after revision ", from,
              " was pruned (--event_retention) while this watch replayed it; the oldest "
              "revision still kept is ",
              oldest_kept, ": resume with after_revision=", oldest_kept - 1,
              " (skipping what was lost) or watch from now")),
          oldest_kept - 1);
      queue_events_.clear();
      if (out.empty()) return failed_;
      return out;
    }
    if (chunk->empty() && cursor_ < offered_ && out.empty()) {
      // An Offer that came while we read (it did not wake us: we were not
      // idle) says its commit has landed: read again.
      if (offers_ != offers_before) continue;
      // The commit through offered_ has not landed yet: its Offer wakes us.
      idle_ = true;
      return out;
    }
    for (const store::StoredEvent& se : *chunk) {
      cursor_ = se.revision;
      v1::TaskEvent e = ToEvent(se);
      if (Matches(e)) out.push_back(std::move(e));
    }
    if (chunk->size() < static_cast<size_t>(kReplayChunk) && cursor_ >= offered_) {
      // Caught up with every offer so far: from now on offers are queued.
      replaying_ = false;
    }
    if (!out.empty() || !replaying_) {
      if (out.empty()) continue;  // go live and look at the queue
      return out;
    }
  }
}

void Watch::Sent(int64_t revision) {
  std::lock_guard<std::mutex> lock(mu_);
  sent_ = std::max(sent_, revision);
}

void Watch::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  queue_events_.clear();
}

}  // namespace taskgrid::engine
