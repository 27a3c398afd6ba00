// ReadyQueues: placement's state. The PENDING tasks by placement class,
// where each class waits, the order Dispatch takes the classes in (by
// their best task, or by queue while queues share by weight), and what
// each queue's attempts on agents hold (for fair share and quotas).
//
// It runs Dispatch's loop: it picks the next head, asks its host (the
// Scheduler) whether the queue may start a task, finds the agent, and has
// the host start the task there; the host's transition takes the task out
// of the ready queues again (Remove). It changes no task and sends no
// message itself.
//
// Owns: the ready classes and their interned names, the heads (and the
// same by queue), the parked, held and over-quota sets, the agents that
// got room back since the last Dispatch, the capacity cache, and the
// slots and resources held by queue.
// Invariants (CheckInvariants, against what the Scheduler counts):
//   - the classes hold exactly the PENDING tasks, none empty;
//   - each class is in exactly the set its `where` names (heads by its
//     first task, parked, held or over quota under its queue), and none
//     is left aside after a Dispatch;
//   - the heads by queue are kept exactly while queues share by weight;
//   - a settled class has no room on an agent that did not get room back;
//   - the capacity kept is the agents' while the agents did not change;
//   - the slots and resources held by queue are those of the attempts on
//     agents.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "scheduler/core/agent_registry.h"
#include "scheduler/core/model.h"
#include "scheduler/core/placement.h"
#include "scheduler/core/queue_controls.h"
#include "scheduler/core/ready_key.h"

namespace taskgrid::core {

// The PENDING tasks of one placement class (one placement, as
// PlacementClass spells it), erased when the last one leaves.
struct ReadyClass {
  std::string key;
  v1::Placement placement;
  Resources need;  // NeedOf(placement)
  ReadySet tasks;
  // kHeads: its head is in the heads, Dispatch looks at it. kAside: no
  // agent has room for it in this Dispatch (back in the heads when it
  // ends). kParked: no connected agent could take it; parked until one
  // that can connects. kHeld: its queue may not start a task now (paused,
  // at its concurrency or rate limit); held until it may. kOverQuota: its
  // head's start would pass its queue's quota; it waits until the queue's
  // tasks give some back or the quota changes.
  enum class Where { kHeads, kAside, kParked, kHeld, kOverQuota } where = Where::kHeads;
  std::string queue;
  // A class of replicas: the id of their task (whose other replicas'
  // agents it may not take).
  std::string replica_of;
  // Dispatch found no room for it on any agent, and since then only the
  // agents that grew got room back (or joined): the next Dispatch looks
  // for it there alone. Never for gangs and replicas (their room depends
  // on their siblings too).
  bool settled = false;
};

class ReadyQueues {
 public:
  // What Dispatch asks of the Scheduler.
  class Host {
   public:
    virtual ~Host() = default;
    // Whether a task of `queue` may start now.
    virtual QueueControls::Gate GateOf(const std::string& queue) const = 0;
    // Agents a replica of `group` may not take: those holding another of
    // its replicas, and those one succeeded on.
    virtual absl::flat_hash_set<std::string> ReplicaAgents(const TaskRecord& group) const = 0;
    // Dispatch came to a class of a gang's (`group`): all of it starts on
    // `agents` (those with a free slot), or its classes leave the heads
    // (MoveClassesOf, with `aside`).
    virtual void DispatchGang(TaskRecord& group, const std::vector<AgentRecord*>& agents,
                              std::vector<std::string>* aside) = 0;
    // Starts PENDING `t` on `a`, which has room for it. `need` is its
    // class's: it goes when `t`'s transition empties the class.
    virtual void StartOn(TaskRecord& t, const Resources& need, AgentRecord& a) = 0;
  };

  // What the agents that take work offer: slots, and each resource.
  struct Capacity {
    int64_t slots = 0;
    Resources resources;
  };

  ReadyQueues(const QueueControls* controls, AgentRegistry* agents)
      : controls_(controls), agents_(agents) {}
  ReadyQueues(const ReadyQueues&) = delete;
  ReadyQueues& operator=(const ReadyQueues&) = delete;

  // Sets t.class_name to TaskClass(t.spec), interned: the records share
  // the string. Names no record holds any more are swept each time the
  // table of names has doubled.
  void SetClass(TaskRecord& t);
  // A task becomes PENDING, or stops being.
  void Add(TaskRecord& t);
  void Remove(const TaskRecord& t);
  // PENDING `t` is in its class (for the invariant checker).
  bool Holds(const TaskRecord& t) const;

  // Hands heads to agents while any has room, through `host`.
  void Dispatch(Host& host);
  // Dispatch would look at nothing: no class is in the heads, or none
  // would find room now (no agent got room back, none changed, no class
  // came). Called on every tick, so it costs nothing.
  bool Idle() const;

  // --- What makes Dispatch look again. ---
  // `a` has more room than before (it connected or was undrained, an
  // attempt ended there, a gang's reservation went): Dispatch looks there
  // for the settled classes.
  void Grew(const AgentRecord& a) { grown_.insert(a.id); }
  // A queue's controls changed: a class in the heads may be closed now.
  void LookAgain() { look_again_ = true; }
  // `a` takes work now (it connected, or was undrained): the parked
  // classes it matches go back to the heads.
  void UnparkFor(const AgentRecord& a);
  // A replica of `group` stopped holding an agent (or a member of its
  // gang changed): its parked classes go back to the heads.
  void UnparkClassesOf(const TaskRecord& group);
  // The classes of `group`'s PENDING replicas that are in the heads go
  // `where` (kAside: appended to `aside`, which Dispatch puts back at its
  // end). For a gang that does not start as a whole.
  void MoveClassesOf(const TaskRecord& group, ReadyClass::Where where,
                     std::vector<std::string>* aside);

  // --- Queue controls. ---
  // The queue may start tasks again (or may have): its held classes go
  // back to the heads, to be looked at by the next Dispatch.
  void ReleaseHeld(const std::string& queue);
  // Held queues whose gate (`gate_of`) opened meanwhile (a rate's token came).
  void ReleaseOpened(absl::FunctionRef<QueueControls::Gate(const std::string&)> gate_of);
  void ReleaseOverQuota(const std::string& queue);
  // Some class waits held by its queue.
  bool any_held() const { return !held_.empty(); }
  // Some class of `queue` waits held or over its quota.
  bool QueueHeld(const std::string& queue) const {
    return held_.contains(queue) || over_quota_.contains(queue);
  }
  // Fills or drops the heads by queue as queue weights start or stop.
  void IndexHeadsByQueue();

  // --- What the queues hold. ---
  // An attempt of `queue` on `a` starts or stops holding `slots` and
  // `need` (its agent's and its queue's held amounts); giving back lets
  // the queue's classes over its quota be looked at again.
  void TakeResources(AgentRecord& a, const std::string& queue, int32_t slots,
                     const Resources& need);
  void GiveBackResources(AgentRecord& a, const std::string& queue, int32_t slots,
                         const Resources& need);
  // What `queue`'s attempts on agents hold: nullptr for nothing.
  const Resources* HeldBy(const std::string& queue) const;
  bool HoldsSlots(const std::string& queue) const { return slots_by_queue_.contains(queue); }
  // Whether `need` fits under the quota of `queue` beside what its tasks
  // hold; and if not, why ("queue q is at its quota of gpu=4 ...", empty
  // when it fits).
  bool WithinQuota(const std::string& queue, const Resources& need) const;
  std::string QuotaReason(const std::string& queue, const Resources& need) const;
  // The largest fraction of `cap` that `queue`'s attempts hold, over slots
  // and every resource (its dominant share).
  double DominantShare(const std::string& queue, const Capacity& cap) const;
  Capacity CapacityNow() const;

  // Whether any connected agent that takes work could ever run `p` (free
  // slots aside), `exclude` aside.
  bool AnyAgentCouldTake(const v1::Placement& p,
                         const absl::flat_hash_set<std::string>* exclude = nullptr) const;

  // --- Introspection. ---
  size_t classes() const { return ready_.size(); }
  size_t class_names() const { return class_names_.size(); }
  size_t parked() const { return parked_.size(); }
  int64_t placement_attempts() const { return placement_attempts_; }
  int64_t agents_examined() const { return agents_examined_; }
  // "" or what is broken. `pending`: the PENDING tasks; `held_by_queue`,
  // `slots_by_queue`: what the attempts on agents hold, counted from the
  // agents; `waits_rightly`: the Scheduler's own check of a parked or
  // over-quota class (whether its gang or its replicas could be placed).
  std::string CheckInvariants(
      size_t pending, const absl::flat_hash_map<std::string, Resources>& held_by_queue,
      const absl::flat_hash_map<std::string, int64_t>& slots_by_queue,
      absl::FunctionRef<std::string(const ReadyClass&)> waits_rightly) const;

 private:
  // A class in the heads, by its first task.
  using Head = std::pair<ReadyKey, ReadyClass*>;
  // Classes waiting by queue (held, or over quota).
  using ClassesByQueue = absl::flat_hash_map<std::string, absl::flat_hash_set<ReadyClass*>>;

  // A parked, held or set-aside class that Dispatch looks at again.
  void BackToHeads(ReadyClass& c);
  void InsertHead(const Head& h);
  void EraseHead(const Head& h);
  // Dispatch found the queue closed, or the class's head over its quota.
  void Hold(ReadyClass& c);
  void OverQuota(ReadyClass& c);
  // The queue's classes in `by_queue` go back to the heads.
  void ReleaseAll(ClassesByQueue* by_queue, const std::string& queue);
  // `c` leaves `by_queue` (its queue's entry goes with its last class).
  static void Unlist(ClassesByQueue* by_queue, ReadyClass* c);
  // CapacityNow(), computed again only after the agents changed.
  const Capacity& CapacityCached();
  // While queues share by weight: the head Dispatch takes next, the best
  // of the queue with the least dominant share per weight (queues of
  // weight 0 only when no other has a head).
  absl::btree_set<Head>::iterator FairHead(const Capacity& cap);

  const QueueControls* const controls_;
  // Read here; the agents Dispatch picks are handed to the host to change.
  AgentRegistry* const agents_;

  // PENDING tasks by placement class; heads_ orders the classes Dispatch
  // looks at by their first task, so each pick is O(log classes) and
  // classes no agent can take cost nothing until one connects.
  absl::flat_hash_map<std::string, std::unique_ptr<ReadyClass>> ready_;
  // Every placement class a record holds, by name (SetClass). Entries
  // whose records are all gone are swept when the map has doubled since
  // the last sweep.
  absl::flat_hash_map<std::string, std::weak_ptr<const std::string>> class_names_;
  size_t class_names_swept_ = 0;  // its size after the last sweep
  absl::btree_set<Head> heads_;
  // The same heads by queue, kept only while queues share by weight
  // (heads_by_queue_on_): Dispatch then takes the best head of the queue
  // furthest below its share. Changed only with heads_ (InsertHead,
  // EraseHead); filled or dropped when weighting starts or stops.
  absl::flat_hash_map<std::string, absl::btree_set<Head>> heads_by_queue_;
  bool heads_by_queue_on_ = false;
  absl::flat_hash_set<ReadyClass*> parked_;
  // What lets a Dispatch skip the agents where nothing changed (O(agents)
  // per placement at 10,000 agents otherwise): the agents that got room
  // back or connected since the last Dispatch, by id; whether a class that
  // is not settled came into the heads (or a queue's controls changed)
  // since; and agents_->changes() at that Dispatch (when it moved on, an
  // agent may have gone: a settled class with no room is checked for an
  // agent that could take it at all).
  absl::flat_hash_set<std::string> grown_;
  bool look_again_ = true;
  uint64_t dispatched_at_changes_ = ~uint64_t{0};
  Capacity capacity_;
  uint64_t capacity_at_changes_ = ~uint64_t{0};
  // Classes whose queue may not start tasks now, by queue.
  ClassesByQueue held_;
  // Classes waiting for room under their queue's quota, by queue.
  ClassesByQueue over_quota_;
  // What each queue's attempts on agents hold (the attempts holding slots;
  // no entry for a queue holding nothing). Changed with AgentRecord::held.
  absl::flat_hash_map<std::string, Resources> held_by_queue_;
  // Slots the same attempts hold, by queue (no entry for none).
  absl::flat_hash_map<std::string, int64_t> slots_by_queue_;
  // Times Dispatch has looked for an agent for the head of a class, and
  // the agents those looks were given.
  int64_t placement_attempts_ = 0;
  int64_t agents_examined_ = 0;
};

}  // namespace taskgrid::core
