#include "agent/agent.h"

#include <spdlog/spdlog.h>

#include <random>
#include <thread>
#include <vector>

#include "common/proto_time.h"

namespace taskgrid::agent {

namespace {
constexpr char kVersion[] = "0.1.0";

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  grpc::ChannelArguments args;
  // Notice a dead scheduler or network in seconds, even when idle.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}
}  // namespace

Agent::Agent(AgentOptions opts) : opts_(std::move(opts)) {}

Agent::~Agent() { Stop(); }

int Agent::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

int Agent::unacked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(unacked_.size());
}

void Agent::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  stop_deadline_ = absl::Now() + opts_.exec.kill_grace + opts_.stop_flush;
  for (auto& [id, r] : running_) r.run->Cancel();
  cv_.notify_all();
}

bool Agent::StopCompleteLocked() const {
  return stopping_ && ((threads_ == 0 && unacked_.empty()) || absl::Now() >= stop_deadline_);
}

int Agent::Run() {
  std::thread heartbeat([this] { HeartbeatLoop(); });
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = opts_.reconnect_min;
  int sessions = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (StopCompleteLocked()) break;
    }
    ++sessions;
    const absl::Time start = absl::Now();
    Session();
    if (absl::Now() - start > absl::Seconds(10)) backoff = opts_.reconnect_min;
    // Full jitter: agents that lost one scheduler do not return in lockstep.
    std::uniform_int_distribution<int64_t> jitter(0, absl::ToInt64Microseconds(backoff));
    const absl::Duration wait = absl::Microseconds(jitter(rng)) + opts_.reconnect_min;
    backoff = std::min(backoff * 2, opts_.reconnect_max);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(wait), [this] { return StopCompleteLocked(); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run_done_ = true;
    cv_.notify_all();
  }
  heartbeat.join();
  // Task threads hold `this`: wait for them (cancelled, they end within
  // kill_grace).
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return threads_ == 0; });
  return sessions;
}

void Agent::Session() {
  // A fresh channel per attempt: a channel that saw the scheduler go away
  // keeps failing calls fast for its own backoff (seconds), while ours is
  // bounded by reconnect_max, well inside the scheduler's reconnect grace.
  std::unique_ptr<v1::AgentService::Stub> stub =
      v1::AgentService::NewStub(MakeChannel(opts_.scheduler));
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
    for (const auto& [k, v] : opts_.labels) (*h->mutable_labels())[k] = v;
    for (const auto& [id, r] : running_) {
      v1::AttemptRef* ref = h->add_running();
      ref->set_task_id(id);
      ref->set_attempt(r.run->assignment().attempt());
    }
    // Finished but unacknowledged attempts are still ours: the scheduler
    // must keep them until the results (resent after Welcome) arrive.
    for (const auto& [key, result] : unacked_) {
      v1::AttemptRef* ref = h->add_running();
      ref->set_task_id(key.first);
      ref->set_attempt(key.second);
    }
  }
  bool ok = stream->Write(hello);
  if (ok) {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = stream.get();
  }
  v1::SchedulerMessage msg;
  while (ok && stream->Read(&msg)) Handle(msg);
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = nullptr;
  }
  ctx.TryCancel();
  grpc::Status st = stream->Finish();
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = stopping_;
  }
  if (stopping) return;
  if (welcomed_) {
    spdlog::warn("stream to {} ended ({}: {}); reconnecting", opts_.scheduler,
                 static_cast<int>(st.error_code()), st.error_message());
    welcomed_ = false;
    last_unreachable_log_ = absl::Now();
  } else if (absl::Now() - last_unreachable_log_ > absl::Seconds(10)) {
    // Once per 10 s while the scheduler stays unreachable, not per attempt.
    spdlog::warn("cannot reach the scheduler at {}: {}", opts_.scheduler, st.error_message());
    last_unreachable_log_ = absl::Now();
  }
}

bool Agent::Write(const v1::AgentMessage& msg) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_ == nullptr) return false;
  return stream_->Write(msg);
}

void Agent::Handle(const v1::SchedulerMessage& msg) {
  switch (msg.msg_case()) {
    case v1::SchedulerMessage::kWelcome: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        const absl::Duration hb = FromProto(msg.welcome().heartbeat_interval());
        if (hb > absl::ZeroDuration()) heartbeat_interval_ = hb;
        cv_.notify_all();
      }
      welcomed_ = true;
      spdlog::info("connected to {} as {} (session {})", opts_.scheduler, opts_.id,
                   msg.welcome().session_id());
      ResendUnacked();
      break;
    }
    case v1::SchedulerMessage::kAssign:
      for (const v1::Assignment& a : msg.assign().tasks()) OnAssign(a);
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
    default:
      break;
  }
}

void Agent::OnAssign(const v1::Assignment& a) {
  v1::AgentMessage reply;
  std::shared_ptr<TaskRun> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(a.task_id());
    const int32_t slots = a.slots() > 0 ? a.slots() : 1;
    if (it != running_.end() && it->second.run->assignment().attempt() == a.attempt()) {
      reply.mutable_accept()->set_task_id(a.task_id());  // a repeat: accept again
      reply.mutable_accept()->set_attempt(a.attempt());
    } else if (stopping_ || it != running_.end() || used_slots_ + slots > opts_.slots) {
      reply.mutable_reject()->set_task_id(a.task_id());
      reply.mutable_reject()->set_attempt(a.attempt());
      reply.mutable_reject()->set_reason(stopping_ ? "agent is stopping"
                                         : it != running_.end()
                                             ? "another attempt of this task is running here"
                                             : "no free slots");
    } else {
      run = std::make_shared<TaskRun>(a, opts_.exec);
      running_[a.task_id()] = {run, slots};
      used_slots_ += slots;
      ++threads_;
      reply.mutable_accept()->set_task_id(a.task_id());
      reply.mutable_accept()->set_attempt(a.attempt());
    }
  }
  // Accept goes out before the task can finish and send its Result.
  Write(reply);
  if (run) {
    spdlog::info("running {} attempt {}", a.task_id(), a.attempt());
    std::thread([this, run] { TaskThread(run); }).detach();
  }
}

void Agent::OnCancel(const v1::Cancel& c) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = running_.find(c.task_id());
  if (it != running_.end() && it->second.run->assignment().attempt() == c.attempt()) {
    spdlog::info("cancelling {} attempt {}", c.task_id(), c.attempt());
    it->second.run->Cancel();
  }
}

void Agent::TaskThread(std::shared_ptr<TaskRun> run) {
  v1::TaskResult result = run->Run();
  const v1::Assignment& a = run->assignment();
  v1::AgentMessage msg;
  v1::Result* r = msg.mutable_result();
  r->set_task_id(a.task_id());
  r->set_attempt(a.attempt());
  *r->mutable_result() = std::move(result);
  spdlog::info("{} attempt {} finished: {}", a.task_id(), a.attempt(),
               v1::Outcome_Name(r->result().outcome()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(a.task_id());
    if (it != running_.end() && it->second.run == run) {
      used_slots_ -= it->second.slots;
      running_.erase(it);
    }
    unacked_[{a.task_id(), a.attempt()}] = msg.result();
  }
  Write(msg);  // if the stream is down, ResendUnacked() sends it after Welcome
  std::lock_guard<std::mutex> lock(mu_);
  --threads_;
  cv_.notify_all();
}

void Agent::ResendUnacked() {
  std::vector<v1::AgentMessage> msgs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, result] : unacked_) *msgs.emplace_back().mutable_result() = result;
  }
  for (const v1::AgentMessage& m : msgs) Write(m);
}

void Agent::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(heartbeat_interval_),
                 [this] { return run_done_ || StopCompleteLocked(); });
    if (run_done_) return;
    if (StopCompleteLocked()) {
      // Everything is handed over: end the stream so Run() returns.
      if (ctx_ != nullptr) ctx_->TryCancel();
      cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return run_done_; });
      continue;
    }
    v1::AgentMessage hb;
    hb.mutable_heartbeat();
    for (const auto& [id, r] : running_) {
      v1::AttemptRef* ref = hb.mutable_heartbeat()->add_running();
      ref->set_task_id(id);
      ref->set_attempt(r.run->assignment().attempt());
    }
    lock.unlock();
    Write(hb);
    lock.lock();
  }
}

}  // namespace taskgrid::agent
