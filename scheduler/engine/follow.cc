// The Engine's side of StreamTaskOutput: what the relay (output.h) learns
// of the followed tasks, and when. A follower is attached, and every
// change of a followed task is handed over, in the callbacks of the
// commits that carry them, so the relay sees the tasks' states in commit
// order and never one that could still vanish. Nothing here is stored.

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::engine {

absl::StatusOr<std::shared_ptr<OutputFollower>> Engine::StartOutput(
    const v1::StreamTaskOutputRequest& req, std::function<void()> wake) {
  if (req.id().empty()) return absl::InvalidArgumentError("id is empty");
  if (!v1::OutputStream_IsValid(req.stream())) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream is ", req.stream(),
                     "; it must be OUTPUT_STREAM_STDOUT, OUTPUT_STREAM_STDERR or unset (both)"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return Stopped();
  const core::TaskRecord* t = sched_.Find(req.id());
  // A finished task on disk is read back (not into the Scheduler): what
  // its result keeps is all there is to show.
  std::unique_ptr<core::TaskRecord> stored;
  if (const core::ColdTask* c = t == nullptr ? sched_.FindCold(req.id()) : nullptr) {
    const int64_t seq = c->seq;
    lock.unlock();
    ASSIGN_OR_RETURN(std::vector<core::StoredTask> rows, store_->ReadTasks({seq}));
    if (!rows.empty()) {
      ASSIGN_OR_RETURN(stored,
                       core::FromStored(std::move(rows[0].row), rows[0].attempts, rows[0].merged));
    }
    lock.lock();
    if (stopped_) return Stopped();
    t = stored.get();
  }
  if (t == nullptr) return NotFound(req.id());
  ASSIGN_OR_RETURN(std::shared_ptr<OutputFollower> f, output_.Admit(req, std::move(wake)));
  ++followed_[req.id()];
  // Attached once the commits queued before it landed: from then on the
  // updates of this task reach it, in order.
  CommitLocked([this, f, state = OutputStateLocked(*t, /*last=*/true)](const absl::Status& s) {
    if (!s.ok()) {
      output_.Fail(f, s);
      return;
    }
    SendOutputControl(output_.Attach(f, state));
  });
  return f;
}

absl::StatusOr<OutputRelay::Batch> Engine::NextOutput(const std::shared_ptr<OutputFollower>& f,
                                                      size_t max_bytes) {
  return output_.Next(f, max_bytes);
}

void Engine::StopOutput(const std::shared_ptr<OutputFollower>& f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = followed_.find(f->task_id());
    if (it != followed_.end() && --it->second == 0) followed_.erase(it);
  }
  SendOutputControl(output_.Remove(f));
}

OutputTaskState Engine::OutputStateLocked(const core::TaskRecord& t, bool last) const {
  OutputTaskState s;
  s.task_id = t.id();
  s.state = t.state;
  s.attempt = t.attempt;
  s.started = core::IsInFlight(t.state) && (t.claimed() || t.start_time != absl::InfinitePast());
  s.holder = t.agent_id;
  if (s.started) {
    const core::AgentRecord* a = t.claimed() ? nullptr : sched_.FindAgent(t.agent_id);
    if (t.claimed()) {
      s.no_live = absl::StrCat("claimed by pull worker ", t.agent_id,
                               ": no live output; what its result keeps comes when it ends");
    } else if (a == nullptr || !a->live_output) {
      s.no_live = absl::StrCat("agent ", t.agent_id,
                               " does not send live output; what its result keeps comes when the "
                               "attempt ends");
    } else if (!a->connected()) {
      s.no_live = absl::StrCat("agent ", t.agent_id,
                               " is disconnected; output comes when it is back, or what its "
                               "result keeps when the attempt ends");
    } else {
      s.conn = a->conn;
    }
  }
  if (last && core::IsTerminal(t.state) && (t.attempt > 0 || t.result().ByteSizeLong() > 0)) {
    v1::Attempt& a = s.ended.emplace_back();
    a.set_attempt(t.attempt);
    *a.mutable_result() = t.result();
    a.mutable_result()->clear_output();
  }
  return s;
}

void Engine::OutputEventsLocked(const std::vector<core::EventRow>& events) {
  // One state per task, after every change of the commit, with the
  // attempts its events ended.
  std::vector<std::string> order;
  absl::flat_hash_map<std::string, std::vector<int32_t>> ended;
  for (const core::EventRow& e : events) {
    if (!followed_.contains(e.task_id)) continue;
    auto [it, first] = ended.try_emplace(e.task_id);
    if (first) order.push_back(e.task_id);
    if (core::IsInFlight(static_cast<v1::TaskState>(e.from_state)) &&
        !core::IsInFlight(static_cast<v1::TaskState>(e.to_state))) {
      it->second.push_back(e.attempt);
    }
  }
  for (const std::string& id : order) {
    const core::TaskRecord* t = sched_.Find(id);
    if (t == nullptr) continue;
    OutputTaskState s = OutputStateLocked(*t, /*last=*/false);
    for (int32_t attempt : ended[id]) {
      v1::Attempt& out = s.ended.emplace_back();
      out.set_attempt(attempt);
      // The history keeps it: it is the newest (or among the newest).
      for (auto a = t->attempts.rbegin(); a != t->attempts.rend(); ++a) {
        if (a->attempt() == attempt) {
          out = *a;
          break;
        }
      }
    }
    output_updates_.push_back(std::move(s));
  }
}

std::vector<std::string> Engine::FollowedOnConnLocked(uint64_t conn) const {
  std::vector<std::string> ids;
  for (const auto& [id, n] : followed_) {
    const core::TaskRecord* t = sched_.Find(id);
    if (t == nullptr || !core::IsInFlight(t->state) || t->claimed()) continue;
    const core::AgentRecord* a = sched_.FindAgent(t->agent_id);
    if (a != nullptr && a->conn == conn) ids.push_back(id);
  }
  return ids;
}

void Engine::QueueOutputStatesLocked(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    if (const core::TaskRecord* t = sched_.Find(id)) {
      output_updates_.push_back(OutputStateLocked(*t, /*last=*/false));
    }
  }
}

void Engine::UpdateOutput(std::vector<OutputTaskState>& updates) {
  for (const OutputTaskState& s : updates) SendOutputControl(output_.Update(s));
}

void Engine::SendOutputControl(std::vector<core::Outgoing> msgs) {
  if (msgs.empty()) return;
  std::lock_guard<std::mutex> lock(channels_mu_);
  for (core::Outgoing& out : msgs) {
    auto it = channels_.find(out.conn);
    if (it != channels_.end()) it->second->Send(std::move(out.msg));
  }
}

}  // namespace taskgrid::engine
