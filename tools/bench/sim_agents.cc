#include "tools/bench/sim_agents.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_time.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"
#include "tools/bench/child_process.h"

namespace taskgrid::bench {

namespace {

// A heartbeat written this much after it was due counts as late.
constexpr absl::Duration kLate = absl::Milliseconds(500);

struct SimStats {
  std::atomic<int64_t> welcomed{0};
  std::atomic<int64_t> ended{0};  // streams whose OnDone ran
  std::atomic<int64_t> heartbeats{0};
  std::atomic<int64_t> late{0};         // heartbeats written kLate or more after due
  std::atomic<int64_t> max_late_us{0};  // the latest one
  std::mutex mu;
  std::string last_error;  // guarded by mu
};

// One simulated agent. Lifecycle:
//   1. Start(): AddHold, Hello queued as the first write, first read, StartCall.
//   2. Welcome read: the heartbeat interval is known; Heartbeat() from the
//      heartbeat thread writes one whenever it is due and no write is in
//      flight. A HeartbeatAck may change the interval (from the next one on).
//   3. A failed read or write marks the stream closed; once no write is in
//      flight the hold is removed and gRPC calls OnDone.
// Owned by RunSimAgents, which outlives every OnDone (or ends the process).
class SimStream final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::SchedulerMessage> {
 public:
  SimStream(SimStats* stats, std::string id, int slots, std::shared_ptr<grpc::Channel> channel)
      : stats_(stats), id_(std::move(id)), slots_(slots), channel_(std::move(channel)) {}

  void Start() {
    stub_ = v1::AgentService::NewStub(channel_);
    v1::Hello* hello = out_.mutable_hello();
    hello->set_agent_id(id_);
    hello->set_slots(slots_);
    hello->set_version("taskgrid-bench-sim");
    hello->set_adaptive_heartbeat(true);
    stub_->async()->Connect(&ctx_, this);
    AddHold();
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = true;
    }
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }

  // From the heartbeat thread: writes a Heartbeat when one is due.
  void Heartbeat(absl::Duration now) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!welcomed_ || closed_ || writing_ || now < next_due_) return;
      writing_ = true;
      const int64_t late_us = absl::ToInt64Microseconds(now - next_due_);
      if (now - next_due_ >= kLate) stats_->late.fetch_add(1);
      int64_t prev = stats_->max_late_us.load();
      while (late_us > prev && !stats_->max_late_us.compare_exchange_weak(prev, late_us)) {
      }
      last_sent_ = now;
      next_due_ = now + interval_;
      out_.Clear();
      *out_.mutable_heartbeat()->mutable_heartbeat_interval() = ToProto(interval_);
    }
    stats_->heartbeats.fetch_add(1);
    StartWrite(&out_);
  }

  void Cancel() { ctx_.TryCancel(); }
  bool done() const { return done_.load(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      MarkClosed();
      return;
    }
    if (in_.has_welcome()) {
      absl::Duration interval = FromProto(in_.welcome().heartbeat_interval());
      if (interval <= absl::ZeroDuration()) interval = absl::Seconds(1);
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = !welcomed_;
        welcomed_ = true;
        interval_ = interval;
        next_due_ = MonoNow() + interval;
      }
      if (first) stats_->welcomed.fetch_add(1);
    } else if (in_.has_heartbeat_ack()) {
      const absl::Duration interval = FromProto(in_.heartbeat_ack().heartbeat_interval());
      std::lock_guard<std::mutex> lock(mu_);
      if (interval > absl::ZeroDuration() && interval != interval_) {
        interval_ = interval;
        next_due_ = last_sent_ + interval;
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) closed_ = true;
      release = ReleaseLocked();
    }
    if (release) RemoveHold();
  }

  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard<std::mutex> lock(stats_->mu);
      stats_->last_error = absl::StrCat(id_, ": ", s.error_code(), ": ", s.error_message());
    }
    stats_->ended.fetch_add(1);
    done_.store(true);
  }

 private:
  void MarkClosed() {
    bool release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      release = ReleaseLocked();
    }
    if (release) RemoveHold();
  }

  // True once (when closed and no write is in flight): the caller removes
  // the hold.
  bool ReleaseLocked() {
    if (!closed_ || writing_ || released_) return false;
    released_ = true;
    return true;
  }

  SimStats* const stats_;
  const std::string id_;
  const int slots_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  grpc::ClientContext ctx_;
  v1::AgentMessage out_;     // written only by whoever set writing_
  v1::SchedulerMessage in_;  // touched only by reactions (one read in flight)
  std::atomic<bool> done_{false};

  std::mutex mu_;
  bool writing_ = false;                        // guarded by mu_
  bool closed_ = false;                         // guarded by mu_
  bool released_ = false;                       // guarded by mu_
  bool welcomed_ = false;                       // guarded by mu_
  absl::Duration interval_ = absl::Seconds(1);  // guarded by mu_
  absl::Duration next_due_;                     // guarded by mu_
  absl::Duration last_sent_;                    // guarded by mu_
};

}  // namespace

absl::Status RunSimAgents(const SimAgentOptions& opts) {
  if (opts.agents < 1) return absl::InvalidArgumentError("--sim_agents must be at least 1");
  SimStats stats;
  std::vector<std::unique_ptr<SimStream>> streams;
  streams.reserve(static_cast<size_t>(opts.agents));
  const absl::Duration start = MonoNow();
  const absl::Duration end = start + opts.max_run;

  std::atomic<bool> stop{false};
  std::mutex streams_mu;  // guards the vector's growth against the heartbeat thread
  std::thread heartbeats([&] {
    while (!stop.load()) {
      const absl::Duration now = MonoNow();
      size_t n = 0;
      {
        std::lock_guard<std::mutex> lock(streams_mu);
        n = streams.size();
      }
      for (size_t i = 0; i < n; ++i) {
        SimStream* s = nullptr;
        {
          std::lock_guard<std::mutex> lock(streams_mu);
          s = streams[i].get();
        }
        s->Heartbeat(now);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });

  auto report = [&](const char* what) {
    std::string last;
    {
      std::lock_guard<std::mutex> lock(stats.mu);
      last = stats.last_error;
    }
    // The SIMSTATS line is read by the W6 workload (ParseSimStats).
    spdlog::info(
        "SIMSTATS opened={} welcomed={} ended={} heartbeats={} late={} max_late_ms={} ({}){}{}",
        streams.size(), stats.welcomed.load(), stats.ended.load(), stats.heartbeats.load(),
        stats.late.load(), stats.max_late_us.load() / 1000, what,
        last.empty() ? "" : "; last end: ", last);
  };

  for (int64_t i = 0; i < opts.agents && MonoNow() < end;) {
    const int64_t wave_end = std::min(opts.agents, i + opts.wave);
    for (; i < wave_end; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      // As taskgrid-agent sets them (agent/agent.cc), so the scheduler sees
      // the same pings.
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      auto channel = grpc::CreateCustomChannel(
          opts.addr,
          opts.credentials != nullptr ? opts.credentials : grpc::InsecureChannelCredentials(),
          args);
      auto s = std::make_unique<SimStream>(&stats, absl::StrCat(opts.id_prefix, i), opts.slots,
                                           std::move(channel));
      SimStream* raw = s.get();
      {
        std::lock_guard<std::mutex> lock(streams_mu);
        streams.push_back(std::move(s));
      }
      raw->Start();
    }
    const absl::Duration wave_deadline = MonoNow() + opts.wave_timeout;
    while (stats.welcomed.load() + stats.ended.load() < wave_end && MonoNow() < wave_deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    report("opening");
    if (stats.welcomed.load() + stats.ended.load() < wave_end) {
      spdlog::warn("streams {}..{}: not all welcomed within {}", wave_end - opts.wave, wave_end,
                   absl::FormatDuration(opts.wave_timeout));
    }
  }
  report("all streams opened");
  if (stats.welcomed.load() == 0) {
    stop.store(true);
    heartbeats.join();
    for (auto& s : streams) s->Cancel();
    std::_Exit(3);  // no stream works: nothing to clean up gracefully
  }
  absl::Duration next_report = MonoNow() + absl::Seconds(1);
  while (MonoNow() < end) {
    absl::SleepFor(absl::Milliseconds(100));
    if (MonoNow() >= next_report) {
      report("heartbeating");
      next_report += absl::Seconds(1);
    }
  }
  report("max run time reached, closing");
  stop.store(true);
  heartbeats.join();
  for (auto& s : streams) s->Cancel();
  const absl::Duration deadline = MonoNow() + absl::Seconds(10);
  while (stats.ended.load() < static_cast<int64_t>(streams.size()) && MonoNow() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (stats.ended.load() < static_cast<int64_t>(streams.size())) {
    // A reactor still in use must not be destroyed: end without destructors.
    spdlog::warn("{} stream(s) did not end within 10 s", streams.size() - stats.ended.load());
    std::_Exit(0);
  }
  return absl::OkStatus();
}

}  // namespace taskgrid::bench
