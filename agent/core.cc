#include "agent/core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_join.h"
#include "common/flags_help.h"
#include "common/proto_time.h"

namespace taskgrid::agent {

namespace {

// The step supervisors' fence (supervisor::kFence) is the lease plus this:
// after the agent stops its steps itself, and well before the scheduler
// may move them (a second or more after the lease).
constexpr absl::Duration kSupervisorFenceMargin = absl::Milliseconds(500);
// A lease that moved on by less than this is not told (each ack moves it
// by a heartbeat interval; contact without a lease, by every message).
constexpr absl::Duration kFenceStep = absl::Milliseconds(500);
// Told at once when it moved back by more than this (a stream that ended
// cuts it); less is the jitter of reading two clocks.
constexpr absl::Duration kFenceJitter = absl::Milliseconds(50);

CoreOptions WithDefaults(CoreOptions opts) {
  if (opts.exec.work_dir.empty()) opts.exec.work_dir = DefaultWorkDir(opts.id);
  if (opts.clock == nullptr) opts.clock = RealClock::Get();
  return opts;
}

void LogDropped(const std::vector<std::string>& ids, const std::string& why) {
  if (ids.empty()) return;
  spdlog::info("dropped {} waiting chain link(s) ({}): {}", ids.size(), absl::StrJoin(ids, ", "),
               why);
}
}  // namespace

AgentCore::AgentCore(CoreOptions opts, std::function<void()> end_stream)
    : opts_(WithDefaults(std::move(opts))),
      clock_(opts_.clock),
      end_stream_(std::move(end_stream)),
      slots_(opts_.slots, [this](v1::Assignment a) { return MakeRun(std::move(a)); }),
      lease_(opts_.stop_on_lost_after),
      drain_(opts_.exec.kill_grace, opts_.stop_flush),
      last_heartbeat_(clock_->Monotonic()) {}

int AgentCore::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.running();
}

int AgentCore::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.waiting();
}

int AgentCore::unacked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(unacked_.size());
}

bool AgentCore::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drain_.draining();
}

bool AgentCore::exiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drain_.exiting();
}

absl::Duration AgentCore::heartbeat_interval() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heartbeat_interval_;
}

std::shared_ptr<LiveOutput> AgentCore::live_output(const std::string& task_id,
                                                   int32_t attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<TaskRun> run = slots_.RunOf(task_id, attempt);
  return run == nullptr ? nullptr : run->live_output();
}

std::shared_ptr<TaskRun> AgentCore::MakeRun(v1::Assignment a) const {
  ExecutorOptions exec = opts_.exec;
  exec.fence_ns = fence_ns_;
  // The smaller of our own cap and the scheduler's.
  if (welcome_max_output_bytes_ > 0) {
    exec.max_output_bytes = std::min(exec.max_output_bytes, welcome_max_output_bytes_);
  }
  return std::make_shared<TaskRun>(std::move(a), exec);
}

void AgentCore::TellFenceLocked() {
  // On this host's CLOCK_MONOTONIC, which the supervisors read.
  const absl::Duration left = lease_.FenceAt() + kSupervisorFenceMargin - Now();
  const int64_t fence = absl::ToInt64Nanoseconds(RealClock::Get()->Monotonic() + left);
  const int64_t told = fence_ns_->load(std::memory_order_relaxed);
  if (told != 0 && fence < told + absl::ToInt64Nanoseconds(kFenceStep) &&
      fence > told - absl::ToInt64Nanoseconds(kFenceJitter)) {
    return;
  }
  fence_ns_->store(fence, std::memory_order_relaxed);
  for (const std::shared_ptr<TaskRun>& run : slots_.Runs()) run->Wake();
}

int AgentCore::StopAllLocked(StopCause cause, const std::string& note) {
  std::vector<std::string> dropped;
  const int n = slots_.StopAll(cause, note, &dropped);
  LogDropped(dropped, note);
  return n;
}

void AgentCore::SayDraining() {
  v1::AgentMessage m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m.mutable_draining()->set_exiting(drain_.exiting());
  }
  outbox_.Write(std::move(m));
}

void AgentCore::OnUndrain() {
  bool again;
  {
    std::lock_guard<std::mutex> lock(mu_);
    again = drain_.TakeWorkAgain();
    cv_.notify_all();
  }
  if (again) {
    spdlog::info("undrained: taking work again");
  } else {
    // Leaving: the scheduler must keep it draining.
    spdlog::info("the scheduler asked this agent to take work again, but it is stopping");
    SayDraining();
  }
}

void AgentCore::StopTakingWork() {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = drain_.StopTakingWork();
    if (first) {
      spdlog::info("draining: taking no more work; {} task(s) still running", slots_.running());
    }
    cv_.notify_all();
  }
  // When there is no stream now, the next Hello says draining (and Draining
  // follows its Welcome).
  if (first) SayDraining();
}

void AgentCore::Drain(absl::Duration timeout) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !drain_.draining();
    if (first) {
      spdlog::info("draining: taking no more work; {} task(s) still running", slots_.running());
    }
    const absl::Duration before = drain_.NextDeadline();
    const bool release_now = drain_.Begin(Now(), timeout, threads_ == 0);
    if (timeout > absl::ZeroDuration() && drain_.NextDeadline() < before) {
      spdlog::info("drain: waiting up to {} for {} running task(s), then exiting",
                   DurationText(timeout), slots_.running());
    }
    if (release_now) {
      const int n = StopAllLocked(StopCause::kReleased, drain_.ReleaseNote());
      if (n > 0) spdlog::info("drain: releasing {} running task(s) at once", n);
    }
    WakeTimerLocked();
  }
  if (first) SayDraining();
}

void AgentCore::Restart(absl::Duration hold, absl::Duration otherwise) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drain_.exiting() || restart_asked_.has_value()) return;
    first = drain_.StopTakingWork();
    restart_asked_ = Now();
    restart_otherwise_ = otherwise;
    spdlog::info(
        "restarting: asking the scheduler to hold {} running task(s) for {} while their steps run "
        "on",
        slots_.running(), DurationText(hold));
    WakeTimerLocked();
  }
  if (first) SayDraining();
  v1::AgentMessage m;
  *m.mutable_restarting()->mutable_hold() = ToProto(hold);
  outbox_.Write(std::move(m));  // not on a stream: no grant comes, and it drains
}

void AgentCore::OnRestartHold(const v1::RestartHold& msg) {
  const absl::Duration hold = FromProto(msg.hold());
  absl::Duration otherwise;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!restart_asked_.has_value() || drain_.exiting()) return;
    restart_asked_.reset();
    otherwise = restart_otherwise_;
    if (hold > absl::ZeroDuration()) {
      // Counted from now, on this host's CLOCK_MONOTONIC (the supervisors'
      // clock): the scheduler counts from when it sees the stream end,
      // which is later.
      const int64_t until = absl::ToInt64Nanoseconds(RealClock::Get()->Monotonic() + hold);
      const std::vector<std::shared_ptr<TaskRun>> runs = slots_.Runs();
      for (const std::shared_ptr<TaskRun>& run : runs) run->Detach(until);
      spdlog::info(
          "the scheduler holds this agent's tasks for {}: keeping the steps of {} running task(s) "
          "for the next agent, and exiting",
          DurationText(hold), runs.size());
      // What cannot be kept is stopped and released; a detach comes first
      // for those that can.
      StopAllLocked(StopCause::kReleased,
                    "the agent restarted and could not keep this step for the next one (a builtin "
                    "or http step, or one still reading its stdin)");
    }
  }
  if (hold <= absl::ZeroDuration()) {
    spdlog::warn("the scheduler holds nothing for a restart: draining for up to {} instead",
                 DurationText(otherwise));
    Drain(otherwise);
    return;
  }
  // What could not be kept (a builtin or http step, a step still reading
  // its stdin) is stopped and released.
  Drain(absl::ZeroDuration());
}

int AgentCore::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

int AgentCore::TakeBackKept() {
  std::vector<std::string> dropped;
  std::vector<KeptRun> kept = ReadKeptAttempts(opts_.exec.work_dir, &dropped);
  for (const std::string& d : dropped) spdlog::warn("a kept task was not taken back: {}", d);
  std::string results_error;
  v1::KeptResults results = ReadKeptResults(opts_.exec.work_dir, opts_.id, &results_error);
  if (!results_error.empty()) spdlog::warn("{}", results_error);
  std::vector<std::shared_ptr<TaskRun>> runs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (v1::AgentMessage& m : *results.mutable_messages()) {
      if (!m.has_result() && !m.has_release()) continue;
      KeepUnackedLocked(std::move(m));
    }
    if (results.messages_size() > 0) {
      spdlog::info("{} result(s) the agent before this one exited with go to the scheduler",
                   results.messages_size());
    }
    const absl::Duration real_now = RealClock::Get()->Monotonic();
    for (KeptRun& k : kept) {
      const absl::Duration until = absl::Nanoseconds(k.kept.hold_until_monotonic_ns());
      // Ours until then, welcomed or not: the scheduler holds them longer.
      lease_.KeptUntil(Now() + (until - real_now));
      TellFenceLocked();
      ExecutorOptions exec = opts_.exec;
      exec.fence_ns = fence_ns_;
      auto run = std::make_shared<TaskRun>(std::move(k), std::move(exec));
      slots_.Adopt(run);
      runs.push_back(std::move(run));
      ++threads_;
    }
    WakeTimerLocked();
  }
  for (std::shared_ptr<TaskRun>& run : runs) {
    spdlog::info("took back {} attempt {}, kept by the agent before this one",
                 run->assignment().task_id(), run->assignment().attempt());
    workers_.Run([this, run = std::move(run)] { TaskThread(run); });
  }
  return static_cast<int>(runs.size());
}

bool AgentCore::DrainComplete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drain_.Complete(Now(), HandedOverLocked());
}

bool AgentCore::WaitDrainComplete(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                      [this] { return drain_.Complete(Now(), HandedOverLocked()); });
}

bool AgentCore::WaitTasksEnded(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return threads_ == 0; });
}

int AgentCore::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  // Task threads hold `this`: wait for them. Normally none is left; past
  // the exit deadline any still running is cancelled now and ends within
  // kill_grace.
  StopAllLocked(StopCause::kReleased, "agent exited");
  cv_.wait(lock, [this] { return threads_ == 0; });
  // What the scheduler has not acknowledged goes to the next agent with
  // this id (a restart while the scheduler is away must not lose a result).
  v1::KeptResults kept;
  kept.set_agent_id(opts_.id);
  std::vector<const Unacked*> in_order;
  for (const auto& [key, u] : unacked_) in_order.push_back(&u);
  std::sort(in_order.begin(), in_order.end(),
            [](const Unacked* a, const Unacked* b) { return a->seq < b->seq; });
  for (const Unacked* u : in_order) *kept.add_messages() = u->msg;
  if (std::string error = WriteKeptResults(opts_.exec.work_dir, kept); !error.empty()) {
    spdlog::error("{} result(s) not acknowledged are lost: {}", kept.messages_size(), error);
  } else if (kept.messages_size() > 0) {
    spdlog::info("kept {} result(s) not acknowledged for the next agent with this --id",
                 kept.messages_size());
  }
  return static_cast<int>(unacked_.size());
}

void AgentCore::KeepUnackedLocked(v1::AgentMessage msg) {
  const Key key = msg.has_result() ? Key{msg.result().task_id(), msg.result().attempt()}
                                   : Key{msg.release().task_id(), msg.release().attempt()};
  unacked_[key] = Unacked{next_unacked_seq_++, std::move(msg)};
}

void AgentCore::ListHeldLocked(google::protobuf::RepeatedPtrField<v1::AttemptRef>* out) const {
  slots_.ListHeld(out);
  for (const Key& key : kept_keys_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(key.first);
    ref->set_attempt(key.second);
  }
  // Finished but unacknowledged attempts (Result or Release) are still
  // ours: the scheduler must keep them until the messages, resent after
  // Welcome, arrive.
  for (const auto& [key, u] : unacked_) {
    v1::AttemptRef* ref = out->Add();
    ref->set_task_id(key.first);
    ref->set_attempt(key.second);
    ref->set_finished(true);
  }
}

v1::AgentMessage AgentCore::StreamStarted() {
  v1::AgentMessage hello;
  std::lock_guard<std::mutex> lock(mu_);
  v1::Hello* h = hello.mutable_hello();
  h->set_agent_id(opts_.id);
  h->set_slots(opts_.slots);
  h->set_version(kVersion);
  h->set_draining(drain_.draining());
  h->set_exiting(drain_.exiting());
  h->set_undrain(true);
  h->set_chains(true);
  h->set_batches(true);
  h->set_adaptive_heartbeat(true);
  h->set_live_output(true);
  h->set_reports_stops(true);
  for (const auto& [k, v] : opts_.labels) (*h->mutable_labels())[k] = v;
  for (const auto& [k, v] : opts_.resources) (*h->mutable_resources())[k] = v;
  ListHeldLocked(h->mutable_running());
  stream_open_ = true;
  welcomed_ = false;
  silence_ended_ = false;
  lease_.HelloSent(Now());
  TellFenceLocked();
  return hello;
}

bool AgentCore::SchedulerRefused() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool before = lease_.HoldingForRestart();
  lease_.Refused();
  TellFenceLocked();
  WakeTimerLocked();
  return !before && lease_.HoldingForRestart() && slots_.AnyUnstopped();
}

void AgentCore::SchedulerNotRestarting() {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_.HoldingForRestart() && slots_.AnyUnstopped()) {
    spdlog::warn(
        "the scheduler answers otherwise than a restarting one does: its running tasks are no "
        "longer held for its restart");
  }
  lease_.RestartRuledOut();
  TellFenceLocked();
  WakeTimerLocked();
}

absl::Duration AgentCore::restart_hold_left() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lease_.HoldingForRestart()) return absl::ZeroDuration();
  return std::max(lease_.FenceAt() - Now(), absl::ZeroDuration());
}

bool AgentCore::StreamEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool welcomed = welcomed_;
  // The scheduler may have seen the stream end too, and then moves the
  // tasks after its grace, however long the lease.
  lease_.StreamEnded(Now(), welcomed);
  // Left for not answering: whatever the outage is, it is not a restart
  // that refuses connections.
  if (silence_ended_) lease_.RestartRuledOut();
  TellFenceLocked();
  // Whoever followed output here asks again on the next stream.
  watches_.Clear();
  stream_open_ = false;
  welcomed_ = false;
  WakeTimerLocked();
  return welcomed;
}

void AgentCore::Handle(const v1::SchedulerMessage& msg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease_.Heard(Now());
    TellFenceLocked();
  }
  switch (msg.msg_case()) {
    case v1::SchedulerMessage::kWelcome:
      OnWelcome(msg.welcome());
      break;
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
    case v1::SchedulerMessage::kResultAck:
      OnResultAck(msg.result_ack());
      break;
    case v1::SchedulerMessage::kDrain:
      spdlog::info("the scheduler asked this agent to drain");
      StopTakingWork();
      break;
    case v1::SchedulerMessage::kUndrain:
      OnUndrain();
      break;
    case v1::SchedulerMessage::kHeartbeatAck:
      OnHeartbeatAck(msg.heartbeat_ack());
      break;
    case v1::SchedulerMessage::kWatchOutput:
      OnWatchOutput(msg.watch_output());
      break;
    case v1::SchedulerMessage::kRestartHold:
      OnRestartHold(msg.restart_hold());
      break;
    default:  // contact, noted above
      break;
  }
}

void AgentCore::OnWelcome(const v1::Welcome& welcome) {
  outbox_.SetBatches(welcome.batches());
  bool draining;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Duration hb = FromProto(welcome.heartbeat_interval());
    if (hb > absl::ZeroDuration()) heartbeat_interval_ = hb;
    // It answers the Hello.
    lease_.Welcomed(Now(), FromProto(welcome.stop_on_lost_after()),
                    FromProto(welcome.heartbeat_lease()));
    lease_.SetRestartGrace(FromProto(welcome.restart_grace()));
    TellFenceLocked();
    welcome_max_output_bytes_ = welcome.max_output_bytes();
    draining = drain_.draining();
    welcomed_ = true;
    WakeTimerLocked();
  }
  // Hello said so too, unless the drain began while it was on its way.
  if (draining) SayDraining();
  ResendUnacked();
}

void AgentCore::OnHeartbeatAck(const v1::HeartbeatAck& ack) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_.HeartbeatAcked(FromProto(ack.heartbeat_lease()));
  TellFenceLocked();
  const absl::Duration interval = FromProto(ack.heartbeat_interval());
  if (interval > absl::ZeroDuration() && interval != heartbeat_interval_) {
    spdlog::info("heartbeat interval now {} (was {}), as the scheduler asks",
                 DurationText(interval), DurationText(heartbeat_interval_));
    heartbeat_interval_ = interval;
    WakeTimerLocked();  // the next one may be due sooner
  }
}

void AgentCore::OnWatchOutput(const v1::WatchOutput& w) {
  std::vector<v1::AgentMessage> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!w.watch()) {
      watches_.Stop(w.task_id(), w.attempt());
      return;
    }
    std::shared_ptr<TaskRun> run = slots_.RunOf(w.task_id(), w.attempt());
    out = watches_.Start(w.task_id(), w.attempt(), run == nullptr ? nullptr : run->live_output(),
                         Now());
    WakeTimerLocked();  // its next output is due sooner than anything else
  }
  outbox_.WriteAll(std::move(out));
}

void AgentCore::OnResultAck(const v1::ResultAck& ack) {
  if (!ack.accepted()) {
    spdlog::warn("result of {} attempt {} was stale: the scheduler did not take it", ack.task_id(),
                 ack.attempt());
  }
  std::lock_guard<std::mutex> lock(mu_);
  unacked_.erase({ack.task_id(), ack.attempt()});
  NotifyLocked();
}

void AgentCore::OnAssign(const v1::Assign& assign) {
  std::vector<v1::AgentMessage> replies;
  std::vector<std::shared_ptr<TaskRun>> starts;
  {
    // Every entry under one hold of mu_, so that no task of the Assign can
    // end before the links that follow it are queued.
    std::lock_guard<std::mutex> lock(mu_);
    slots_.Admit(assign, drain_.draining(), &replies, &starts);
    threads_ += static_cast<int>(starts.size());
    if (!starts.empty() && lease_.FenceAt() < timer_due_) WakeTimerLocked();
  }
  // Tasks that cannot wait (noop, echo, fail) run right here, and their
  // Results go out with the Accepts, after them: one message for the whole
  // Assign when the scheduler reads batches, and no thread hand-off.
  for (std::shared_ptr<TaskRun>& run : starts) {
    spdlog::info("running {} attempt {}", run->assignment().task_id(), run->assignment().attempt());
    if (run->instant()) TaskThread(std::move(run), &replies);
  }
  // Accepts go out before the other tasks can finish and send their Results.
  outbox_.WriteAll(std::move(replies));
  for (std::shared_ptr<TaskRun>& run : starts) {
    if (run != nullptr) workers_.Run([this, run = std::move(run)] { TaskThread(run); });
  }
}

void AgentCore::OnCancel(const v1::Cancel& c) {
  // Every Cancel is answered (Hello.reports_stops): a running attempt by
  // its Result once its processes are gone, a waiting link by a Release
  // now, and an attempt held nowhere here by a Release marked not_held, so
  // the scheduler frees it on our word and not on a timer.
  std::optional<v1::AgentMessage> answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spdlog::info("cancel of {} attempt {}", c.task_id(), c.attempt());
    const Key key{c.task_id(), c.attempt()};
    if (slots_.RunOf(c.task_id(), c.attempt()) != nullptr) {
      slots_.Cancel(c.task_id(), c.attempt());  // its Result says when it is gone
      return;
    }
    const std::vector<std::string> dropped = slots_.Cancel(c.task_id(), c.attempt());
    if (!dropped.empty()) {
      spdlog::info("cancelled waiting chain link(s) {}", absl::StrJoin(dropped, ", "));
      answer = ReleaseMsg(c.task_id(), c.attempt(), "cancelled before it started");
      KeepUnackedLocked(*answer);
    } else if (unacked_.count(key) > 0 || kept_keys_.count(key) > 0) {
      return;  // its message is on its way, or the next agent holds it
    } else {
      answer = ReleaseMsg(c.task_id(), c.attempt(), "this agent does not hold it");
      answer->mutable_release()->set_not_held(true);
    }
  }
  outbox_.Write(std::move(*answer));
}

void AgentCore::TaskThread(std::shared_ptr<TaskRun> run, std::vector<v1::AgentMessage>* sink) {
  while (run != nullptr) {
    v1::TaskResult result = run->Run();
    const v1::Assignment& a = run->assignment();
    if (run->detached()) {
      // Kept for the next agent: nothing to say; the scheduler holds it.
      std::lock_guard<std::mutex> lock(mu_);
      watches_.Finish(a.task_id(), a.attempt());
      LogDropped(slots_.Kept(run), "their predecessor was kept for the next agent");
      kept_keys_.insert({a.task_id(), a.attempt()});
      ++kept_;
      break;
    }
    Slots::Ended ended;
    // A watched attempt's last output goes before its Result.
    std::vector<v1::AgentMessage> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out = watches_.Finish(a.task_id(), a.attempt());
      ended = slots_.Finish(run, std::move(result), drain_.draining());
      KeepUnackedLocked(ended.report);
      if (ended.link.has_release()) KeepUnackedLocked(ended.link);
    }
    if (ended.report.has_release()) {
      spdlog::info("{} attempt {} released: {}", a.task_id(), a.attempt(),
                   ended.report.release().reason());
    } else {
      spdlog::info("{} attempt {} finished: {}", a.task_id(), a.attempt(),
                   v1::Outcome_Name(ended.report.result().result().outcome()));
    }
    if (!ended.dropped.empty()) {
      spdlog::info("dropped chain link(s) after {}: {}", a.task_id(),
                   absl::StrJoin(ended.dropped, ", "));
    }
    if (ended.link.has_release()) {
      spdlog::info("{} attempt {} released: agent is draining", ended.link.release().task_id(),
                   ended.link.release().attempt());
    }
    // If the stream is down, ResendUnacked() sends it after Welcome. A link's
    // Accept follows its predecessor's Result.
    out.push_back(std::move(ended.report));
    if (ended.link.msg_case() != v1::AgentMessage::MSG_NOT_SET) {
      out.push_back(std::move(ended.link));
    }
    if (sink == nullptr) {
      outbox_.WriteAll(std::move(out));
    } else {
      for (v1::AgentMessage& m : out) sink->push_back(std::move(m));
    }
    std::shared_ptr<TaskRun> next = std::move(ended.next);
    if (next != nullptr) {
      spdlog::info("running {} attempt {} after {}", next->assignment().task_id(),
                   next->assignment().attempt(), a.task_id());
    }
    if (sink != nullptr && next != nullptr && !next->instant()) {
      // A link that may wait goes to a pooled thread, still counted in
      // threads_; what it answers must follow what this run sent.
      outbox_.WriteAll(std::move(*sink));
      sink->clear();
      workers_.Run([this, next = std::move(next)] { TaskThread(next); });
      return;
    }
    run = std::move(next);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (--threads_ == 0) drain_.TasksEnded(Now());
  NotifyLocked();
}

void AgentCore::ResendUnacked() {
  std::vector<v1::AgentMessage> msgs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const Unacked*> in_order;
    for (const auto& [key, u] : unacked_) in_order.push_back(&u);
    std::sort(in_order.begin(), in_order.end(),
              [](const Unacked* a, const Unacked* b) { return a->seq < b->seq; });
    for (const Unacked* u : in_order) msgs.push_back(u->msg);
  }
  outbox_.WriteAll(std::move(msgs));
}

absl::Duration AgentCore::Tick() {
  // What the pass decided to write, done after the lock is released.
  std::optional<v1::AgentMessage> out;
  std::vector<v1::AgentMessage> output;  // of watched attempts
  bool end_stream = false;
  std::optional<absl::Duration> heartbeat_at;
  std::optional<absl::Duration> drain_instead;  // no grant came for Restart()
  absl::Duration due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Duration now = Now();
    if (restart_asked_.has_value() && now >= *restart_asked_ + kRestartAnswerWait) {
      restart_asked_.reset();
      drain_instead = restart_otherwise_;
    }
    if (drain_.Complete(now, HandedOverLocked())) {
      // Kept attempts are still this agent's (the next one takes them
      // back): no Goodbye, which would say everything was handed over.
      if (stream_open_ && kept_ == 0 && drain_.GoodbyeDue(now, HandedOverLocked())) {
        // Everything is handed over: say so, and the scheduler forgets this
        // agent instead of listing it as lost. It closes the stream.
        out.emplace().mutable_goodbye();
        due = drain_.goodbye_deadline();
      } else if (stream_open_ && drain_.AwaitingClose(now)) {
        due = drain_.goodbye_deadline();
      } else {
        // Handed over (or the time is up): end the stream so Run() returns.
        end_stream = stream_open_;
        cv_.notify_all();  // Run() may be waiting to reconnect
        due = now + absl::Milliseconds(50);
      }
    } else {
      if (drain_.ReleaseDue(now)) {
        const int n = StopAllLocked(StopCause::kReleased, drain_.ReleaseNote());
        if (n > 0) {
          spdlog::info("drain: {} passed; releasing {} running task(s)",
                       DurationText(drain_.timeout()), n);
        }
      }
      if (slots_.AnyUnstopped() && now >= lease_.FenceAt()) {
        // By now the scheduler may have given these tasks to another agent.
        const std::string silent =
            DurationText(absl::Trunc(now - lease_.last_heard(), absl::Milliseconds(100)));
        const std::string note =
            lease_.HoldingForRestart()
                ? "stopped: the scheduler refused connections for longer than its restart grace (" +
                      DurationText(lease_.restart_grace()) + ")"
                : "stopped: no contact with the scheduler for " +
                      (lease_.ByLease() ? silent : DurationText(lease_.StopOnLostAfter()));
        const int n = StopAllLocked(StopCause::kFenced, note);
        spdlog::warn(
            "self-fenced: no contact with the scheduler for {}; stopped {} running task(s)", silent,
            n);
      }
      // A scheduler that stops answering (frozen, or cut off while the
      // connection looks open) is left for the next one well before the
      // tasks must stop: a standby may lead by now.
      const std::optional<absl::Duration> asked = lease_.OldestUnanswered();
      // Two heartbeats and a second, or half of what the tasks have left
      // when the stream ends, whichever is shorter.
      const absl::Duration silence_limit =
          std::min(lease_.StopOnLostAfter() / 2, 2 * heartbeat_interval_ + absl::Seconds(1));
      if (stream_open_ && !silence_ended_ && asked.has_value() && now >= *asked + silence_limit) {
        silence_ended_ = true;
        end_stream = true;
        spdlog::warn("the scheduler has not answered for {}; reconnecting",
                     DurationText(absl::Trunc(now - *asked, absl::Milliseconds(100))));
      }
      if (now >= last_heartbeat_ + heartbeat_interval_) {
        last_heartbeat_ = now;
        v1::Heartbeat* hb = out.emplace().mutable_heartbeat();
        ListHeldLocked(hb->mutable_running());
        *hb->mutable_heartbeat_interval() = ToProto(heartbeat_interval_);
        lease_.HeartbeatSent(now);
        heartbeat_at = now;
      }
      output = watches_.Due(now);
      due = std::min(
          {last_heartbeat_ + heartbeat_interval_, drain_.NextDeadline(), watches_.NextDue()});
      if (slots_.AnyUnstopped()) due = std::min(due, lease_.FenceAt());
      if (stream_open_ && !silence_ended_ && asked.has_value()) {
        due = std::min(due, *asked + silence_limit);
      }
      if (restart_asked_.has_value()) due = std::min(due, *restart_asked_ + kRestartAnswerWait);
    }
    TellFenceLocked();
    timer_due_ = due;
  }
  if (drain_instead.has_value()) {
    spdlog::warn("the scheduler did not answer the restart: draining for up to {} instead",
                 DurationText(*drain_instead));
    Drain(*drain_instead);
  }
  if (!output.empty()) outbox_.WriteAll(std::move(output));
  if (out.has_value()) {
    const bool sent = outbox_.Write(std::move(*out));
    if (!sent && heartbeat_at.has_value()) {
      // Not on the stream: no ack will answer it.
      std::lock_guard<std::mutex> lock(mu_);
      lease_.HeartbeatNotSent(*heartbeat_at);
    }
  }
  if (end_stream) end_stream_();
  return due;
}

void AgentCore::WakeTimerLocked() {
  ++changes_;
  timer_cv_.notify_all();
  cv_.notify_all();
}

void AgentCore::NotifyLocked() {
  cv_.notify_all();
  // Once exiting, a task that ended or a result acknowledged may complete
  // the drain: the timer says Goodbye.
  if (drain_.exiting()) WakeTimerLocked();
}

void AgentCore::TimerLoop() {
  for (;;) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (timer_stopped_) return;
      seen = changes_;
    }
    const absl::Duration due = Tick();
    // Woken early by any change since the pass began; then everything is
    // recomputed.
    std::unique_lock<std::mutex> lock(mu_);
    const absl::Duration wait = std::max(due - Now(), absl::Milliseconds(1));
    timer_cv_.wait_for(lock, absl::ToChronoNanoseconds(wait),
                       [&] { return timer_stopped_ || changes_ != seen; });
  }
}

void AgentCore::StopTimer() {
  std::lock_guard<std::mutex> lock(mu_);
  timer_stopped_ = true;
  timer_cv_.notify_all();
}

}  // namespace taskgrid::agent
