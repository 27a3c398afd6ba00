#include "scheduler/core/agent_registry.h"

#include <algorithm>

namespace taskgrid::core {

AgentRecord* AgentRegistry::Find(const std::string& id) {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.get();
}

const AgentRecord* AgentRegistry::Find(const std::string& id) const {
  auto it = agents_.find(id);
  return it == agents_.end() ? nullptr : it->second.get();
}

AgentRecord* AgentRegistry::ByConn(uint64_t conn) {
  auto it = by_conn_.find(conn);
  return it == by_conn_.end() ? nullptr : it->second;
}

AgentRecord& AgentRegistry::FindOrAdd(const std::string& id) {
  std::unique_ptr<AgentRecord>& slot = agents_[id];
  if (slot == nullptr) {
    slot = std::make_unique<AgentRecord>();
    slot->id = id;
    ++changes_;
  }
  return *slot;
}

uint64_t AgentRegistry::Bind(AgentRecord& a, uint64_t conn) {
  const uint64_t old = a.conn;
  if (old != 0) by_conn_.erase(old);
  a.conn = conn;
  a.restored = false;
  a.restarting = false;
  a.restart_hold = absl::ZeroDuration();
  by_conn_[conn] = &a;
  UpdateHeartbeatFactor();
  ++changes_;
  return old;
}

void AgentRegistry::Unbind(AgentRecord& a, absl::Duration grace_end) {
  by_conn_.erase(a.conn);
  a.conn = 0;
  deadlines_.Set(a.id, grace_end);
  UpdateHeartbeatFactor();
  ++changes_;
}

void AgentRegistry::Heard(AgentRecord& a) {
  a.silence_deadline =
      std::max(a.silence_deadline, a.last_seen + opts_->HeartbeatTimeoutFor(a.judged_interval()));
  deadlines_.Set(a.id, a.silence_deadline);
}

void AgentRegistry::MarkLost(AgentRecord& a, absl::Duration until) {
  a.lost = true;
  deadlines_.Set(a.id, until);
  ++changes_;
}

uint64_t AgentRegistry::Forget(const std::string& id) {
  auto it = agents_.find(id);
  if (it == agents_.end()) return 0;
  const uint64_t conn = it->second->conn;
  if (conn != 0) by_conn_.erase(conn);
  deadlines_.Remove(id);
  agents_.erase(it);
  UpdateHeartbeatFactor();
  ++changes_;
  return conn;
}

AgentRecord& AgentRegistry::Restored(const std::string& id, absl::Duration now,
                                     absl::Duration grace_end) {
  const bool known = agents_.contains(id);
  AgentRecord& a = FindOrAdd(id);
  if (!known) {
    a.last_seen = now;
    a.restored = true;
    deadlines_.Set(id, grace_end);
  }
  return a;
}

AgentRegistry::Expired AgentRegistry::Expire(absl::Duration now) {
  Expired out;
  for (const std::string& id : deadlines_.PopExpired(now)) {
    auto it = agents_.find(id);
    if (it == agents_.end()) continue;
    AgentRecord& a = *it->second;
    if (a.connected()) {
      // Silent past its heartbeat timeout: the grace starts now.
      out.silent_conns.push_back(a.conn);
      // One that was restarting keeps the hold it was granted.
      Unbind(a, now + opts_->reconnect_grace + a.restart_hold);
      if (a.restart_hold > absl::ZeroDuration()) a.restarting = true;
    } else if (!a.lost) {
      out.grace_over.push_back(id);
    } else {
      agents_.erase(it);  // lost long enough: forgotten
      ++changes_;
    }
  }
  return out;
}

bool AgentRegistry::ConnIndexAgrees(const AgentRecord& a) const {
  if (!a.connected()) return true;
  auto it = by_conn_.find(a.conn);
  return it != by_conn_.end() && it->second == &a;
}

void AgentRegistry::UpdateHeartbeatFactor() {
  heartbeat_factor_ =
      opts_->HeartbeatFactor(static_cast<int64_t>(by_conn_.size()), heartbeat_factor_);
}

}  // namespace taskgrid::core
