// Placement policy: which agent runs a task. Pure and narrow so that other
// policies can replace it; the Scheduler owns the agents and the queues.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "common/resources.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::core {

struct AgentRecord {
  std::string id;
  uint64_t conn = 0;  // the live stream; 0 while disconnected
  // Disconnected past its grace: its tasks have moved; kept to be listed.
  bool lost = false;
  bool draining = false;  // takes no new work
  // Said Goodbye: forgotten as soon as it holds nothing, not listed as lost.
  bool leaving = false;
  // Held attempts before a restart and has not connected since: its grace
  // is the restart grace, and its tasks move uncounted when it runs out.
  bool restored = false;
  // Restarting: what it was granted to keep its attempts through its own
  // restart (zero: nothing); once its stream ended, that is its grace and
  // its tasks move uncounted when it runs out (restarting).
  absl::Duration restart_hold = absl::ZeroDuration();
  bool restarting = false;
  bool chains = false;  // runs Assignment.run_after (Hello.chains)
  // Takes SchedulerMessage.undrain (Hello.undrain).
  bool undrains = false;
  // Drains to stop (SIGTERM; Hello.exiting, Draining.exiting): no undrain.
  bool exiting = false;
  // Takes WatchOutput and sends TaskOutput (Hello.live_output).
  bool live_output = false;
  // Answers every Cancel and lists all it holds in each Heartbeat
  // (Hello.reports_stops): a timed-out attempt waits for its word.
  bool reports_stops = false;
  // Accepted attempts (task id, attempt) the last Heartbeat left out: one
  // the next leaves out too is no longer there, and is ended.
  absl::flat_hash_set<std::pair<std::string, int32_t>> unlisted;
  std::string version;
  absl::Time connect_time = absl::InfinitePast();    // wall, for display
  absl::Time last_seen_time = absl::InfinitePast();  // wall, for display
  absl::flat_hash_map<std::string, std::string> labels;
  int32_t slots = 0;
  int32_t used = 0;  // slots held by live attempts
  // What it offers (Hello.resources) and what the attempts holding its
  // slots hold of it (their Placement.resources): free is the difference,
  // negative when it came back offering less than it still runs.
  Resources resources;
  Resources held;
  // Room a waiting gang reserved here (the id of its task): other work
  // leaves `reserved_slots` slots and `reserved` of the free amounts alone.
  std::string reserved_for;
  int32_t reserved_slots = 0;
  Resources reserved;
  absl::Duration last_seen;                // monotonic
  uint64_t last_assigned = 0;              // tie-break: least recently used first
  absl::flat_hash_set<std::string> tasks;  // ids of the live attempts it holds
  // Hello.adaptive_heartbeat: it takes the interval from each HeartbeatAck.
  bool adaptive_heartbeat = false;
  // The interval told to it last (Welcome or HeartbeatAck), and the one it
  // said it heartbeats at (Heartbeat.heartbeat_interval; from Welcome until
  // it says). Its silence is judged by the longer of the two, so an agent
  // that has not yet heard a shorter interval is not lost meanwhile.
  absl::Duration told_interval;
  absl::Duration agent_interval;
  absl::Duration judged_interval() const { return std::max(told_interval, agent_interval); }
  // Connected: when it counts as lost if silent (monotonic). Never moved
  // closer on a stream: the agent's lease may rest on an earlier heartbeat
  // judged by a longer interval.
  absl::Duration silence_deadline;

  bool connected() const { return conn != 0; }
  // Connected and not draining: may be given work.
  bool takes_work() const { return conn != 0 && !draining; }
  int32_t free_slots() const { return slots - used; }
  // Has `need` free now.
  bool HasFree(const Resources& need) const;
  // Has `slots` slots and `need` free now for a task of the gang `gang`
  // (empty: not of a gang): the room another gang reserved does not count.
  bool HasRoom(int32_t slots, const Resources& need, const std::string& gang) const;
};

// What a task's placement asks for beyond slots. Validated at submit, so a
// stored spec always parses; empty when it names nothing.
Resources NeedOf(const v1::Placement& p);

// Slots a task occupies (the spec's 0 means 1).
int32_t SlotsOf(const v1::Placement& p);

// True when `agent` carries the labels and id the placement asks for and
// offers at least its slots and resources (`need`, NeedOf(p)), regardless
// of what is free.
bool Matches(const v1::Placement& p, const Resources& need, const AgentRecord& agent);
bool Matches(const v1::Placement& p, const AgentRecord& agent);

// The connected matching agent with room for the task (free slots, and
// `need` free, past what another gang reserved there; `gang`: the task's
// gang, or empty), never one in `exclude` (the agents of a task's other
// replicas); nullptr when none has. A task that names no resources goes
// where the most slots are free (spreading the load); one that does goes
// where it fits best: the least left over of what it asks for, as a
// fraction of each agent's offer, so large requests still find room
// whole instead of fragments everywhere. Ties: the least recently
// assigned.
AgentRecord* Pick(const v1::Placement& p, const Resources& need,
                  const std::vector<AgentRecord*>& agents,
                  const absl::flat_hash_set<std::string>* exclude = nullptr,
                  const std::string& gang = std::string());

// The key grouping tasks that any given agent either can or cannot run.
std::string PlacementClass(const v1::Placement& p);
// The ready class of a task: its queue's and placement's (needs the
// queue filled in), and for a replica that of its task alone (its
// siblings exclude agents the others may take).
std::string TaskClass(const v1::TaskSpec& spec);

// Why no agent in `agents` can ever take a task with this placement right
// now (ignoring how busy they are): e.g. "no agent has label gpu=1",
// "needs gpu=4; the largest agent has gpu=2". Empty when some agent that
// takes work matches.
std::string WhyUnplaceable(const v1::Placement& p, const std::vector<const AgentRecord*>& agents);

}  // namespace taskgrid::core
