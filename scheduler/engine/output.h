// OutputRelay: live output from the agents that run attempts to the
// StreamTaskOutput streams that follow them. None of it is task state and
// none of it is stored: it is best effort, bounded, and never blocks the
// Engine.
//
// Per followed task a feed: its followers, the attempt whose output flows,
// the agent stream asked for it (WatchOutput), and a backlog of the newest
// chunks received (at most backlog_bytes) that each follower reads from a
// cursor of its own. The first follower of a running attempt makes the
// relay ask its agent; the last one leaving, while the attempt runs, makes
// it tell the agent to stop (an attempt that ends stops its agent by
// itself). A follower the backlog outruns skips ahead to the oldest chunk
// kept; the offsets it is sent show what it missed.
//
// When a followed attempt ends, each follower is sent the chunks of it not
// read yet, then whatever the attempt's stored tails (TaskResult) hold past
// what it was sent, so nothing the result kept is missed (an agent that
// sends no live output is followed by its tails alone), then
// ATTEMPT_ENDED. Stored tails wait in the follower's queue; past
// max_pending_bytes unread, the stream ends RESOURCE_EXHAUSTED (a slow
// reader of a task that ends and retries fast). A follower ends with END
// once the task is finished (or, without follow, once it has what there
// was: a finished task's tails, the agent's answer to the watch).
//
// The Engine orders it: Attach() and Update() come in commit order (from
// commit callbacks) with the task as the Scheduler had it at that point,
// and return the WatchOutput messages to send. Offer() comes from agent
// streams, fenced by the Scheduler first; Next() and Remove() from the
// follower's stream.
//
// Thread-safe: one mutex. The wake functions are called without it held,
// on the thread that brought what wakes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "scheduler/core/scheduler.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/task_service.pb.h"

namespace taskgrid::engine {

// A followed task as the Scheduler has it at one point of the commit
// order (taken under the Engine's mutex).
struct OutputTaskState {
  std::string task_id;
  v1::TaskState state = v1::TASK_STATE_UNSPECIFIED;
  int32_t attempt = 0;   // the live attempt, or the last one
  bool started = false;  // the live attempt runs (its agent accepted it, or it is claimed)
  std::string holder;    // of the live attempt: its agent or claim owner
  // The stream to ask for the live attempt's output; 0 when there is none
  // (not started, a claim, an agent without live output or disconnected),
  // and then `no_live` says why.
  uint64_t conn = 0;
  std::string no_live;
  // Attempts ended since the last state (Update), or a finished task's
  // last one (Attach), with their stored results; oldest first.
  std::vector<v1::Attempt> ended;
};

class OutputRelay;

// One StreamTaskOutput stream. Opaque: its state is the relay's, guarded
// by the relay's mutex.
class OutputFollower {
 public:
  const std::string& task_id() const { return task_id_; }

 private:
  friend class OutputRelay;
  enum class Phase {
    kPending,  // admitted, not attached yet
    kWaiting,  // no attempt to follow: waits for one after attempt_
    kOn,       // follows attempt_
    kEnding,   // what is queued is the last of it
    kDone,     // everything was taken
  };
  OutputFollower(std::string task_id, bool follow, v1::OutputStream only,
                 std::function<void()> wake)
      : task_id_(std::move(task_id)), follow_(follow), only_(only), wake_(std::move(wake)) {}

  const std::string task_id_;
  const bool follow_;
  const v1::OutputStream only_;  // UNSPECIFIED: both
  const std::function<void()> wake_;
  Phase phase_ = Phase::kPending;
  v1::TaskState state_ = v1::TASK_STATE_UNSPECIFIED;  // as last known
  int32_t attempt_ = 0;
  int64_t sent_[2] = {0, 0};  // offsets of attempt_'s streams queued through
  uint64_t cursor_ = 0;       // the next backlog chunk to read
  std::deque<v1::StreamTaskOutputResponse> pending_;
  size_t pending_bytes_ = 0;
  bool idle_ = false;  // its stream waits for a wake
  bool removed_ = false;
  absl::Status failed_;
};

class OutputRelay {
 public:
  struct Options {
    // StreamTaskOutput streams open at once (--max_output_follows).
    size_t max_followers = 1000;
    // Newest chunks kept per followed task, for its followers to read.
    size_t backlog_bytes = 128 << 10;
    // Stored tails a follower may leave unread before it is ended (the
    // Engine raises it to 4 x the scheduler's max_output_bytes).
    size_t max_pending_bytes = 1 << 20;
  };
  explicit OutputRelay(Options opts) : opts_(opts) {}

  // A new follower, sent nothing until Attach. RESOURCE_EXHAUSTED past
  // max_followers.
  absl::StatusOr<std::shared_ptr<OutputFollower>> Admit(const v1::StreamTaskOutputRequest& req,
                                                        std::function<void()> wake);
  // The follower starts from the task as `s` has it.
  std::vector<core::Outgoing> Attach(const std::shared_ptr<OutputFollower>& f,
                                     const OutputTaskState& s);
  // The task of `s` changed (an attempt started or ended, it finished, its
  // agent's stream changed).
  std::vector<core::Outgoing> Update(const OutputTaskState& s);
  // Output of an attempt from the agent stream `conn`, fenced by the
  // Scheduler. Kept only when its task's feed follows that attempt on
  // that stream; a malformed one (no stream, a negative offset) is
  // dropped.
  void Offer(uint64_t conn, const v1::TaskOutput& out);
  // Ends the follower with `why` (its commit failed, the server stops).
  void Fail(const std::shared_ptr<OutputFollower>& f, const absl::Status& why);
  void FailAll(const absl::Status& why);

  struct Batch {
    std::vector<v1::StreamTaskOutputResponse> msgs;
    bool done = false;  // after these the stream ends OK
  };
  // What the follower is to send next, about `max_bytes` of data; empty
  // (not done): nothing now, and the follower's wake is called when there
  // is. An error ends the stream.
  absl::StatusOr<Batch> Next(const std::shared_ptr<OutputFollower>& f, size_t max_bytes);
  // The follower's stream ended.
  std::vector<core::Outgoing> Remove(const std::shared_ptr<OutputFollower>& f);

  size_t followers() const;

 private:
  struct Chunk {
    uint64_t seq = 0;
    int stream = 0;  // 0 stdout, 1 stderr
    int64_t offset = 0;
    std::string data;
  };
  struct Feed {
    int32_t attempt = 0;  // whose output flows; 0: none
    uint64_t conn = 0;    // the stream asked for it; 0: none
    bool caught_up = false;
    std::deque<Chunk> backlog;  // consecutive seqs
    size_t bytes = 0;
    uint64_t next_seq = 1;
    int64_t end[2] = {0, 0};  // offsets received through
    absl::flat_hash_set<OutputFollower*> followers;
  };
  using Wakes = std::vector<std::function<void()>>;

  // Brings `feed` to the attempt and stream of `s`; asks its agent when a
  // follower is on that attempt and it was not asked on that stream.
  void SyncFeed(Feed& feed, const OutputTaskState& s, std::vector<core::Outgoing>* out);
  // Queues output of f's attempt, past what it was sent (and of its
  // stream), in chunks of at most kMaxOutputChunkBytes.
  void Emit(OutputFollower& f, int stream, int64_t offset, const std::string& data) const;
  void Queue(OutputFollower& f, v1::StreamTaskOutputResponse msg, Wakes* wakes) const;
  // Queues the backlog's chunks f has not read (of its attempt).
  void TakeBacklog(OutputFollower& f, const Feed& feed) const;
  // f's attempt ended: its unread chunks, its stored tails, ATTEMPT_ENDED.
  void EndAttempt(OutputFollower& f, Feed& feed, const OutputTaskState& s, Wakes* wakes) const;
  // f follows `attempt` from now on: ATTEMPT_STARTED.
  void Started(OutputFollower& f, int32_t attempt, const std::string& holder,
               const std::string& note, Wakes* wakes) const;
  void Started(OutputFollower& f, const OutputTaskState& s, Wakes* wakes) const;
  // A waiting f is told of the attempts in s.ended it never saw, which
  // started and ended between two states: each one's tails.
  void CatchUp(OutputFollower& f, const OutputTaskState& s, Wakes* wakes) const;
  // Queues END and leaves f's feed (`feed` may be null).
  void End(OutputFollower& f, Feed* feed, const std::string& note, Wakes* wakes) const;
  void FailLocked(OutputFollower& f, const absl::Status& why, Wakes* wakes);
  // Drops `feed` once no follower is left; tells its agent to stop.
  void DropIfUnfollowed(const std::string& task_id, std::vector<core::Outgoing>* out);
  static void Wake(OutputFollower& f, Wakes* wakes);

  const Options opts_;
  mutable std::mutex mu_;
  // Guarded by mu_: every follower admitted and not removed (which keeps
  // it alive for the feeds' raw pointers), and the feeds by task id.
  absl::flat_hash_map<OutputFollower*, std::shared_ptr<OutputFollower>> all_;
  absl::flat_hash_map<std::string, Feed> feeds_;
};

}  // namespace taskgrid::engine
