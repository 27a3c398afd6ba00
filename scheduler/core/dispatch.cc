// Dispatch: the ready queues by placement class, and handing their heads
// (with the chains below them) to agents.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

namespace {

// Per agent, Assign messages of about kAssignBytes each (a chain is never
// split between two), and never more than kMaxAssignBytes.
constexpr size_t kAssignBytes = 4 << 20;
constexpr size_t kMaxAssignBytes = 32 << 20;

}  // namespace

bool Scheduler::FillAssignment(const TaskRecord& t, const TaskRecord* run_after, v1::Assignment* as,
                               int64_t* input_bytes) const {
  *input_bytes = 0;
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result().outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    *input_bytes += static_cast<int64_t>(OutputOf(*d).size());
  }
  if (*input_bytes > opts_.max_input_bytes) return false;
  as->set_task_id(t.id());
  as->set_queue(t.queue());
  *as->mutable_steps() = t.spec.steps();
  as->set_payload(t.spec.payload());
  if (t.merge) *as->mutable_merged_payloads() = t.merge->merged.payloads();
  *as->mutable_attempt_timeout() = t.spec.attempt_timeout();
  as->set_slots(SlotsOf(t.spec.placement()));
  if (run_after != nullptr) as->set_run_after(run_after->id());
  for (const TaskRecord* d : t.deps) {
    if (d == run_after || d->result().outcome() == v1::OUTCOME_UNSPECIFIED) continue;
    (*as->mutable_inputs())[d->id()] = OutputOf(*d);
  }
  return true;
}

void Scheduler::SetClass(TaskRecord& t) {
  std::string name = TaskClass(t.spec);
  if (t.class_name != nullptr && *t.class_name == name) return;
  // Names no record holds any more are swept each time the map doubles.
  if (class_names_.size() >= 2 * class_names_swept_ + 64 && !class_names_.contains(name)) {
    absl::erase_if(class_names_, [](const auto& e) { return e.second.expired(); });
    class_names_swept_ = class_names_.size();
  }
  std::weak_ptr<const std::string>& slot = class_names_[name];
  t.class_name = slot.lock();
  if (t.class_name == nullptr) {
    t.class_name = std::make_shared<const std::string>(std::move(name));
    slot = t.class_name;
  }
}

void Scheduler::AddReady(TaskRecord& t) {
  std::unique_ptr<ReadyClass>& slot = ready_[t.placement_class()];
  if (slot == nullptr) {
    slot = std::make_unique<ReadyClass>();
    slot->key = t.placement_class();
    slot->placement = t.spec.placement();
    slot->need = NeedOf(slot->placement);
    slot->replica_of = t.spec.replica_of();
    slot->queue = t.queue();
  }
  ReadyClass& c = *slot;
  const ReadyKey key = ReadyKeyOf(t);
  const bool new_head = c.tasks.empty() || key < *c.tasks.begin();
  if (new_head && c.where == ReadyClass::Where::kHeads) {
    if (!c.tasks.empty()) EraseHead({*c.tasks.begin(), &c});
    InsertHead({key, &c});
  }
  c.tasks.insert(key);
  board_.AddReady(t);
}

void Scheduler::RemoveReady(const TaskRecord& t) {
  auto it = ready_.find(t.placement_class());
  TASKGRID_CHECK(it != ready_.end(), absl::StrCat("PENDING task ", t.id(), " has no ready class"));
  ReadyClass& c = *it->second;
  const ReadyKey key = ReadyKeyOf(t);
  const bool was_head = *c.tasks.begin() == key;
  if (was_head && c.where == ReadyClass::Where::kHeads) EraseHead({key, &c});
  c.tasks.erase(key);
  board_.RemoveReady(t);
  if (c.tasks.empty()) {
    parked_.erase(&c);
    if (c.where == ReadyClass::Where::kHeld) {
      auto h = held_.find(c.queue);
      h->second.erase(&c);
      if (h->second.empty()) held_.erase(h);
    }
    if (c.where == ReadyClass::Where::kOverQuota) {
      auto h = over_quota_.find(c.queue);
      h->second.erase(&c);
      if (h->second.empty()) over_quota_.erase(h);
    }
    ready_.erase(it);
    return;
  }
  if (was_head && c.where == ReadyClass::Where::kHeads) InsertHead({*c.tasks.begin(), &c});
}

void Scheduler::BackToHeads(ReadyClass& c) {
  c.where = ReadyClass::Where::kHeads;
  c.settled = false;
  InsertHead({*c.tasks.begin(), &c});
}

void Scheduler::InsertHead(const Head& h) {
  if (!h.second->settled) look_again_ = true;
  heads_.insert(h);
  if (heads_by_queue_on_) heads_by_queue_[h.second->queue].insert(h);
}

void Scheduler::EraseHead(const Head& h) {
  heads_.erase(h);
  if (!heads_by_queue_on_) return;
  auto it = heads_by_queue_.find(h.second->queue);
  if (it == heads_by_queue_.end()) return;
  it->second.erase(h);
  if (it->second.empty()) heads_by_queue_.erase(it);
}

void Scheduler::IndexHeadsByQueue() {
  const bool want = queue_controls_.weighted();
  if (want == heads_by_queue_on_) return;
  heads_by_queue_.clear();
  heads_by_queue_on_ = want;
  if (!want) return;
  for (const Head& h : heads_) heads_by_queue_[h.second->queue].insert(h);
}

Scheduler::Capacity Scheduler::CapacityNow() const {
  Capacity cap;
  for (const auto& [id, a] : agents_.all()) {
    if (!a->takes_work()) continue;
    cap.slots += a->slots;
    AddResources(a->resources, &cap.resources);
  }
  return cap;
}

const Scheduler::Capacity& Scheduler::CapacityCached() {
  if (capacity_at_changes_ != agents_.changes()) {
    capacity_ = CapacityNow();
    capacity_at_changes_ = agents_.changes();
  }
  return capacity_;
}

double Scheduler::DominantShare(const std::string& queue, const Capacity& cap) const {
  double share = 0;
  if (auto s = slots_by_queue_.find(queue); s != slots_by_queue_.end() && cap.slots > 0) {
    share = static_cast<double>(s->second) / static_cast<double>(cap.slots);
  }
  if (auto h = held_by_queue_.find(queue); h != held_by_queue_.end()) {
    for (const auto& [name, amount] : h->second) {
      auto offer = cap.resources.find(name);
      if (offer == cap.resources.end() || offer->second <= 0) continue;
      share = std::max(share, static_cast<double>(amount) / static_cast<double>(offer->second));
    }
  }
  return share;
}

absl::btree_set<Scheduler::Head>::iterator Scheduler::FairHead(const Capacity& cap) {
  const absl::btree_set<Head>* best = nullptr;
  bool best_zero = true;
  double best_score = 0;
  for (const auto& [queue, heads] : heads_by_queue_) {
    const int32_t weight = queue_controls_.WeightOf(queue);
    const bool zero = weight == 0;
    const double share = DominantShare(queue, cap);
    const double score = zero ? share : share / weight;
    // A queue with a weight before one without; then the least share per
    // weight; then the better head (priority, then submit order).
    if (best == nullptr || (best_zero && !zero) ||
        (zero == best_zero &&
         (score < best_score || (score == best_score && *heads.begin() < *best->begin())))) {
      best = &heads;
      best_zero = zero;
      best_score = score;
    }
  }
  return heads_.find(*best->begin());
}

bool Scheduler::AnyAgentCouldTake(const v1::Placement& p,
                                  const absl::flat_hash_set<std::string>* exclude) const {
  const Resources need = NeedOf(p);
  auto could = [&](const AgentRecord& a) {
    return a.takes_work() && Matches(p, need, a) &&
           (exclude == nullptr || !exclude->contains(a.id));
  };
  if (!p.agent_ids().empty()) {
    // Pinned: only the named agents need looking at.
    return std::any_of(p.agent_ids().begin(), p.agent_ids().end(), [&](const std::string& id) {
      const AgentRecord* a = agents_.Find(id);
      return a != nullptr && could(*a);
    });
  }
  return std::any_of(agents_.all().begin(), agents_.all().end(),
                     [&](const auto& e) { return could(*e.second); });
}

void Scheduler::StartOn(TaskRecord& t, const Resources& need, AgentRecord& a, absl::Duration mono,
                        absl::Time now, Assigns* assigns) {
  v1::Assignment head;
  int64_t input_bytes = 0;
  if (!FillAssignment(t, nullptr, &head, &input_bytes)) {
    Transition(t, v1::TASK_STATE_FAILED,
               absl::StrCat("the outputs of its dependencies total ", input_bytes,
                            " bytes; the limit is ", opts_.max_input_bytes));
    start_deadlines_.Remove(t.id());
    return;
  }
  queue_controls_.Take(t.queue(), mono);
  head.set_attempt(++t.attempt);
  t.agent_id = a.id;
  t.dispatch_time = now;
  t.start_time = absl::InfinitePast();
  TakeResources(a, t.queue(), SlotsOf(t.spec.placement()), need);
  a.tasks.insert(t.id());
  a.last_assigned = ++assign_counter_;
  task_deadlines_.Set(t.id(), mono + AckTimeout(t));
  Transition(t, v1::TASK_STATE_DISPATCHED,
             absl::StrCat("attempt ", t.attempt, " dispatched to agent ", a.id));
  auto& msgs = (*assigns)[&a];
  if (msgs.empty() || msgs.back().second >= kAssignBytes) msgs.emplace_back();
  msgs.back().second += head.ByteSizeLong();
  *msgs.back().first.add_tasks() = std::move(head);
  if (!a.chains) return;
  // The chain below t goes along, each link to start when the one
  // before it succeeded there.
  TaskRecord* cur = &t;
  for (int len = 1; len < opts_.max_chain_length; ++len) {
    TaskRecord* d = ChainSuccessor(*cur, now);
    if (d == nullptr) break;
    // Each link starts a task of the queue (the same as cur's: they
    // share a class) and counts against its limits.
    if (!queue_controls_.empty() && GateOf(d->queue()) != QueueControls::Gate::kOpen) break;
    v1::Assignment link;
    FillAssignment(*d, cur, &link, &input_bytes);  // no inputs but cur's
    // The rest of the chain goes in a later Assign, once cur succeeded:
    // one message stays well under what an agent accepts (64 MiB).
    if (msgs.back().second + link.ByteSizeLong() > kMaxAssignBytes) break;
    queue_controls_.Take(d->queue(), mono);
    link.set_attempt(++d->attempt);
    d->agent_id = a.id;
    d->dispatch_time = now;
    d->start_time = absl::InfinitePast();
    a.tasks.insert(d->id());
    cur->chain_next = d;
    d->chained_after = cur;
    Transition(*d, v1::TASK_STATE_DISPATCHED,
               absl::StrCat("attempt ", d->attempt, " dispatched to agent ", a.id,
                            ", to run after ", cur->id()));
    msgs.back().second += link.ByteSizeLong();
    *msgs.back().first.add_tasks() = std::move(link);
    cur = d;
  }
}

void Scheduler::Dispatch() {
  // Called on every tick: nothing ready (or only classes no agent could
  // take) must cost nothing, however many agents there are.
  if (heads_.empty()) return;
  // Every class in the heads found no room in the last Dispatch; unless an
  // agent got room back, another class came or the agents changed (one
  // may have gone, and a class no agent could take any more is parked),
  // none would now.
  const bool agents_changed = dispatched_at_changes_ != agents_.changes();
  if (!agents_changed && !look_again_ && grown_.empty()) return;
  const uint64_t changes_at_start = agents_.changes();
  // The agents with a free slot: all of them for a class that is not
  // settled, built when the first such class comes; for a settled class,
  // those that got room back (room that comes back while this Dispatch
  // runs, from a gang's reservation, is for the next one).
  std::vector<AgentRecord*> all;
  bool all_built = false;
  auto all_agents = [&]() -> const std::vector<AgentRecord*>& {
    if (!all_built) {
      all_built = true;
      for (const auto& [id, a] : agents_.all()) {
        if (a->takes_work() && a->free_slots() > 0) all.push_back(a.get());
      }
    }
    return all;
  };
  std::vector<AgentRecord*> grown;
  for (const std::string& id : std::exchange(grown_, {})) {
    AgentRecord* a = agents_.Find(id);
    if (a != nullptr && a->takes_work() && a->free_slots() > 0) grown.push_back(a);
  }
  Assigns assigns;
  std::vector<std::string> aside;  // classes no agent has room for now
  const absl::Duration mono = Mono();
  const absl::Time now = Now();
  // Queues share by weight once any has one; else the best head of all.
  const bool fair = heads_by_queue_on_;
  const Capacity cap = fair ? CapacityCached() : Capacity();
  while (!heads_.empty()) {
    const Head next = fair ? *FairHead(cap) : *heads_.begin();
    auto [key, cls] = next;
    TaskRecord& t = *std::get<2>(key);
    if (IsGangMember(t)) {
      ++placement_attempts_;
      DispatchGang(*t.replica_of, all_agents(), mono, now, &assigns, &aside);
      continue;
    }
    // Its queue may not start a task now: the class waits for it to open.
    if (!queue_controls_.empty() && GateOf(cls->queue) != QueueControls::Gate::kOpen) {
      EraseHead(next);
      Hold(*cls);
      continue;
    }
    // Its start would pass its queue's quota: it waits for the queue's
    // tasks to give some back (or for a new quota).
    if (!cls->need.empty() && !WithinQuota(cls->queue, cls->need)) {
      EraseHead(next);
      OverQuota(*cls);
      continue;
    }
    ++placement_attempts_;
    // A replica keeps off the agents of its siblings.
    absl::flat_hash_set<std::string> taken;
    if (!cls->replica_of.empty()) taken = ReplicaAgents(*t.replica_of);
    const absl::flat_hash_set<std::string>* exclude = cls->replica_of.empty() ? nullptr : &taken;
    const std::vector<AgentRecord*>& candidates = cls->settled ? grown : all_agents();
    agents_examined_ += static_cast<int64_t>(candidates.size());
    AgentRecord* a = Pick(cls->placement, cls->need, candidates, exclude);
    if (a == nullptr) {
      EraseHead(next);
      // A settled class could be taken before; it still can unless the
      // agents changed.
      if ((cls->settled && !agents_changed) || AnyAgentCouldTake(cls->placement, exclude)) {
        cls->where = ReadyClass::Where::kAside;
        aside.push_back(cls->key);
      } else {
        cls->where = ReadyClass::Where::kParked;
        parked_.insert(cls);
      }
      continue;
    }
    StartOn(t, cls->need, *a, mono, now, &assigns);
  }
  // Every class still ready found no room: from now on only agents that
  // get room back need looking at for it.
  look_again_ = false;
  dispatched_at_changes_ = changes_at_start;
  for (const std::string& k : aside) {
    auto it = ready_.find(k);  // emptied meanwhile: gone
    if (it == ready_.end() || it->second->where != ReadyClass::Where::kAside) continue;
    ReadyClass& c = *it->second;
    c.where = ReadyClass::Where::kHeads;
    // Gangs and replicas are looked at whole every time (InsertHead sets
    // look_again_ again for them).
    c.settled = c.replica_of.empty();
    InsertHead({*c.tasks.begin(), &c});
  }
  for (auto& [a, msgs] : assigns) {
    for (auto& [assign, bytes] : msgs) {
      v1::SchedulerMessage msg;
      *msg.mutable_assign() = std::move(assign);
      Send(a->conn, std::move(msg));
    }
  }
}

}  // namespace taskgrid::core
