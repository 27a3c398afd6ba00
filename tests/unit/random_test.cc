// A seeded random walk over the scheduler core and the real SQLite store:
// submits (tasks and small jobs), cancels, retries, resets, pauses and
// resumes, agents that connect, accept, finish, reject, release, send
// stale or foreign results, crash and come back inside or after the grace,
// clock jumps, finished tasks leaving memory for disk (and read back before
// an operation on them, as the Engine does), deletes, and restarts after
// outages of any length up to three restart graces that read the table
// back from SQLite (finished rows light). The agents are modelled as
// taskgrid-agent behaves (Hello.reports_stops): each holds a process for
// every attempt from the Assign that gave it until it reports the attempt
// ended (its kill grace is the walk's delay before it says so), answers a
// Cancel of an attempt it does not hold, lists all it holds in heartbeats,
// and when its stream ends its processes run on until it stops them itself
// (a broken stream: stop_on_lost_after; a restart of the scheduler: the
// restart grace less a second; its own restart keeping its steps: the hold
// granted), unless it died with them (kill -9). After every step:
//   - every invariant of the scheduler holds;
//   - no two attempts of a task have live processes at once (checked at
//     every Assign against every agent's processes);
//   - a result an agent produced for an attempt it ran is committed, or
//     the attempt's end is one the agent could not report (LOST) or is not
//     counted;
//   - every task whose submit was acknowledged, and not deleted, is there:
//     in memory, or on disk with its stored row in the state the index
//     says (after a restart: read back from the store);
//   - a result for an attempt other than the live one changes nothing;
//   - event revisions go up by exactly one, across restarts too.
// At the end the agents go away, one well-behaved agent finishes what is
// left, and every task must reach a terminal state: nothing is stuck.
//
// Reproducible: TASKGRID_RANDOM_SEED=N runs one seed, TASKGRID_RANDOM_STEPS
// sets the walk's length (default 1000 per seed, seeds 1-3). A failure
// names the seed and the step.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/proto_time.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/store/sqlite_store.h"
#include "tests/testing/temp_dir.h"

namespace taskgrid::core {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::atoi(v);
}

SchedulerOptions Options() {
  SchedulerOptions o;
  o.default_initial_backoff = absl::Seconds(1);
  o.default_max_backoff = absl::Seconds(4);
  o.default_ack_timeout = absl::Seconds(10);
  o.heartbeat_timeout = absl::Seconds(5);
  o.reconnect_grace = absl::Seconds(5);
  // Short, so that agents come back both within it and after it.
  o.restart_grace = absl::Seconds(30);
  o.random = [] { return 0.0; };
  o.max_attempt_history = 2;  // small, so histories are trimmed all the time
  // Finished tasks leave memory within a few steps; retention is left to
  // the walk's own deletes.
  o.finished_in_memory = absl::Seconds(3);
  o.retention = absl::ZeroDuration();
  o.failed_retention = absl::ZeroDuration();
  return o;
}

class Walk {
 public:
  explicit Walk(uint64_t seed) : rng_(seed) {
    OpenStore();
    sched_ = std::make_unique<Scheduler>(&clock_, Options());
  }

  // One random step; false (with a failure recorded) when a check broke.
  void Step() {
    const int op = Pick(100);
    if (op < 18) {
      SubmitTask();
    } else if (op < 24) {
      SubmitJob();
    } else if (op < 28) {
      OnTask([&](const std::string& id) { (void)sched_->Cancel(id); });
    } else if (op < 31) {
      OnTask([&](const std::string& id) { (void)sched_->Retry(id); });
    } else if (op < 34) {
      OnTask([&](const std::string& id) { (void)sched_->Reset(id); });
    } else if (op < 37) {
      OnTask([&](const std::string& id) { (void)sched_->Pause(id); });
    } else if (op < 40) {
      OnTask([&](const std::string& id) { (void)sched_->Resume(id); });
    } else if (op < 42) {
      DeleteTask();
    } else if (op < 47) {
      ConnectAgent();
    } else if (op < 77) {
      AgentSays();
    } else if (op < 80) {
      StaleResult();
    } else if (op < 84) {
      CrashAgent();
    } else if (op < 96) {
      clock_.Advance(absl::Milliseconds(100 + Pick(8000)));
      StopDue();
      sched_->Tick();
    } else if (op < 98) {
      Restart(/*reopen_store=*/false);
    } else {
      Restart(/*reopen_store=*/true);
    }
    Persist();
    // What the last step finished goes to disk when old enough: all of it
    // is committed (Persist applied it).
    sched_->Evict(last_revision_);
    CheckAll();
  }

  // Every agent leaves; one agent that does what it is told finishes the
  // rest. Every task must end.
  void Finish() {
    for (auto& [conn, agent] : std::map<uint64_t, std::string>(conns_)) {
      sched_->Disconnect(conn);
      StreamEnded(agents_[agent], Options().StopOnLostAfter(), /*forget=*/false);
    }
    Persist();
    for (int i = 0; i < 10; ++i) {
      clock_.Advance(absl::Minutes(1));
      StopDue();
      sched_->Tick();
      Persist();
    }
    for (const std::string& id : acked_) (void)sched_->Resume(id);
    Persist();
    v1::Hello h;
    h.set_agent_id("finisher");
    h.set_slots(64);
    h.set_reports_stops(true);
    const uint64_t conn = next_conn_++;
    ASSERT_TRUE(sched_->Connect(conn, h).ok());
    conns_[conn] = "finisher";
    AgentModel& finisher = agents_["finisher"];
    finisher.conn = conn;
    Persist();
    for (int round = 0; round < 500 && !AllTerminal(); ++round) {
      // Whatever it holds, including what finishing one hands it next.
      for (int pass = 0; pass < 100; ++pass) {
        std::vector<Key> todo;
        for (const auto& [key, held] : finisher.held) {
          if (held.alive && held.started) todo.push_back(key);
        }
        if (todo.empty()) break;
        for (const Key& key : todo) {
          if (finisher.held.count(key) == 0) continue;
          Send(conn, AcceptMsg(key.first, key.second));
          Report(conn, finisher, key, ResultMsg(key.first, key.second, v1::OUTCOME_SUCCEEDED));
          Persist();
        }
      }
      clock_.Advance(absl::Seconds(2));
      sched_->Tick();
      Persist();
      Heartbeat(conn);
      Persist();
      CheckAll();
    }
    ListFilter all;
    all.page_size = static_cast<int>(sched_->task_count() + sched_->cold_task_count()) + 1;
    std::map<std::string, int> by_state;
    for (const TaskRecord* t : sched_->List(all).tasks) {
      ++by_state[t == nullptr ? "on disk" : StateName(t->state)];
    }
    std::string summary;
    for (const auto& [state, n] : by_state) absl::StrAppend(&summary, " ", state, " ", n);
    std::printf(
        "walk: %zu tasks (%s), %d restarts, %d stale results refused, %d read back from disk, "
        "%d deleted, revision %lld\n",
        sched_->task_count() + sched_->cold_task_count(), summary.c_str(), restarts_, stale_,
        warmed_, deleted_, static_cast<long long>(last_revision_));
    for (const TaskRecord* t : sched_->List(all).tasks) {
      if (t == nullptr) continue;
      EXPECT_TRUE(IsTerminal(t->state))
          << t->id() << " is stuck " << StateName(t->state) << ": " << t->reason;
    }
  }

  void CheckAll() {
    absl::Status s = sched_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
    // Every one is indexed; a few on disk (a different few each step) are
    // read back and checked against the index.
    std::vector<int64_t> on_disk;
    std::vector<v1::TaskState> states;
    for (const std::string& id : acked_) {
      if (sched_->Find(id) != nullptr) continue;
      const ColdTask* c = sched_->FindCold(id);
      ASSERT_NE(c, nullptr) << "acknowledged task " << id << " is lost";
      if (Pick(20) != 0) continue;
      on_disk.push_back(c->seq);
      states.push_back(c->state());
    }
    auto stored = store_->ReadTasks(on_disk);
    ASSERT_TRUE(stored.ok()) << stored.status();
    ASSERT_EQ(stored->size(), on_disk.size()) << "a task on disk is not stored";
    for (size_t i = 0; i < on_disk.size(); ++i) {
      ASSERT_EQ((*stored)[i].row.state, states[i]) << (*stored)[i].row.id;
    }
  }

  bool AllTerminal() const {
    ListFilter all;
    all.page_size = static_cast<int>(sched_->task_count() + sched_->cold_task_count()) + 1;
    for (const TaskRecord* t : sched_->List(all).tasks) {
      if (t != nullptr && !IsTerminal(t->state)) return false;  // on disk: finished
    }
    return true;
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

  v1::TaskSpec Spec(const std::string& id) {
    v1::TaskSpec s;
    s.set_id(id);
    s.add_steps()->mutable_builtin()->set_name("noop");
    s.set_max_attempts(1 + Pick(3));
    if (Pick(6) == 0) s.mutable_not_before()->set_seconds(absl::ToUnixSeconds(clock_.Now()) + 5);
    if (Pick(3) == 0) s.mutable_attempt_timeout()->set_seconds(3);
    if (Pick(4) == 0) s.mutable_schedule_timeout()->set_seconds(Pick(2) == 0 ? 3 : 20);
    return s;
  }

  void SubmitTask() {
    const std::string id = absl::StrCat("t", next_id_++);
    if (sched_->Submit({Spec(id)}).ok()) acked_.insert(id);
  }

  void SubmitJob() {
    const std::string job = absl::StrCat("j", next_id_++);
    std::vector<v1::TaskSpec> specs = {Spec(job + "-a"), Spec(job + "-b"), Spec(job + "-c")};
    specs[1].add_depends_on(job + "-a");
    specs[2].add_depends_on(job + "-b");
    if (Pick(2) == 0) specs[2].set_on_upstream_failure(v1::UPSTREAM_FAILURE_RUN);
    if (sched_->SubmitJob(job, specs).ok()) {
      for (const v1::TaskSpec& s : specs) acked_.insert(s.id());
    }
  }

  // An operation on a random acknowledged task, which is read back from
  // disk first if it went there (as the Engine's WithWarm does).
  template <typename F>
  void OnTask(F f) {
    if (acked_.empty()) return;
    auto it = acked_.begin();
    std::advance(it, Pick(static_cast<int>(acked_.size())));
    WarmBack(sched_->ColdSeqsOfIds({*it}));
    f(*it);
  }

  // Reads `seqs` back from the store into memory, with what they need.
  void WarmBack(std::vector<int64_t> seqs) {
    std::map<int64_t, std::unique_ptr<TaskRecord>> loaded;
    for (int round = 0; round < 10 && !seqs.empty(); ++round) {
      auto stored = store_->ReadTasks(seqs);
      ASSERT_TRUE(stored.ok()) << stored.status();
      for (StoredTask& st : *stored) {
        const int64_t seq = st.row.seq;
        auto rec = FromStored(std::move(st.row), st.attempts, st.merged);
        ASSERT_TRUE(rec.ok()) << rec.status();
        loaded[seq] = std::move(*rec);
      }
      std::vector<std::unique_ptr<TaskRecord>> records;
      for (auto& [seq, rec] : loaded) records.push_back(std::move(rec));
      loaded.clear();
      seqs = sched_->Warm(&records);
      for (auto& rec : records) loaded[rec->seq] = std::move(rec);
      if (seqs.empty()) ++warmed_;
    }
    ASSERT_TRUE(seqs.empty()) << "tasks on disk were not read back";
  }

  // A finished task deleted for good (refused for others): gone from the
  // scheduler and the store.
  void DeleteTask() {
    if (acked_.empty()) return;
    auto it = acked_.begin();
    std::advance(it, Pick(static_cast<int>(acked_.size())));
    const std::string id = *it;
    absl::StatusOr<std::vector<std::string>> ids = sched_->DeleteTask(id);
    if (!ids.ok()) return;
    for (const std::string& gone : *ids) acked_.erase(gone);
    ++deleted_;
    ASSERT_EQ(sched_->Find(id), nullptr);
    ASSERT_EQ(sched_->FindCold(id), nullptr);
  }

  // --- The agents, as taskgrid-agent behaves ---

  struct Held {
    bool alive = true;      // its process runs (or may: an Assign on its way)
    bool finished = false;  // its end was reported, not yet acknowledged
    bool accepted = false;
    std::string pred;         // a chain link: the task it runs after
    bool started = true;      // a link whose predecessor succeeded here
    v1::AgentMessage report;  // what it reported, resent after a reconnect
  };
  using Key = std::pair<std::string, int>;
  struct AgentModel {
    uint64_t conn = 0;  // 0: no stream
    std::map<Key, Held> held;
    // Disconnected with processes alive: when it stops them itself, and
    // whether it then keeps their end to report (a broken stream, an outage
    // of the scheduler) or forgets them (a restart of its own whose hold
    // ran out: the next agent drops what it kept).
    absl::Duration stops_at = absl::InfiniteDuration();
    bool forgets_at_stop = false;
    absl::Duration restart_hold = absl::ZeroDuration();  // granted, for its own restart
  };

  // TASKGRID_RANDOM_TRACE=1 prints what the agents and the clock do.
  static bool Tracing() {
    static const bool on = EnvInt("TASKGRID_RANDOM_TRACE", 0) != 0;
    return on;
  }
  template <typename... Args>
  void Trace(const Args&... args) {
    if (Tracing()) {
      std::fprintf(stderr, "[%.1fs] %s\n", absl::ToDoubleSeconds(clock_.Monotonic()),
                   absl::StrCat(args...).c_str());
    }
  }

  static const char* AgentName(int i) {
    static const char* const kNames[] = {"a0", "a1", "a2"};
    return kNames[i];
  }

  // No other attempt of `id` has a live process on any agent.
  void CheckOneCopy(const std::string& id, int attempt, const std::string& to) {
    for (const auto& [name, m] : agents_) {
      for (const auto& [key, h] : m.held) {
        if (key.first == id && key.second != attempt && h.alive) {
          std::string history;
          if (const TaskRecord* t = sched_->Find(id); t != nullptr) {
            for (const v1::Attempt& a : t->attempts) {
              absl::StrAppend(&history, "\n  attempt ", a.attempt(), " on ", a.agent_id(), ": ",
                              v1::Outcome_Name(a.result().outcome()),
                              a.interrupted() ? " (not counted) " : " ", a.result().error());
            }
          }
          ADD_FAILURE() << "attempt " << attempt << " of " << id << " went to " << to
                        << " while attempt " << key.second << " still runs on " << name
                        << "; its ended attempts:" << history;
        }
      }
    }
  }

  // Its processes stop, at `why`: they keep their end to report, or (a
  // restart of its own not taken back) are forgotten.
  void StopAll(AgentModel& m, bool forget) {
    for (auto it = m.held.begin(); it != m.held.end();) {
      Held& h = it->second;
      if (!h.alive) {
        ++it;
        continue;
      }
      Trace("  ", it->first.first, " attempt ", it->first.second, " stopped by its agent",
            forget ? " (forgotten)" : "");
      if (forget) {
        it = m.held.erase(it);
        continue;
      }
      h.alive = false;
      h.finished = true;
      h.report = ReleaseMsg(it->first.first, it->first.second, "stopped: no contact");
      ++it;
    }
    m.stops_at = absl::InfiniteDuration();
  }

  // Time passed: agents without a stream stop their processes when due.
  void StopDue() {
    for (auto& [name, m] : agents_) {
      if (m.conn == 0 && m.stops_at <= clock_.Monotonic()) StopAll(m, m.forgets_at_stop);
    }
  }

  // Its stream ended with it alive: its processes run on until `after`.
  void StreamEnded(AgentModel& m, absl::Duration after, bool forget) {
    if (m.conn != 0) conns_.erase(m.conn);
    m.conn = 0;
    m.stops_at = std::min(m.stops_at, clock_.Monotonic() + after);
    m.forgets_at_stop = forget;
  }

  void ConnectAgent() {
    const std::string agent = AgentName(Pick(3));
    AgentModel& m = agents_[agent];
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(1 + Pick(3));
    h.set_chains(Pick(2) == 0);
    h.set_reports_stops(true);
    // Coming back: it names everything it holds; now and then it lost one
    // (what ran of it died with it).
    for (auto it = m.held.begin(); it != m.held.end();) {
      if (Pick(8) == 0) {
        it = m.held.erase(it);
        continue;
      }
      v1::AttemptRef* r = h.add_running();
      r->set_task_id(it->first.first);
      r->set_attempt(it->first.second);
      r->set_waiting(!it->second.started);
      r->set_finished(it->second.finished);
      ++it;
    }
    const uint64_t conn = next_conn_++;
    if (!sched_->Connect(conn, h).ok()) return;
    Trace("agent ", agent, " connects listing ", h.running_size());
    if (m.conn != 0) conns_.erase(m.conn);  // the scheduler ends the old stream
    m.conn = conn;
    m.stops_at = absl::InfiniteDuration();
    m.restart_hold = absl::ZeroDuration();
    conns_[conn] = agent;
    Persist();
    // After Welcome, what it reported and was not acknowledged goes again.
    std::vector<v1::AgentMessage> again;
    for (const auto& [key, held] : m.held) {
      if (held.finished) again.push_back(held.report);
    }
    for (const v1::AgentMessage& msg : again) Send(conn, msg);
  }

  // An agent's stream ends: it died (its processes with it), or the stream
  // broke (they run on until it fences itself), or it restarts keeping its
  // steps (they run on for the hold it was granted).
  void CrashAgent() {
    if (conns_.empty()) return;
    auto it = conns_.begin();
    std::advance(it, Pick(static_cast<int>(conns_.size())));
    const uint64_t conn = it->first;
    AgentModel& m = agents_[it->second];
    const int how = Pick(3);
    Trace("agent ", it->second, how == 0 ? " killed" : how == 1 ? " stream broke" : " restarts");
    switch (how) {
      case 0:  // kill -9: its supervisors kill every step at once
        sched_->Disconnect(conn);
        conns_.erase(conn);
        m.conn = 0;
        m.held.clear();
        break;
      case 1:
        sched_->Disconnect(conn);
        StreamEnded(m, Options().StopOnLostAfter(), /*forget=*/false);
        break;
      default: {
        v1::AgentMessage r;
        *r.mutable_restarting()->mutable_hold() = ToProto(absl::Seconds(1 + Pick(20)));
        Send(conn, r);
        Persist();  // its grant (RestartHold), seen below
        const absl::Duration hold = m.restart_hold;
        sched_->Disconnect(conn);
        if (hold > absl::ZeroDuration()) {
          StreamEnded(m, hold, /*forget=*/true);
        } else {
          StreamEnded(m, Options().StopOnLostAfter(), /*forget=*/false);
        }
        break;
      }
    }
  }

  static v1::AgentMessage AcceptMsg(const std::string& id, int attempt) {
    v1::AgentMessage m;
    m.mutable_accept()->set_task_id(id);
    m.mutable_accept()->set_attempt(attempt);
    return m;
  }

  static v1::AgentMessage ResultMsg(const std::string& id, int attempt, v1::Outcome outcome) {
    v1::AgentMessage m;
    m.mutable_result()->set_task_id(id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_result()->set_outcome(outcome);
    m.mutable_result()->mutable_result()->set_exit_code(outcome == v1::OUTCOME_SUCCEEDED ? 0 : 1);
    return m;
  }

  static v1::AgentMessage ReleaseMsg(const std::string& id, int attempt, const std::string& why,
                                     bool not_held = false) {
    v1::AgentMessage m;
    m.mutable_release()->set_task_id(id);
    m.mutable_release()->set_attempt(attempt);
    m.mutable_release()->set_reason(why);
    m.mutable_release()->set_not_held(not_held);
    return m;
  }

  void Send(uint64_t conn, const v1::AgentMessage& m) { sched_->OnAgentMessage(conn, m); }

  void Heartbeat(uint64_t conn) {
    v1::AgentMessage m;
    m.mutable_heartbeat();
    for (const auto& [key, h] : agents_[conns_[conn]].held) {
      v1::AttemptRef* r = m.mutable_heartbeat()->add_running();
      r->set_task_id(key.first);
      r->set_attempt(key.second);
      r->set_waiting(!h.started);
      r->set_finished(h.finished);
    }
    Send(conn, m);
  }

  // The chain links after `id` on `m`, dropped (their predecessor did not
  // succeed: the agent says nothing of them) or started.
  void AfterEnd(AgentModel& m, const std::string& id, bool succeeded) {
    std::vector<std::string> preds = {id};
    while (!preds.empty()) {
      const std::string pred = preds.back();
      preds.pop_back();
      for (auto it = m.held.begin(); it != m.held.end();) {
        if (it->second.pred != pred || it->second.finished || it->second.started) {
          ++it;
          continue;
        }
        if (succeeded) {
          it->second.started = true;
          ++it;
          continue;
        }
        preds.push_back(it->first.first);
        it = m.held.erase(it);
      }
    }
  }

  // The agent reports the end of `key` with `msg`.
  void Report(uint64_t conn, AgentModel& m, const Key& key, v1::AgentMessage msg) {
    Trace(conns_[conn], " reports ", key.first, " attempt ", key.second, ": ",
          msg.has_result() ? v1::Outcome_Name(msg.result().result().outcome()) : "release");
    Held& h = m.held[key];
    h.alive = false;
    h.finished = true;
    h.report = msg;
    const bool succeeded =
        msg.has_result() && msg.result().result().outcome() == v1::OUTCOME_SUCCEEDED;
    AfterEnd(m, key.first, succeeded);
    Send(conn, msg);
  }

  // A connected agent says something about an attempt it holds.
  void AgentSays() {
    if (conns_.empty()) return;
    auto it = conns_.begin();
    std::advance(it, Pick(static_cast<int>(conns_.size())));
    const uint64_t conn = it->first;
    AgentModel& m = agents_[it->second];
    std::vector<Key> live;
    for (const auto& [key, h] : m.held) {
      if (h.alive && h.started) live.push_back(key);
    }
    if (live.empty() || Pick(5) == 0) {
      Heartbeat(conn);
      return;
    }
    const Key key = live[Pick(static_cast<int>(live.size()))];
    Held& h = m.held[key];
    const auto& [id, attempt] = key;
    switch (Pick(8)) {
      case 0:
      case 1:
      case 2:
        Trace(it->second, " accepts ", id, " attempt ", attempt);
        h.accepted = true;
        Send(conn, AcceptMsg(id, attempt));
        break;
      case 3:
      case 4:
        Report(conn, m, key, ResultMsg(id, attempt, v1::OUTCOME_SUCCEEDED));
        break;
      case 5:
        Report(conn, m, key,
               ResultMsg(id, attempt, Pick(2) ? v1::OUTCOME_FAILED : v1::OUTCOME_CANCELLED));
        break;
      case 6: {
        if (h.accepted) break;  // an agent rejects before it accepts
        v1::AgentMessage msg;
        msg.mutable_reject()->set_task_id(id);
        msg.mutable_reject()->set_attempt(attempt);
        msg.mutable_reject()->set_code(static_cast<v1::RejectCode>(Pick(5)));
        msg.mutable_reject()->set_reason("random");
        m.held.erase(key);
        AfterEnd(m, id, false);
        Send(conn, msg);
        break;
      }
      default:
        Report(conn, m, key, ReleaseMsg(id, attempt, "random"));
        break;
    }
  }

  // A result for an attempt that is not the live one, or from an agent
  // that does not hold it: refused, nothing changes.
  void StaleResult() {
    if (conns_.empty() || acked_.empty()) return;
    auto it = conns_.begin();
    std::advance(it, Pick(static_cast<int>(conns_.size())));
    auto t = acked_.begin();
    std::advance(t, Pick(static_cast<int>(acked_.size())));
    const TaskRecord* rec = sched_->Find(*t);
    if (rec == nullptr) return;
    int attempt = rec->attempt - 1 - Pick(2);
    if (rec->agent_id != it->second && Pick(2) == 0) attempt = rec->attempt;  // foreign agent
    if (attempt == rec->attempt && rec->agent_id == it->second) return;
    const v1::TaskState state = rec->state;
    const int32_t live = rec->attempt;
    const size_t finished = rec->attempts.size();
    Send(it->first, ResultMsg(*t, attempt, v1::OUTCOME_SUCCEEDED));
    ++stale_;
    rec = sched_->Find(*t);
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->state, state) << "a stale result for " << *t << " attempt " << attempt
                                 << " from " << it->second << " changed its state";
    EXPECT_EQ(rec->attempt, live);
    EXPECT_EQ(rec->attempts.size(), finished);
  }

  // A result this agent produced was refused: the scheduler must have
  // ended that attempt in a way the agent could not report, or not count it.
  void CheckRefused(const std::string& id, int attempt, const v1::AgentMessage& report) {
    if (!report.has_result()) return;
    const TaskRecord* t = sched_->Find(id);
    if (t == nullptr) return;  // on disk: its history is not read back
    for (const v1::Attempt& a : t->attempts) {
      if (a.attempt() != attempt) continue;
      EXPECT_TRUE(a.interrupted() || a.result().outcome() == v1::OUTCOME_LOST)
          << "the result of " << id << " attempt " << attempt << " was refused, but the attempt "
          << "counts as " << v1::Outcome_Name(a.result().outcome()) << ": " << a.result().error();
      return;
    }
  }

  // Commits what the last step changed and follows what was sent: the
  // agents act on their messages (a Cancel of what they do not hold is
  // answered after).
  void Persist() {
    std::vector<std::pair<uint64_t, v1::AgentMessage>> answers;
    for (int round = 0; round < 10; ++round) {
      Effects fx = sched_->TakeEffects();
      for (const EventRow& e : fx.batch.events) {
        ASSERT_EQ(e.revision, last_revision_ + 1) << "revisions must go up by one";
        last_revision_ = e.revision;
      }
      absl::Status s = store_->Apply(fx.batch);
      ASSERT_TRUE(s.ok()) << s;
      for (const Outgoing& o : fx.messages) Deliver(o, &answers);
      for (uint64_t conn : fx.close_conns) {
        auto agent = conns_.find(conn);
        if (agent == conns_.end()) continue;
        // Ended by the scheduler (silent past its heartbeat timeout): the
        // agent fences itself as for any stream that ends.
        StreamEnded(agents_[agent->second], Options().StopOnLostAfter(), /*forget=*/false);
      }
      if (answers.empty()) return;
      for (const auto& [conn, msg] : answers) {
        if (conns_.count(conn) > 0) Send(conn, msg);
      }
      answers.clear();
    }
  }

  void Deliver(const Outgoing& o, std::vector<std::pair<uint64_t, v1::AgentMessage>>* answers) {
    auto agent = conns_.find(o.conn);
    if (agent == conns_.end()) return;
    AgentModel& m = agents_[agent->second];
    auto deliver_one = [&](const v1::SchedulerMessage& msg) {
      if (msg.has_assign()) {
        for (const v1::Assignment& a : msg.assign().tasks()) {
          Trace("assign ", a.task_id(), " attempt ", a.attempt(), " to ", agent->second,
                a.run_after().empty() ? "" : " after " + a.run_after());
          CheckOneCopy(a.task_id(), a.attempt(), agent->second);
          Held h;
          h.pred = a.run_after();
          h.started = a.run_after().empty();
          m.held[{a.task_id(), a.attempt()}] = h;
        }
      } else if (msg.has_result_ack()) {
        const v1::ResultAck& ack = msg.result_ack();
        auto it = m.held.find({ack.task_id(), ack.attempt()});
        if (it != m.held.end()) {
          if (!ack.accepted()) CheckRefused(ack.task_id(), ack.attempt(), it->second.report);
          m.held.erase(it);
        }
      } else if (msg.has_cancel()) {
        const Key key{msg.cancel().task_id(), msg.cancel().attempt()};
        Trace("cancel ", key.first, " attempt ", key.second, " to ", agent->second);
        auto it = m.held.find(key);
        if (it == m.held.end()) {
          answers->push_back(
              {o.conn, ReleaseMsg(key.first, key.second, "not held", /*not_held=*/true)});
        } else if (!it->second.started && !it->second.finished) {
          // A waiting link: dropped, and said so (with the links after it).
          it->second.alive = false;
          it->second.finished = true;
          it->second.report = ReleaseMsg(key.first, key.second, "cancelled before it started");
          AfterEnd(m, key.first, false);
          answers->push_back({o.conn, it->second.report});
        }
        // Running: it stops, and says so when the walk has it report.
      } else if (msg.has_restart_hold()) {
        m.restart_hold = FromProto(msg.restart_hold().hold());
      }
    };
    if (o.msg.has_batch()) {
      for (const v1::SchedulerMessage& msg : o.msg.batch().msgs()) deliver_one(msg);
    } else {
      deliver_one(o.msg);
    }
  }

  void OpenStore() {
    store_.reset();
    auto s = store::SqliteStore::Open({dir_.path(), store::Durability::kNormal});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }

  // A new scheduler reads the table back, as a restarted process does; the
  // agents' streams are gone, their memory of what they hold is not.
  void Restart(bool reopen_store) {
    Persist();
    // Each task's history as the scheduler has it: a restart must read the
    // same back (what the store trimmed, and the counts of what it dropped).
    std::map<std::string, std::tuple<std::vector<int32_t>, int32_t, int32_t>> history;
    for (const std::string& id : acked_) {
      const TaskRecord* rec = sched_->Find(id);
      if (rec == nullptr) continue;
      std::vector<int32_t> numbers;
      for (const v1::Attempt& a : rec->attempts) numbers.push_back(a.attempt());
      history[id] = {numbers, rec->attempts_dropped, rec->interrupted_dropped};
    }
    ++restarts_;
    Trace("scheduler restarts");
    // The agents hold their running steps through the restart, at most the
    // restart grace less a second from when their streams ended.
    for (auto& [name, m] : agents_) {
      if (m.conn != 0) StreamEnded(m, Options().RestartGrace() - absl::Seconds(1), false);
    }
    conns_.clear();
    if (reopen_store) OpenStore();
    // The scheduler is down for a while, of any length up to three restart
    // graces: the agents' attempts wait out the restart grace from the
    // restore on, whatever the outage was.
    clock_.Advance(absl::Milliseconds(Pick(90'000)));
    StopDue();
    sched_ = std::make_unique<Scheduler>(&clock_, Options());
    // As Engine::Restore: finished rows light, the others whole, then what
    // the others need read back whole.
    auto span = store_->GetEventSpan();
    ASSERT_TRUE(span.ok()) << span.status();
    ASSERT_EQ(span->newest, last_revision_) << "the store lost events";
    const int64_t oldest = span->oldest > 0 ? span->oldest : span->newest + 1;
    ASSERT_TRUE(sched_->BeginRestore(0, span->newest, oldest).ok());
    absl::Status s = store_->ScanTasks(
        [&](std::vector<TaskRow>* rows) -> absl::Status {
          std::vector<std::unique_ptr<TaskRecord>> records;
          std::vector<TaskRow> light;
          for (TaskRow& row : *rows) {
            if (row.light) {
              light.push_back(std::move(row));
              continue;
            }
            std::vector<AttemptRow> of;
            std::vector<MergedRow> merged;
            if (absl::Status h = store_->ReadHistory({row.id}, &of, &merged); !h.ok()) return h;
            auto rec = FromStored(std::move(row), of, merged);
            if (!rec.ok()) return rec.status();
            records.push_back(std::move(*rec));
          }
          if (absl::Status c = sched_->RestoreCold(light); !c.ok()) return c;
          return sched_->RestoreTasks(&records);
        },
        /*light_finished=*/true);
    ASSERT_TRUE(s.ok()) << s;
    for (std::vector<int64_t> need = sched_->RestoreNeeds(); !need.empty();
         need = sched_->RestoreNeeds()) {
      auto stored = store_->ReadTasks(need);
      ASSERT_TRUE(stored.ok()) << stored.status();
      std::vector<std::unique_ptr<TaskRecord>> records;
      for (StoredTask& st : *stored) {
        auto rec = FromStored(std::move(st.row), st.attempts, st.merged);
        ASSERT_TRUE(rec.ok()) << rec.status();
        records.push_back(std::move(*rec));
      }
      ASSERT_TRUE(sched_->RestoreTasks(&records).ok());
    }
    ASSERT_TRUE(sched_->FinishRestore().ok());
    ASSERT_EQ(sched_->last_revision(), last_revision_);
    for (const auto& [id, before] : history) {
      const TaskRecord* rec = sched_->Find(id);
      if (rec == nullptr) {
        ASSERT_NE(sched_->FindCold(id), nullptr) << id;  // finished: stays on disk
        continue;
      }
      std::vector<int32_t> numbers;
      for (const v1::Attempt& a : rec->attempts) numbers.push_back(a.attempt());
      EXPECT_EQ(std::make_tuple(numbers, rec->attempts_dropped, rec->interrupted_dropped), before)
          << "the history of " << id << " changed across a restart";
    }
  }

  std::mt19937_64 rng_;
  FakeClock clock_;
  testing::TempDir dir_;
  std::unique_ptr<store::SqliteStore> store_;
  std::unique_ptr<Scheduler> sched_;
  std::set<std::string> acked_;
  std::map<uint64_t, std::string> conns_;     // live streams: conn -> agent id
  std::map<std::string, AgentModel> agents_;  // by agent id
  uint64_t next_conn_ = 1;
  int next_id_ = 1;
  int64_t last_revision_ = 0;
  int restarts_ = 0;
  int stale_ = 0;
  int warmed_ = 0;
  int deleted_ = 0;
};

TEST(RandomWalk, NothingLostNothingCommittedTwiceNothingStuck) {
  const int steps = EnvInt("TASKGRID_RANDOM_STEPS", 1000);
  std::vector<uint64_t> seeds = {1, 2, 3};
  if (const int one = EnvInt("TASKGRID_RANDOM_SEED", 0); one > 0) seeds = {uint64_t(one)};
  for (uint64_t seed : seeds) {
    Walk walk(seed);
    for (int step = 0; step < steps; ++step) {
      SCOPED_TRACE(absl::StrCat("TASKGRID_RANDOM_SEED=", seed, " step ", step));
      walk.Step();
      if (::testing::Test::HasFailure()) return;
    }
    SCOPED_TRACE(absl::StrCat("TASKGRID_RANDOM_SEED=", seed, " finishing"));
    walk.Finish();
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace taskgrid::core
