// The agents the scheduler knows, by id and by stream, and their liveness:
// when a connected agent counts as silent, how long a disconnected one may
// take to come back, how long a lost one is still listed. It decides
// nothing about tasks: Expire() returns what ran out, and the Scheduler
// ends streams and moves tasks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "scheduler/core/deadline_table.h"
#include "scheduler/core/options.h"
#include "scheduler/core/placement.h"

namespace taskgrid::core {

class AgentRegistry {
 public:
  explicit AgentRegistry(const SchedulerOptions* opts) : opts_(opts) {}

  // nullptr when unknown.
  AgentRecord* Find(const std::string& id);
  const AgentRecord* Find(const std::string& id) const;
  AgentRecord* ByConn(uint64_t conn);
  bool HasConn(uint64_t conn) const { return by_conn_.contains(conn); }
  // The agent with this id, made (disconnected, holding nothing) if new.
  AgentRecord& FindOrAdd(const std::string& id);

  // `a` now speaks on `conn` (a Hello). Returns the stream it had, which
  // the caller ends, or 0.
  uint64_t Bind(AgentRecord& a, uint64_t conn);
  // Its stream ended: it keeps its tasks until `grace_end` (monotonic).
  void Unbind(AgentRecord& a, absl::Duration grace_end);
  // Heard from just now (a.last_seen): it counts as silent after its
  // heartbeat timeout, but never sooner than it would have before on this
  // stream (its lease may rest on an earlier heartbeat).
  void Heard(AgentRecord& a);
  // Its tasks moved: listed as LOST until `until`, then forgotten.
  void MarkLost(AgentRecord& a, absl::Duration until);
  // Gone at once (it said Goodbye and holds nothing). Returns its stream,
  // which the caller ends, or 0.
  uint64_t Forget(const std::string& id);
  // Restore: an agent that held tasks before the restart, disconnected
  // until it comes back, by `grace_end`.
  AgentRecord& Restored(const std::string& id, absl::Duration now, absl::Duration grace_end);

  // What ran out by `now` (monotonic).
  struct Expired {
    // Connected agents silent past their heartbeat timeout: now
    // disconnected with a reconnect grace; the caller ends these streams.
    std::vector<uint64_t> silent_conns;
    // Disconnected past their grace: the caller moves their tasks and
    // marks them lost.
    std::vector<std::string> grace_over;
  };
  // Lost agents past their retention are forgotten here.
  Expired Expire(absl::Duration now);

  // The factor of heartbeat_interval that keeps the connected agents within
  // max_heartbeats_per_second (SchedulerOptions::HeartbeatFactor).
  int64_t heartbeat_factor() const { return heartbeat_factor_; }
  size_t connected() const { return by_conn_.size(); }
  size_t size() const { return agents_.size(); }
  const absl::flat_hash_map<std::string, std::unique_ptr<AgentRecord>>& all() const {
    return agents_;
  }
  // When `id`'s timer runs out (monotonic; InfiniteDuration for none):
  // connected, when it counts as silent; disconnected, when its grace ends;
  // lost, when it is forgotten.
  absl::Duration deadline(const std::string& id) const { return deadlines_.Get(id); }
  // Cross-checks of its own indexes (for Scheduler::CheckInvariants).
  bool ConnIndexAgrees(const AgentRecord& a) const;

  // Counts the changes that may change which agents take work and what
  // they offer: an agent added, bound, unbound, lost or forgotten here,
  // and whatever the Scheduler reports with Changed() (drain flags). What
  // the Scheduler derives from the whole fleet (its capacity, which
  // agents could ever take a class) is good while this stays the same.
  uint64_t changes() const { return changes_; }
  void Changed() { ++changes_; }

 private:
  void UpdateHeartbeatFactor();

  const SchedulerOptions* const opts_;
  absl::flat_hash_map<std::string, std::unique_ptr<AgentRecord>> agents_;
  absl::flat_hash_map<uint64_t, AgentRecord*> by_conn_;
  // Connected: silence; disconnected: grace; lost: forgetting.
  DeadlineTable deadlines_;
  int64_t heartbeat_factor_ = 1;
  uint64_t changes_ = 0;
};

}  // namespace taskgrid::core
