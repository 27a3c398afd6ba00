// Watch: one WatchTasks subscription. It first replays the stored history
// after a revision (read from the Store in chunks, as the client keeps up),
// then switches to live events the Engine offers after each commit.
//
// The replay checks that it has no gap: history pruned under it (between
// the watch's start and a read, or between two reads) ends the watch with
// OUT_OF_RANGE naming the oldest revision still kept, never a silent skip.
// After revision 0 means all the history still kept.
//
// Live events wait in a bounded queue; a watcher that lets it fill is ended
// (RESOURCE_EXHAUSTED, naming the revision to resume after) instead of
// slowing the scheduler: Offer() never blocks and never waits for I/O.
//
// Thread-safe. Offer() comes from the Engine's commit callbacks (in revision
// order); Next()/Sent()/Close() from the stream's reactor. The Store is
// borrowed and must outlive the Watch.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "scheduler/store/store.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::engine {

// A watch that ends early says where a client may resume: the revision to
// pass as after_revision, carried in the status itself (a payload), so no
// one parses it out of the message. The service sends it to clients as
// trailing metadata "taskgrid-resume-after".
absl::Status WithResumeAfter(absl::Status status, int64_t after_revision);
std::optional<int64_t> ResumeAfterOf(const absl::Status& status);

class Watch {
 public:
  // `wake` is called (from Offer, without locks held) when events arrive
  // for a watcher that had nothing to send; it must not block.
  // `must_replay_through`: the newest revision assigned when the watch
  // started. Its commit may still be on its way (and never be offered, if
  // it was queued before the watch existed): the watch reads the store
  // until it has it, before it takes live offers.
  Watch(const v1::WatchTasksRequest& filter, int64_t after_revision, store::Store* store,
        size_t max_queue, std::function<void()> wake, int64_t must_replay_through = 0);

  // A commit through revision `through`, with its events in revision order
  // (empty when it was queued before any watch existed: they are then read
  // from the store).
  void Offer(const std::vector<v1::TaskEvent>& events, int64_t through);
  void Offer(const std::vector<v1::TaskEvent>& events) {
    Offer(events, events.empty() ? 0 : events.back().revision());
  }

  // Up to `max` events to send next. Empty: nothing now (the next Offer
  // that brings something calls `wake`). An error ends the watch.
  absl::StatusOr<std::vector<v1::TaskEvent>> Next(size_t max);

  // The client got everything through `revision`.
  void Sent(int64_t revision);
  // No more wakes; later offers are dropped.
  void Close();

  // The revision the watch started after: the first event it sends is the
  // next one (that matches).
  int64_t starts_after() const { return starts_after_; }

  bool Matches(const v1::TaskEvent& e) const;
  static v1::TaskEvent ToEvent(const store::StoredEvent& e);

 private:
  const std::string queue_;
  const std::string job_id_;
  const absl::flat_hash_set<std::string> task_ids_;
  const absl::flat_hash_set<int> states_;
  store::Store* const store_;
  const size_t max_queue_;
  const std::function<void()> wake_;
  const int64_t starts_after_;

  std::mutex mu_;
  bool replaying_ = true;                   // guarded by mu_: reading history from the store
  int64_t cursor_;                          // guarded by mu_: every revision <= cursor_ is handled
  int64_t offered_ = 0;                     // guarded by mu_: highest revision offered
  uint64_t offers_ = 0;                     // guarded by mu_: Offer calls so far
  int64_t sent_ = 0;                        // guarded by mu_: highest revision the client got
  bool idle_ = false;                       // guarded by mu_: the reactor waits for a wake
  bool closed_ = false;                     // guarded by mu_
  absl::Status failed_;                     // guarded by mu_
  std::deque<v1::TaskEvent> queue_events_;  // guarded by mu_: live, matching
};

}  // namespace taskgrid::engine
