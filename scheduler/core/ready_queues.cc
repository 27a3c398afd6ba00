// ReadyQueues: the ready classes, where each waits, and Dispatch's loop.

#include "scheduler/core/ready_queues.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/core/replica_rules.h"
#include "scheduler/core/scheduler_internal.h"

namespace taskgrid::core {

void ReadyQueues::SetClass(TaskRecord& t) {
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

void ReadyQueues::Add(TaskRecord& t) {
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
}

void ReadyQueues::Remove(const TaskRecord& t) {
  auto it = ready_.find(t.placement_class());
  TASKGRID_CHECK(it != ready_.end(), absl::StrCat("PENDING task ", t.id(), " has no ready class"));
  ReadyClass& c = *it->second;
  const ReadyKey key = ReadyKeyOf(t);
  const bool was_head = *c.tasks.begin() == key;
  if (was_head && c.where == ReadyClass::Where::kHeads) EraseHead({key, &c});
  c.tasks.erase(key);
  if (c.tasks.empty()) {
    parked_.erase(&c);
    if (c.where == ReadyClass::Where::kHeld) Unlist(&held_, &c);
    if (c.where == ReadyClass::Where::kOverQuota) Unlist(&over_quota_, &c);
    ready_.erase(it);
    return;
  }
  if (was_head && c.where == ReadyClass::Where::kHeads) InsertHead({*c.tasks.begin(), &c});
}

bool ReadyQueues::Holds(const TaskRecord& t) const {
  auto it = ready_.find(t.placement_class());
  return it != ready_.end() && it->second->tasks.contains(ReadyKeyOf(t));
}

void ReadyQueues::BackToHeads(ReadyClass& c) {
  c.where = ReadyClass::Where::kHeads;
  c.settled = false;
  InsertHead({*c.tasks.begin(), &c});
}

void ReadyQueues::InsertHead(const Head& h) {
  if (!h.second->settled) look_again_ = true;
  heads_.insert(h);
  if (heads_by_queue_on_) heads_by_queue_[h.second->queue].insert(h);
}

void ReadyQueues::EraseHead(const Head& h) {
  heads_.erase(h);
  if (!heads_by_queue_on_) return;
  auto it = heads_by_queue_.find(h.second->queue);
  if (it == heads_by_queue_.end()) return;
  it->second.erase(h);
  if (it->second.empty()) heads_by_queue_.erase(it);
}

void ReadyQueues::IndexHeadsByQueue() {
  const bool want = controls_->weighted();
  if (want == heads_by_queue_on_) return;
  heads_by_queue_.clear();
  heads_by_queue_on_ = want;
  if (!want) return;
  for (const Head& h : heads_) heads_by_queue_[h.second->queue].insert(h);
}

void ReadyQueues::UnparkFor(const AgentRecord& a) {
  if (!a.takes_work()) return;
  for (auto it = parked_.begin(); it != parked_.end();) {
    ReadyClass& c = **it;
    if (!Matches(c.placement, c.need, a)) {
      ++it;
      continue;
    }
    parked_.erase(it++);
    BackToHeads(c);
  }
}

void ReadyQueues::UnparkClassesOf(const TaskRecord& group) {
  for (const TaskRecord* r : group.replicas) {
    auto it = ready_.find(r->placement_class());
    if (it == ready_.end() || it->second->where != ReadyClass::Where::kParked) continue;
    parked_.erase(it->second.get());
    BackToHeads(*it->second);
  }
}

void ReadyQueues::MoveClassesOf(const TaskRecord& group, ReadyClass::Where where,
                                std::vector<std::string>* aside) {
  for (const TaskRecord* r : group.replicas) {
    if (r->state != v1::TASK_STATE_PENDING) continue;
    auto it = ready_.find(r->placement_class());
    if (it == ready_.end() || it->second->where != ReadyClass::Where::kHeads) continue;
    ReadyClass& c = *it->second;
    EraseHead({*c.tasks.begin(), &c});
    switch (where) {
      case ReadyClass::Where::kAside:
        c.where = where;
        aside->push_back(c.key);
        break;
      case ReadyClass::Where::kParked:
        c.where = where;
        parked_.insert(&c);
        break;
      case ReadyClass::Where::kHeld:
        Hold(c);
        break;
      case ReadyClass::Where::kOverQuota:
        OverQuota(c);
        break;
      case ReadyClass::Where::kHeads:
        TASKGRID_CHECK(false, "a gang's classes leave the heads");
    }
  }
}

void ReadyQueues::Hold(ReadyClass& c) {
  c.where = ReadyClass::Where::kHeld;
  held_[c.queue].insert(&c);
}

void ReadyQueues::ReleaseAll(ClassesByQueue* by_queue, const std::string& queue) {
  auto it = by_queue->find(queue);
  if (it == by_queue->end()) return;
  for (ReadyClass* c : it->second) BackToHeads(*c);
  by_queue->erase(it);
}

void ReadyQueues::Unlist(ClassesByQueue* by_queue, ReadyClass* c) {
  auto it = by_queue->find(c->queue);
  it->second.erase(c);
  if (it->second.empty()) by_queue->erase(it);
}

void ReadyQueues::ReleaseHeld(const std::string& queue) { ReleaseAll(&held_, queue); }

void ReadyQueues::ReleaseOpened(
    absl::FunctionRef<QueueControls::Gate(const std::string&)> gate_of) {
  std::vector<std::string> opened;
  for (const auto& [queue, classes] : held_) {
    if (gate_of(queue) == QueueControls::Gate::kOpen) opened.push_back(queue);
  }
  for (const std::string& q : opened) ReleaseHeld(q);
}

void ReadyQueues::OverQuota(ReadyClass& c) {
  c.where = ReadyClass::Where::kOverQuota;
  over_quota_[c.queue].insert(&c);
}

void ReadyQueues::ReleaseOverQuota(const std::string& queue) { ReleaseAll(&over_quota_, queue); }

void ReadyQueues::TakeResources(AgentRecord& a, const std::string& queue, int32_t slots,
                                const Resources& need) {
  a.used += slots;
  slots_by_queue_[queue] += slots;
  if (need.empty()) return;
  AddResources(need, &a.held);
  AddResources(need, &held_by_queue_[queue]);
}

void ReadyQueues::GiveBackResources(AgentRecord& a, const std::string& queue, int32_t slots,
                                    const Resources& need) {
  a.used -= slots;
  Grew(a);
  if (auto it = slots_by_queue_.find(queue); it != slots_by_queue_.end()) {
    it->second -= slots;
    if (it->second == 0) slots_by_queue_.erase(it);
  }
  if (need.empty()) return;
  SubtractResources(need, &a.held);
  if (auto it = held_by_queue_.find(queue); it != held_by_queue_.end()) {
    SubtractResources(need, &it->second);
    if (it->second.empty()) held_by_queue_.erase(it);
  }
  ReleaseOverQuota(queue);
}

const Resources* ReadyQueues::HeldBy(const std::string& queue) const {
  auto it = held_by_queue_.find(queue);
  return it == held_by_queue_.end() ? nullptr : &it->second;
}

bool ReadyQueues::WithinQuota(const std::string& queue, const Resources& need) const {
  // Strings are made only for a class over its quota.
  return need.empty() || QuotaReason(queue, need).empty();
}

std::string ReadyQueues::QuotaReason(const std::string& queue, const Resources& need) const {
  const Resources* quota = controls_->QuotaOf(queue);
  if (quota == nullptr) return "";
  const auto held = held_by_queue_.find(queue);
  for (const auto& [name, cap] : *quota) {
    auto n = need.find(name);
    if (n == need.end()) continue;
    const int64_t have = held == held_by_queue_.end() ? 0 : AmountOf(held->second, name);
    if (have + n->second <= cap) continue;
    const std::string asks = absl::StrCat(name, "=", FormatResourceAmount(name, n->second));
    const std::string quota_text = absl::StrCat(name, "=", FormatResourceAmount(name, cap));
    if (n->second > cap) {
      return absl::StrCat("needs ", asks, "; the quota of queue ", queue, " is ", quota_text);
    }
    return absl::StrCat("queue ", queue, " is at its quota of ", quota_text, " (",
                        FormatResourceAmount(name, have), " held; this task needs ",
                        FormatResourceAmount(name, n->second), ")");
  }
  return "";
}

ReadyQueues::Capacity ReadyQueues::CapacityNow() const {
  Capacity cap;
  for (const auto& [id, a] : agents_->all()) {
    if (!a->takes_work()) continue;
    cap.slots += a->slots;
    AddResources(a->resources, &cap.resources);
  }
  return cap;
}

const ReadyQueues::Capacity& ReadyQueues::CapacityCached() {
  if (capacity_at_changes_ != agents_->changes()) {
    capacity_ = CapacityNow();
    capacity_at_changes_ = agents_->changes();
  }
  return capacity_;
}

double ReadyQueues::DominantShare(const std::string& queue, const Capacity& cap) const {
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

absl::btree_set<ReadyQueues::Head>::iterator ReadyQueues::FairHead(const Capacity& cap) {
  const absl::btree_set<Head>* best = nullptr;
  bool best_zero = true;
  double best_score = 0;
  for (const auto& [queue, heads] : heads_by_queue_) {
    const int32_t weight = controls_->WeightOf(queue);
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

bool ReadyQueues::AnyAgentCouldTake(const v1::Placement& p,
                                    const absl::flat_hash_set<std::string>* exclude) const {
  const Resources need = NeedOf(p);
  auto could = [&](const AgentRecord& a) {
    return a.takes_work() && Matches(p, need, a) &&
           (exclude == nullptr || !exclude->contains(a.id));
  };
  if (!p.agent_ids().empty()) {
    // Pinned: only the named agents need looking at.
    return std::any_of(p.agent_ids().begin(), p.agent_ids().end(), [&](const std::string& id) {
      const AgentRecord* a = std::as_const(*agents_).Find(id);
      return a != nullptr && could(*a);
    });
  }
  return std::any_of(agents_->all().begin(), agents_->all().end(),
                     [&](const auto& e) { return could(*e.second); });
}

bool ReadyQueues::Idle() const {
  // Every class in the heads found no room in the last Dispatch; unless an
  // agent got room back, another class came or the agents changed (one
  // may have gone, and a class no agent could take any more is parked),
  // none would now.
  return heads_.empty() ||
         (dispatched_at_changes_ == agents_->changes() && !look_again_ && grown_.empty());
}

void ReadyQueues::Dispatch(Host& host) {
  // Called on every tick: nothing ready (or only classes no agent could
  // take) must cost nothing, however many agents there are.
  if (Idle()) return;
  const bool agents_changed = dispatched_at_changes_ != agents_->changes();
  const uint64_t changes_at_start = agents_->changes();
  // The agents with a free slot: all of them for a class that is not
  // settled, built when the first such class comes; for a settled class,
  // those that got room back (room that comes back while this Dispatch
  // runs, from a gang's reservation, is for the next one).
  std::vector<AgentRecord*> all;
  bool all_built = false;
  auto all_agents = [&]() -> const std::vector<AgentRecord*>& {
    if (!all_built) {
      all_built = true;
      for (const auto& [id, a] : agents_->all()) {
        if (a->takes_work() && a->free_slots() > 0) all.push_back(a.get());
      }
    }
    return all;
  };
  std::vector<AgentRecord*> grown;
  for (const std::string& id : std::exchange(grown_, {})) {
    AgentRecord* a = agents_->Find(id);
    if (a != nullptr && a->takes_work() && a->free_slots() > 0) grown.push_back(a);
  }
  std::vector<std::string> aside;  // classes no agent has room for now
  // Queues share by weight once any has one; else the best head of all.
  const bool fair = heads_by_queue_on_;
  const Capacity cap = fair ? CapacityCached() : Capacity();
  while (!heads_.empty()) {
    const Head next = fair ? *FairHead(cap) : *heads_.begin();
    auto [key, cls] = next;
    TaskRecord& t = *std::get<2>(key);
    if (IsGangMember(t)) {
      ++placement_attempts_;
      host.DispatchGang(*t.replica_of, all_agents(), &aside);
      continue;
    }
    // Its queue may not start a task now: the class waits for it to open.
    if (!controls_->empty() && host.GateOf(cls->queue) != QueueControls::Gate::kOpen) {
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
    if (!cls->replica_of.empty()) taken = host.ReplicaAgents(*t.replica_of);
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
    host.StartOn(t, cls->need, *a);
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
}

std::string ReadyQueues::CheckInvariants(
    size_t pending, const absl::flat_hash_map<std::string, Resources>& held_by_queue,
    const absl::flat_hash_map<std::string, int64_t>& slots_by_queue,
    absl::FunctionRef<std::string(const ReadyClass&)> waits_rightly) const {
  size_t in_ready = 0;
  size_t in_heads = 0, parked = 0, held = 0, over_quota = 0;
  for (const auto& [key, c] : ready_) {
    if (c->tasks.empty()) return absl::StrCat("ready class ", key, " is empty but kept");
    if (c->key != key) return absl::StrCat("ready class ", key, " is keyed as ", c->key);
    in_ready += c->tasks.size();
    switch (c->where) {
      case ReadyClass::Where::kHeads:
        ++in_heads;
        if (!heads_.contains({*c->tasks.begin(), c.get()})) {
          return absl::StrCat("ready class ", key, " is not in the heads by its first task");
        }
        if (!c->settled) break;
        if (!c->replica_of.empty()) return absl::StrCat("replica class ", key, " is settled");
        // Dispatch looks for a settled class only on the agents that got
        // room back: no other may have room for it.
        for (const auto& [aid, a] : agents_->all()) {
          if (!a->takes_work() || grown_.contains(aid)) continue;
          if (a->HasRoom(SlotsOf(c->placement), c->need, "") &&
              Matches(c->placement, c->need, *a)) {
            return absl::StrCat("ready class ", key, " is settled, but agent ", aid,
                                " has room for it and did not get room back since");
          }
        }
        break;
      case ReadyClass::Where::kAside:
        return absl::StrCat("ready class ", key, " was left aside after a dispatch");
      case ReadyClass::Where::kParked:
        ++parked;
        if (!parked_.contains(c.get())) {
          return absl::StrCat("parked class ", key, " is not listed");
        }
        break;
      case ReadyClass::Where::kHeld: {
        ++held;
        auto h = held_.find(c->queue);
        if (h == held_.end() || !h->second.contains(c.get())) {
          return absl::StrCat("held class ", key, " is not listed under its queue ", c->queue);
        }
        if (controls_->Find(c->queue) == nullptr) {
          return absl::StrCat("class ", key, " is held, but its queue ", c->queue,
                              " has no controls");
        }
        break;
      }
      case ReadyClass::Where::kOverQuota: {
        ++over_quota;
        auto h = over_quota_.find(c->queue);
        if (h == over_quota_.end() || !h->second.contains(c.get())) {
          return absl::StrCat("class ", key, " over quota is not listed under its queue ",
                              c->queue);
        }
        break;
      }
    }
    if (c->where == ReadyClass::Where::kParked || c->where == ReadyClass::Where::kOverQuota) {
      if (std::string broken = waits_rightly(*c); !broken.empty()) return broken;
    }
  }
  if (heads_.size() != in_heads) {
    return absl::StrCat("heads hold ", heads_.size(), " classes, not ", in_heads);
  }
  if (heads_by_queue_on_ != controls_->weighted()) {
    return absl::StrCat("heads are indexed by queue ", heads_by_queue_on_ ? "without" : "with",
                        " queue weights");
  }
  size_t by_queue = 0;
  for (const auto& [queue, heads] : heads_by_queue_) {
    if (heads.empty()) return absl::StrCat("queue ", queue, " has no head but is listed");
    for (const Head& h : heads) {
      if (h.second->queue != queue || !heads_.contains(h)) {
        return absl::StrCat("a head of queue ", queue, " is not among the heads");
      }
    }
    by_queue += heads.size();
  }
  if (heads_by_queue_on_ && by_queue != heads_.size()) {
    return absl::StrCat("heads by queue hold ", by_queue, " classes, not ", heads_.size());
  }
  if (parked_.size() != parked) {
    return absl::StrCat(parked_.size(), " classes listed parked, not ", parked);
  }
  if (capacity_at_changes_ == agents_->changes()) {
    const Capacity now = CapacityNow();
    if (now.slots != capacity_.slots || now.resources != capacity_.resources) {
      return absl::StrCat("the capacity kept (", capacity_.slots, " slots, ",
                          FormatResources(capacity_.resources), ") is not the agents' (", now.slots,
                          " slots, ", FormatResources(now.resources), ")");
    }
  }
  size_t listed_held = 0;
  for (const auto& [queue, classes] : held_) {
    if (classes.empty()) return absl::StrCat("queue ", queue, " holds no class but is listed");
    listed_held += classes.size();
  }
  if (listed_held != held) return absl::StrCat(listed_held, " classes listed held, not ", held);
  size_t listed_over = 0;
  for (const auto& [queue, classes] : over_quota_) {
    if (classes.empty()) {
      return absl::StrCat("queue ", queue, " has no class over quota but is listed");
    }
    listed_over += classes.size();
  }
  if (listed_over != over_quota) {
    return absl::StrCat(listed_over, " classes listed over quota, not ", over_quota);
  }
  if (in_ready != pending) {
    return absl::StrCat("ready queues hold ", in_ready, " tasks, not ", pending);
  }
  if (held_by_queue != held_by_queue_) {
    for (const auto& [queue, r] : held_by_queue_) {
      auto it = held_by_queue.find(queue);
      if (it == held_by_queue.end() || it->second != r) {
        return absl::StrCat("queue ", queue, " is said to hold ", FormatResources(r), ", not ",
                            it == held_by_queue.end() ? "nothing" : FormatResources(it->second));
      }
    }
    return "a queue holds resources it is not said to";
  }
  if (slots_by_queue != slots_by_queue_) return "slots held by queue are counted wrongly";
  return "";
}

}  // namespace taskgrid::core
