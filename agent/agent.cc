#include "agent/agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/batching.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/message_limits.h"
#include "common/proto_time.h"

namespace taskgrid::agent {

namespace {
constexpr char kVersion[] = "0.1.0";

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> creds) {
  grpc::ChannelArguments args;
  // The heartbeats and their acks prove the stream alive; a keepalive ping
  // goes out only after this long without anything read, so with
  // heartbeats every few seconds there are none. A short keepalive time cost
  // the scheduler a ping per agent every 5 s once the heartbeat interval
  // grew past it. Setting it also turns on TCP_USER_TIMEOUT (the keepalive
  // timeout): a heartbeat that a dead scheduler or network does not take
  // breaks the stream within 5 s. The scheduler accepts pings this often
  // (scheduler/service/server.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(kMaxReplyBytes);
  if (creds == nullptr) creds = grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(target, creds, args);
}

// "30s", "1.5s", "0s" (absl says "0").
std::string Format(absl::Duration d) {
  return d == absl::ZeroDuration() ? "0s" : absl::FormatDuration(d);
}

int32_t SlotsOf(const v1::Assignment& a) { return a.slots() > 0 ? a.slots() : 1; }

AgentOptions WithDefaults(AgentOptions opts) {
  if (opts.exec.work_dir.empty()) opts.exec.work_dir = DefaultWorkDir(opts.id);
  return opts;
}

// How long a Goodbye waits for the scheduler to close the stream.
constexpr absl::Duration kGoodbyeWait = absl::Seconds(2);

v1::AgentMessage RejectMsg(const v1::Assignment& a, v1::RejectCode code, std::string reason) {
  v1::AgentMessage m;
  m.mutable_reject()->set_task_id(a.task_id());
  m.mutable_reject()->set_attempt(a.attempt());
  m.mutable_reject()->set_reason(std::move(reason));
  m.mutable_reject()->set_code(code);
  return m;
}

v1::AgentMessage AcceptMsg(const v1::Assignment& a) {
  v1::AgentMessage m;
  m.mutable_accept()->set_task_id(a.task_id());
  m.mutable_accept()->set_attempt(a.attempt());
  return m;
}
}  // namespace

Agent::Agent(AgentOptions opts) : opts_(WithDefaults(std::move(opts))) {}

Agent::~Agent() { Stop(); }

absl::Duration Agent::Now() { return RealClock::Get()->Monotonic(); }

int Agent::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

int Agent::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

int Agent::unacked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(unacked_.size());
}

bool Agent::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool Agent::StartDrainingLocked() {
  if (draining_) return false;
  draining_ = true;
  spdlog::info("draining: taking no more work; {} task(s) still running", running_.size());
  cv_.notify_all();
  return true;
}

void Agent::StopTakingWork() {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = StartDrainingLocked();
  }
  // When there is no stream now, the next Hello says draining (and Draining
  // follows its Welcome).
  if (first) {
    v1::AgentMessage m;
    m.mutable_draining();
    Write(m);
  }
}

void Agent::Drain(absl::Duration timeout) {
  timeout = std::max(timeout, absl::ZeroDuration());
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = StartDrainingLocked();
    const absl::Duration now = Now();
    exiting_ = true;
    if (!drain_expired_ && now + timeout < drain_deadline_) {
      drain_deadline_ = now + timeout;
      drain_timeout_ = timeout;
      exit_deadline_ =
          std::min(exit_deadline_, drain_deadline_ + opts_.exec.kill_grace + opts_.stop_flush);
      if (timeout > absl::ZeroDuration()) {
        spdlog::info("drain: waiting up to {} for {} running task(s), then exiting",
                     Format(timeout), running_.size());
      }
    }
    if (threads_ == 0) exit_deadline_ = std::min(exit_deadline_, now + opts_.stop_flush);
    if (!drain_expired_ && now >= drain_deadline_) {
      drain_expired_ = true;
      const int n = StopRunningLocked(StopCause::kReleased,
                                      "agent drained: " + Format(drain_timeout_) + " passed");
      if (n > 0) spdlog::info("drain: releasing {} running task(s) at once", n);
    }
    cv_.notify_all();
  }
  if (first) {
    v1::AgentMessage m;
    m.mutable_draining();
    Write(m);
  }
}

int Agent::StopRunningLocked(StopCause cause, const std::string& note) {
  int n = 0;
  for (auto& [id, r] : running_) {
    if (r.cause != StopCause::kNone) continue;
    r.cause = cause;
    r.note = note;
    r.run->Cancel();
    ++n;
  }
  if (!waiting_.empty()) {
    std::vector<std::string> ids;
    for (const auto& [pred, a] : waiting_) ids.push_back(a.task_id());
    waiting_.clear();
    spdlog::info("dropped {} waiting chain link(s) ({}): {}", ids.size(), absl::StrJoin(ids, ", "),
                 note);
  }
  return n;
}

std::vector<std::string> Agent::DropChainLocked(std::string pred) {
  std::vector<std::string> dropped;
  for (auto it = waiting_.find(pred); it != waiting_.end(); it = waiting_.find(pred)) {
    pred = it->second.task_id();
    dropped.push_back(pred);
    waiting_.erase(it);
  }
  return dropped;
}

std::map<std::string, v1::Assignment>::iterator Agent::FindWaitingLocked(
    const std::string& task_id) {
  return std::find_if(waiting_.begin(), waiting_.end(),
                      [&](const auto& e) { return e.second.task_id() == task_id; });
}

void Agent::ListHeldLocked(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const {
  for (const auto& [id, r] : running_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(id);
    ref->set_attempt(r.run->assignment().attempt());
  }
  // Not started yet, but the scheduler counts them as ours (DISPATCHED):
  // unlisted, they would be failed as lost.
  for (const auto& [pred, a] : waiting_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(a.task_id());
    ref->set_attempt(a.attempt());
    ref->set_waiting(true);
  }
}

bool Agent::DrainCompleteLocked() const {
  return exiting_ && ((threads_ == 0 && unacked_.empty()) || Now() >= exit_deadline_);
}

int Agent::Run() {
  std::thread timer([this] { TimerLoop(); });
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = opts_.reconnect_min;
  int sessions = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (DrainCompleteLocked()) break;
    }
    ++sessions;
    const absl::Duration start = Now();
    Session();
    if (Now() - start > absl::Seconds(10)) backoff = opts_.reconnect_min;
    // Full jitter: agents that lost one scheduler do not return in lockstep.
    std::uniform_int_distribution<int64_t> jitter(0, absl::ToInt64Microseconds(backoff));
    const absl::Duration wait = absl::Microseconds(jitter(rng)) + opts_.reconnect_min;
    backoff = std::min(backoff * 2, opts_.reconnect_max);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [this] { return DrainCompleteLocked(); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run_done_ = true;
    cv_.notify_all();
  }
  timer.join();
  // Task threads hold `this`: wait for them. Normally none is left; past the
  // exit deadline any still running is cancelled now and ends within
  // kill_grace.
  std::unique_lock<std::mutex> lock(mu_);
  const int left = StopRunningLocked(StopCause::kReleased, "agent exited");
  cv_.wait(lock, [this] { return threads_ == 0; });
  if (left > 0 || !unacked_.empty()) {
    spdlog::warn("drained: exiting with {} result(s) not acknowledged by the scheduler",
                 unacked_.size());
  } else {
    spdlog::info("drained: every result was handed over");
  }
  return sessions;
}

void Agent::Session() {
  // A fresh channel per attempt: a channel that saw the scheduler go away
  // keeps failing calls fast for its own backoff (seconds), while ours is
  // bounded by reconnect_max, well inside the scheduler's reconnect grace.
  std::unique_ptr<v1::AgentService::Stub> stub =
      v1::AgentService::NewStub(MakeChannel(opts_.scheduler, opts_.credentials));
  grpc::ClientContext ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = &ctx;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>> stream =
      stub->Connect(&ctx);
  v1::AgentMessage hello;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v1::Hello* h = hello.mutable_hello();
    h->set_agent_id(opts_.id);
    h->set_slots(opts_.slots);
    h->set_version(kVersion);
    h->set_draining(draining_);
    h->set_chains(true);
    h->set_batches(true);
    h->set_adaptive_heartbeat(true);
    for (const auto& [k, v] : opts_.labels) (*h->mutable_labels())[k] = v;
    ListHeldLocked(h->mutable_running());
    // Finished but unacknowledged attempts (Result or Release) are still
    // ours: the scheduler must keep them until the messages, resent after
    // Welcome, arrive.
    for (const auto& [key, m] : unacked_) {
      v1::AttemptRef* ref = h->add_running();
      ref->set_task_id(key.first);
      ref->set_attempt(key.second);
    }
  }
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    batches_ = false;  // until this stream's Welcome says otherwise
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease_.HelloSent(Now());
  }
  bool ok = stream->Write(hello);
  if (ok) {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = stream.get();
    std::lock_guard<std::mutex> out_lock(out_mu_);
    connected_ = true;
  }
  v1::SchedulerMessage msg;
  while (ok && stream->Read(&msg)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lease_.Heard(Now());
    }
    Handle(msg);
  }
  {
    // What is queued now would go nowhere (results are resent after the
    // next Welcome); later Writes say they were dropped.
    std::lock_guard<std::mutex> out_lock(out_mu_);
    connected_ = false;
    out_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
    // The scheduler may have seen the stream end too, and then moves the
    // tasks after its grace, however long the lease.
    lease_.StreamEnded(Now(), welcomed_);
  }
  // After Read() returned false the call is over and Finish() gives the
  // scheduler's status; a failed Hello needs the call cancelled first.
  if (!ok) ctx.TryCancel();
  grpc::Status st = stream->Finish();
  bool exiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exiting = exiting_;
  }
  if (exiting) {  // the final line of Run() says what was left unacknowledged
    welcomed_ = false;
    return;
  }
  if (welcomed_) {
    spdlog::warn("stream to {} ended ({}: {}); reconnecting", opts_.scheduler,
                 static_cast<int>(st.error_code()), st.error_message());
    welcomed_ = false;
    last_unreachable_log_ = Now();
  } else if (Now() - last_unreachable_log_ > absl::Seconds(10)) {
    // Once per 10 s while the scheduler stays unreachable, not per attempt.
    const bool refused = st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                         st.error_code() == grpc::StatusCode::PERMISSION_DENIED;
    spdlog::warn("{} at {}: {}",
                 refused ? "the scheduler refused this agent" : "cannot reach the scheduler",
                 opts_.scheduler, FromGrpcStatus(st).ToString());
    last_unreachable_log_ = Now();
  }
}

bool Agent::Write(v1::AgentMessage msg) {
  std::vector<v1::AgentMessage> msgs;
  msgs.push_back(std::move(msg));
  return WriteAll(std::move(msgs));
}

bool Agent::WriteAll(std::vector<v1::AgentMessage> msgs) {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!connected_) return false;
    for (v1::AgentMessage& m : msgs) out_.push_back(std::move(m));
    if (writing_) return true;  // the writing thread takes them along
    writing_ = true;
  }
  std::lock_guard<std::mutex> write_lock(write_mu_);
  for (;;) {
    v1::AgentMessage next;
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      if (out_.empty()) {
        writing_ = false;
        return true;
      }
      next = TakeBatch(out_, batches_);
    }
    if (stream_ != nullptr) stream_->Write(next);
  }
}

void Agent::Handle(const v1::SchedulerMessage& msg) {
  switch (msg.msg_case()) {
    case v1::SchedulerMessage::kWelcome: {
      bool draining;
      {
        std::lock_guard<std::mutex> lock(out_mu_);
        batches_ = msg.welcome().batches();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        const absl::Duration hb = FromProto(msg.welcome().heartbeat_interval());
        if (hb > absl::ZeroDuration()) heartbeat_interval_ = hb;
        // It answers the Hello.
        lease_.Welcomed(Now(), FromProto(msg.welcome().stop_on_lost_after()),
                        FromProto(msg.welcome().heartbeat_lease()));
        welcome_max_output_bytes_ = msg.welcome().max_output_bytes();
        draining = draining_;
        cv_.notify_all();
      }
      welcomed_ = true;
      spdlog::info("connected to {} as {} (session {})", opts_.scheduler, opts_.id,
                   msg.welcome().session_id());
      // Hello said so too, unless the drain began while it was on its way.
      if (draining) {
        v1::AgentMessage m;
        m.mutable_draining();
        Write(m);
      }
      ResendUnacked();
      break;
    }
    case v1::SchedulerMessage::kAssign:
      OnAssign(msg.assign());
      break;
    case v1::SchedulerMessage::kBatch:
      for (const v1::SchedulerMessage& m : msg.batch().msgs()) {
        if (!m.has_batch()) Handle(m);
      }
      break;
    case v1::SchedulerMessage::kCancel:
      OnCancel(msg.cancel());
      break;
    case v1::SchedulerMessage::kResultAck: {
      const v1::ResultAck& ack = msg.result_ack();
      if (!ack.accepted()) {
        spdlog::warn("result of {} attempt {} was stale: the scheduler did not take it",
                     ack.task_id(), ack.attempt());
      }
      std::lock_guard<std::mutex> lock(mu_);
      unacked_.erase({ack.task_id(), ack.attempt()});
      cv_.notify_all();
      break;
    }
    case v1::SchedulerMessage::kDrain:
      spdlog::info("the scheduler asked this agent to drain");
      StopTakingWork();
      break;
    case v1::SchedulerMessage::kHeartbeatAck:
      OnHeartbeatAck(msg.heartbeat_ack());
      break;
    default:  // contact, noted by Session()
      break;
  }
}

void Agent::OnHeartbeatAck(const v1::HeartbeatAck& ack) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_.HeartbeatAcked(FromProto(ack.heartbeat_lease()));
  const absl::Duration interval = FromProto(ack.heartbeat_interval());
  if (interval > absl::ZeroDuration() && interval != heartbeat_interval_) {
    spdlog::info("heartbeat interval now {} (was {}), as the scheduler asks", Format(interval),
                 Format(heartbeat_interval_));
    heartbeat_interval_ = interval;
    cv_.notify_all();  // the timer thread recomputes when the next one is due
  }
}

void Agent::OnAssign(const v1::Assign& assign) {
  std::vector<v1::AgentMessage> replies;
  std::vector<std::shared_ptr<TaskRun>> starts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, bool> earlier;
    for (const v1::Assignment& a : assign.tasks()) AdmitLocked(a, &earlier, &replies, &starts);
    threads_ += static_cast<int>(starts.size());
  }
  // Tasks that cannot wait (noop, echo, fail) run right here, and their
  // Results go out with the Accepts, after them: one message for the whole
  // Assign when the scheduler reads batches, and no thread hand-off.
  for (std::shared_ptr<TaskRun>& run : starts) {
    spdlog::info("running {} attempt {}", run->assignment().task_id(), run->assignment().attempt());
    if (run->instant()) TaskThread(std::move(run), &replies);
  }
  // Accepts go out before the other tasks can finish and send their Results.
  WriteAll(std::move(replies));
  for (std::shared_ptr<TaskRun>& run : starts) {
    if (run != nullptr) workers_.Run([this, run = std::move(run)] { TaskThread(run); });
  }
}

void Agent::AdmitLocked(const v1::Assignment& a, std::map<std::string, bool>* earlier,
                        std::vector<v1::AgentMessage>* replies,
                        std::vector<std::shared_ptr<TaskRun>>* starts) {
  const int32_t slots = SlotsOf(a);
  auto running = running_.find(a.task_id());
  auto waiting = FindWaitingLocked(a.task_id());
  bool& held = (*earlier)[a.task_id()];
  held = false;
  // A repeat of an attempt held here: accepted again if it runs, still
  // silent while it waits.
  if (running != running_.end() && running->second.run->assignment().attempt() == a.attempt()) {
    replies->push_back(AcceptMsg(a));
    held = true;
    return;
  }
  if (waiting != waiting_.end() && waiting->second.attempt() == a.attempt()) {
    held = true;
    return;
  }
  const bool busy = running != running_.end() || waiting != waiting_.end();
  if (a.run_after().empty()) {
    if (draining_ || busy || used_slots_ + slots > opts_.slots) {
      if (draining_) {
        replies->push_back(RejectMsg(a, v1::REJECT_CODE_DRAINING, "agent is draining"));
      } else if (busy) {
        replies->push_back(
            RejectMsg(a, v1::REJECT_CODE_BUSY, "another attempt of this task is running here"));
      } else {
        replies->push_back(RejectMsg(a, v1::REJECT_CODE_NO_SLOTS, "no free slots"));
      }
      return;
    }
    replies->push_back(AcceptMsg(a));
    starts->push_back(StartLocked(a));
    held = true;
    return;
  }

  // A chain link.
  const std::string& pred = a.run_after();
  auto before = earlier->find(pred);
  if (before == earlier->end() || pred == a.task_id()) {
    replies->push_back(
        RejectMsg(a, v1::REJECT_CODE_INVALID,
                  "run_after \"" + pred + "\" is not an earlier entry of this Assign"));
    return;
  }
  if (!before->second) {  // rejected or dropped: the scheduler ends this one too
    spdlog::info("dropped chain link {} attempt {}: {} is not held here", a.task_id(), a.attempt(),
                 pred);
    return;
  }
  int32_t pred_slots = 0;
  if (auto r = running_.find(pred); r != running_.end()) {
    pred_slots = r->second.slots;
  } else if (auto w = FindWaitingLocked(pred); w != waiting_.end()) {
    pred_slots = SlotsOf(w->second);
  }
  std::string reason;
  v1::RejectCode code = v1::REJECT_CODE_INVALID;
  if (draining_) {
    code = v1::REJECT_CODE_DRAINING;
    reason = "agent is draining";
  } else if (busy) {
    code = v1::REJECT_CODE_BUSY;
    reason = "another attempt of this task is running here";
  } else if (waiting_.count(pred) > 0) {
    reason = "another chain link already runs after " + pred;
  } else if (slots > pred_slots) {
    // It takes the slots its predecessor frees, and nothing else.
    reason = absl::StrCat("a chain link needs ", slots, " slot(s), more than the ", pred_slots,
                          " of ", pred, " that it runs after");
  }
  if (!reason.empty()) {
    replies->push_back(RejectMsg(a, code, std::move(reason)));
    return;
  }
  waiting_[pred] = a;
  held = true;
  spdlog::info("{} attempt {} waits for {}", a.task_id(), a.attempt(), pred);
}

std::shared_ptr<TaskRun> Agent::StartLocked(v1::Assignment a) {
  ExecutorOptions exec = opts_.exec;
  // The smaller of our own cap and the scheduler's.
  if (welcome_max_output_bytes_ > 0) {
    exec.max_output_bytes = std::min(exec.max_output_bytes, welcome_max_output_bytes_);
  }
  const std::string id = a.task_id();
  const int32_t slots = SlotsOf(a);
  auto run = std::make_shared<TaskRun>(std::move(a), exec);
  Running& r = running_[id];
  r.run = run;
  r.slots = slots;
  used_slots_ += slots;
  return run;
}

void Agent::OnCancel(const v1::Cancel& c) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = running_.find(c.task_id());
  if (it != running_.end() && it->second.run->assignment().attempt() == c.attempt()) {
    // Its waiting successors are dropped when it ends cancelled.
    spdlog::info("cancelling {} attempt {}", c.task_id(), c.attempt());
    it->second.run->Cancel();
    return;
  }
  auto w = FindWaitingLocked(c.task_id());
  if (w != waiting_.end() && w->second.attempt() == c.attempt()) {
    const std::vector<std::string> dropped = DropChainLocked(w->first);
    spdlog::info("cancelled waiting chain link(s) {}", absl::StrJoin(dropped, ", "));
  }
}

void Agent::TaskThread(std::shared_ptr<TaskRun> run, std::vector<v1::AgentMessage>* sink) {
  while (run != nullptr) {
    v1::TaskResult result = run->Run();
    const v1::Assignment& a = run->assignment();
    v1::AgentMessage msg;
    // About the chain link after this task: Accept (then `next` runs on this
    // thread) or Release.
    v1::AgentMessage link_msg;
    std::shared_ptr<TaskRun> next;
    std::vector<std::string> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      StopCause cause = StopCause::kNone;
      std::string note;
      auto it = running_.find(a.task_id());
      if (it != running_.end() && it->second.run == run) {
        cause = it->second.cause;
        note = std::move(it->second.note);
        used_slots_ -= it->second.slots;
        running_.erase(it);
      }
      // A task that ended on its own just before the agent stopped it keeps
      // its real result.
      const bool stopped_by_us = result.outcome() == v1::OUTCOME_CANCELLED;
      const bool succeeded = result.outcome() == v1::OUTCOME_SUCCEEDED;
      if (cause == StopCause::kReleased && stopped_by_us) {
        v1::Release* r = msg.mutable_release();
        r->set_task_id(a.task_id());
        r->set_attempt(a.attempt());
        r->set_reason(note);
      } else {
        if (cause == StopCause::kFenced && stopped_by_us) result.set_error(note);
        v1::Result* r = msg.mutable_result();
        r->set_task_id(a.task_id());
        r->set_attempt(a.attempt());
        *r->mutable_result() = std::move(result);
      }
      unacked_[{a.task_id(), a.attempt()}] = msg;

      // When the agent fences itself or its drain runs out it drops every
      // waiting link at once (StopRunningLocked): a task that still ends
      // SUCCEEDED after that finds no link here.
      auto link = waiting_.find(a.task_id());
      if (link != waiting_.end() && !succeeded) {
        dropped = DropChainLocked(a.task_id());
      } else if (link != waiting_.end() && draining_) {
        const v1::Assignment& l = link->second;
        v1::Release* r = link_msg.mutable_release();
        r->set_task_id(l.task_id());
        r->set_attempt(l.attempt());
        r->set_reason("agent is draining");
        unacked_[{l.task_id(), l.attempt()}] = link_msg;
        const std::string link_id = l.task_id();
        waiting_.erase(link);
        dropped = DropChainLocked(link_id);
      } else if (link != waiting_.end()) {
        v1::Assignment l = std::move(link->second);
        waiting_.erase(link);
        // What a task hands on: its output file, else its stdout.
        const v1::TaskResult& done = msg.result().result();
        (*l.mutable_inputs())[a.task_id()] = done.has_output() ? done.output() : done.stdout_tail();
        link_msg = AcceptMsg(l);
        next = StartLocked(std::move(l));  // in the slot(s) just freed
      }
    }
    if (msg.has_release()) {
      spdlog::info("{} attempt {} released: {}", a.task_id(), a.attempt(), msg.release().reason());
    } else {
      spdlog::info("{} attempt {} finished: {}", a.task_id(), a.attempt(),
                   v1::Outcome_Name(msg.result().result().outcome()));
    }
    if (!dropped.empty()) {
      spdlog::info("dropped chain link(s) after {}: {}", a.task_id(), absl::StrJoin(dropped, ", "));
    }
    // If the stream is down, ResendUnacked() sends it after Welcome. A link's
    // Accept follows its predecessor's Result.
    if (link_msg.has_release()) {
      spdlog::info("{} attempt {} released: agent is draining", link_msg.release().task_id(),
                   link_msg.release().attempt());
    }
    std::vector<v1::AgentMessage> out;
    out.push_back(std::move(msg));
    if (link_msg.msg_case() != v1::AgentMessage::MSG_NOT_SET) out.push_back(std::move(link_msg));
    if (sink == nullptr) {
      WriteAll(std::move(out));
    } else {
      for (v1::AgentMessage& m : out) sink->push_back(std::move(m));
    }
    if (next != nullptr) {
      spdlog::info("running {} attempt {} after {}", next->assignment().task_id(),
                   next->assignment().attempt(), a.task_id());
    }
    if (sink != nullptr && next != nullptr && !next->instant()) {
      // A link that may wait goes to a pooled thread, still counted in
      // threads_; what it answers must follow what this run sent.
      WriteAll(std::move(*sink));
      sink->clear();
      workers_.Run([this, next = std::move(next)] { TaskThread(next); });
      return;
    }
    run = std::move(next);
  }
  std::lock_guard<std::mutex> lock(mu_);
  --threads_;
  if (exiting_ && threads_ == 0) {
    exit_deadline_ = std::min(exit_deadline_, Now() + opts_.stop_flush);
  }
  cv_.notify_all();
}

void Agent::ResendUnacked() {
  std::vector<v1::AgentMessage> msgs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, m] : unacked_) msgs.push_back(m);
  }
  WriteAll(std::move(msgs));
}

void Agent::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Duration last_heartbeat = Now();
  for (;;) {
    if (run_done_) return;
    const absl::Duration now = Now();
    if (DrainCompleteLocked()) {
      if (!goodbye_sent_ && ctx_ != nullptr && threads_ == 0 && unacked_.empty()) {
        // Everything is handed over: say so, and the scheduler forgets this
        // agent instead of listing it as lost. It closes the stream.
        goodbye_sent_ = true;
        goodbye_deadline_ = now + kGoodbyeWait;
        v1::AgentMessage bye;
        bye.mutable_goodbye();
        lock.unlock();
        Write(std::move(bye));
        lock.lock();
        continue;
      }
      if (goodbye_sent_ && now < goodbye_deadline_ && ctx_ != nullptr) {
        cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return run_done_; });
        continue;
      }
      // Handed over (or the time is up): end the stream so Run() returns.
      if (ctx_ != nullptr) ctx_->TryCancel();
      cv_.notify_all();  // Run() may be waiting to reconnect
      cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return run_done_; });
      continue;
    }
    if (exiting_ && !drain_expired_ && now >= drain_deadline_) {
      drain_expired_ = true;
      const int n = StopRunningLocked(StopCause::kReleased,
                                      "agent drained: " + Format(drain_timeout_) + " passed");
      if (n > 0) {
        spdlog::info("drain: {} passed; releasing {} running task(s)", Format(drain_timeout_), n);
      }
    }
    absl::Duration wake = last_heartbeat + heartbeat_interval_;
    if (exiting_ && !drain_expired_) wake = std::min(wake, drain_deadline_);
    wake = std::min(wake, exit_deadline_);
    const bool unstopped = std::any_of(running_.begin(), running_.end(), [](const auto& e) {
      return e.second.cause == StopCause::kNone;
    });
    if (unstopped) {
      // With a lease (and no fixed stop_on_lost_after of our own), by it;
      // else by the time since anything arrived.
      const absl::Duration fence_at = lease_.FenceAt();
      if (now >= fence_at) {
        // By now the scheduler may have given these tasks to another agent.
        const std::string silent =
            Format(absl::Trunc(now - lease_.last_heard(), absl::Milliseconds(100)));
        const int n = StopRunningLocked(
            StopCause::kFenced, "stopped: no contact with the scheduler for " +
                                    (lease_.ByLease() ? silent : Format(lease_.StopOnLostAfter())));
        spdlog::warn(
            "self-fenced: no contact with the scheduler for {}; stopped {} running task(s)", silent,
            n);
      } else {
        wake = std::min(wake, fence_at);
      }
    }
    if (now >= last_heartbeat + heartbeat_interval_) {
      last_heartbeat = now;
      v1::AgentMessage hb;
      ListHeldLocked(hb.mutable_heartbeat()->mutable_running());
      *hb.mutable_heartbeat()->mutable_heartbeat_interval() = ToProto(heartbeat_interval_);
      lease_.HeartbeatSent(now);
      lock.unlock();
      const bool sent = Write(hb);
      lock.lock();
      // Not on the stream: no ack will answer it.
      if (!sent) lease_.HeartbeatNotSent(now);
      continue;
    }
    // Woken early by any change (notify_all); then everything is recomputed.
    cv_.wait_for(lock, absl::ToChronoNanoseconds(std::max(wake - now, absl::Milliseconds(1))));
  }
}

}  // namespace taskgrid::agent
