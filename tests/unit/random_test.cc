// A seeded random walk over the scheduler core and the real SQLite store:
// submits (tasks and small jobs), cancels, retries, resets, pauses and
// resumes, agents that connect, accept, finish, reject, release, send
// stale or foreign results, crash and come back inside or after the grace,
// clock jumps, finished tasks leaving memory for disk (and read back before
// an operation on them, as the Engine does), deletes, and restarts after
// outages of any length up to three restart graces that read the table
// back from SQLite (finished rows light). After every step:
//   - every invariant of the scheduler holds;
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
    for (auto& [conn, agent] : conns_) sched_->Disconnect(conn);
    conns_.clear();
    Persist();
    for (int i = 0; i < 10; ++i) {
      clock_.Advance(absl::Minutes(1));
      sched_->Tick();
      Persist();
    }
    for (const std::string& id : acked_) (void)sched_->Resume(id);
    Persist();
    v1::Hello h;
    h.set_agent_id("finisher");
    h.set_slots(64);
    const uint64_t conn = next_conn_++;
    ASSERT_TRUE(sched_->Connect(conn, h).ok());
    conns_[conn] = "finisher";
    Persist();
    for (int round = 0; round < 500 && !AllTerminal(); ++round) {
      // Whatever it holds, including what finishing one hands it next.
      for (int pass = 0; pass < 100 && !held_[conn].empty(); ++pass) {
        const std::set<std::pair<std::string, int>> held = held_[conn];
        for (const auto& [id, attempt] : held) {
          Send(conn, AcceptMsg(id, attempt));
          Send(conn, ResultMsg(id, attempt, v1::OUTCOME_SUCCEEDED));
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
    if (Pick(8) == 0) s.mutable_attempt_timeout()->set_seconds(3);
    if (Pick(8) == 0) s.mutable_schedule_timeout()->set_seconds(20);
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

  void ConnectAgent() {
    const std::string agent = absl::StrCat("a", Pick(3));
    v1::Hello h;
    h.set_agent_id(agent);
    h.set_slots(1 + Pick(3));
    h.set_chains(Pick(2) == 0);
    // Coming back: it names the attempts it still holds (or some of them).
    for (const auto& [id, attempt] : memory_[agent]) {
      if (Pick(4) == 0) continue;
      v1::AttemptRef* r = h.add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
    }
    const uint64_t conn = next_conn_++;
    if (sched_->Connect(conn, h).ok()) conns_[conn] = agent;
  }

  void CrashAgent() {
    if (conns_.empty()) return;
    auto it = conns_.begin();
    std::advance(it, Pick(static_cast<int>(conns_.size())));
    sched_->Disconnect(it->first);
    conns_.erase(it);
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

  void Send(uint64_t conn, const v1::AgentMessage& m) { sched_->OnAgentMessage(conn, m); }

  void Heartbeat(uint64_t conn) {
    v1::AgentMessage m;
    for (const auto& [id, attempt] : held_[conn]) {
      v1::AttemptRef* r = m.mutable_heartbeat()->add_running();
      r->set_task_id(id);
      r->set_attempt(attempt);
    }
    m.mutable_heartbeat();
    Send(conn, m);
  }

  // A connected agent says something about an attempt it was given.
  void AgentSays() {
    if (conns_.empty()) return;
    auto it = conns_.begin();
    std::advance(it, Pick(static_cast<int>(conns_.size())));
    const uint64_t conn = it->first;
    std::set<std::pair<std::string, int>>& held = held_[conn];
    if (held.empty() || Pick(5) == 0) {
      Heartbeat(conn);
      return;
    }
    auto h = held.begin();
    std::advance(h, Pick(static_cast<int>(held.size())));
    const auto [id, attempt] = *h;
    switch (Pick(8)) {
      case 0:
      case 1:
      case 2:
        Send(conn, AcceptMsg(id, attempt));
        break;
      case 3:
      case 4:
        Send(conn, ResultMsg(id, attempt, v1::OUTCOME_SUCCEEDED));
        break;
      case 5:
        Send(conn, ResultMsg(id, attempt, Pick(2) ? v1::OUTCOME_FAILED : v1::OUTCOME_CANCELLED));
        break;
      case 6: {
        v1::AgentMessage m;
        m.mutable_reject()->set_task_id(id);
        m.mutable_reject()->set_attempt(attempt);
        m.mutable_reject()->set_code(static_cast<v1::RejectCode>(Pick(5)));
        m.mutable_reject()->set_reason("random");
        Send(conn, m);
        held.erase(h);
        memory_[it->second].erase({id, attempt});
        break;
      }
      default: {
        v1::AgentMessage m;
        m.mutable_release()->set_task_id(id);
        m.mutable_release()->set_attempt(attempt);
        m.mutable_release()->set_reason("random");
        Send(conn, m);
        held.erase(h);
        memory_[it->second].erase({id, attempt});
        break;
      }
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

  // Commits what the last step changed and follows what was sent.
  void Persist() {
    Effects fx = sched_->TakeEffects();
    for (const EventRow& e : fx.batch.events) {
      ASSERT_EQ(e.revision, last_revision_ + 1) << "revisions must go up by one";
      last_revision_ = e.revision;
    }
    absl::Status s = store_->Apply(fx.batch);
    ASSERT_TRUE(s.ok()) << s;
    for (const Outgoing& o : fx.messages) {
      auto agent = conns_.find(o.conn);
      if (agent == conns_.end()) continue;
      if (o.msg.has_assign()) {
        for (const v1::Assignment& a : o.msg.assign().tasks()) {
          held_[o.conn].insert({a.task_id(), a.attempt()});
          memory_[agent->second].insert({a.task_id(), a.attempt()});
        }
      } else if (o.msg.has_result_ack()) {
        const v1::ResultAck& ack = o.msg.result_ack();
        held_[o.conn].erase({ack.task_id(), ack.attempt()});
        memory_[agent->second].erase({ack.task_id(), ack.attempt()});
      }
    }
    for (uint64_t conn : fx.close_conns) conns_.erase(conn);
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
    conns_.clear();
    held_.clear();
    if (reopen_store) OpenStore();
    // The scheduler is down for a while, of any length up to three restart
    // graces: the agents' attempts wait out the restart grace from the
    // restore on, whatever the outage was.
    clock_.Advance(absl::Milliseconds(Pick(90'000)));
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
  std::map<uint64_t, std::string> conns_;  // live streams: conn -> agent id
  std::map<uint64_t, std::set<std::pair<std::string, int>>> held_;       // by stream
  std::map<std::string, std::set<std::pair<std::string, int>>> memory_;  // by agent id
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
