#include "agent/agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/connect.h"
#include "common/grpc_status.h"
#include "common/message_limits.h"
#include "common/tcp_probe.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"

namespace taskgrid::agent {

namespace {
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

}  // namespace

Agent::Agent(AgentOptions opts)
    : opts_(std::move(opts)),
      clock_(opts_.clock != nullptr ? opts_.clock : RealClock::Get()),
      addresses_(SchedulerAddresses::ParseChecked(opts_.scheduler, "AgentOptions::scheduler")),
      credentials_(opts_.credentials),
      core_(opts_, [this] { EndStream(); }) {}

Agent::~Agent() { Stop(); }

void Agent::Classify(const std::string& target, const grpc::Status& st, bool standby) {
  // A standby's answer: a takeover may be on its way; neither way.
  if (standby) return;
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // Could not connect, or the connection broke: ask the address itself.
    switch (ProbeTcp(target, absl::Seconds(1))) {
      case TcpProbe::kRefused:
        if (core_.SchedulerRefused()) {
          spdlog::warn(
              "the scheduler at {} refuses connections (restarting?): its running tasks go on "
              "for up to {} while it comes back",
              target, DurationText(absl::Trunc(core_.restart_hold_left(), absl::Seconds(1))));
        }
        return;
      case TcpProbe::kAccepted:
        return;  // something listens now: the next try tells more
      case TcpProbe::kNoAnswer:
        break;
    }
  }
  // No answer at all, or a scheduler that answers but did not welcome us.
  core_.SchedulerNotRestarting();
}

void Agent::EndStream() {
  std::lock_guard<std::mutex> lock(ctx_mu_);
  if (ctx_ != nullptr) ctx_->TryCancel();
}

int Agent::Run() {
  if (const int kept = core_.TakeBackKept(); kept > 0) {
    spdlog::info("took back {} running task(s) kept by the agent before this one", kept);
  }
  std::thread timer([this] { core_.TimerLoop(); });
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = opts_.reconnect_min;
  // Zero until the scheduler refuses this agent; then doubling.
  absl::Duration refused_backoff = absl::ZeroDuration();
  int sessions = 0;
  while (!core_.DrainComplete()) {
    ++sessions;
    const absl::Duration start = Now();
    Session();
    if (Now() - start > absl::Seconds(10)) backoff = opts_.reconnect_min;
    absl::Duration wait;
    if (!refused_.ok()) {
      // Refused: only a fixed file helps, so try far less often. Jitter in
      // the upper half, so the pace stays near what the log line says.
      refused_backoff = std::clamp(refused_backoff * 2, opts_.refused_retry_min,
                                   std::max(opts_.refused_retry_min, opts_.refused_retry_max));
      std::uniform_int_distribution<int64_t> jitter(0,
                                                    absl::ToInt64Microseconds(refused_backoff) / 2);
      wait = refused_backoff / 2 + absl::Microseconds(jitter(rng));
      LogRefusal(refused_by_, refused_, refused_backoff);
    } else {
      refused_backoff = absl::ZeroDuration();
      // Full jitter: agents that lost one scheduler do not return in lockstep.
      std::uniform_int_distribution<int64_t> jitter(0, absl::ToInt64Microseconds(backoff));
      wait = absl::Microseconds(jitter(rng)) + opts_.reconnect_min;
      backoff = std::min(backoff * 2, opts_.reconnect_max);
    }
    core_.WaitDrainComplete(wait);
    if (!refused_.ok() && opts_.reload_credentials != nullptr && !core_.DrainComplete()) {
      // The token or certificate file may have been fixed meanwhile.
      auto creds = opts_.reload_credentials();
      if (creds.ok()) {
        credentials_ = *std::move(creds);
        logged_reload_error_.clear();
      } else if (std::string e(creds.status().message()); e != logged_reload_error_) {
        spdlog::error("cannot read the agent's credentials again, keeping those from before: {}",
                      e);
        logged_reload_error_ = e;
      }
    }
  }
  core_.StopTimer();
  timer.join();
  const int unacked = core_.Finish();
  if (const int kept = core_.kept(); kept > 0) {
    spdlog::info(
        "exiting: {} running task(s) kept for the next agent with this --id and --work_dir, "
        "{} result(s) not acknowledged",
        kept, unacked);
  } else if (unacked > 0) {
    spdlog::warn("drained: exiting with {} result(s) not acknowledged by the scheduler", unacked);
  } else {
    spdlog::info("drained: every result was handed over");
  }
  return sessions;
}

void Agent::Session() {
  // A fresh channel per attempt: a channel that saw the scheduler go away
  // keeps failing calls fast for its own backoff (seconds), while ours is
  // bounded by reconnect_max, well inside the scheduler's reconnect grace.
  const std::string target = addresses_.current();
  std::shared_ptr<grpc::Channel> channel = MakeChannel(target, credentials_);
  refused_ = grpc::Status::OK;
  // With standbys to try: one that is up connects in milliseconds; one
  // that does not (frozen, or its host gone) is passed over.
  if (addresses_.size() > 1 && !ConnectsWithin(channel.get(), absl::Seconds(2))) {
    if (Now() - last_unreachable_log_ > absl::Seconds(10)) {
      spdlog::warn("cannot connect to the scheduler at {}; trying the next of {}", target,
                   addresses_.text());
      last_unreachable_log_ = Now();
    }
    addresses_.Failed("");
    Classify(target, grpc::Status(grpc::StatusCode::UNAVAILABLE, "did not connect"),
             /*standby=*/false);
    return;
  }
  std::unique_ptr<v1::AgentService::Stub> stub = v1::AgentService::NewStub(channel);
  grpc::ClientContext ctx;
  {
    std::lock_guard<std::mutex> lock(ctx_mu_);
    ctx_ = &ctx;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::SchedulerMessage>> stream =
      stub->Connect(&ctx);
  Outbox& outbox = core_.outbox();
  bool ok = stream->Write(core_.StreamStarted());
  if (ok) {
    outbox.Attach([s = stream.get()](const v1::AgentMessage& m) { return s->Write(m); });
  }
  v1::SchedulerMessage msg;
  // A Hello that could not be written means the call is over already (a
  // standby answers at once): reading to its end, which comes at once,
  // keeps its status. (EndStream() can still cancel it.)
  while (stream->Read(&msg)) {
    if (!ok) continue;
    core_.Handle(msg);
    if (msg.has_welcome()) {
      addresses_.Answered();
      if (!logged_refusal_.empty()) {
        spdlog::info("the scheduler at {} accepts this agent now", target);
        logged_refusal_.clear();
      }
      spdlog::info("connected to {} as {} (session {})", target, opts_.id,
                   msg.welcome().session_id());
    }
  }
  // What is queued now would go nowhere (results are resent after the next
  // Welcome); later writes say they were dropped.
  outbox.Detach();
  {
    std::lock_guard<std::mutex> lock(ctx_mu_);
    ctx_ = nullptr;
  }
  const bool welcomed = core_.StreamEnded();
  // After Read() returned false the call is over and Finish() gives the
  // scheduler's status and trailing metadata (a standby's names the leader).
  grpc::Status st = stream->Finish();
  if (core_.exiting()) {
    return;  // the final line of Run() says what was left unacknowledged
  }
  // A stream that was welcomed came from the leader: back to it first.
  // Else a standby named the leader, or the next address may lead.
  const std::string leader = LeaderNamedBy(ctx);
  if (!welcomed) {
    addresses_.Failed(leader);
    Classify(target, st, AnsweredByStandby(ctx));
  }
  if (!leader.empty()) {
    if (Now() - last_unreachable_log_ > absl::Seconds(10)) {
      spdlog::info("{} is a standby; the leader is at {}", target, leader);
      last_unreachable_log_ = Now();
    }
  } else if (welcomed) {
    spdlog::warn("stream to {} ended ({}: {}); reconnecting", target,
                 static_cast<int>(st.error_code()), st.error_message());
    last_unreachable_log_ = Now();
  } else if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
             st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    // Run() logs it (once) with the time to the next try.
    refused_ = st;
    refused_by_ = target;
  } else if (Now() - last_unreachable_log_ > absl::Seconds(10)) {
    // Once per 10 s while the scheduler stays unreachable, not per attempt;
    // gRPC's text ("Socket closed") does not say what failed, a probe
    // does (nothing listens, or which side of the TLS handshake gave up).
    const std::string why = st.error_code() == grpc::StatusCode::UNAVAILABLE
                                ? ExplainConnectFailure(target, opts_.tls_files, absl::Seconds(1))
                                : "";
    spdlog::warn("cannot reach the scheduler at {}: {}{}", target,
                 why.empty() ? "" : absl::StrCat(why, "; gRPC: "), FromGrpcStatus(st).ToString());
    last_unreachable_log_ = Now();
  }
}

void Agent::LogRefusal(const std::string& target, const grpc::Status& st, absl::Duration retry) {
  const std::string reason = FromGrpcStatus(st).ToString();
  if (reason == logged_refusal_) {
    spdlog::debug("the scheduler at {} refused this agent again: {}", target, reason);
    return;
  }
  logged_refusal_ = reason;
  const std::string& msg = st.error_message();
  const std::string token = opts_.token_file.empty()
                                ? std::string("no --token_file")
                                : absl::StrCat("the token in --token_file ", opts_.token_file);
  const std::string sighup = "the scheduler's --tokens_file (then SIGHUP the scheduler)";
  std::string fix;
  if (absl::StrContains(msg, "certificate")) {
    fix = absl::StrCat("the id must be a name of the client certificate (",
                       opts_.tls_files.cert.empty()
                           ? std::string("no --tls_cert")
                           : absl::StrCat("--tls_cert ", opts_.tls_files.cert),
                       "): fix --id or the certificate");
  } else if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    fix = opts_.token_file.empty()
              ? absl::StrCat(
                    "the scheduler needs a token: give --token_file a token with role "
                    "agent from ",
                    sighup)
              : absl::StrCat(token, " is not one the scheduler knows: fix the file, or add it to ",
                             sighup);
  } else if (absl::StrContains(msg, "needs role")) {
    fix = absl::StrCat(token, " lacks role agent: fix the file, or give its name role agent in ",
                       sighup);
  } else if (absl::StrContains(msg, "may act as")) {
    fix = absl::StrCat(token, " may not act as --id ", opts_.id, ": fix --id, or name ", opts_.id,
                       " in its ids= in ", sighup);
  } else {
    fix = absl::StrCat("check --token_file, --tls_cert and --id against ", sighup);
  }
  spdlog::error(
      "the scheduler at {} refused this agent ({}): {}; {}. The agent tries again by itself "
      "(within {}, then at most every {}, reading its token and certificate files again), no "
      "restart needed; this is logged again only if the reason changes",
      target, opts_.id, reason, fix, DurationText(absl::Trunc(retry, absl::Seconds(1))),
      DurationText(opts_.refused_retry_max));
}

}  // namespace taskgrid::agent
