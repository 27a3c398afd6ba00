// ClaimBoard: the state of pull mode. The PENDING tasks a pull worker may
// claim, by queue in the order a Claim takes them (ReadyKey), and the
// live claims: how many each queue has, and when each ends.
//
// A claim is the task's live attempt, held by a worker (its owner)
// instead of an agent; the Scheduler makes and ends it (Claim,
// ExtendClaim, CompleteClaim, AbandonClaim, TrashClaim, a claim that ran
// out) through the one door, and tells the board each time (Claimed,
// Extended, Released). The board decides nothing about a task.
//
// Owns: the claimable index by queue, the claim counts by queue, the
// claim ends (wall time since the Unix epoch, as stored, so a restart
// arms a claim where it was).
// Invariants (CheckInvariants, against the tasks the Scheduler counts):
//   - the index holds exactly the PENDING tasks that are claimable (not
//     pinned to agent ids, not replicas), each under its queue, and no
//     queue with none;
//   - each queue's claim count is its RUNNING claimed tasks, and each of
//     them, only they, has a claim end.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "google/protobuf/map.h"
#include "scheduler/core/deadline_table.h"
#include "scheduler/core/model.h"
#include "scheduler/core/ready_key.h"

namespace taskgrid::core {

class ClaimBoard {
 public:
  using Labels = google::protobuf::Map<std::string, std::string>;

  ClaimBoard() = default;
  ClaimBoard(const ClaimBoard&) = delete;
  ClaimBoard& operator=(const ClaimBoard&) = delete;

  // The most ready tasks one Claim (or count) looks at: a worker whose
  // labels match none of a long queue's first tasks costs a bounded walk,
  // and may miss a matching task further back (the queue's own order,
  // priority then submit order, decides which tasks are looked at).
  static constexpr int kMaxScan = 10'000;

  // Whether a PENDING task is on the board at all: not pinned to agent
  // ids (meant for those agents alone), not a replica (each on an agent
  // of its own).
  static bool OnBoard(const TaskRecord& t) {
    return t.spec.placement().agent_ids().empty() && t.spec.replica_of().empty();
  }
  // Whether a worker with `labels` may claim a task placed so.
  static bool Claimable(const v1::Placement& p, const Labels& labels);
  // The first label `p` requires that `labels` lack (or carry another
  // value of), or nullptr.
  static const Labels::value_type* MissingLabel(const v1::Placement& p, const Labels& labels);

  // --- The claimable index. `t` became PENDING, or stops being. ---
  void AddReady(const TaskRecord& t);
  void RemoveReady(const TaskRecord& t);
  // Up to `max` of the queue's ready tasks a worker with `labels` may
  // claim, best first, of the first kMaxScan.
  std::vector<TaskRecord*> Pick(const std::string& queue, int max, const Labels& labels) const;
  // How many Pick would find with no `max`.
  int64_t Count(const std::string& queue, const Labels& labels) const;
  bool Indexed(const TaskRecord& t) const;

  // --- Live claims. ---
  // `t` is claimed (or, at start-up, was) until `until`.
  void Claimed(const TaskRecord& t, absl::Time until);
  void Extended(const TaskRecord& t, absl::Time until);
  // `t`'s claim ended.
  void Released(const TaskRecord& t);
  // The claims whose end passed by `now`, taken off the timer.
  std::vector<std::string> Expired(absl::Time now);
  bool HasEnd(const std::string& id) const { return ends_.Contains(id); }
  // Live claims of the queue (QueueStats.claimed).
  int64_t ClaimedIn(const std::string& queue) const;

  // "" when the board holds what `claimable` (PENDING tasks on the board)
  // and `claimed` (RUNNING claimed tasks by queue) say; else what is wrong.
  std::string CheckInvariants(size_t claimable,
                              const absl::flat_hash_map<std::string, int64_t>& claimed) const;

 private:
  // Hands `take` each task of the queue's first kMaxScan that a worker
  // with `labels` may claim, best first, until it returns false.
  template <typename F>
  void Walk(const std::string& queue, const Labels& labels, F&& take) const;

  // PENDING tasks on the board, by queue; a queue without any is erased.
  absl::flat_hash_map<std::string, ReadySet> ready_;
  // Live claims by queue (no entry for none).
  absl::flat_hash_map<std::string, int64_t> claimed_;
  DeadlineTable ends_;
};

}  // namespace taskgrid::core
